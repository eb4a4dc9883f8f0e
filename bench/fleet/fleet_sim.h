// FleetSimulator: N simulated worker daemons, each on its own real
// WorkerService.Connect stream to a coordinator, for load tests of the
// coordinator's control plane (registration, heartbeats, the command
// protocol of worker.proto) without running any model.
//
// Each worker registers, heartbeats at the interval the coordinator gives
// it, acknowledges every command, answers a ProfileCommand with a canned
// profile (canned.h) and, once started, reports metrics for
// `train_duration` and then a normal StageOutcome. Streams use gRPC's
// callback API and one timer thread drives every worker's heartbeats and
// simulated training, so 10,000 workers need neither 10,000 threads nor
// 10,000 connections: they share `workers_per_channel` streams per TCP
// connection. The process needs one file descriptor per channel.
//
// Call order: construct, Start() once, then any of the Wait*/Await*
// methods and the accessors, then Stop() (or destroy). A simulator is not
// restartable.
// Thread-safety: all public methods are thread-safe, except that Start()
// and Stop() must not race with each other.
#ifndef APAPO_BENCH_FLEET_FLEET_SIM_H_
#define APAPO_BENCH_FLEET_FLEET_SIM_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/fleet/timer_queue.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo::bench {

struct FleetOptions {
  // The coordinator, "host:port".
  std::string target;
  int workers = 100;
  // Streams sharing one channel (one TCP connection: every channel gets a
  // distinct channel argument, so none share a subchannel).
  int workers_per_channel = 100;
  // Worker ids are "<id_prefix>-<index>", index from 0.
  std::string id_prefix = "sim";
  // What each worker reports (WorkerInfo, WorkerResources).
  int64_t memory_bytes = int64_t{8} << 30;
  std::map<std::string, std::string> labels;
  // Simulated training: metrics reports spread over `train_duration`, then
  // the outcome.
  absl::Duration train_duration = absl::Milliseconds(500);
  int metrics_reports = 3;
  // The port a rank hosting a rendezvous "binds" (no store is started).
  int fake_store_port = 29500;
};

// A coordinator -> worker command as one worker saw it.
struct CommandRecord {
  // CoordinatorMessage::kind_case().
  apapo::v1::CoordinatorMessage::KindCase kind =
      apapo::v1::CoordinatorMessage::KIND_NOT_SET;
  std::string job_id;
  absl::Time received;
  // CommandAcks written for it (the rank hosting a profiling rendezvous
  // acknowledges twice, as worker.proto says).
  int acks_sent = 0;
};

// One simulated worker, as Workers() reports it.
struct WorkerRecord {
  std::string worker_id;
  bool registered = false;
  absl::Duration registration_latency;  // stream start -> Registered
  absl::Duration heartbeat_interval;    // as the coordinator gave it
  std::optional<absl::Duration> heartbeat_offset;  // likewise, if it did
  int64_t heartbeats_sent = 0;
  // By command id.
  std::map<int64_t, CommandRecord> commands;
  // The stream's end, if it ended (the status the coordinator returned, or
  // the local cancellation).
  bool ended = false;
  absl::Time end_time;
  absl::StatusCode end_code = absl::StatusCode::kOk;
  std::string end_message;
};

// Figures over the whole fleet.
struct FleetStats {
  int workers = 0;
  int registered = 0;
  // Streams that ended, and those that ended while Stop() was not closing
  // them (the coordinator dropped them, or they failed to connect).
  int streams_ended = 0;
  int streams_ended_early = 0;
  // Messages by their oneof case number (WorkerMessage::KindCase for sent,
  // CoordinatorMessage::KindCase for received); "sent" counts writes the
  // stream accepted.
  std::array<int64_t, 8> sent{};
  std::array<int64_t, 8> received{};
  // Failed writes, messages of unknown kind, commands that could not be
  // handled.
  int64_t errors = 0;
  // Registration latencies of the registered workers, sorted.
  std::vector<absl::Duration> registration_latencies;
  // Start() -> the last worker registered (when all are).
  absl::Duration time_to_register_all;
  // How late the timer thread ran its latest callback, at worst: the
  // simulator falling behind its own schedule.
  absl::Duration max_timer_lateness;

  int64_t heartbeats_sent() const {
    return sent[apapo::v1::WorkerMessage::kHeartbeat];
  }
};

