#include "worker/daemon/stage_process.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/threads.h"
#include "worker/daemon/cores.h"
#include "worker/daemon/profiler.h"
#include "worker/daemon/stage_channel.h"
#include "worker/stage_runner.h"
#include "worker/transport.h"

namespace apapo::worker {
namespace {

using apapo::v1::AssignStage;
using apapo::v1::MetricsReport;

void BoundComputeThreads(int threads) {
  at::set_num_threads(threads);
  // OpenBLAS keeps its own pool (see docs/BAZEL_OFFLINE.md); the parent also
  // sets OPENBLAS_NUM_THREADS, which it reads at load time.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
}

class TcpJobStore : public JobStore {
 public:
  explicit TcpJobStore(std::unique_ptr<StoreServer> server)
      : server_(std::move(server)) {}
  int port() const override { return server_->port(); }

 private:
  std::unique_ptr<StoreServer> server_;
};

}  // namespace

absl::Status RunAssignment(const AssignStage& a,
                           std::function<void(const MetricsReport&)> report,
                           MetricsReport* final_metrics) {
  return RunStage(a, std::move(report), final_metrics);
}

namespace {

// A child mode's frames go to the original stdout; anything else printed to
// stdout (library chatter) would corrupt them, so stdout becomes stderr.
// Returns the frames' descriptor (ends the process if it cannot).
int TakeFrameOutput() {
  const int out_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (out_fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    std::fprintf(stderr, "apapo-worker: cannot set up the daemon pipe: %s\n",
                 std::strerror(errno));
    std::fflush(stderr);
    _exit(2);
  }
  return out_fd;
}

// Writes `s` as the status frame and ends the process with `code`, without
// unwinding: c10d's teardown can block on peers that are gone.
int Finish(FrameWriter& writer, const char* what, const absl::Status& s, int code) {
  if (!s.ok()) std::fprintf(stderr, "apapo-worker %s: %s\n", what, s.ToString().c_str());
  (void)writer.Write(FrameType::kStatus, EncodeStatus(s));
  std::fflush(stderr);
  _exit(code);
  return code;
}

// Parses the serialized message in `path` (the daemon's memfd).
bool ReadMessage(const std::string& path, google::protobuf::Message* m) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return in && m->ParseFromString(ss.str());
}

}  // namespace

int StageThreads(const apapo::v1::JobSpec& spec) {
  // Read each time: a container's limit may be resized in place.
  return ThreadsWithin(spec.resources().threads_per_worker(), ThisProcessCpuQuota());
}

int RunAssignmentChildMain(const std::string& path) {
  static FrameWriter writer(TakeFrameOutput());  // the terminate handler's too
  ReportUncaughtExceptions(&writer, "stage process");
  AssignStage a;
  if (!ReadMessage(path, &a)) {
    return Finish(writer, "stage process",
                  absl::InvalidArgumentError(absl::StrCat(
                      "cannot read a serialized AssignStage from '", path, "'")),
                  2);
  }
  BoundComputeThreads(StageThreads(a.spec()));
  MetricsReport final_metrics;
  absl::Status status = RunAssignment(
      a,
      [&writer](const MetricsReport& m) {
        // A broken pipe means the daemon is gone: SIGPIPE ends us.
        (void)writer.Write(FrameType::kMetrics, m.SerializeAsString());
      },
      &final_metrics);
  if (status.ok()) {
    (void)writer.Write(FrameType::kFinal, final_metrics.SerializeAsString());
  }
  return Finish(writer, "stage process", status, status.ok() ? 0 : 1);
}

int RunProfileChildMain(const std::string& path) {
  static FrameWriter writer(TakeFrameOutput());  // the terminate handler's too
  ReportUncaughtExceptions(&writer, "profiling process");
  apapo::v1::ProfileCommand command;
  if (!ReadMessage(path, &command)) {
    return Finish(writer, "profiling process",
                  absl::InvalidArgumentError(absl::StrCat(
                      "cannot read a serialized ProfileCommand from '", path, "'")),
                  2);
  }
  const int threads = StageThreads(command.spec());
  BoundComputeThreads(threads);
  ProfileOptions o;
  o.threads = threads;
  absl::StatusOr<apapo::v1::ProfileResult> result = ProfileJob(command, o);
  if (result.ok()) {
    (void)writer.Write(FrameType::kProfile, result->SerializeAsString());
  }
  return Finish(writer, "profiling process", result.status(), result.ok() ? 0 : 1);
}

absl::StatusOr<std::unique_ptr<JobStore>> StartJobStore() {
  // c10d's TCPStore server listens on every interface whatever host it is
  // given, so ranks on other hosts reach it at the worker's --host.
  auto server = StartStoreServer("127.0.0.1");
  if (!server.ok()) return server.status();
  return std::unique_ptr<JobStore>(new TcpJobStore(*std::move(server)));
}

}  // namespace apapo::worker
