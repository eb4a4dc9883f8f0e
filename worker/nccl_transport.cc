#include "worker/nccl_transport.h"

#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace apapo {
namespace worker {

absl::StatusOr<std::string> NcclTransport::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat("ncclGetUniqueId failed: ", ncclGetErrorString(r)));
  }
  return std::string(id.internal, sizeof(id.internal));
}

NcclTransport::NcclTransport(int rank, int world, absl::Duration timeout,
                             std::string label)
    : rank_(rank), world_(world), timeout_(timeout), label_(std::move(label)) {}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    const std::string& unique_id, int rank, int world_size, int device,
    absl::Duration timeout, std::string label) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError("malformed NCCL unique id");
  }
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  std::unique_ptr<NcclTransport> t(
      new NcclTransport(rank, world_size, timeout, std::move(label)));
  if (auto s = t->Check(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) {
    return s;
  }
  if (auto s = t->Check(cudaStreamCreateWithFlags(&t->send_stream_,
                                                  cudaStreamNonBlocking),
                        "creating the send stream");
      !s.ok()) {
    return s;
  }
  if (auto s = t->Check(cudaStreamCreateWithFlags(&t->recv_stream_,
                                                  cudaStreamNonBlocking),
                        "creating the receive stream");
      !s.ok()) {
    return s;
  }
  // Non-blocking, so that a peer that never joins costs the timeout, not a
  // hang: ncclCommInitRankConfig returns at once and Settle polls.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const std::string joining = absl::StrCat(
      "joining the NCCL communicator as rank ", rank, " of ", world_size);
  if (auto s = t->Check(
          ncclCommInitRankConfig(&t->comm_, world_size, id, rank, &config),
          joining);
      !s.ok()) {
    return s;
  }
  if (auto s = t->Settle(absl::StrCat(joining, " (a peer did not join)"));
      !s.ok()) {
    return s;
  }
  return t;
}

NcclTransport::~NcclTransport() {
  for (auto& [ticket, p] : pending_) cudaEventDestroy(p.event);
  if (comm_ != nullptr) {
    if (failure_.ok()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (send_stream_ != nullptr) cudaStreamDestroy(send_stream_);
  if (recv_stream_ != nullptr) cudaStreamDestroy(recv_stream_);
}

absl::Status NcclTransport::Check(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  if (failure_.ok()) {
    failure_ = absl::UnavailableError(absl::StrCat(
        label_, ": ", what, " failed: ", ncclGetErrorString(r), " (",
        ncclGetLastError(comm_), ")"));
  }
  return failure_;
}

absl::Status NcclTransport::Check(cudaError_t r, const std::string& what) {
  if (r == cudaSuccess) return absl::OkStatus();
  if (failure_.ok()) {
    failure_ = absl::UnavailableError(
        absl::StrCat(label_, ": ", what, " failed: ", cudaGetErrorString(r)));
  }
  return failure_;
}

absl::StatusOr<uint64_t> NcclTransport::Record(cudaStream_t stream, int peer,
                                               const char* what) {
  Pending p;
  p.peer = peer;
  p.what = absl::StrCat(what, " rank ", peer);
  if (auto s = Check(cudaEventCreateWithFlags(&p.event, cudaEventDisableTiming),
                     "creating an event");
      !s.ok()) {
    return s;
  }
  p.stream = stream;
  if (group_depth_ == 0) {
    // Outside a group the call has launched its work once NCCL settles.
    if (auto s = Settle(p.what); !s.ok()) {
      cudaEventDestroy(p.event);
      return s;
    }
    if (auto s = Check(cudaEventRecord(p.event, stream), "recording an event");
        !s.ok()) {
      cudaEventDestroy(p.event);
      return s;
    }
    p.recorded = true;
  }
  const uint64_t ticket = next_ticket_++;
  pending_[ticket] = std::move(p);
  return ticket;
}

absl::StatusOr<uint64_t> NcclTransport::PostSend(const void* device_ptr,
                                                 size_t bytes, int peer) {
  if (!failure_.ok()) return failure_;
  const std::string what = absl::StrCat("send to rank ", peer);
  if (auto s = Check(ncclSend(device_ptr, bytes, ncclUint8, peer, comm_,
                              send_stream_),
                     what);
      !s.ok()) {
    return s;
  }
  return Record(send_stream_, peer, "send to");
}

absl::StatusOr<uint64_t> NcclTransport::PostRecv(void* device_ptr, size_t bytes,
                                                 int peer) {
  if (!failure_.ok()) return failure_;
  const std::string what = absl::StrCat("receive from rank ", peer);
  if (auto s = Check(ncclRecv(device_ptr, bytes, ncclUint8, peer, comm_,
                              recv_stream_),
                     what);
      !s.ok()) {
    return s;
  }
  return Record(recv_stream_, peer, "receive from");
}

absl::Status NcclTransport::WaitEvent(cudaEvent_t event,
                                      const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout_;
  while (true) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return Check(q, what);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      return Check(async, what);
    }
    if (absl::Now() >= deadline) return Expire(what);
    // NCCL offers no blocking wait with a timeout; poll the event cheaply.
    std::this_thread::yield();
  }
}