// Points in a job's life as the fleet saw them; JobRecord counts each and
// keeps the first and latest time.
enum class JobMilestone {
  kProfileReceived,
  kProfileResultSent,
  kAssignReceived,
  kStartReceived,
  kOutcomeSent,
  kStopReceived,
};
inline constexpr int kJobMilestones = 6;

struct JobRecord {
  struct Point {
    int count = 0;
    absl::Time first = absl::InfiniteFuture();
    absl::Time last = absl::InfinitePast();
  };
  std::array<Point, kJobMilestones> points;

  const Point& at(JobMilestone m) const {
    return points[static_cast<int>(m)];
  }
};

class FleetSimulator {
 public:
  explicit FleetSimulator(FleetOptions options);
  // Stops (with a short deadline) if still running.
  ~FleetSimulator();

  FleetSimulator(const FleetSimulator&) = delete;
  FleetSimulator& operator=(const FleetSimulator&) = delete;

  // Opens every worker's stream and sends its registration; returns at
  // once (the answers arrive asynchronously). INVALID_ARGUMENT for bad
  // options.
  absl::Status Start();

  // Whether every worker is registered by `deadline`. Returns false early
  // once a worker's stream has ended unregistered.
  bool WaitAllRegistered(absl::Time deadline);

  // Whether every worker has sent at least `count` heartbeats by
  // `deadline`.
  bool WaitForHeartbeats(int64_t count, absl::Time deadline);

  // Whether `milestone` of `job_id` has been reached `count` times by
  // `deadline`. Returns false early once a worker of the job was sent a
  // StopCommand (the job failed or was cancelled).
  bool AwaitJobMilestone(const std::string& job_id, JobMilestone milestone,
                         int count, absl::Time deadline);

  // Whether every command received so far has been acknowledged (a write
  // accepted) by `deadline`.
  bool AwaitAllAcked(absl::Time deadline);

  FleetStats Stats();
  // Every worker, by index.
  std::vector<WorkerRecord> Workers();
  // The job as the fleet saw it (all zero if unknown).
  JobRecord Job(const std::string& job_id);

  // Closes every stream (WritesDone after the writes queued so far) and
  // waits for the coordinator to end them, until `deadline`; then cancels
  // those still open and waits for them too. DEADLINE_EXCEEDED if any had
  // to be cancelled, INTERNAL if some did not end even then (their memory
  // is then leaked rather than freed under gRPC). Later calls return the
  // first call's result.
  absl::Status Stop(absl::Time deadline);

 private:
  class Worker;
  friend class Worker;

  // Events from the workers' streams (any gRPC or timer thread).
  // `offset`: Registered.heartbeat_offset, if the coordinator gave one.
  void OnRegistered(int index, absl::Duration latency, absl::Duration interval,
                    std::optional<absl::Duration> offset);
  void OnReceived(int index, const apapo::v1::CoordinatorMessage& message);
  void OnSent(int index, const apapo::v1::WorkerMessage& message, bool ok);
  void OnError(int index);
  void OnEnded(int index, absl::StatusCode code, const std::string& message);
  // Heartbeat of worker `index` due at `when`; reschedules itself.
  void Heartbeat(int index, absl::Time when, absl::Duration interval,
                 std::optional<absl::Duration> offset);

  void RecordMilestone(const std::string& job_id, JobMilestone m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const FleetOptions options_;

  // Written by Start() only, before any stream starts; read-only after.
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<apapo::v1::WorkerService::Stub>> stubs_;
  std::vector<std::unique_ptr<Worker>> workers_;
  absl::Time start_time_;

  // Heartbeats and simulated training; stopped first by Stop().
  TimerQueue timers_;

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stop_status_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerRecord> records_ ABSL_GUARDED_BY(mu_);
  FleetStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time last_registered_ ABSL_GUARDED_BY(mu_);
  int ended_unregistered_ ABSL_GUARDED_BY(mu_) = 0;
  // heartbeat_levels_[k]: workers that have sent at least k heartbeats
  // (k >= 1), so that WaitForHeartbeats' condition is O(1).
  std::vector<int> heartbeat_levels_ ABSL_GUARDED_BY(mu_);
  int64_t commands_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t commands_acked_ ABSL_GUARDED_BY(mu_) = 0;  // at least once
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace apapo::bench

#endif  // APAPO_BENCH_FLEET_FLEET_SIM_H_
