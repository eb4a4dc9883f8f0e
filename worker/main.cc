// apapo-worker: the APapo worker binary.
//
//   apapo-worker --coordinator=HOST:PORT [--id=ID] [--threads=N]
//       a worker daemon: registers with the coordinator, heartbeats, and
//       profiles / trains the stages it is assigned, each in a child
//       process; reconnects with backoff when the coordinator is away.
//   apapo-worker --local=N --spec=job.textproto [--summary=FILE]
//       trains the job on this machine (no coordinator): plans it, then
//       runs N stage processes exactly as a daemon runs its assignments
//       (worker/local_driver.h) and writes a JSON summary.
//   (internal) --run_assignment=FILE
//       one stage process, of the daemon or of --local (see
//       worker/daemon/stage_process.h).
//   (internal) --run_profile=FILE
//       the daemon's profiling process (stage_process.h).
//
// Exit codes: 0 success; 1 training failed (a stage reported an error);
// 2 bad usage or invalid spec; 3 internal error.
//
// Compute threads are bounded here, and only here: LibTorch's intra-op pool
// (at::set_num_threads) and OpenBLAS's own pool, which ignores the former
// (OPENBLAS_NUM_THREADS is set before exec for children, and
// openblas_set_num_threads is called through dlsym in every process).

#include <dlfcn.h>
#include <malloc.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/spec_paths.h"
#include "common/threads.h"
#include "common/tls.h"
#include "worker/confined_files.h"
#include "worker/daemon/daemon.h"
#include "worker/daemon/cores.h"
#include "worker/daemon/memory.h"
#include "worker/daemon/profiler.h"
#include "worker/daemon/stage_process.h"
#include "worker/daemon/torch_job_runner.h"
#include "worker/local_driver.h"

ABSL_FLAG(int, local, 0,
          "Train --spec on this machine in this many worker processes.");
ABSL_FLAG(std::string, spec, "", "JobSpec in protobuf text format.");
ABSL_FLAG(std::string, summary, "", "Write the JSON run summary here.");
ABSL_FLAG(int, threads, 0,
          "Compute threads per worker process (LibTorch and OpenBLAS); 0: the "
          "spec's resources.threads_per_worker, else cores / workers. The "
          "cores are the CPUs this process may run on, within its cgroups' "
          "CPU quota (a container's CPU limit): whole cores of it, at least 1.");
ABSL_FLAG(int, timeout_s, 120,
          "Bound on every transfer wait; a dead or silent peer stops the job "
          "within this many seconds.");
ABSL_FLAG(std::string, coordinator, "",
          "Run as a worker daemon connected to the coordinator at HOST:PORT.");
ABSL_FLAG(std::string, id, "",
          "Daemon: worker id, unique in the cluster (default HOSTNAME-PID).");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "Daemon: address other workers reach this one at (rendezvous); "
          "its Gloo transports bind to it, so it must be an address of this "
          "machine.");
ABSL_FLAG(std::string, tls_ca, "",
          "Daemon: verify the coordinator against this CA (PEM); with "
          "--tls_cert/--tls_key, this worker's client certificate (its common "
          "name must be --id). deploy/pki.sh makes them.");
ABSL_FLAG(std::string, tls_cert, "", "Daemon: this worker's certificate (PEM).");
ABSL_FLAG(std::string, tls_key, "", "Daemon: its private key (PEM).");
ABSL_FLAG(std::string, data_roots, "/usr/share/datasets,/var/lib/apapo",
          "Daemon: comma-separated directories a job may read and write "
          "under (data, TorchScript, checkpoints); a spec naming anything "
          "else, '..', or a non-regular file is refused before it runs.");
ABSL_FLAG(std::string, confine_to, "",
          "Open every path a spec names (data, TorchScript, checkpoints) "
          "beneath these comma-separated data roots (openat2): the daemon "
          "passes its --data_roots to its stage processes; --local passes "
          "it on to its stages.");
ABSL_FLAG(std::string, labels, "",
          "Daemon: labels matched by job specs' worker_selector, "
          "\"key=value,key=value\".");
ABSL_FLAG(std::string, run_assignment, "",
          "internal: train the serialized AssignStage in this file (the "
          "daemon's stage process)");
ABSL_FLAG(std::string, run_profile, "",
          "internal: profile the model of the serialized ProfileCommand in "
          "this file (the daemon's profiling process)");

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 3;

