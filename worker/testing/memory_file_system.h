// An in-memory FileSystem for tests (testonly): files are strings keyed by
// path; directories exist implicitly (List names the subdirectories that
// hold files; removing a directory is a no-op). Fail(path) makes the next writes of
// that path fail, to test error paths.
#ifndef APAPO_WORKER_TESTING_MEMORY_FILE_SYSTEM_H_
#define APAPO_WORKER_TESTING_MEMORY_FILE_SYSTEM_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/file_system.h"

namespace apapo::worker::testing {

class MemoryFileSystem : public FileSystem {
 public:
  absl::Status CreateDir(const std::string& dir) override {
    absl::MutexLock lock(&mu_);
    dirs_.insert(dir);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    absl::MutexLock lock(&mu_);
    std::set<std::string> names;
    const std::string prefix = dir + "/";
    for (const auto& [path, bytes] : files_) {
      if (!absl::StartsWith(path, prefix)) continue;
      // A file of a subdirectory lists the subdirectory.
      const size_t slash = path.find('/', prefix.size());
      names.insert(path.substr(prefix.size(), slash == std::string::npos
                                                  ? std::string::npos
                                                  : slash - prefix.size()));
    }
    return std::vector<std::string>(names.begin(), names.end());
  }
  absl::Status WriteAtomically(const std::string& path,
                               absl::string_view bytes) override {
    absl::MutexLock lock(&mu_);
    if (failing_.count(path)) {
      return absl::InternalError(absl::StrCat("writing '", path, "' failed"));
    }
    files_[path] = std::string(bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Read(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(path);
    if (it == files_.end()) {
      return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
    }
    return it->second;
  }
  absl::Status Remove(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    files_.erase(path);
    return absl::OkStatus();
  }

  void Fail(const std::string& path) {
    absl::MutexLock lock(&mu_);
    failing_.insert(path);
  }
  void Put(const std::string& path, const std::string& bytes) {
    absl::MutexLock lock(&mu_);
    files_[path] = bytes;
  }
  std::vector<std::string> Paths() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [path, bytes] : files_) out.push_back(path);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> failing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace apapo::worker::testing

#endif  // APAPO_WORKER_TESTING_MEMORY_FILE_SYSTEM_H_
