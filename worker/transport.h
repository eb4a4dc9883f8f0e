// Point-to-point and replica-group communication between stage processes.
//
// Transport is the interface the stage executor talks to; GlooTransport
// implements it over c10d's ProcessGroupGloo rendezvoused through a
// TCPStore (CPU). A CUDA/NCCL transport lives in nccl_transport.h (built
// with --config=cuda).
//
// Overlap model: every peer has dedicated communication threads, one per
// direction. Send() only enqueues: the peer's send thread posts the transfer
// and waits for it, so the compute thread never blocks on a send until
// Flush(). ExpectRecv() declares, in order, the messages a peer will send;
// the peer's receive thread keeps up to `recv_lookahead` of them posted ahead
// so the bytes land while the stage computes, and Recv() returns a message
// as soon as it is in. Gloo's TCP transport is rendezvous-based (a send
// completes once the matching receive is posted), which is why receives are
// posted ahead.
//
// Failure model: every wait is bounded by `timeout`. A dead peer (closed
// connection) or an expired wait makes every later call fail with
// UNAVAILABLE / DEADLINE_EXCEEDED naming this rank's stage, the peer and the
// cause; nothing hangs.
//
// Thread-safety: all methods are thread-safe, but messages to one peer are
// ordered as Send() is called, so a stage normally calls them from its one
// compute thread. Call order: Create -> (ExpectRecv | Send | Recv |
// AllReduce)* -> Flush -> destroy.

#ifndef APAPO_WORKER_TRANSPORT_H_
#define APAPO_WORKER_TRANSPORT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/apapo/v1/job.pb.h"
#include "worker/model_graph.h"