absl::Status NcclTransport::Expire(const std::string& what) {
  // Abort unblocks every operation still queued on the communicator.
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  if (failure_.ok()) {
    failure_ = absl::DeadlineExceededError(
        absl::StrCat(label_, ": ", what, " did not complete within ",
                     absl::FormatDuration(timeout_)));
  }
  return failure_;
}

absl::Status NcclTransport::Settle(const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout_;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return Check(r, what);
    if (state != ncclInProgress) return Check(state, what);
    if (absl::Now() >= deadline) return Expire(what);
    std::this_thread::yield();
  }
}

absl::Status NcclTransport::GroupStart() {
  if (!failure_.ok()) return failure_;
  if (auto s = Check(ncclGroupStart(), "starting a transfer group"); !s.ok()) {
    return s;
  }
  ++group_depth_;
  return absl::OkStatus();
}

absl::Status NcclTransport::GroupEnd() {
  if (!failure_.ok()) return failure_;
  if (group_depth_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(label_, ": GroupEnd without GroupStart"));
  }
  --group_depth_;
  if (auto s = Check(ncclGroupEnd(), "launching a transfer group"); !s.ok()) {
    return s;
  }
  if (group_depth_ > 0) return absl::OkStatus();
  if (auto s = Settle("launching a transfer group"); !s.ok()) return s;
  // The group's work is on its streams now: record the deferred events.
  for (auto& [ticket, p] : pending_) {
    if (p.recorded) continue;
    if (auto s = Check(cudaEventRecord(p.event, p.stream), "recording an event");
        !s.ok()) {
      return s;
    }
    p.recorded = true;
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Wait(uint64_t ticket) {
  if (!failure_.ok()) return failure_;
  auto it = pending_.find(ticket);
  if (it == pending_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": unknown transfer ticket ", ticket));
  }
  if (!it->second.recorded) {
    return absl::FailedPreconditionError(absl::StrCat(
        label_, ": ", it->second.what,
        " is in a group still open: call GroupEnd before Wait"));
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  absl::Status s = WaitEvent(p.event, p.what);
  cudaEventDestroy(p.event);
  return s;
}

absl::Status NcclTransport::AllReduceSum(float* device_ptr, size_t count) {
  if (!failure_.ok()) return failure_;
  if (group_depth_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        label_, ": AllReduceSum waits for its result: call it outside a group"));
  }
  if (auto s = Check(ncclAllReduce(device_ptr, device_ptr, count, ncclFloat,
                                   ncclSum, comm_, send_stream_),
                     "gradient all-reduce");
      !s.ok()) {
    return s;
  }
  auto ticket = Record(send_stream_, -1, "all-reduce with");
  if (!ticket.ok()) return ticket.status();
  return Wait(*ticket);
}

}  // namespace worker
}  // namespace apapo
