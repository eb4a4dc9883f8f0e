// WorkerRegistry: the coordinator's view of the worker daemons — who is
// connected, idle or busy, when each last spoke — and, per connection, a
// WorkerSession holding the worker's liveness and its outbox of commands.
//
// A worker registers when its Connect stream opens (a session), heartbeats
// while it lives, and is LOST when its stream ends (Disconnect) or it stays
// silent past `heartbeat_interval * kMissedHeartbeats` (CheckTimeouts). A
// lost worker that reconnects with the same id gets its entry back (a new
// session).
//
// Built for fleets of thousands of workers heartbeating every second:
//   - A heartbeat is one atomic store on the session the stream holds: no
//     registry lock, no lookup, no allocation.
//   - Silence is found through a deadline queue: each session sits in it
//     once, at the time it would be lost if it stayed silent; CheckTimeouts
//     pops only the due entries and re-queues those that spoke since
//     (O(log n) per worker per timeout, not a scan per interval).
//   - Commands are pushed: Send queues on the session and tells its
//     WorkerStream, which takes them (TakeCommand) and writes them. Nothing
//     polls.
//   - The registry's map lock is taken shared for lookups (Send, List) and
//     exclusively only for state changes (register, lost, reserve,
//     release); each session's outbox has its own lock.
//
// Call order: Register -> (WorkerSession::Heartbeat | Send | TakeCommand)*
// -> Disconnect (or lost by CheckTimeouts).
// Thread-safety: all methods of both classes are thread-safe. Hooks and
// WorkerStream callbacks are never called with the registry's lock held.
#ifndef APAPO_COORDINATOR_WORKER_REGISTRY_H_
#define APAPO_COORDINATOR_WORKER_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "proto/apapo/v1/service.pb.h"
#include "proto/apapo/v1/worker.pb.h"

namespace apapo::coordinator {

// The transport side of one session (the gRPC stream). Both callbacks must
// not block: they may run on any thread, including a scheduler or another
// worker's stream thread.
class WorkerStream {
 public:
  virtual ~WorkerStream() = default;
  // Commands were queued on the session: take them and write them.
  virtual void OnCommandsQueued() = 0;
  // The session ended (the worker was marked lost): close the stream.
  virtual void OnSessionEnded(const std::string& reason) = 0;
};

// One registration of a worker, shared by the registry and its stream.
class WorkerSession {
 public:
  WorkerSession(std::string worker_id, int64_t id, Clock* clock,
                WorkerStream* stream);

  const std::string& worker_id() const { return worker_id_; }
  // Unique over the registry's life; a reconnect gets a new one.
  int64_t id() const { return id_; }

  // A sign of life: one atomic store.
  void Heartbeat();
  absl::Time last_seen() const;
  // False once the session ended (lost, or superseded by a reconnect).
  bool live() const { return live_.load(std::memory_order_acquire); }
  // True while the registry holds the worker idle (no job reserved it): its
  // stream may pace its reads (worker_service.h). One atomic load.
  bool idle() const { return idle_.load(std::memory_order_relaxed); }

  // The oldest queued command, or nullopt.
  std::optional<apapo::v1::CoordinatorMessage> TakeCommand();
  // Commands queued and not yet taken.
  size_t pending() const;

  // The stream is going away: returns once no callback into it is running,
  // and none is made afterwards.
  void DetachStream();

 private:
  friend class WorkerRegistry;
  // Queues `message`; false if the session has ended.
  bool Queue(apapo::v1::CoordinatorMessage message);
  // Marks the session ended and drops its outbox (under the registry lock).
  void MarkEnded();
  // Tells the stream (outside the registry lock).
  void NotifyQueued();
  void NotifyEnded(const std::string& reason);

  // Constant after construction.
  const std::string worker_id_;
  const int64_t id_;
  Clock* const clock_;

  std::atomic<int64_t> last_seen_ns_;
  std::atomic<bool> live_{true};
  std::atomic<bool> idle_{false};  // set by the registry's SetStateLocked

  mutable absl::Mutex mu_;
  std::deque<apapo::v1::CoordinatorMessage> outbox_ ABSL_GUARDED_BY(mu_);

  // Held while calling the stream, so DetachStream can wait them out. The
  // stream may take commands meanwhile: stream_mu_ is taken before mu_.
  absl::Mutex stream_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  WorkerStream* stream_ ABSL_GUARDED_BY(stream_mu_);
};

class WorkerRegistry {
 public:
  // A worker is lost after this many heartbeat intervals of silence.
  static constexpr int kMissedHeartbeats = 3;
  // ListWorkers pages: the default and the most one page holds.
  static constexpr int kDefaultPageSize = 500;
  static constexpr int kMaxPageSize = 5000;

  // Called (outside the lock) with (worker id, job id or "", reason) when a
  // worker is lost.
  using LostHook = std::function<void(const std::string&, const std::string&,
                                      const std::string&)>;

  // Keeps at most `max_lost` lost workers listed (the oldest lost are
  // forgotten first), so a churning fleet does not grow the registry.
  WorkerRegistry(Clock* clock, absl::Duration heartbeat_interval,
                 int max_lost = 10000);

