// ReadPacer: holds streams whose next read should wait, and resumes each at
// the first tick at or after its deadline, from one thread, a batch per
// tick.
//
// Why (issue 14): gRPC 1.51's chttp2 answers every message it hands to a
// read that was posted before the message arrived with a write (a stream
// and a connection WINDOW_UPDATE, 15 + 15 bytes: `bench/fleet/README.md`).
// A read posted after the message is already buffered completes without
// that write. So the worker service parks the read that follows an idle
// worker's heartbeat until just after the next heartbeat should have
// arrived (worker_service.h, "Paced reads").
//
// The deadlines sit in a hashed timing wheel: one slot per tick, as many
// slots as `max_delay` needs, so parking and resuming are O(1) per entry
// and one tick resumes its slot's batch (one wake-up of gRPC's threads for
// many reads, not one per read).
//
// Thread-safety: Park may be called from any thread. Resume and Release run
// on the pacer's thread, never under its lock; a Client must stay valid
// until its Release (the pacer keeps no other reference).
#ifndef APAPO_COORDINATOR_READ_PACER_H_
#define APAPO_COORDINATOR_READ_PACER_H_

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace apapo::coordinator {

class ReadPacer {
 public:
  class Client {
   public:
    virtual ~Client() = default;
    // The entry parked with `token` is due (the client decides whether it
    // still wants it: it may have resumed by itself meanwhile).
    virtual void Resume(uint64_t token) = 0;
    // The pacer holds no more reference to this entry: after Resume, or
    // instead of it when the pacer stops.
    virtual void Release() = 0;
  };

  // `tick` and `max_delay` must be > 0.
  ReadPacer(absl::Duration tick, absl::Duration max_delay);
  // Stops the thread; entries still parked are released, not resumed.
  ~ReadPacer();

  ReadPacer(const ReadPacer&) = delete;
  ReadPacer& operator=(const ReadPacer&) = delete;

  absl::Duration tick() const { return absl::FromChrono(tick_); }

  // Resumes `client` with `token` at the first tick at least `delay`
  // (clamped to [0, max_delay]) from now, and at the earliest at the next
  // tick; then releases it.
  void Park(Client* client, uint64_t token, absl::Duration delay);

  // Entries parked and not yet resumed.
  int64_t parked() const;
  // Entries resumed so far.
  int64_t resumed() const;

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;
  struct Entry {
    Client* client;
    uint64_t token;
  };
  void Run();

  const std::chrono::nanoseconds tick_;
  const std::chrono::nanoseconds max_delay_;
  const SteadyTime origin_;  // tick k is at origin_ + k * tick_
  mutable absl::Mutex mu_;
  // slots_[k % size] holds the entries due at tick k, for the ticks from
  // next_tick_ to next_tick_ + size - 1.
  std::vector<std::vector<Entry>> slots_ ABSL_GUARDED_BY(mu_);
  int64_t next_tick_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t parked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resumed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_READ_PACER_H_
