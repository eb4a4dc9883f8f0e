// WorkerService gRPC adapter on gRPC's callback (reactor) API: each worker's
// Connect stream is one reactor object, not a thread. It registers the
// worker in the WorkerRegistry, records heartbeats on its session (one
// atomic store), hands every other message to a WorkerMessageListener
// (profiles, metrics, acknowledgements, stage outcomes), and writes the
// commands queued for the worker as soon as the registry tells it they are
// there (WorkerStream) — nothing polls.
//
// A stream ends when the worker closes it, the connection breaks, the
// registry marks the worker lost (silent too long: the stream is closed
// with UNAVAILABLE), the same id registers on another stream while this one
// is lost, or the server shuts down; the worker is then lost in the
// registry.
//
// Paced reads (issue 14, bench/fleet/README.md): gRPC 1.51 answers every
// message that completes a read posted before it arrived with a write of
// flow-control window (two WINDOW_UPDATE frames): a send per heartbeat. A
// read posted when the message is already buffered completes without it.
// So for a worker the registry holds idle, the read after a heartbeat is
// parked with a ReadPacer until a quarter tick (50 ms at 1 s heartbeats)
// after the next heartbeat should have arrived, judged from the
// heartbeats' own send times, and resumed on the pacer's next tick (ticks
// of a fifth of an interval). Every 16th heartbeat the read is posted at
// once, which measures the worker's clock offset and transit afresh (or
// drains a heartbeat that queued). What waits: only an idle worker's
// messages after a heartbeat, by at most about an interval (two, for a
// worker whose clock lies). Queuing a command, a cancelled call (the
// worker went away), a heartbeat without a time and a busy worker post the
// read at once; silence is still found by the registry's timeout (a parked
// read only delays noticing a message, never invents one). Measured on
// 1,000 workers at 1 Hz: sends per heartbeat 1.0 -> 0.1, the coordinator's
// CPU down by about a third; `--pace_idle_reads=false` turns it off.
//
// Heartbeats in slots (bench/fleet/README.md): what a heartbeat still
// costs once paced is its arrival, gRPC's poller waking for it. So
// Registered tells each worker when in the interval to heartbeat
// (`heartbeat_offset`, one of `heartbeat_slots` evenly spaced offsets),
// and the fleet's heartbeats arrive in a few bursts per interval, each
// wake-up reading many. Registrations fill a slot with
// `heartbeat_slot_size` workers before the next is opened, and wrap
// around after the last: 1,000 workers beat in 2 bursts of 500, 10,000 in
// 10 of 1,000. Measured on 1,000 workers at 1 Hz: the coordinator's CPU
// about halved. 0 slots gives no offset (workers heartbeat every interval
// from their registration).
//
// Thread-safety: reactions run on gRPC's callback threads; a registry
// notification may arrive from any thread. Each reactor serialises its own
// writes; all shared state is in the registry and the listener, both of
// which must be thread-safe and must not block.
#ifndef APAPO_COORDINATOR_WORKER_SERVICE_H_
#define APAPO_COORDINATOR_WORKER_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "coordinator/access.h"
#include "coordinator/read_pacer.h"
#include "coordinator/worker_listener.h"
#include "coordinator/worker_registry.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo::coordinator {

class WorkerServiceImpl final : public apapo::v1::WorkerService::CallbackService {
 public:
  // `registry` (and `listener`, which may be null) must outlive the service,
  // and the server serving it must be shut down before it is destroyed.
  // Offsets handed out per heartbeat interval ("Heartbeats in slots").
  static constexpr int kDefaultHeartbeatSlots = 10;
  static constexpr int kMaxHeartbeatSlots = 1000;
  static constexpr int kDefaultHeartbeatSlotSize = 500;

  // `pace_idle_reads`: see "Paced reads" above. `heartbeat_slots`: see
  // "Heartbeats in slots", in [0, kMaxHeartbeatSlots]; `heartbeat_slot_size`
  // likewise (at least 1).
  WorkerServiceImpl(WorkerRegistry* registry, WorkerMessageListener* listener,
                    bool pace_idle_reads = true,
                    int heartbeat_slots = kDefaultHeartbeatSlots,
                    int heartbeat_slot_size = kDefaultHeartbeatSlotSize);
  ~WorkerServiceImpl() override;

  // Called after every registration with what the worker registered
  // (wakes the scheduler, counts, adopts the stages it still trains). Set
  // before the server starts.
  void SetRegisterHook(std::function<void(const apapo::v1::WorkerInfo&)> hook) {
    on_registered_ = std::move(hook);
  }
  // With TLS: a worker must present a client certificate signed by the
  // cluster CA whose common name is the id it registers
  // (UNAUTHENTICATED without one, PERMISSION_DENIED for another id). Set
  // before the server starts.
  void RequireWorkerCertificates(bool require) { require_certificates_ = require; }
  // ListWorkers needs the read role of `access` (null: no tokens checked).
  // Set before the server starts.
  void SetAccessPolicy(const AccessPolicy* access) { access_ = access; }

  // Heartbeats read with the next read parked, so far (paced reads).
  int64_t paced_reads() const {
    return paced_reads_.load(std::memory_order_relaxed);
  }

  grpc::ServerBidiReactor<apapo::v1::WorkerMessage, apapo::v1::CoordinatorMessage>*
  Connect(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListWorkers(
      grpc::CallbackServerContext* context,
      const apapo::v1::ListWorkersRequest* request,
      apapo::v1::ListWorkersResponse* response) override;

 private:
  class ConnectReactor;

  WorkerRegistry* const registry_;
  WorkerMessageListener* const listener_;
  std::function<void(const apapo::v1::WorkerInfo&)> on_registered_;
  bool require_certificates_ = false;
  const AccessPolicy* access_ = nullptr;
  std::unique_ptr<ReadPacer> pacer_;  // null: reads are never parked
  std::atomic<int64_t> paced_reads_{0};
  const int heartbeat_slots_;
  const int heartbeat_slot_size_;
  std::atomic<uint64_t> registrations_{0};  // picks the next slot
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_WORKER_SERVICE_H_