  absl::Duration heartbeat_interval() const { return heartbeat_interval_; }

  // Registers a worker on a new stream (which may be null: then nobody is
  // told of queued commands) and returns its session. INVALID_ARGUMENT for
  // an empty id; ALREADY_EXISTS if a live session holds the id.
  absl::StatusOr<std::shared_ptr<WorkerSession>> Register(
      const apapo::v1::WorkerInfo& info, WorkerStream* stream = nullptr);

  // The session's stream ended: the worker is lost (reason logged). A no-op
  // if the session is no longer the worker's live one.
  void Disconnect(const WorkerSession& session, const std::string& reason);

  // Marks workers whose sessions stayed silent too long as lost; returns
  // their ids. Touches only the sessions that are due.
  std::vector<std::string> CheckTimeouts();
  // When CheckTimeouts next has something to do (InfiniteFuture if no
  // worker is connected).
  absl::Time NextDeadline();

  // Queues a command for a connected worker and tells its stream. Assigns
  // the command id. UNAVAILABLE if the worker is not connected.
  absl::StatusOr<int64_t> Send(const std::string& worker_id,
                               apapo::v1::CoordinatorMessage message);

  // Takes `count` idle workers matching `selector` for `job_id`, in
  // registration order. RESOURCE_EXHAUSTED (nothing reserved) if too few.
  absl::StatusOr<std::vector<std::string>> Reserve(
      const std::string& job_id, int count,
      const std::map<std::string, std::string>& selector);
  // Up to `max_count` idle workers matching `selector`, none of `exclude`,
  // not reserved.
  std::vector<std::string> IdleMatching(
      int max_count, const std::map<std::string, std::string>& selector,
      const std::set<std::string>& exclude = {});
  // Takes up to `max_count` idle workers matching `selector`, none of
  // `exclude` (maybe none).
  std::vector<std::string> ReserveUpTo(
      const std::string& job_id, int max_count,
      const std::map<std::string, std::string>& selector,
      const std::set<std::string>& exclude = {});
  // Returns the job's workers (or just `worker_ids` of them) to idle.
  void Release(const std::string& job_id,
               const std::vector<std::string>& worker_ids = {});

  // What a worker registered; nullopt if unknown.
  std::optional<apapo::v1::WorkerInfo> Info(const std::string& worker_id);

  // One page of workers in id order (ListWorkers). INVALID_ARGUMENT naming
  // the field for a negative page_size.
  absl::StatusOr<apapo::v1::ListWorkersResponse> List(
      const apapo::v1::ListWorkersRequest& request);
  // Every known worker, in id order.
  std::vector<apapo::v1::WorkerStatus> List();
  // (id, last heartbeat) of every connected worker, in id order.
  std::vector<std::pair<std::string, absl::Time>> LastHeartbeats();

  // Counts of workers by state (for metrics); O(1).
  std::map<apapo::v1::WorkerState, int> CountByState();

  void SetLostHook(LostHook hook);

 private:
  struct Entry {
    apapo::v1::WorkerStatus status;  // last_heartbeat is filled on read
    std::shared_ptr<WorkerSession> session;
    int64_t order = 0;  // first registration, for Reserve
  };
  struct Due {
    absl::Time when;
    std::shared_ptr<WorkerSession> session;
    bool operator>(const Due& other) const { return when > other.when; }
  };

  absl::Duration timeout() const {
    return heartbeat_interval_ * kMissedHeartbeats;
  }
  void SetStateLocked(Entry& entry, apapo::v1::WorkerState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks a worker lost; returns what to call after unlocking (the hook
  // and the stream's notification).
  std::function<void()> MarkLostLocked(Entry& entry, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  apapo::v1::WorkerStatus StatusOf(const Entry& entry) const;
  // Up to `max_count` idle workers matching `selector`, none of `exclude`,
  // in registration order; TakeLocked reserves them for `job_id`.
  std::vector<std::string> MatchingIdleLocked(
      int max_count, const std::map<std::string, std::string>& selector,
      const std::set<std::string>& exclude = {}) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void TakeLocked(const std::string& job_id,
                  const std::vector<std::string>& worker_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Schedule(absl::Time when, std::shared_ptr<WorkerSession> session);

  // Constant after construction.
  Clock* const clock_;
  const absl::Duration heartbeat_interval_;
  const size_t max_lost_;

  std::atomic<int64_t> next_command_{1};

  absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  // Idle workers by registration order (Reserve walks only these).
  std::map<int64_t, std::string> idle_ ABSL_GUARDED_BY(mu_);
  std::map<apapo::v1::WorkerState, int> counts_ ABSL_GUARDED_BY(mu_);
  int64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_order_ ABSL_GUARDED_BY(mu_) = 1;
  LostHook lost_hook_ ABSL_GUARDED_BY(mu_);
  // Lost sessions, oldest first: (worker id, session id). Entries that came
  // back since are skipped when popped.
  std::deque<std::pair<std::string, int64_t>> lost_order_ ABSL_GUARDED_BY(mu_);

  // The deadline queue (lock taken after mu_ when both are held).
  absl::Mutex due_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due_
      ABSL_GUARDED_BY(due_mu_);
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_WORKER_REGISTRY_H_