int ExitCodeFor(const absl::Status& s) {
  if (s.ok()) return 0;
  if (s.code() == absl::StatusCode::kInvalidArgument ||
      s.code() == absl::StatusCode::kNotFound ||
      s.code() == absl::StatusCode::kUnimplemented) {
    return kExitUsage;
  }
  if (s.code() == absl::StatusCode::kInternal) return kExitInternal;
  return kExitFailed;
}

// The CPUs this process may run on (its affinity mask, else every online
// one) within its cgroups' CPU quota.
int CoresWithinQuota(double quota) {
  int cpus = apapo::worker::ThisProcessCores().size;
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return apapo::ThreadsWithin(cpus, quota);
}

void BoundComputeThreads(int threads) {
  at::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
}

int RunLocal(const apapo::v1::JobSpec& spec, int workers, int threads) {
  // Stage children get these from TorchJobRunner too; the parent plans only.
  setenv("OPENBLAS_NUM_THREADS", absl::StrCat(threads).c_str(), 1);
  setenv("OMP_NUM_THREADS", absl::StrCat(threads).c_str(), 1);
  apapo::worker::LocalJobOptions o;
  o.workers = workers;
  o.threads = threads;
  o.summary_path = absl::GetFlag(FLAGS_summary);
  o.exe = "/proc/self/exe";
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  absl::Status s = apapo::worker::RunLocalJob(spec, o);
  if (!s.ok()) {
    std::fprintf(stderr, "apapo-worker: %s\n", s.ToString().c_str());
    return ExitCodeFor(s);
  }
  return 0;
}

// The coordinator-connected daemon: runs until SIGINT/SIGTERM.
int RunDaemon(int threads, double cpu_quota) {
  // SIGINT/SIGTERM are taken by one thread; block them before any other
  // thread starts (the stage children get a clean mask before exec).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  apapo::worker::DaemonOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  apapo::v1::WorkerInfo& info = options.info;
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  info.set_worker_id(absl::GetFlag(FLAGS_id).empty()
                         ? absl::StrCat(hostname, "-", getpid())
                         : absl::GetFlag(FLAGS_id));
  info.set_host(absl::GetFlag(FLAGS_host));
  info.set_cores(threads);
  info.set_memory_bytes(apapo::worker::AvailableMemoryBytes());
  const apapo::worker::CoreSet cores = apapo::worker::ThisProcessCores();
  info.set_core_set(cores.id);
  info.set_core_set_size(cores.size);
  info.set_cpu_quota(cpu_quota);
  apapo::v1::Device* cpu = info.add_devices();
  cpu->set_kind("cpu");
  cpu->set_name(hostname);
  cpu->set_memory_bytes(info.memory_bytes());
  info.mutable_build()->set_version("apapo 0.1");
  info.mutable_build()->set_torch_version(TORCH_VERSION);
#ifdef APAPO_CUDA
  info.mutable_build()->set_cuda(true);
#endif
  for (absl::string_view kv :
       absl::StrSplit(absl::GetFlag(FLAGS_labels), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> pair = absl::StrSplit(kv, '=');
    if (pair.first.empty() || pair.second.empty()) {
      std::fprintf(stderr, "apapo-worker: --labels: \"%s\" is not key=value\n",
                   std::string(kv).c_str());
      return kExitUsage;
    }
    (*info.mutable_labels())[pair.first] = pair.second;
  }
  if (absl::GetFlag(FLAGS_host).empty()) {
    std::fprintf(stderr, "apapo-worker: --host must not be empty\n");
    return kExitUsage;
  }
  absl::StatusOr<std::vector<std::string>> data_roots =
      apapo::ParseDataRoots(absl::GetFlag(FLAGS_data_roots), "--data_roots");
  if (!data_roots.ok()) {
    std::fprintf(stderr, "apapo-worker: %s\n",
                 std::string(data_roots.status().message()).c_str());
    return kExitUsage;
  }
  options.data_roots = *data_roots;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      apapo::MakeChannelCredentials({absl::GetFlag(FLAGS_tls_ca),
                                     absl::GetFlag(FLAGS_tls_cert),
                                     absl::GetFlag(FLAGS_tls_key)});
  if (!credentials.ok()) {
    std::fprintf(stderr, "apapo-worker: %s\n",
                 std::string(credentials.status().message()).c_str());
    return kExitUsage;
  }
  options.credentials = *credentials;

  // Stage children inherit the environment: OpenBLAS reads it at load time.
  setenv("OPENBLAS_NUM_THREADS", absl::StrCat(threads).c_str(), 1);
  setenv("OMP_NUM_THREADS", absl::StrCat(threads).c_str(), 1);
  apapo::worker::TorchJobRunnerOptions runner_options;
  runner_options.exe = "/proc/self/exe";
  runner_options.host = absl::GetFlag(FLAGS_host);  // Gloo binds to it
  runner_options.data_roots = *data_roots;  // its children open beneath them
  apapo::worker::TorchJobRunner runner(runner_options);
  apapo::worker::WorkerDaemon daemon(options, &runner);
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "apapo-worker: signal %d, shutting down\n", sig);
    daemon.Shutdown();
  });
  std::fprintf(stderr, "apapo-worker: %s connecting to %s\n",
               info.worker_id().c_str(), options.coordinator.c_str());
  daemon.Run();
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  return 0;
}

}  // namespace

