#include "coordinator/job_store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"

namespace apapo::coordinator {

absl::Status MemoryJobStore::SaveJob(const apapo::v1::Job& job) {
  absl::MutexLock lock(&mu_);
  jobs_[job.id()] = job;
  ++job_writes_;
  return absl::OkStatus();
}

absl::Status MemoryJobStore::SaveJobs(const std::vector<apapo::v1::Job>& jobs) {
  absl::MutexLock lock(&mu_);
  for (const auto& job : jobs) jobs_[job.id()] = job;
  ++job_writes_;
  return absl::OkStatus();
}

int64_t MemoryJobStore::job_writes() {
  absl::MutexLock lock(&mu_);
  return job_writes_;
}

absl::Status MemoryJobStore::AppendEvent(const std::string& job_id,
                                         const apapo::v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  events_[job_id].push_back(event);
  return absl::OkStatus();
}

absl::Status MemoryJobStore::SavePlan(const std::string& job_id,
                                      const apapo::v1::GetPlanResponse& plan) {
  absl::MutexLock lock(&mu_);
  plans_[job_id] = plan;
  return absl::OkStatus();
}

absl::Status MemoryJobStore::DeleteJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
  events_.erase(job_id);
  plans_.erase(job_id);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<apapo::v1::Job>> MemoryJobStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<apapo::v1::Job> out;
  for (const auto& [id, job] : jobs_) out.push_back(job);
  return out;
}

absl::StatusOr<std::vector<apapo::v1::JobEvent>> MemoryJobStore::LoadEvents(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(job_id);
  if (it == events_.end()) return std::vector<apapo::v1::JobEvent>{};
  return it->second;
}

absl::StatusOr<apapo::v1::GetPlanResponse> MemoryJobStore::LoadPlan(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = plans_.find(job_id);
  if (it == plans_.end()) {
    return absl::NotFoundError(absl::StrCat("no plan stored for ", job_id));
  }
  return it->second;
}

namespace {

// One SQLite connection, serialised by a mutex. Events are written one per
// statement (they are rare); progress comes in batches (SaveJobs), one
// transaction each.
class SqliteJobStore : public JobStore {
 public:
  explicit SqliteJobStore(sqlite3* db) : db_(db) {}
  ~SqliteJobStore() override { sqlite3_close(db_); }

  absl::Status Init() {
    absl::MutexLock lock(&mu_);
    return Exec(
        "PRAGMA journal_mode=WAL;"
        "PRAGMA synchronous=NORMAL;"
        "CREATE TABLE IF NOT EXISTS jobs(id TEXT PRIMARY KEY, job BLOB);"
        "CREATE TABLE IF NOT EXISTS events(job_id TEXT, seq INTEGER, "
        "  event BLOB, PRIMARY KEY(job_id, seq));"
        "CREATE TABLE IF NOT EXISTS plans(job_id TEXT PRIMARY KEY, plan BLOB);");
  }

  absl::Status SaveJob(const apapo::v1::Job& job) override {
    return Write("INSERT OR REPLACE INTO jobs(id, job) VALUES(?1, ?2)",
                 job.id(), 0, job.SerializeAsString(), /*has_seq=*/false);
  }

  absl::Status SaveJobs(const std::vector<apapo::v1::Job>& jobs) override {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
    for (const auto& job : jobs) {
      absl::Status s = WriteLocked("INSERT OR REPLACE INTO jobs(id, job) VALUES(?1, ?2)",
                                   job.id(), 0, job.SerializeAsString(),
                                   /*has_seq=*/false);
      if (!s.ok()) {
        Exec("ROLLBACK").IgnoreError();
        return s;
      }
    }
    return Exec("COMMIT");
  }

  absl::Status AppendEvent(const std::string& job_id,
                           const apapo::v1::JobEvent& event) override {
    return Write("INSERT OR REPLACE INTO events(job_id, seq, event) "
                 "VALUES(?1, ?3, ?2)",
                 job_id, event.sequence(), event.SerializeAsString(),
                 /*has_seq=*/true);
  }

  absl::Status SavePlan(const std::string& job_id,
                        const apapo::v1::GetPlanResponse& plan) override {
    return Write("INSERT OR REPLACE INTO plans(job_id, plan) VALUES(?1, ?2)",
                 job_id, 0, plan.SerializeAsString(), /*has_seq=*/false);
  }

