#include "worker/daemon/torch_job_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/daemon/link_profiler.h"
#include "worker/daemon/stage_channel.h"

extern char** environ;

namespace apapo::worker {
namespace {

constexpr const char* kThreadVariables[] = {"OPENBLAS_NUM_THREADS",
                                            "OMP_NUM_THREADS",
                                            "MKL_NUM_THREADS"};

std::string ErrnoMessage(const char* what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The child's environment: ours, with the compute thread counts replaced
// (OpenBLAS reads its variable only when it loads).
std::vector<std::string> ChildEnvironment(int threads) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    bool replaced = false;
    for (const char* name : kThreadVariables) {
      replaced |= absl::StartsWith(*e, absl::StrCat(name, "="));
    }
    if (!replaced) env.emplace_back(*e);
  }
  for (const char* name : kThreadVariables) {
    env.push_back(absl::StrCat(name, "=", threads));
  }
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string ExitCause(int wstatus) {
  if (WIFSIGNALED(wstatus)) {
    const int sig = WTERMSIG(wstatus);
    const char* name = sigabbrev_np(sig);
    return absl::StrCat("was killed by signal ", sig,
                        name != nullptr ? absl::StrCat(" (SIG", name, ")")
                                        : std::string());
  }
  const int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  return absl::StrCat("exited with code ", code);
}

}  // namespace

TorchJobRunner::TorchJobRunner(std::string exe)
    : TorchJobRunner(TorchJobRunnerOptions{std::move(exe)}) {}

TorchJobRunner::TorchJobRunner(TorchJobRunnerOptions options)
    : options_(std::move(options)) {}

TorchJobRunner::~TorchJobRunner() = default;

absl::StatusOr<apapo::v1::ProfileResult> TorchJobRunner::Profile(
    const apapo::v1::ProfileCommand& command) {
  const std::string& job = command.job_id();
  auto stop = std::make_shared<absl::Notification>();
  {
    absl::MutexLock lock(&mu_);
    profiling_[job] = stop;
  }
  struct Unregister {
    TorchJobRunner* runner;
    const std::string& job;
    const std::shared_ptr<absl::Notification>& stop;
    ~Unregister() {
      absl::MutexLock lock(&runner->mu_);
      auto it = runner->profiling_.find(job);
      if (it != runner->profiling_.end() && it->second == stop) {
        runner->profiling_.erase(it);
      }
    }
  } unregister{this, job, stop};

  // Links first: the peers start together, before their model timings
  // (which take different times on different workers) set them apart.
  std::vector<apapo::v1::LinkMeasurement> links;
  std::vector<apapo::v1::AllReduceMeasurement> allreduces;
  const apapo::v1::Rendezvous& rv = command.rendezvous();
  if (rv.world_size() > 1) {
    LinkProfileOptions lo;
    lo.host = rv.local_host().empty() ? options_.host : rv.local_host();
    lo.stop = stop.get();
    absl::StatusOr<std::vector<apapo::v1::LinkMeasurement>> measured =
        MeasureLinks(command, lo, &allreduces);
    // Every rank has left the store (or failed): the host may let it go.
    if (rv.rank() == 0) ReleaseStore(job);
    if (!measured.ok()) {
      if (stop->HasBeenNotified()) {
        return absl::CancelledError("profiling stopped");
      }
      return measured.status();
    }
    links = *std::move(measured);
  }

  // The model is built and timed in a child process: model code never runs
  // in the daemon (a crash or an OOM there ends the child, not us).
  const std::string label = absl::StrCat("profiling ", job);
  if (options_.exe.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": no worker binary to profile with"));
  }
  if (stop->HasBeenNotified()) return absl::CancelledError("profiling stopped");
  apapo::v1::ProfileCommand child_command = command;
  auto* resources = child_command.mutable_spec()->mutable_resources();
  if (resources->memory_per_worker_bytes() <= 0 && options_.memory_bytes > 0) {
    resources->set_memory_per_worker_bytes(options_.memory_bytes);
  }
  apapo::v1::ProfileResult result;
  ChildOutput out;
  out.profile = &result;
  absl::Status st = RunChild(job, label, "--run_profile", child_command.SerializeAsString(),
                             StageThreads(command.spec()), out);
  if (st.code() == absl::StatusCode::kCancelled) {
    return absl::CancelledError("profiling stopped");
  }
  if (!st.ok()) return st;
  for (auto& link : links) *result.add_links() = std::move(link);
  // Over every rank in ascending bytes, then the one on this host.
  int over_all = 0;
  for (apapo::v1::AllReduceMeasurement& a : allreduces) {
    if (a.worker_ids_size() > 0) {
      *result.mutable_host_allreduce() = std::move(a);
    } else if (over_all++ == 0) {
      *result.mutable_allreduce() = std::move(a);
    } else {
      *result.mutable_large_allreduce() = std::move(a);
    }
  }
  return result;
}