// Keeps freed tensor memory in the process instead of returning it to the
// kernel. glibc serves large allocations with mmap and, by its dynamic
// threshold, may keep doing so for every step's activations and gradients:
// each step then page-faults its buffers in anew. Whether a process falls
// into that depends on its allocation order, so the same stage ran at two
// speeds: the cnn on one core at 295-366 samples/s with glibc's defaults and
// 930-970 with these settings (3 interleaved runs each, 40 steps); in perf,
// page faults took a quarter of the slow runs' CPU time. Every mode of the
// binary (daemon profiling, stage process, --local) gets it.
namespace {
void KeepFreedMemory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum; fixes it there
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}
}  // namespace

int main(int argc, char** argv) {
  KeepFreedMemory();
  absl::SetProgramUsageMessage(
      "APapo worker.\n"
      "  apapo-worker --coordinator=HOST:PORT [--id=ID] [--threads=N]\n"
      "      a worker daemon serving the coordinator's jobs;\n"
      "  apapo-worker --local=N --spec=job.textproto [--summary=FILE]\n"
      "      trains a job on this machine in N processes.");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "apapo-worker: unexpected argument \"%s\" (see --help)\n",
                 rest[1]);
    return kExitUsage;
  }
  if (!absl::GetFlag(FLAGS_confine_to).empty()) {
    absl::StatusOr<std::vector<std::string>> roots =
        apapo::ParseDataRoots(absl::GetFlag(FLAGS_confine_to), "--confine_to");
    if (!roots.ok()) {
      std::fprintf(stderr, "apapo-worker: %s\n",
                   std::string(roots.status().message()).c_str());
      return kExitUsage;
    }
    apapo::worker::ConfineToDataRoots(*std::move(roots));
  }
  if (!absl::GetFlag(FLAGS_run_assignment).empty()) {
    return apapo::worker::RunAssignmentChildMain(
        absl::GetFlag(FLAGS_run_assignment));
  }
  if (!absl::GetFlag(FLAGS_run_profile).empty()) {
    return apapo::worker::RunProfileChildMain(absl::GetFlag(FLAGS_run_profile));
  }
  if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    const double quota = apapo::worker::ThisProcessCpuQuota();
    int threads = absl::GetFlag(FLAGS_threads);
    if (threads <= 0) {
      threads = CoresWithinQuota(quota);
    } else if (apapo::ThreadsWithin(threads, quota) < threads) {
      std::fprintf(stderr,
                   "apapo-worker: --threads=%d is more than the %.2f core(s) of CPU "
                   "quota this process's cgroups allow: kept for the daemon; its "
                   "stages compute with at most %d\n",
                   threads, quota, apapo::ThreadsWithin(threads, quota));
    }
    BoundComputeThreads(threads);
    return RunDaemon(threads, quota);
  }
  const std::string spec_path = absl::GetFlag(FLAGS_spec);
  const int local = absl::GetFlag(FLAGS_local);
  if (local <= 0) {
    std::fprintf(stderr,
                 "apapo-worker: nothing to do: pass --coordinator=HOST:PORT "
                 "or --local=N --spec=FILE (see --help)\n");
    return kExitUsage;
  }
  if (spec_path.empty()) {
    std::fprintf(stderr, "apapo-worker: --spec is required\n");
    return kExitUsage;
  }
  auto spec = apapo::worker::ReadJobSpec(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "apapo-worker: %s\n", spec.status().ToString().c_str());
    return kExitUsage;
  }
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = spec->resources().threads_per_worker();
  if (threads <= 0) {
    const int cores = CoresWithinQuota(apapo::worker::ThisProcessCpuQuota());
    threads = std::max(1, cores / std::max(1, local));
  }
  return RunLocal(*spec, local, threads);
}
