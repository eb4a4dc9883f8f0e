// WorkerRegistry: the coordinator's view of the worker daemons — who is
// connected, idle or busy, when each last spoke — and the outbox of commands
// for each connected worker.
//
// A worker registers when its Connect stream opens (a session), heartbeats
// while it lives, and is LOST when its stream ends or it stays silent past
// `heartbeat_interval * kMissedHeartbeats` (CheckTimeouts). A lost worker
// that reconnects with the same id gets its entry back (a new session).
// Commands are queued per worker (Send) and drained by the stream's writer
// (NextCommand), so callers never block on a slow network.
//
// Call order: Register -> (Heartbeat | NextCommand | Send)* -> Disconnect.
// Thread-safety: all methods are thread-safe.
#ifndef APAPO_COORDINATOR_WORKER_REGISTRY_H_
#define APAPO_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "proto/apapo/v1/worker.pb.h"

namespace apapo::coordinator {

class WorkerRegistry {
 public:
  // A worker is lost after this many heartbeat intervals of silence.
  static constexpr int kMissedHeartbeats = 3;

  // Called (outside the lock) with (worker id, job id or "", reason) when a
  // worker is lost.
  using LostHook = std::function<void(const std::string&, const std::string&,
                                      const std::string&)>;

  WorkerRegistry(Clock* clock, absl::Duration heartbeat_interval);

  absl::Duration heartbeat_interval() const { return heartbeat_interval_; }

  // Registers a worker on a new stream and returns its session number.
  // INVALID_ARGUMENT for an empty id; ALREADY_EXISTS if a live session holds
  // the id.
  absl::StatusOr<int64_t> Register(const apapo::v1::WorkerInfo& info);

  // Records a sign of life from `worker_id`'s session.
  void Heartbeat(const std::string& worker_id, int64_t session);

  // The session's stream ended: the worker is lost (reason logged).
  void Disconnect(const std::string& worker_id, int64_t session,
                  const std::string& reason);

  // Marks workers silent for too long as lost; returns their ids.
  std::vector<std::string> CheckTimeouts();

  // Queues a command for a connected worker. Assigns the command id.
  // UNAVAILABLE if the worker is not connected.
  absl::StatusOr<int64_t> Send(const std::string& worker_id,
                               apapo::v1::CoordinatorMessage message);

  // Blocks until a command is queued for the session or `deadline`; nullopt
  // on deadline or when the session is no longer current.
  std::optional<apapo::v1::CoordinatorMessage> NextCommand(
      const std::string& worker_id, int64_t session, absl::Time deadline);

  // Whether the session is still the worker's current, live one.
  bool IsCurrent(const std::string& worker_id, int64_t session);

  // Takes `count` idle workers matching `selector` for `job_id`, in
  // registration order. RESOURCE_EXHAUSTED (nothing reserved) if too few.
  absl::StatusOr<std::vector<std::string>> Reserve(
      const std::string& job_id, int count,
      const std::map<std::string, std::string>& selector);
  // Returns the job's workers (or just `worker_ids` of them) to idle.
  void Release(const std::string& job_id,
               const std::vector<std::string>& worker_ids = {});

  // Every known worker, in id order.
  std::vector<apapo::v1::WorkerStatus> List();

  // Counts of workers by state (for metrics).
  std::map<apapo::v1::WorkerState, int> CountByState();

  void SetLostHook(LostHook hook);

 private:
  struct Entry {
    apapo::v1::WorkerStatus status;
    int64_t session = 0;
    absl::Time last_seen;
    std::deque<apapo::v1::CoordinatorMessage> outbox;
  };
  // Marks a worker lost; returns the hook call to make after unlocking.
  std::function<void()> MarkLostLocked(Entry& entry, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  Clock* const clock_;
  const absl::Duration heartbeat_interval_;

  absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // registration order
  int64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_command_ ABSL_GUARDED_BY(mu_) = 1;
  LostHook lost_hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_WORKER_REGISTRY_H_