void TorchJobRunner::ReleaseStore(const std::string& job_id) {
  std::unique_ptr<JobStore> store;
  absl::MutexLock lock(&mu_);
  if (auto s = stores_.find(job_id); s != stores_.end()) {
    store = std::move(s->second);
    stores_.erase(s);
  }
  // `store` is destroyed after the lock is dropped.
}

absl::StatusOr<int> TorchJobRunner::HostRendezvous(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = stores_.find(job_id);
    if (it != stores_.end()) return it->second->port();
    early_stops_.erase(job_id);  // a new assignment of the job
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = StartJobStore();
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("hosting the rendezvous of ", job_id,
                                     ": ", store.status().message()));
  }
  const int port = (*store)->port();
  absl::MutexLock lock(&mu_);
  stores_[job_id] = *std::move(store);
  return port;
}

void TorchJobRunner::PrepareAssignment(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  early_stops_.erase(job_id);
}

bool TorchJobRunner::TakeEarlyStop(const std::string& job_id) {
  const absl::Time now = absl::Now();
  for (auto it = early_stops_.begin(); it != early_stops_.end();) {
    if (now - it->second > options_.stop_memory) {
      it = early_stops_.erase(it);
    } else {
      ++it;
    }
  }
  return early_stops_.erase(job_id) > 0;
}

void TorchJobRunner::Stop(const std::string& job_id) {
  std::unique_ptr<JobStore> released;
  absl::MutexLock lock(&mu_);
  if (auto it = profiling_.find(job_id);
      it != profiling_.end() && !it->second->HasBeenNotified()) {
    it->second->Notify();
  }
  auto it = children_.find(job_id);
  if (it == children_.end()) {
    early_stops_[job_id] = absl::Now();
    if (auto s = stores_.find(job_id); s != stores_.end()) {
      released = std::move(s->second);
      stores_.erase(s);
    }
    return;  // `released` is destroyed after the lock is dropped
  }
  Child* child = it->second;
  if (child->stop_requested) return;
  child->stop_requested = true;
  child->kill_at = absl::Now() + options_.stop_grace;
  ::kill(child->pid, SIGTERM);
  // Wake the Train thread so it arms the SIGKILL deadline.
  const char byte = 1;
  (void)!::write(child->wake_fd, &byte, 1);
}

absl::Status TorchJobRunner::Train(const apapo::v1::AssignStage& assignment,
                                   const MetricsCallback& report,
                                   apapo::v1::MetricsReport* final_metrics) {
  const std::string& job = assignment.job_id();
  const std::string label =
      absl::StrCat("stage ", assignment.stage(), " replica ",
                   assignment.replica(), " (rank ",
                   assignment.rendezvous().rank(), ")");
  const std::string stopped_message =
      absl::StrCat("stage ", assignment.stage(),
                   " stopped: stop requested for job ", job);
  // The job's store (if hosted here) lives until this returns.
  struct ReleaseAtEnd {
    TorchJobRunner* runner;
    const std::string& job;
    ~ReleaseAtEnd() { runner->ReleaseStore(job); }
  } release_store{this, job};

  if (options_.exe.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": no worker binary to run the stage with"));
  }
  // The child's transport binds to this worker's address.
  apapo::v1::AssignStage local = assignment;
  if (local.rendezvous().local_host().empty()) {
    local.mutable_rendezvous()->set_local_host(options_.host);
  }
  ChildOutput out;
  out.report = &report;
  out.final_metrics = final_metrics;
  absl::Status status = RunChild(job, label, "--run_assignment", local.SerializeAsString(),
                                 StageThreads(assignment.spec()), out);
  if (status.code() == absl::StatusCode::kCancelled) {
    return absl::CancelledError(stopped_message);
  }
  return status;
}

