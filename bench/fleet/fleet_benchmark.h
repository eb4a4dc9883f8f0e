// The fleet benchmark: a FleetSimulator against a running coordinator,
// measuring what the control plane costs at fleet scale — registration of
// N workers, the coordinator's CPU per heartbeat, workers wrongly marked
// lost, ListWorkers latency, and how long a job on many workers takes from
// submission through profiling, assignment and start to its end.
//
// fleet_bench.cc maps flags to BenchOptions; bench/fleet/run.py starts the
// coordinator and runs the binary for each fleet size (see README.md).
//
// Thread-safety: RunFleetBenchmark may run concurrently with itself against
// different coordinators; the other functions are stateless.
#ifndef APAPO_BENCH_FLEET_FLEET_BENCHMARK_H_
#define APAPO_BENCH_FLEET_FLEET_BENCHMARK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace apapo::bench {

struct BenchOptions {
  // The coordinator, "host:port".
  std::string target;
  // Its process, for CPU figures (/proc/PID/stat); 0 = not measured.
  int coordinator_pid = 0;
  int workers = 1000;
  int workers_per_channel = 100;
  // Steady-state heartbeat measurement.
  absl::Duration window = absl::Seconds(10);
  // Workers of the submitted job; 0 = no job.
  int job_workers = 64;
  // ListWorkers: page size and calls per figure (the median is reported).
  int list_page_size = 500;
  int list_repeats = 5;
  // Deadlines of the phases.
  absl::Duration register_timeout = absl::Minutes(2);
  absl::Duration job_timeout = absl::Minutes(2);
  // Simulated training time of each stage of the job.
  absl::Duration train_duration = absl::Milliseconds(500);
};

// Every figure, in the units its name says; -1 where not measured.
struct BenchResult {
  std::string target;
  int workers = 0;
  int workers_per_channel = 0;

  // Registration.
  int registered = 0;
  double register_all_s = -1;
  double register_p50_ms = -1;
  double register_p99_ms = -1;
  double register_max_ms = -1;
  double register_coordinator_cpu_s = -1;

  // Heartbeat window.
  double window_s = 0;
  int64_t window_heartbeats = 0;
  double heartbeat_interval_s = -1;  // as the coordinator gave it
  double window_coordinator_cpu_percent = -1;  // of one core
  double coordinator_cpu_s_per_1000_heartbeats = -1;
  int lost_workers = -1;         // state LOST, counted on every page
  int lost_total_reported = -1;  // ListWorkersResponse.total of that query

  // ListWorkers (no filter).
  double list_first_page_ms = -1;     // median
  int list_first_page_workers = -1;   // workers on the first page
  int list_total_reported = -1;       // its ListWorkersResponse.total
  double list_all_pages_ms = -1;      // median of paging through all
  int list_pages = -1;
  int list_distinct_workers = -1;

  // The job (job_workers > 0).
  int job_workers = 0;
  std::string job_id;
  std::string job_state;  // JobState name at the end
  std::string job_error;
  double submit_to_profiled_s = -1;   // -> last ProfileResult written
  double profiled_to_assigned_s = -1; // -> last AssignStage received
  double assigned_to_started_s = -1;  // -> last StartCommand received
  double started_to_end_s = -1;       // -> WatchJob saw the end
  double job_coordinator_cpu_s = -1;

  // Workers in state LOST after the job, before the fleet disconnects.
  int lost_workers_end = -1;

  // The simulator's own view.
  int64_t fleet_errors = 0;
  int streams_ended_early = 0;
  int64_t messages_sent = 0;
  int64_t messages_received = 0;
  double max_timer_lateness_ms = 0;
  absl::Status stop_status;

  // Phases that failed (deadline passed, RPC error), in order.
  std::vector<std::string> problems;
};

// Runs every phase in order; a phase that fails is recorded in
// `problems` and the later ones still run where they can. Errors only for
// bad options.
absl::StatusOr<BenchResult> RunFleetBenchmark(const BenchOptions& options);

// One line of JSON (sorted keys) and a human-readable table.
std::string ResultJson(const BenchResult& result);
std::string ResultTable(const BenchResult& result);

// User + system CPU seconds of a /proc/PID/stat line (utime and stime,
// fields 14 and 15, counted after the parenthesised command name, which
// may itself hold spaces and parentheses). INVALID_ARGUMENT if malformed.
absl::StatusOr<double> ParseProcStatCpuSeconds(absl::string_view stat,
                                               int64_t ticks_per_second);

// The same, read from /proc/<pid>/stat now.
absl::StatusOr<double> ProcessCpuSeconds(int pid);

}  // namespace apapo::bench

#endif  // APAPO_BENCH_FLEET_FLEET_BENCHMARK_H_
