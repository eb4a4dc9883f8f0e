// apapo-coordinator: accepts training jobs over gRPC and drives them through
// profiling, planning and training on the registered worker daemons.
//
// Only flags, their mapping to CoordinatorOptions, the lines scripts read
// ("listening on port N", "metrics on port N"), signals and exit codes live
// here; the daemon itself is the Coordinator library (coordinator.h).
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/spec_paths.h"
#include "coordinator/coordinator.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address to listen on. Beyond loopback (e.g. 0.0.0.0) TLS is "
          "required (--tls_*), unless --insecure.");
ABSL_FLAG(std::string, tls_cert, "", "TLS: the coordinator's certificate (PEM).");
ABSL_FLAG(std::string, tls_key, "", "TLS: its private key (PEM).");
ABSL_FLAG(std::string, tls_ca, "",
          "TLS: the cluster CA (PEM); workers' client certificates must be "
          "signed by it and name their --id. deploy/pki.sh makes all three.");
ABSL_FLAG(std::string, tokens_file, "",
          "Bearer tokens with roles (lines \"TOKEN read|submit|admin USER\") "
          "that JobService calls and ListWorkers must carry; empty = none "
          "checked.");
ABSL_FLAG(bool, insecure, false,
          "Listen beyond loopback without TLS: anyone who reaches the port "
          "can submit, read and cancel jobs and pose as a worker.");
ABSL_FLAG(int, port, 7070,
          "gRPC port for JobService, WorkerService, health and reflection; 0 "
          "picks a free port (printed on start).");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound port to this file once serving.");
ABSL_FLAG(std::string, data_dir, "",
          "Folder for the state database; default $HOME/.local/share/apapo.");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(2),
          "How often workers heartbeat; a worker silent for 3 intervals is "
          "marked lost.");
ABSL_FLAG(bool, pace_idle_reads, true,
          "Read an idle worker's stream once per heartbeat interval, when its "
          "next heartbeat is already buffered (saves a write and a wake-up "
          "per heartbeat; an idle worker's messages wait up to an interval).");
ABSL_FLAG(int, heartbeat_slots,
          apapo::coordinator::WorkerServiceImpl::kDefaultHeartbeatSlots,
          "Workers are told to heartbeat at one of this many evenly spaced "
          "offsets into each interval (by wall clock), so that their "
          "heartbeats arrive in bursts and cost fewer wake-ups; 0 lets each "
          "heartbeat from its own registration. At most 1000.");
ABSL_FLAG(int, heartbeat_slot_size,
          apapo::coordinator::WorkerServiceImpl::kDefaultHeartbeatSlotSize,
          "Workers given one heartbeat offset before the next is used "
          "(--heartbeat_slots); after the last, the first again.");
ABSL_FLAG(int, metrics_port, 9464,
          "Port of the Prometheus /metrics endpoint; 0 picks a free port "
          "(printed on start); -1 disables it.");
ABSL_FLAG(absl::Duration, profile_timeout, absl::Minutes(5),
          "A job whose workers have not all profiled by then fails.");
ABSL_FLAG(absl::Duration, transfer_timeout, absl::Seconds(60),
          "Timeout of every blocking transfer between stages.");
ABSL_FLAG(std::string, checkpoint_root, "/var/lib/apapo/checkpoints",
          "Every job that names no checkpoint folder checkpoints into "
          "<checkpoint_root>/<job id>.<submit time>, from which it restarts after a fault. "
          "Every worker must read and write it (one machine's disk, or a "
          "volume all workers mount) and it must lie under their "
          "--data_roots. Empty: such jobs do not checkpoint.");
ABSL_FLAG(int32_t, max_ended_jobs, 10000,
          "Job history retention: ended jobs (succeeded, failed, cancelled) kept in "
          "the state and listed; beyond it the oldest submitted are dropped.");
ABSL_FLAG(int64_t, checkpoint_every_steps, 100,
          "Steps between checkpoints for a job whose spec sets none.");
ABSL_FLAG(absl::Duration, growth_min_remaining, absl::Minutes(1),
          "A running job below its fault_tolerance.max_workers takes an idle "
          "worker in (a restart) only with at least this much training left.");
ABSL_FLAG(absl::Duration, growth_check_every, absl::Seconds(10),
          "How often such a job is re-planned with the idle workers there.");
ABSL_FLAG(double, remeasure_below_speed, 0.8,
          "A worker whose profile computes below this fraction of the fastest "
          "of its job's workers is profiled once more, alone, and the faster "
          "profile kept (a slow spell while profiling would otherwise plan it "
          "as slow for the whole job); the others are then checked against "
          "the new figures, each profiled again at most once. 0 never does; "
          "at most 1.");
ABSL_FLAG(std::string, data_roots, "/usr/share/datasets,/var/lib/apapo",
          "Comma-separated directories a job spec may name files under "
          "(data, TorchScript, checkpoints); anything else is refused at "
          "submit. Workers check the same with their own --data_roots.");
ABSL_FLAG(std::string, state, "",
          "State database path (SQLite); default DATA_DIR/coordinator.db; "
          "':memory:' keeps nothing across restarts.");

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitUnavailable = 3;

std::string DefaultDataDir() {
  const char* home = std::getenv("HOME");
  return absl::StrCat(home && *home ? home : ".", "/.local/share/apapo");
}