namespace apapo {
namespace worker {

// Cumulative counters of one transport.
struct TransportStats {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  // Sum over sends of the time from posting to completion (comm threads).
  double send_seconds = 0;
  // Sum over receives of the time from posting to arrival (comm threads);
  // includes waiting for the peer to produce the message.
  double recv_seconds = 0;
  // Time the caller blocked in Recv() / Flush() / AllReduceSum() (with
  // the parts: copying them in, and waiting in FinishAllReduceSums).
  double recv_wait_seconds = 0;
  double flush_wait_seconds = 0;
  double allreduce_seconds = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Enqueues `bytes` (a contiguous kUInt8 CPU tensor, kept alive until sent)
  // for `dst` under `tag`. Fails only if the transport has already failed.
  virtual absl::Status Send(int dst, int64_t tag, at::Tensor bytes) = 0;
  // Declares the next message `src` will send to us: its tag and size.
  virtual absl::Status ExpectRecv(int src, int64_t tag, int64_t nbytes) = 0;
  // Declares a message of variable size, at most `max_bytes`: its first 8
  // bytes hold its whole length (int64, this machine's byte order), and
  // Recv() returns exactly that many bytes. A message that names a length
  // below 8 or above `max_bytes` fails the transport (DATA_LOSS naming the
  // peer and tag).
  virtual absl::Status ExpectRecvUpTo(int src, int64_t tag,
                                      int64_t max_bytes) = 0;
  // Returns the declared message (src, tag) once it has arrived.
  virtual absl::StatusOr<at::Tensor> Recv(int src, int64_t tag) = 0;
  // Waits until every enqueued send has completed.
  virtual absl::Status Flush() = 0;
  // Sums `tensors` over the replica group `group` (an index into the groups
  // given at creation); the entries of `tensors` are replaced by the sums.
  // The sums may be views of a buffer the transport keeps for the group:
  // they stay valid until the next AllReduceSum on that group.
  virtual absl::Status AllReduceSum(int group,
                                    std::vector<at::Tensor>& tensors) = 0;
  // The same sum in parts that overlap the caller's compute: each
  // StartAllReduceSum copies `tensors` into a buffer the transport keeps
  // for the k-th start on `group` since the last finish, starts summing it
  // on the group's threads and returns; FinishAllReduceSums waits for every
  // one started since the last finish and returns their sums, [k] holding
  // the k-th start's tensors in the order given. Every member of a group
  // must start the same parts (shapes and order) between two finishes. The
  // sums may be views of the buffers: valid until the next start of the
  // same part on that group. A failed or expired part fails the transport
  // (UNAVAILABLE naming the group), as AllReduceSum does.
  virtual absl::Status StartAllReduceSum(int group,
                                         const std::vector<at::Tensor>& tensors) = 0;
  virtual absl::StatusOr<std::vector<std::vector<at::Tensor>>> FinishAllReduceSums(
      int group) = 0;
  // Whether every part started on `group` since the last finish has
  // completed (FinishAllReduceSums would not wait); true for a group
  // without parts or out of range (FinishAllReduceSums says which).
  virtual bool AllReduceSumsDone(int group) = 0;
  virtual TransportStats Stats() const = 0;
};

struct GlooTransportOptions {
  // Rendezvous: the TCPStore served by the launcher (or a test).
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  // This rank's own address (name or IP): the Gloo device binds to it and
  // peers connect to it, so across hosts it is the worker's --host. It must
  // resolve to an address of this machine.
  std::string host = "127.0.0.1";
  // Namespace inside the store, so several jobs can share one store.
  std::string store_prefix = "apapo";
  int rank = 0;
  int world_size = 1;
  // Bound on every wait (connect, transfer, all-reduce).
  absl::Duration timeout = absl::Seconds(120);
  // Receives kept posted ahead per peer.
  int recv_lookahead = 8;
  // Replica groups (lists of global ranks). Groups this rank is not in are
  // ignored; AllReduceSum takes an index into this list.
  std::vector<std::vector<int>> groups;
  // Shown in errors: "stage 1 (rank 2)".
  std::string label;
};

// Binds to `host`, connects to the store and to every other rank; fails
// with FAILED_PRECONDITION (before touching the store) if `host` is not an
// address of this machine, and with UNAVAILABLE / DEADLINE_EXCEEDED naming
// the cause if a peer does not show up in time.
absl::StatusOr<std::unique_ptr<Transport>> CreateGlooTransport(
    const GlooTransportOptions& options);

// OK if a Gloo transport can bind to `host` (it resolves to an address of
// this machine); FAILED_PRECONDITION naming the host otherwise.
absl::Status CheckTransportHost(const std::string& host);

// Starts a TCPStore server on `host`, port 0 (a free port), for the launcher
// and tests. The returned handle keeps it alive; *port receives the port.
class StoreServer {
 public:
  virtual ~StoreServer() = default;
  virtual int port() const = 0;
  // Reads a key set by a worker (waits up to `timeout`).
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;
};
absl::StatusOr<std::unique_ptr<StoreServer>> StartStoreServer(
    const std::string& host = "127.0.0.1");

// Stores `value` under `key` in the store (workers report results this way).
absl::Status PutToStore(const std::string& host, int port,
                        const std::string& key, const std::string& value);

// ---- bundles: the tensors that cross a cut, packed as one message ----

// The precision float32 tensors travel in (ScheduleSpec.transfer_precision).
// Integer tensors (labels, token ids) always travel exactly.
enum class WirePrecision { kFloat32, kBFloat16 };

// The job's choice (UNSPECIFIED and FLOAT32: kFloat32).
WirePrecision WirePrecisionFor(const apapo::v1::JobSpec& spec);

// Bytes of one bundle of `entries` for `batch` samples sent in `wire`.
int64_t BundleBytes(const std::vector<BundleEntry>& entries, int64_t batch,
                    WirePrecision wire);
// Packs tensors (float32 or int64) into one contiguous kUInt8 tensor, the
// float32 ones rounded to `wire` (to nearest even).
at::Tensor PackBundle(const std::vector<at::Tensor>& tensors,
                      WirePrecision wire);
// The bundle's tensors, float32 entries as float32 whatever `wire` was:
// views of `bytes` where nothing was rounded (kFloat32, and int64
// entries), widened copies otherwise.
absl::StatusOr<std::vector<at::Tensor>> UnpackBundle(
    const at::Tensor& bytes, const std::vector<BundleEntry>& entries,
    int64_t batch, WirePrecision wire);

// ---- bundles without zeros (ScheduleSpec.skip_zeros) ----
//
// An entry with skip_zeros (a ReLU's output) crosses in an activations
// bundle as a bitmask of its nonzero values (in `wire`: a value that
// rounds to zero is zero) and those values, in order; in the gradients
// bundle that answers it, its gradient travels only at the mask's
// positions (a ReLU passes no gradient through its zeros), and the
// receiver fills the rest with zeros. Other entries travel as in
// PackBundle. Such bundles vary in size: they start with their length
// (ExpectRecvUpTo) and are at most SkipZerosCapacity bytes.
enum class BundleKind { kActivations, kGradients };

// Whether any entry has skip_zeros (the bundle is then length-prefixed).
bool AnySkipsZeros(const std::vector<BundleEntry>& entries);
// The most bytes such a bundle of `entries` for `batch` samples takes.
int64_t SkipZerosCapacity(const std::vector<BundleEntry>& entries,
                          int64_t batch, WirePrecision wire, BundleKind kind);
// Packs `tensors` (one per entry). Activations: `masks` receives, per
// entry, the positions sent (a kBool tensor of the entry's shape) for
// skip_zeros entries and an undefined tensor for the others. Gradients:
// `masks` gives them (what the activations bundle carried).
at::Tensor PackSkippingZeros(const std::vector<at::Tensor>& tensors,
                             const std::vector<BundleEntry>& entries,
                             WirePrecision wire, BundleKind kind,
                             std::vector<at::Tensor>& masks);
// The inverse: float32 tensors of the entries' full shapes. Activations:
// `masks` receives the masks as PackSkippingZeros gave them; gradients:
// `masks` gives them. INTERNAL naming the entry when the bytes do not
// match (a length, a mask or a count off).
absl::StatusOr<std::vector<at::Tensor>> UnpackSkippingZeros(
    const at::Tensor& bytes, const std::vector<BundleEntry>& entries,
    int64_t batch, WirePrecision wire, BundleKind kind,
    std::vector<at::Tensor>& masks);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_TRANSPORT_H_