  absl::StatusOr<std::vector<apapo::v1::Job>> LoadJobs() override {
    std::vector<apapo::v1::Job> out;
    absl::Status s = Read("SELECT job FROM jobs ORDER BY id", "",
                          [&](const std::string& blob) {
                            out.emplace_back();
                            return out.back().ParseFromString(blob);
                          });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<apapo::v1::JobEvent>> LoadEvents(
      const std::string& job_id) override {
    std::vector<apapo::v1::JobEvent> out;
    absl::Status s =
        Read("SELECT event FROM events WHERE job_id = ?1 ORDER BY seq", job_id,
             [&](const std::string& blob) {
               out.emplace_back();
               return out.back().ParseFromString(blob);
             });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<apapo::v1::GetPlanResponse> LoadPlan(
      const std::string& job_id) override {
    apapo::v1::GetPlanResponse plan;
    bool found = false;
    absl::Status s = Read("SELECT plan FROM plans WHERE job_id = ?1", job_id,
                          [&](const std::string& blob) {
                            found = true;
                            return plan.ParseFromString(blob);
                          });
    if (!s.ok()) return s;
    if (!found) {
      return absl::NotFoundError(absl::StrCat("no plan stored for ", job_id));
    }
    return plan;
  }

  absl::Status DeleteJob(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
    for (const char* sql : {"DELETE FROM events WHERE job_id = ?1",
                            "DELETE FROM plans WHERE job_id = ?1",
                            "DELETE FROM jobs WHERE id = ?1"}) {
      sqlite3_stmt* stmt = nullptr;
      if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
        absl::Status s = Error("prepare");
        Exec("ROLLBACK").IgnoreError();
        return s;
      }
      sqlite3_bind_text(stmt, 1, job_id.data(), job_id.size(), SQLITE_TRANSIENT);
      const int rc = sqlite3_step(stmt);
      sqlite3_finalize(stmt);
      if (rc != SQLITE_DONE) {
        absl::Status s = Error("delete");
        Exec("ROLLBACK").IgnoreError();
        return s;
      }
    }
    return Exec("COMMIT");
  }

 private:
  absl::Status Error(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::InternalError(
        absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db_)));
  }

  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      absl::Status s = absl::InternalError(absl::StrCat("job store: ", err));
      sqlite3_free(err);
      return s;
    }
    return absl::OkStatus();
  }

  // Runs one statement binding ?1 = key (text), ?2 = blob, ?3 = seq.
  absl::Status Write(const char* sql, const std::string& key, int64_t seq,
                     const std::string& blob, bool has_seq) {
    absl::MutexLock lock(&mu_);
    return WriteLocked(sql, key, seq, blob, has_seq);
  }
  absl::Status WriteLocked(const char* sql, const std::string& key, int64_t seq,
                           const std::string& blob, bool has_seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
      return Error("prepare");
    }
    sqlite3_bind_text(stmt, 1, key.data(), key.size(), SQLITE_TRANSIENT);
    sqlite3_bind_blob(stmt, 2, blob.data(), blob.size(), SQLITE_TRANSIENT);
    if (has_seq) sqlite3_bind_int64(stmt, 3, seq);
    int rc = sqlite3_step(stmt);
    sqlite3_finalize(stmt);
    if (rc != SQLITE_DONE) return Error("write");
    return absl::OkStatus();
  }

  // Runs a query with optional ?1 = key and calls `row` with column 0.
  template <typename RowFn>
  absl::Status Read(const char* sql, const std::string& key, RowFn row) {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
      return Error("prepare");
    }
    if (!key.empty()) {
      sqlite3_bind_text(stmt, 1, key.data(), key.size(), SQLITE_TRANSIENT);
    }
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      const void* data = sqlite3_column_blob(stmt, 0);
      int size = sqlite3_column_bytes(stmt, 0);
      std::string blob(static_cast<const char*>(data), size);
      if (!row(blob)) {
        sqlite3_finalize(stmt);
        return absl::DataLossError("job store: a stored record does not parse");
      }
    }
    sqlite3_finalize(stmt);
    if (rc != SQLITE_DONE) return Error("read");
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  sqlite3* const db_;  // Guarded by mu_ for every statement.
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(
    const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                          SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open state database ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  auto store = std::make_unique<SqliteJobStore>(db);
  if (absl::Status s = store->Init(); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot initialise state database ", path, ": ",
                     s.message()));
  }
  return store;
}

}  // namespace apapo::coordinator