// Every worker holds one connection (a file descriptor) open: a fleet of
// thousands needs more than the usual soft limit of 1024. Raise it to the
// hard limit, as the operator or the unit file (LimitNOFILE) allows.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) {
    return;
  }
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    std::cerr << "apapo-coordinator: cannot raise the open-file limit above "
              << before << "; at most about that many workers can connect\n";
  }
}

int Run() {
  RaiseOpenFileLimit();
  // Debian's Abseil is built with its mutex deadlock detector on, which
  // records every lock acquisition in a graph (3% of the coordinator's CPU
  // with 1,000 workers heartbeating). The daemon runs without it; the
  // tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Handle SIGINT/SIGTERM on this thread: block them here, before any
  // thread (gRPC, the metrics server, the scheduler) starts and inherits the
  // mask, so no other thread takes the default action.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::string state = absl::GetFlag(FLAGS_state);
  if (state.empty()) {
    std::string dir = absl::GetFlag(FLAGS_data_dir);
    if (dir.empty()) dir = DefaultDataDir();
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      std::cerr << "apapo-coordinator: cannot create --data_dir " << dir << ": "
                << ec.message() << "\n";
      return kExitUsage;
    }
    state = dir + "/coordinator.db";
  }
  if (absl::GetFlag(FLAGS_port) < 0 || absl::GetFlag(FLAGS_port) > 65535) {
    std::cerr << "apapo-coordinator: --port must be in 0..65535, got "
              << absl::GetFlag(FLAGS_port) << "\n";
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_heartbeat_interval) <= absl::ZeroDuration()) {
    std::cerr << "apapo-coordinator: --heartbeat_interval must be > 0\n";
    return kExitUsage;
  }

  const double remeasure = absl::GetFlag(FLAGS_remeasure_below_speed);
  if (!(remeasure >= 0 && remeasure <= 1)) {
    std::cerr << "apapo-coordinator: --remeasure_below_speed must be in 0..1, got "
              << remeasure << "\n";
    return kExitUsage;
  }

  absl::StatusOr<std::vector<std::string>> data_roots =
      apapo::ParseDataRoots(absl::GetFlag(FLAGS_data_roots), "--data_roots");
  if (!data_roots.ok()) {
    std::cerr << "apapo-coordinator: " << data_roots.status().message() << "\n";
    return kExitUsage;
  }
  apapo::coordinator::CoordinatorOptions options;
  options.data_roots = *data_roots;
  options.host = absl::GetFlag(FLAGS_host);
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  options.allow_insecure = absl::GetFlag(FLAGS_insecure);
  options.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  options.port = absl::GetFlag(FLAGS_port);
  // Any negative value turns metrics off.
  options.metrics_port = std::max(-1, absl::GetFlag(FLAGS_metrics_port));
  options.state_path = state;
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.pace_idle_reads = absl::GetFlag(FLAGS_pace_idle_reads);
  options.heartbeat_slots = absl::GetFlag(FLAGS_heartbeat_slots);
  options.heartbeat_slot_size = absl::GetFlag(FLAGS_heartbeat_slot_size);
  options.max_ended_jobs = absl::GetFlag(FLAGS_max_ended_jobs);
  options.scheduler.profile_timeout = absl::GetFlag(FLAGS_profile_timeout);
  options.scheduler.transfer_timeout = absl::GetFlag(FLAGS_transfer_timeout);
  options.scheduler.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  options.scheduler.growth_min_remaining = absl::GetFlag(FLAGS_growth_min_remaining);
  options.scheduler.growth_check_every = absl::GetFlag(FLAGS_growth_check_every);
  options.scheduler.remeasure_below_speed = remeasure;
  options.scheduler.checkpoint_every_steps =
      std::max<int64_t>(1, absl::GetFlag(FLAGS_checkpoint_every_steps));

  apapo::coordinator::Coordinator coordinator(options);
  if (absl::Status s = coordinator.Start(); !s.ok()) {
    std::cerr << "apapo-coordinator: " << s.message() << "\n";
    // A port that cannot be bound may free up; anything else is the
    // operator's to fix.
    return s.code() == absl::StatusCode::kUnavailable ? kExitUnavailable
                                                      : kExitUsage;
  }
  std::cout << "apapo-coordinator listening on port " << coordinator.port()
            << " (state " << state << ")" << std::endl;
  if (coordinator.metrics_port() >= 0) {
    std::cout << "apapo-coordinator metrics on port "
              << coordinator.metrics_port() << " (/metrics)" << std::endl;
  }
  if (std::string file = absl::GetFlag(FLAGS_port_file); !file.empty()) {
    std::string tmp = file + ".tmp";
    std::ofstream(tmp) << coordinator.port() << "\n";
    std::filesystem::rename(tmp, file);
  }

  int sig = 0;
  sigwait(&signals, &sig);
  std::cerr << "apapo-coordinator: signal " << sig << ", shutting down\n";
  coordinator.Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs the APapo coordinator: accepts jobs (JobService), registers "
      "worker daemons (WorkerService), plans and drives training.\n"
      "Usage: apapo-coordinator [--port=7070] [--state=PATH]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "apapo-coordinator: unexpected argument \"" << rest[1]
              << "\" (see --help)\n";
    return kExitUsage;
  }
  return Run();
}
