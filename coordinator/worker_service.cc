#include "coordinator/worker_service.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "coordinator/call_access.h"
#include "coordinator/read_pacer.h"
#include "google/protobuf/util/time_util.h"

namespace apapo::coordinator {

using apapo::v1::CoordinatorMessage;
using apapo::v1::WorkerMessage;

// One worker's Connect stream. Lives from Connect() until OnDone() and the
// pacer's release of its last parked read, whichever is later (a count of
// references). At most one read is outstanding at a time, or it is parked
// with the pacer (no read outstanding); at most one write: the Registered
// reply first, then the session's commands in order.
class WorkerServiceImpl::ConnectReactor final
    : public grpc::ServerBidiReactor<WorkerMessage, CoordinatorMessage>,
      public WorkerStream,
      public ReadPacer::Client {
 public:
  ConnectReactor(WorkerServiceImpl* service,
                 grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    StartRead(&in_);
  }

  // --- gRPC reactions ---

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker half-closed, or the call was cancelled (connection lost,
      // server shutting down).
      End(grpc::Status::OK, context_->IsCancelled()
                                ? "connection lost"
                                : "stream closed by the worker");
      return;
    }
    if (session_ == nullptr) {
      OnRegister();
      return;
    }
    if (!session_->live()) {
      End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       "this session ended; reconnect"),
          "superseded");
      return;
    }
    session_->Heartbeat();  // any message is a sign of life
    switch (in_.kind_case()) {
      case WorkerMessage::kHeartbeat:
        if (MaybePark()) return;
        break;
      case WorkerMessage::kRegister:
        End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "register may only be the first message"),
            "registered twice on one stream");
        return;
      default:
        if (service_->listener_ != nullptr) {
          service_->listener_->OnWorkerMessage(session_->worker_id(), in_);
        }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) broken_ = true;  // the read fails too and ends the stream
      if (pending_finish_.has_value() && !resuming_) {
        finish = std::move(pending_finish_);
        pending_finish_.reset();
      }
    }
    if (finish.has_value()) {
      Finish(*finish);
      return;
    }
    WriteNext();
  }

  // The worker went away (or the server is stopping) while the read may be
  // parked: read now, so the failed read ends the stream at once.
  void OnCancel() override { Unpark(); }

  void OnDone() override {
    if (session_ != nullptr) session_->DetachStream();
    Unref();
  }

  // --- WorkerStream (from the registry, any thread) ---

  // A command expects an answer: the read is not left parked.
  void OnCommandsQueued() override {
    WriteNext();
    Unpark();
  }

  // --- ReadPacer::Client (the pacer's thread) ---

  void Resume(uint64_t token) override { ResumeRead(token); }
  void Release() override { Unref(); }

  void OnSessionEnded(const std::string& reason) override {
    FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "the coordinator marked this worker lost: " + reason));
  }

 private:
  // Every this many heartbeats of an idle worker, the next read is posted
  // at once instead of parked: it completes when the next heartbeat
  // arrives, which measures the worker's offset afresh (or, if heartbeats
  // did queue up, drains one).
  static constexpr int kReadAtOnceEvery = 16;

  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // After a heartbeat: parks the next read with the pacer until just after
  // the worker's next heartbeat should have arrived, and returns true; or
  // returns false, and the caller posts the read now. Runs in a read
  // reaction.
  //
  // When the next heartbeat arrives is learnt from the heartbeats' own
  // send times (`Heartbeat.time`, the worker's clock): our receive time
  // minus its send time is the worker's offset (clock difference plus
  // transit) plus how long the heartbeat waited for our read. A read
  // posted at once waits for its heartbeat, so it measures the offset; a
  // paced read only bounds it from above (the minimum is kept). The next
  // heartbeat is sent one interval after this one, so it is buffered
  // from send time + interval + offset; the read resumes at the first
  // pacer tick a margin later. A worker whose clock lies only delays its
  // own reads (by at most 2 intervals: never long enough to be lost).
  bool MaybePark() {
    ReadPacer* pacer = service_->pacer_.get();
    const bool measured = !last_read_paced_;
    last_read_paced_ = false;
    if (pacer == nullptr || !in_.heartbeat().has_time()) return false;
    const absl::Time now = absl::Now();
    // absl saturates: a hostile time gives an infinite offset, not overflow.
    const absl::Time sent = absl::FromUnixSeconds(in_.heartbeat().time().seconds()) +
                            absl::Nanoseconds(in_.heartbeat().time().nanos());
    offset_ = measured ? now - sent : std::min(offset_, now - sent);
    if (++heartbeats_paced_ >= kReadAtOnceEvery) {
      heartbeats_paced_ = 0;
      return false;
    }
    const absl::Duration interval = service_->registry_->heartbeat_interval();
    const absl::Duration wait =
        sent + interval + offset_ + pacer->tick() / 4 - now;
    if (wait <= absl::ZeroDuration() || wait > 2 * interval) return false;
    uint64_t token;
    {
      // A command being written, or waiting to be, expects an answer: that
      // must not wait. Under mu_: a reservation and command that came
      // before (WriteNext held mu_) are seen here; one that comes after
      // finds the read parked and unparks it. A call cancelled before
      // OnCancel could unpark (it takes mu_ too) must fail its read now.
      absl::MutexLock lock(&mu_);
      if (!session_->idle() || finished_ || writing_ || send_registered_ ||
          session_->pending() > 0 || context_->IsCancelled()) {
        return false;
      }
      parked_ = true;
      token = ++park_token_;
    }
    last_read_paced_ = true;
    refs_.fetch_add(1, std::memory_order_relaxed);  // the pacer's, until Release
    service_->paced_reads_.fetch_add(1, std::memory_order_relaxed);
    pacer->Park(this, token, wait);
    return true;
  }

  // Posts the parked read now (a command, a cancellation). Any thread.
  void Unpark() { ResumeRead(0); }

  // Posts the read parked with `token` (0: whichever is parked) unless it
  // was posted already or the call is finished. A Finish asked for
  // meanwhile waits until StartRead has returned: once a read is
  // outstanding gRPC cannot end the call under us, but between deciding to
  // read and StartRead it could.
  void ResumeRead(uint64_t token) {
    {
      absl::MutexLock lock(&mu_);
      if (!parked_ || (token != 0 && token != park_token_)) return;
      parked_ = false;
      if (finished_) return;
      resuming_ = true;
    }
    StartRead(&in_);
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      resuming_ = false;
      if (pending_finish_.has_value() && !writing_) {
        finish = std::move(pending_finish_);
        pending_finish_.reset();
      }
    }
    if (finish.has_value()) Finish(*finish);
  }

  void OnRegister() {
    if (in_.kind_case() != WorkerMessage::kRegister) {
      FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "the first message on Connect must be register"));
      return;
    }
    if (service_->require_certificates_) {
      const std::string& id = in_.register_().worker_id();
      const std::string name = VerifiedPeerName(*context_->auth_context());
      if (name.empty()) {
        FinishOnce(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                "a worker must present its client certificate "
                                "(--tls_cert, --tls_key; deploy/pki.sh)"));
        return;
      }
      if (name != id) {
        FinishOnce(grpc::Status(
            grpc::StatusCode::PERMISSION_DENIED,
            "the client certificate is for worker \"" + name +
                "\"; it cannot register as \"" + id + "\""));
        return;
      }
    }
    WorkerRegistry* registry = service_->registry_;
    absl::StatusOr<std::shared_ptr<WorkerSession>> session =
        registry->Register(in_.register_(), this);
    if (!session.ok()) {
      FinishOnce(ToGrpcStatus(session.status()));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      session_ = *session;
      registered_.mutable_registered()->set_worker_id(session_->worker_id());
      *registered_.mutable_registered()->mutable_heartbeat_interval() =
          google::protobuf::util::TimeUtil::NanosecondsToDuration(
              absl::ToInt64Nanoseconds(registry->heartbeat_interval()));
      if (const int slots = service_->heartbeat_slots_; slots > 0) {
        const uint64_t slot =
            service_->registrations_.fetch_add(1, std::memory_order_relaxed) /
            service_->heartbeat_slot_size_ % slots;
        *registered_.mutable_registered()->mutable_heartbeat_offset() =
            google::protobuf::util::TimeUtil::NanosecondsToDuration(
                absl::ToInt64Nanoseconds(registry->heartbeat_interval() *
                                         static_cast<int64_t>(slot) / slots));
      }
      send_registered_ = true;
    }
    if (service_->on_registered_) service_->on_registered_(in_.register_());
    WriteNext();
    StartRead(&in_);
  }

  // Starts the next write if none is in flight: the Registered reply, then
  // the oldest queued command. StartWrite is called without mu_ held, since
  // gRPC may run OnWriteDone on this thread before it returns.
  void WriteNext() {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_ || broken_) return;
      if (send_registered_) {
        send_registered_ = false;
        out_ = std::move(registered_);
      } else {
        if (session_ == nullptr) return;
        std::optional<CoordinatorMessage> command = session_->TakeCommand();
        if (!command.has_value()) return;
        out_ = std::move(*command);
      }
      writing_ = true;
    }
    StartWrite(&out_);
  }

  // Finishes the call with `status` and records the worker lost (unless it
  // already is). Finishing first keeps `status`: the registry's lost
  // notification would finish it with UNAVAILABLE. Once finished, OnDone
  // may delete this at any moment, so what follows uses locals only.
  void End(grpc::Status status, const std::string& reason) {
    std::shared_ptr<WorkerSession> session = session_;
    WorkerRegistry* registry = service_->registry_;
    FinishOnce(std::move(status));
    if (session != nullptr) registry->Disconnect(*session, reason);
  }

  // Finishes the call once; after a write in flight completes, if any.
  void FinishOnce(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      if (writing_ || resuming_) {
        pending_finish_ = std::move(status);
        return;
      }
    }
    Finish(status);
  }

  WorkerServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  // gRPC's reference (dropped in OnDone) and one per read parked with the
  // pacer (dropped in Release).
  std::atomic<int> refs_{1};
  // Touched only by the read reactions, which gRPC never runs concurrently.
  WorkerMessage in_;
  std::shared_ptr<WorkerSession> session_;  // set once, on registration
  int heartbeats_paced_ = 0;    // since the last read posted at once
  bool last_read_paced_ = false;  // the read now completing was parked
  absl::Duration offset_;         // the worker's, see MaybePark

  absl::Mutex mu_;
  CoordinatorMessage out_ ABSL_GUARDED_BY(mu_);  // the write in flight
  CoordinatorMessage registered_ ABSL_GUARDED_BY(mu_);
  bool send_registered_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
  // The next read waits for the pacer (token park_token_), or is being
  // posted by ResumeRead.
  bool parked_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t park_token_ ABSL_GUARDED_BY(mu_) = 0;
  bool resuming_ ABSL_GUARDED_BY(mu_) = false;
};

