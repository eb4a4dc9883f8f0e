// What moving one message over TCP costs this host's CPU, by size: a
// sender thread writes messages to this process over loopback, and the
// receiver reads each into a freshly allocated tensor, as the transport
// does (Gloo's receives land in a new buffer per message). The figure is
// process CPU per byte handled, each byte counted once sent and once
// received, as the link test counts (LinkMeasurement.cpu_seconds_per_byte).
//
// Why by size: the link test times 4 MiB messages, but a cut of a
// convolutional network can carry 19 MB a micro-batch, and past the caches
// every copy runs at memory speed. Loopback on this development host, each
// byte out and in: 0.2 ns at 1-4 MiB, 0.4-0.8 ns at 16-19 MiB, 1-3.5 ns at
// 64 MiB. Charging the 4 MiB figure at 19 MB led the planner to a cnn
// pipeline that ran at 990 samples/s where data parallelism ran 1800.
//
// Thread-safety: each call is independent; it starts and joins its own
// sender thread.

#ifndef APAPO_WORKER_DAEMON_TRANSFER_CPU_PROBE_H_
#define APAPO_WORKER_DAEMON_TRANSFER_CPU_PROBE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/apapo/v1/profile.pb.h"

namespace apapo {
namespace worker {

// CPU seconds this process has used, every thread together (the probe's
// and the link test's meter: the kernel charges a loopback delivery to the
// sender, and Gloo's socket copies run on its own threads).
double ProcessCpuSeconds();

// The size the link test times its large messages at
// (LinkProfileOptions::message_bytes): the reference the other sizes are
// compared with.
inline constexpr int64_t kLinkTestMessageBytes = int64_t{4} << 20;

// The largest message the probe moves (timing 64 MiB messages took seconds
// here); for a larger activation the planner continues the rise of the
// figures below it (partitioner::Cluster::TransferCpuPerByte).
inline constexpr int64_t kMaxTransferProbeBytes = int64_t{32} << 20;

// CPU seconds per byte of `bytes`-byte messages (1 .. kMaxTransferProbeBytes):
// `warmups` untimed messages, then `timed` ones, each acknowledged before
// the next is sent. INVALID_ARGUMENT for a size or count out of range;
// UNAVAILABLE naming the call when a socket operation fails.
absl::StatusOr<double> MeasureTransferCpu(int64_t bytes, int warmups = 3,
                                          int timed = 4);

// The sizes a worker times for a model whose largest activation (one
// message at one micro-batch per mini-batch) is `largest_message_bytes`:
// none when it is no larger than twice `reference_bytes` (the link test's
// size: its own figure holds there); else the reference, the largest
// (capped at kMaxTransferProbeBytes) and their geometric mean.
std::vector<int64_t> TransferProbeSizes(int64_t largest_message_bytes,
                                        int64_t reference_bytes);

// MeasureTransferCpu at each of TransferProbeSizes; a size that fails is
// left out (with a line on stderr), and with the reference missing nothing
// is returned (the others would have no base).
std::vector<apapo::v1::TransferCpuMeasurement> MeasureTransferCpuBySize(
    int64_t largest_message_bytes, int64_t reference_bytes);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_DAEMON_TRANSFER_CPU_PROBE_H_