absl::Status TorchJobRunner::RunChild(const std::string& job, const std::string& label,
                                      const std::string& flag, const std::string& payload,
                                      int threads, const ChildOutput& out) {
  // Everything the child needs is prepared before fork: after it, the child
  // may only make async-signal-safe calls.
  int assignment_fd = ::memfd_create("apapo-child-input", MFD_CLOEXEC);
  if (assignment_fd < 0) {
    return absl::InternalError(
        absl::StrCat(label, ": ", ErrnoMessage("memfd_create")));
  }
  {
    size_t done = 0;
    while (done < payload.size()) {
      const ssize_t n =
          ::write(assignment_fd, payload.data() + done, payload.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const std::string error = ErrnoMessage("writing the child's input");
        CloseFd(assignment_fd);
        return absl::InternalError(absl::StrCat(label, ": ", error));
      }
      done += static_cast<size_t>(n);
    }
  }

  int data[2] = {-1, -1};
  int wake[2] = {-1, -1};
  if (::pipe2(data, O_CLOEXEC) != 0 ||
      ::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const std::string error = ErrnoMessage("pipe2");
    CloseFd(assignment_fd);
    CloseFd(data[0]);
    CloseFd(data[1]);
    return absl::InternalError(absl::StrCat(label, ": ", error));
  }
  std::vector<std::string> args = {
      options_.exe,
      absl::StrCat(flag, "=/proc/self/fd/", assignment_fd)};
  if (!options_.data_roots.empty()) {
    args.push_back(absl::StrCat("--confine_to=", absl::StrJoin(options_.data_roots, ",")));
  }
  std::vector<std::string> env = ChildEnvironment(threads);
  std::vector<char*> argv = Pointers(args);
  std::vector<char*> envp = Pointers(env);
  sigset_t no_signals;
  sigemptyset(&no_signals);
  const pid_t parent = ::getpid();

  Child child;
  child.wake_fd = wake[1];
  {
    // Forking under the lock: a concurrent Stop either saw no child (and
    // left an early stop, checked here) or sees the registered one.
    absl::MutexLock lock(&mu_);
    if (TakeEarlyStop(job)) {
      CloseFd(assignment_fd);
      CloseFd(data[0]);
      CloseFd(data[1]);
      CloseFd(wake[0]);
      CloseFd(wake[1]);
      return absl::CancelledError("stopped");
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Child: async-signal-safe calls only.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::sigprocmask(SIG_SETMASK, &no_signals, nullptr);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      if (::dup2(data[1], STDOUT_FILENO) < 0) ::_exit(127);
      const int null_fd = ::open("/dev/null", O_RDONLY);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      ::fcntl(assignment_fd, F_SETFD, 0);  // inherited by the exec'd image
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    if (pid < 0) {
      const std::string error = ErrnoMessage("fork");
      CloseFd(assignment_fd);
      CloseFd(data[0]);
      CloseFd(data[1]);
      CloseFd(wake[0]);
      CloseFd(wake[1]);
      return absl::ResourceExhaustedError(absl::StrCat(label, ": ", error));
    }
    child.pid = pid;
    children_[job] = &child;
  }
  CloseFd(assignment_fd);
  CloseFd(data[1]);
  absl::Status status = Supervise(job, label, flag, &child, data[0], wake[0], out);
  CloseFd(data[0]);
  CloseFd(wake[0]);
  CloseFd(wake[1]);
  return status;
}

absl::Status TorchJobRunner::Supervise(const std::string& job, const std::string& label,
                                       const std::string& flag, Child* child, int data_fd,
                                       int wake_fd, const ChildOutput& out) {
  FrameReader reader;
  absl::Status stream_error;
  absl::Status child_status;
  bool have_status = false;
  bool killed = false;
  bool have_profile = false;
  std::vector<char> buffer(1 << 16);
  for (;;) {
    int timeout_ms = -1;
    {
      absl::MutexLock lock(&mu_);
      if (child->stop_requested && !killed) {
        const absl::Duration left = child->kill_at - absl::Now();
        if (left <= absl::ZeroDuration()) {
          ::kill(child->pid, SIGKILL);
          killed = true;
        } else {
          timeout_ms = static_cast<int>(
              std::ceil(absl::ToDoubleMilliseconds(left)));
        }
      }
    }
    pollfd fds[2] = {{data_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int ready = ::poll(fds, 2, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      stream_error = absl::InternalError(ErrnoMessage("poll"));
      break;
    }
    if (fds[1].revents != 0) {
      char drain[64];
      while (::read(wake_fd, drain, sizeof(drain)) > 0) {
      }
    }
    if (fds[0].revents == 0) continue;
    const ssize_t n = ::read(data_fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      stream_error = absl::InternalError(ErrnoMessage("reading the stage pipe"));
      break;
    }
    if (n == 0) break;  // the child exited (or closed its end)
    reader.Append(buffer.data(), static_cast<size_t>(n));
    FrameType type;
    std::string payload;
    absl::Status corrupt;
    while (reader.Next(&type, &payload, &corrupt)) {
      switch (type) {
        case FrameType::kMetrics: {
          apapo::v1::MetricsReport m;
          if (m.ParseFromString(payload) && out.report != nullptr && *out.report) {
            (*out.report)(m);
          }
          break;
        }
        case FrameType::kFinal:
          if (out.final_metrics != nullptr) out.final_metrics->ParseFromString(payload);
          break;
        case FrameType::kProfile:
          if (out.profile != nullptr) have_profile = out.profile->ParseFromString(payload);
          break;
        case FrameType::kStatus:
          child_status = DecodeStatus(payload);
          have_status = true;
          break;
      }
    }
    if (!corrupt.ok() && stream_error.ok()) {
      stream_error = corrupt;
      ::kill(child->pid, SIGKILL);
    }
  }

  // Unregister before reaping, so that Stop never signals a reaped pid.
  bool stopped;
  {
    absl::MutexLock lock(&mu_);
    stopped = child->stop_requested;
    children_.erase(job);
  }
  int wstatus = 0;
  pid_t waited;
  do {
    waited = ::waitpid(child->pid, &wstatus, 0);
  } while (waited < 0 && errno == EINTR);
  const bool clean_exit = waited == child->pid && WIFEXITED(wstatus) &&
                          WEXITSTATUS(wstatus) == 0;
  // A child that reported success and was not killed finished, even if a
  // stop raced its end. (waitpid fails with ECHILD if the process ignores
  // SIGCHLD; the reported status decides then.)
  if (have_status && child_status.ok() && stream_error.ok() &&
      (clean_exit || waited != child->pid) && (out.profile == nullptr || have_profile)) {
    return absl::OkStatus();
  }
  if (stopped) return absl::CancelledError("stopped");
  if (have_status && !child_status.ok()) {
    if (absl::StrContains(child_status.message(), label)) return child_status;
    return absl::Status(child_status.code(),
                        absl::StrCat(label, ": ", child_status.message()));
  }
  if (!stream_error.ok()) {
    return absl::Status(stream_error.code(),
                        absl::StrCat(label, ": ", stream_error.message()));
  }
  if (waited != child->pid) {
    return absl::InternalError(absl::StrCat(
        label, ": lost track of the stage process: ", ErrnoMessage("waitpid")));
  }
  const char* what = out.profile != nullptr ? "profiling process" : "stage process";
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 127) {
    return absl::InternalError(absl::StrCat(label, ": cannot run the ", what, " '",
                                            options_.exe, "' (exit code 127)"));
  }
  if (clean_exit) {
    return absl::InternalError(absl::StrCat(
        label, ": the ", what, " exited without reporting ",
        out.profile != nullptr ? "a profile" : "an outcome", " (does '", options_.exe,
        "' handle ", flag, "?)"));
  }
  return absl::InternalError(absl::StrCat(label, ": the ", what, " ", ExitCause(wstatus),
                                          " without reporting a cause"));
}

}  // namespace apapo::worker
