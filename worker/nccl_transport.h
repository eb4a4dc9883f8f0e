// GPU transport over NCCL's and CUDA's C APIs (no CUDA LibTorch needed):
// point-to-point sends/receives of device buffers between pipeline stages and
// a sum all-reduce for replica groups. Built only with --config=cuda.
//
// Overlap model: sends and receives are enqueued on two dedicated
// non-blocking CUDA streams (one per direction), separate from the compute
// stream, so transfers proceed while kernels run; each Post* records a CUDA
// event and returns a ticket. Wait() blocks on a ticket.
//
// Grouping: transfers that must progress together (a send and a receive
// between the same two ranks, a self-send) go between GroupStart() and
// GroupEnd(). NCCL launches a group's work only at ncclGroupEnd, so their
// tickets' events are recorded then, not at Post* time (an event recorded
// earlier would complete before the transfer started).
//
// Failure model: the communicator is non-blocking (ncclConfig_t.blocking =
// 0), so joining it and every call are bounded by the timeout too: Create
// returns DEADLINE_EXCEEDED naming the rank when a peer never joins, instead
// of hanging in ncclCommInitRank. Wait() polls the event and
// ncclCommGetAsyncError; on a NCCL error (a peer died) it returns
// UNAVAILABLE, on expiry it aborts the communicator (ncclCommAbort, which
// unblocks every pending operation) and returns DEADLINE_EXCEEDED; both name
// this stage and the peer. After a failure every call fails.
//
// Thread-safety: not thread-safe; one compute thread per transport (NCCL
// requires ordered group calls per communicator). Call order:
// NewUniqueId (rank 0, shared out of band, e.g. through the TCPStore) ->
// Create on every rank -> [GroupStart] Post* [GroupEnd] / Wait /
// AllReduceSum -> destroy.

#ifndef APAPO_WORKER_NCCL_TRANSPORT_H_
#define APAPO_WORKER_NCCL_TRANSPORT_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace apapo {
namespace worker {

class NcclTransport {
 public:
  // A fresh communicator id (bytes of ncclUniqueId), made on rank 0.
  static absl::StatusOr<std::string> NewUniqueId();

  // Joins the communicator `unique_id` as `rank` of `world_size` on CUDA
  // device `device`. Blocks until every rank has joined.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      const std::string& unique_id, int rank, int world_size, int device,
      absl::Duration timeout, std::string label);
  ~NcclTransport();

  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  // Opens / closes a group of transfers launched together (see Grouping).
  // Groups nest; the outermost GroupEnd launches them.
  absl::Status GroupStart();
  absl::Status GroupEnd();

  // Enqueues a transfer of `bytes` of device memory; returns a ticket.
  absl::StatusOr<uint64_t> PostSend(const void* device_ptr, size_t bytes,
                                    int peer);
  absl::StatusOr<uint64_t> PostRecv(void* device_ptr, size_t bytes, int peer);
  // Waits for a ticket's transfer to complete (see failure model).
  absl::Status Wait(uint64_t ticket);
  // Sums `count` floats in place over all ranks of the communicator
  // (a replica group has its own communicator) and waits.
  absl::Status AllReduceSum(float* device_ptr, size_t count);

  int rank() const { return rank_; }

 private:
  NcclTransport(int rank, int world, absl::Duration timeout, std::string label);
  absl::Status Check(ncclResult_t r, const std::string& what);
  absl::Status Check(cudaError_t r, const std::string& what);
  absl::StatusOr<uint64_t> Record(cudaStream_t stream, int peer,
                                  const char* what);
  absl::Status WaitEvent(cudaEvent_t event, const std::string& what);
  // Waits (bounded by the timeout) until the non-blocking communicator has
  // finished the last call (ncclCommGetAsyncError leaves ncclInProgress).
  absl::Status Settle(const std::string& what);
  // Aborts the communicator and records DEADLINE_EXCEEDED for `what`.
  absl::Status Expire(const std::string& what);

  struct Pending {
    cudaEvent_t event = nullptr;
    cudaStream_t stream = nullptr;
    bool recorded = false;
    int peer = 0;
    std::string what;
  };

  const int rank_;
  const int world_;
  const absl::Duration timeout_;
  const std::string label_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t send_stream_ = nullptr;
  cudaStream_t recv_stream_ = nullptr;
  uint64_t next_ticket_ = 1;
  int group_depth_ = 0;
  std::map<uint64_t, Pending> pending_;
  absl::Status failure_;
};

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_NCCL_TRANSPORT_H_