WorkerServiceImpl::WorkerServiceImpl(WorkerRegistry* registry,
                                     WorkerMessageListener* listener,
                                     bool pace_idle_reads, int heartbeat_slots,
                                     int heartbeat_slot_size)
    : registry_(registry),
      listener_(listener),
      heartbeat_slots_(std::clamp(heartbeat_slots, 0, kMaxHeartbeatSlots)),
      heartbeat_slot_size_(std::max(1, heartbeat_slot_size)) {
  if (pace_idle_reads) {
    // A fifth of an interval per tick: a thousand workers at 1 Hz resume in
    // batches of about 200, each read 50-250 ms after its heartbeat arrived.
    pacer_ = std::make_unique<ReadPacer>(registry->heartbeat_interval() / 5,
                                         2 * registry->heartbeat_interval());
  }
}

WorkerServiceImpl::~WorkerServiceImpl() = default;

grpc::ServerBidiReactor<WorkerMessage, CoordinatorMessage>*
WorkerServiceImpl::Connect(grpc::CallbackServerContext* context) {
  return new ConnectReactor(this, context);
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ListWorkers(
    grpc::CallbackServerContext* context,
    const apapo::v1::ListWorkersRequest* request,
    apapo::v1::ListWorkersResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (access_ != nullptr) {
    absl::StatusOr<Caller> caller =
        AuthorizeCall(*access_, *context, Role::kRead, "ListWorkers");
    if (!caller.ok()) {
      reactor->Finish(ToGrpcStatus(caller.status()));
      return reactor;
    }
  }
  absl::StatusOr<apapo::v1::ListWorkersResponse> page = registry_->List(*request);
  if (page.ok()) *response = std::move(*page);
  reactor->Finish(ToGrpcStatus(page.status()));
  return reactor;
}

}  // namespace apapo::coordinator
