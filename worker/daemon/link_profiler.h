// Measures the network links between the workers profiled for one job, with
// real transfers over the Gloo transport the stages use (worker/transport.h),
// so that the planner plans with measured bandwidth instead of a guess.
//
// Every rank of ProfileCommand.rendezvous calls MeasureLinks at about the
// same time (TorchJobRunner::Profile does, before it times the model); rank 0
// hosts the store (JobRunner::HostRendezvous). The protocol, all keys under
// "<rendezvous.prefix>/links/" in the store:
//   join     each rank sets "joined/<rank>" and waits for every rank's key;
//   connect  a GlooTransport over the store, bound to options.host;
//   measure  every pair i < j, in lexicographic order (a rank takes part in
//            its own pairs only, so pairs of disjoint ranks may overlap):
//            rank i ping-pongs with rank j, one warm-up round trip then
//            `latency_round_trips` of 8 bytes, `warmup_round_trips` then
//            `round_trips` of `burst_probe_bytes` (when set) and of
//            `message_bytes`, and sends j its figures, so both report the
//            same link;
//   reduce   every rank together: `warmup_round_trips`, then `round_trips`
//            all-reduces of `message_bytes` of float32 (the median is
//            reported, with its process CPU time); then one all-reduce of
//            each rank's median; three times a matrix product loop runs
//            for 1.5x their mean alone, then beside an all-reduce of the
//            same size until it completes (the compute it cost); and
//            where the mean, scaled to `large_allreduce_bytes`, fits
//            `large_allreduce_budget_seconds`, one warm-up and
//            `round_trips` all-reduces of that size (every rank reads the
//            same mean, so all make the same choice);
//   leave    each rank sets "done/<rank>" and waits for all (nobody closes a
//            connection a peer still uses), drops the transport and sets
//            "left/<rank>"; rank 0 returns only once every rank has left,
//            so the store it hosts outlives its users.
// Figures: latency = half the median 8-byte round trip; bandwidth =
// message_bytes / half the median large round trip (latency included, since
// the planner charges bytes / bandwidth per transfer); burst = FitBurst of
// the two sizes' half round trips.
//
// Failure model: every wait is bounded by rendezvous.timeout (60 s when
// unset); the join and leave waits also end with CANCELLED as soon as
// `options.stop` is notified. Errors name the peer: DEADLINE_EXCEEDED "link
// test: worker w-2 (rank 1) did not join within 1m", UNAVAILABLE "link test
// with worker w-2 (rank 1): ...", FAILED_PRECONDITION when options.host is
// not an address of this machine.
//
// Thread-safety: MeasureLinks is reentrant (each call has its own store
// client and transport).
#ifndef APAPO_WORKER_DAEMON_LINK_PROFILER_H_
#define APAPO_WORKER_DAEMON_LINK_PROFILER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "proto/apapo/v1/worker.pb.h"
#include "worker/daemon/transfer_cpu_probe.h"

namespace apapo::worker {

struct LinkProfileOptions {
  // The address this worker's transport binds to (its --host).
  std::string host = "127.0.0.1";
  // Size of the large messages: a few MB, the order of the activations a
  // stage boundary carries per micro-batch.
  int64_t message_bytes = kLinkTestMessageBytes;
  // Timed round trips of the large and of the 8-byte messages.
  int round_trips = 4;
  int latency_round_trips = 8;
  // Untimed large round trips (and all-reduces) before the timed ones. A
  // fresh connection moves its first few large messages several times
  // slower than later ones (loopback, 4 MiB: round trips of 42, 33, 18, 16
  // ms, then 2.5-4; TCP's buffers and the allocator warm up): with one
  // warm-up, workers on one host measured 0.3-0.5 GB/s between them
  // instead of 2-3, too close to a 1 Gbit/s link to tell the two apart.
  int warmup_round_trips = 3;
  // The larger all-reduce: a replicated stage's gradients are tens of MB,
  // which copy past the caches and cost more per byte than the messages
  // above (the mlp's 57 MB ran at 1.75-1.9 ms per MiB, two ranks on
  // loopback, against 1.3 timed at 4 MiB). 0: not timed. Every rank of a
  // test must be given the same two figures.
  int64_t large_allreduce_bytes = int64_t{64} << 20;
  double large_allreduce_budget_seconds = 0.5;
  // The second size timed for LinkMeasurement.burst_bytes; 0 or not below
  // message_bytes: the burst is not measured. A token bucket reads fully
  // up to half this size (the lab holds 100 KB at 100 Mbit/s, 250 KB at
  // 1 Gbit/s); at 100 Mbit/s its round trips add ~1.1 s to the test.
  int64_t burst_probe_bytes = int64_t{1} << 20;
  // Notified to abandon the test (the job was stopped); may be null.
  const absl::Notification* stop = nullptr;
  // Join as a daemon of the version before host all-reduces did: without
  // publishing `host`, so that no rank times any host's all-reduce. For
  // tests of a job whose daemons run mixed versions.
  bool publish_host = true;
};

// A token bucket's burst from ping-pong round trips of two sizes, each
// message sent after the other direction's (so the bucket has refilled
// when the message is at least twice the burst): with one-way times
// `probe_half` for `probe_bytes` and `large_half` for `large_bytes`
// (larger), the rate is their slope and the burst what the probe passed
// beyond it: probe_bytes - rate * (probe_half - latency), within
// [0, probe_bytes / 2]. 0 where the times do not rise with the size.
double FitBurst(double probe_bytes, double probe_half, double large_bytes,
                double large_half, double latency);

// FitBurst on the fastest of each size's timed round trips (seconds, both
// ways): a busy host only ever adds time to a round trip, and the burst is
// a difference of a few ms between the two sizes (100 KB at 100 Mbit/s is
// 8 ms of an 84 ms probe), which one descheduled echo in a median of four
// hides. 0 where a size has no timings.
double FitBurstFromRoundTrips(double probe_bytes, const std::vector<double>& probe_rtts,
                              double large_bytes, const std::vector<double>& large_rtts,
                              const std::vector<double>& small_rtts);

// Measures the links between this worker (rank command.rendezvous.rank) and
// every other rank of command.rendezvous; returns one LinkMeasurement per
// peer, from this worker (command.peers[rank], else "rank N") to the peer.
// Then every rank takes part in the timed all-reduces over all of them, in
// ascending bytes (message_bytes, then large_allreduce_bytes where timed);
// then the ranks sharing this one's host address, where some but not all
// do, time one of message_bytes among themselves, one host at a time (last,
// its worker_ids naming them). They are written to `allreduces` when not
// null.
// A missing rendezvous or a world size <= 1 measures nothing (empty).
absl::StatusOr<std::vector<apapo::v1::LinkMeasurement>> MeasureLinks(
    const apapo::v1::ProfileCommand& command,
    const LinkProfileOptions& options = {},
    std::vector<apapo::v1::AllReduceMeasurement>* allreduces = nullptr);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_LINK_PROFILER_H_
