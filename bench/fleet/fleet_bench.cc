// fleet_bench: simulates a fleet of worker daemons against a running
// coordinator and reports what its control plane costs (see README.md and
// fleet_benchmark.h). Prints a table, then one JSON line (the last line of
// stdout) for scripts. Exit code 1 when a phase failed, 2 for bad flags.
//
//   fleet_bench --target=127.0.0.1:7070 --coordinator_pid=1234 --workers=1000
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "bench/fleet/fleet_benchmark.h"

ABSL_FLAG(std::string, target, "127.0.0.1:7070", "Coordinator address.");
ABSL_FLAG(int, coordinator_pid, 0,
          "The coordinator's process id, for its CPU figures; 0 = none.");
ABSL_FLAG(int, workers, 1000, "Simulated workers.");
ABSL_FLAG(int, workers_per_channel, 100,
          "Worker streams per channel (TCP connection).");
ABSL_FLAG(absl::Duration, window, absl::Seconds(10),
          "Heartbeat measurement window.");
ABSL_FLAG(int, job_workers, 64,
          "Workers of the submitted data-parallel job; 0 = no job.");
ABSL_FLAG(int, list_page_size, 500, "ListWorkers page size.");
ABSL_FLAG(int, list_repeats, 5, "ListWorkers calls per latency figure.");
ABSL_FLAG(absl::Duration, register_timeout, absl::Minutes(2),
          "Deadline for every worker to register.");
ABSL_FLAG(absl::Duration, job_timeout, absl::Minutes(2),
          "Deadline for the job, from submission to its end.");
ABSL_FLAG(absl::Duration, train_duration, absl::Milliseconds(500),
          "Simulated training time of each stage.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Simulates worker daemons against a coordinator and measures its "
      "control plane.\nUsage: fleet_bench --target=HOST:PORT "
      "[--coordinator_pid=PID] [--workers=N]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "fleet_bench: unexpected argument \"" << rest[1] << "\"\n";
    return 2;
  }
  // One descriptor per channel here, but the benchmark should not be the
  // thing that runs out.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      std::cerr << "fleet_bench: cannot raise RLIMIT_NOFILE: "
                << std::strerror(errno) << "\n";
    }
  }

  apapo::bench::BenchOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.coordinator_pid = absl::GetFlag(FLAGS_coordinator_pid);
  options.workers = absl::GetFlag(FLAGS_workers);
  options.workers_per_channel = absl::GetFlag(FLAGS_workers_per_channel);
  options.window = absl::GetFlag(FLAGS_window);
  options.job_workers = absl::GetFlag(FLAGS_job_workers);
  options.list_page_size = absl::GetFlag(FLAGS_list_page_size);
  options.list_repeats = absl::GetFlag(FLAGS_list_repeats);
  options.register_timeout = absl::GetFlag(FLAGS_register_timeout);
  options.job_timeout = absl::GetFlag(FLAGS_job_timeout);
  options.train_duration = absl::GetFlag(FLAGS_train_duration);

  absl::StatusOr<apapo::bench::BenchResult> result =
      apapo::bench::RunFleetBenchmark(options);
  if (!result.ok()) {
    std::cerr << "fleet_bench: " << result.status().message() << "\n";
    return 2;
  }
  std::cout << apapo::bench::ResultTable(*result);
  std::cout << apapo::bench::ResultJson(*result) << std::endl;
  return result->problems.empty() ? 0 : 1;
}
