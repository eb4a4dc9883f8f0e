// apapo-coordinator: accepts training jobs over gRPC and drives them through
// profiling, planning and training on the registered worker daemons.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "coordinator/clock.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_service.h"
#include "coordinator/job_store.h"
#include "coordinator/metrics.h"
#include "planning/partitioner_planner.h"
#include "coordinator/scheduler.h"
#include "coordinator/server.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "coordinator/worker_registry.h"
#include "coordinator/worker_service.h"
#include "absl/synchronization/notification.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
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
ABSL_FLAG(int, metrics_port, 9464,
          "Port of the Prometheus /metrics endpoint; 0 picks a free port "
          "(printed on start); -1 disables it.");
ABSL_FLAG(absl::Duration, profile_timeout, absl::Minutes(5),
          "A job whose workers have not all profiled by then fails.");
ABSL_FLAG(absl::Duration, transfer_timeout, absl::Seconds(60),
          "Timeout of every blocking transfer between stages.");
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

int Run() {
  // Handle SIGINT/SIGTERM on a dedicated thread: block them here, before any
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

  std::unique_ptr<apapo::coordinator::JobStore> store;
  if (state == ":memory:") {
    store = std::make_unique<apapo::coordinator::MemoryJobStore>();
  } else {
    auto opened = apapo::coordinator::OpenSqliteJobStore(state);
    if (!opened.ok()) {
      std::cerr << "apapo-coordinator: " << opened.status().message() << "\n";
      return kExitUsage;
    }
    store = std::move(*opened);
  }
  apapo::coordinator::RealClock clock;
  apapo::coordinator::JobManager jobs(store.get(), &clock);
  if (absl::Status s = jobs.Recover(); !s.ok()) {
    std::cerr << "apapo-coordinator: recovering " << state << ": "
              << s.message() << "\n";
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_heartbeat_interval) <= absl::ZeroDuration()) {
    std::cerr << "apapo-coordinator: --heartbeat_interval must be > 0\n";
    return kExitUsage;
  }
  apapo::coordinator::WorkerRegistry registry(
      &clock, absl::GetFlag(FLAGS_heartbeat_interval));
  // Metrics: families in a registry served on --metrics_port.
  auto metrics_registry = std::make_shared<prometheus::Registry>();
  apapo::coordinator::CoordinatorMetrics metrics(metrics_registry.get(), &jobs,
                                                 &registry, &clock);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (int mport = absl::GetFlag(FLAGS_metrics_port); mport >= 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(
          absl::StrCat(absl::GetFlag(FLAGS_host), ":", mport));
    } catch (const std::exception& e) {
      std::cerr << "apapo-coordinator: cannot serve metrics on port " << mport
                << ": " << e.what() << "\n";
      return kExitUnavailable;
    }
    exposer->RegisterCollectable(metrics_registry);
    exposer->RegisterCollectable(metrics.state_collectable());
  }

  apapo::planning::PartitionerPlanner planner;
  apapo::coordinator::SchedulerOptions scheduler_options;
  scheduler_options.profile_timeout = absl::GetFlag(FLAGS_profile_timeout);
  scheduler_options.transfer_timeout = absl::GetFlag(FLAGS_transfer_timeout);
  apapo::coordinator::Scheduler scheduler(&jobs, &registry, &planner, &clock,
                                          scheduler_options, &metrics);
  jobs.SetCancelHook(
      [&](const apapo::v1::Job& job) { scheduler.OnCancelled(job); });
  registry.SetLostHook([&](const std::string& worker, const std::string& job,
                           const std::string& reason) {
    metrics.OnWorkerLost(worker);
    scheduler.OnWorkerLost(worker, job, reason);
  });

  apapo::coordinator::JobServiceImpl job_service(&jobs);
  job_service.SetSubmitHook([&](const apapo::v1::Job&) {
    metrics.OnJobSubmitted();
    scheduler.Wake();
  });
  apapo::coordinator::WorkerServiceImpl worker_service(&registry, &scheduler);
  worker_service.SetRegisterHook([&](const std::string& worker) {
    metrics.OnWorkerRegistered(worker);
    scheduler.Wake();
  });
  apapo::coordinator::CoordinatorServer server(
      {&job_service, &worker_service},
      {apapo::v1::JobService::service_full_name(),
       apapo::v1::WorkerService::service_full_name()});

  std::string address =
      absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  absl::StatusOr<int> port = server.Start(address);
  if (!port.ok()) {
    std::cerr << "apapo-coordinator: " << port.status().message() << "\n";
    return kExitUnavailable;
  }
  scheduler.Start();
  std::cout << "apapo-coordinator listening on port " << *port << " (state "
            << state << ")" << std::endl;
  if (exposer) {
    std::cout << "apapo-coordinator metrics on port "
              << exposer->GetListeningPorts().front() << " (/metrics)"
              << std::endl;
  }
  if (std::string file = absl::GetFlag(FLAGS_port_file); !file.empty()) {
    std::string tmp = file + ".tmp";
    std::ofstream(tmp) << *port << "\n";
    std::filesystem::rename(tmp, file);
  }

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::cerr << "apapo-coordinator: signal " << sig << ", shutting down\n";
    server.Shutdown();
  });
  // Marks silent workers lost, once per heartbeat interval.
  absl::Notification stopping;
  std::thread monitor([&] {
    while (!stopping.WaitForNotificationWithTimeout(
        absl::GetFlag(FLAGS_heartbeat_interval))) {
      registry.CheckTimeouts();
    }
  });
  server.Wait();
  stopping.Notify();
  monitor.join();
  scheduler.Stop();
  // Wake the signal thread if the server stopped for another reason.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
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
