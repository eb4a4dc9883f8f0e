#include "worker/daemon/link_profiler.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/transport.h"

namespace apapo::worker {
namespace {

using apapo::v1::LinkMeasurement;
using apapo::v1::ProfileCommand;
using Clock = std::chrono::steady_clock;

constexpr absl::Duration kDefaultTimeout = absl::Seconds(60);
constexpr int64_t kSmallBytes = 8;
// Store polls while waiting for peers start this far apart and back off.
constexpr absl::Duration kFirstPoll = absl::Milliseconds(1);
constexpr absl::Duration kMaxPoll = absl::Milliseconds(50);

// A LibTorch / c10d error's message without the C++ backtrace that
// c10::Error::what() appends (users see these messages).
std::string Cause(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string msg = c10 != nullptr ? c10->what_without_backtrace() : e.what();
  absl::StripTrailingAsciiWhitespace(&msg);
  return msg;
}

absl::Duration TimeoutOf(const apapo::v1::Rendezvous& rv) {
  const absl::Duration t = absl::Seconds(rv.timeout().seconds()) +
                           absl::Nanoseconds(rv.timeout().nanos());
  return t > absl::ZeroDuration() ? t : kDefaultTimeout;
}

std::string WorkerOf(const ProfileCommand& c, int rank) {
  if (rank < c.peers_size() && !c.peers(rank).empty()) return c.peers(rank);
  return absl::StrCat("rank ", rank);
}

// "worker w-2 (rank 1)", or "rank 1" when the command names no peers.
std::string PeerName(const ProfileCommand& c, int rank) {
  if (rank < c.peers_size() && !c.peers(rank).empty()) {
    return absl::StrCat("worker ", c.peers(rank), " (rank ", rank, ")");
  }
  return absl::StrCat("rank ", rank);
}

std::string Key(const std::string& phase, int rank) {
  return absl::StrCat(phase, "/", rank);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The shortest of `v`, not empty: a busy host only ever adds time.
double Fastest(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

// The job's store and the waits on it.
class LinkStore {
 public:
  LinkStore(const ProfileCommand& command, const absl::Notification* stop)
      : command_(command), stop_(stop != nullptr ? stop : &never_) {}

  void Connect(absl::Duration timeout) {
    const apapo::v1::Rendezvous& rv = command_.rendezvous();
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(rv.store_port());
    so.isServer = false;
    so.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
    auto tcp = c10::make_intrusive<c10d::TCPStore>(rv.store_host(), so);
    store_ = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat(rv.prefix(), "/links"), tcp);
  }

  void Set(const std::string& phase, int rank, const std::string& value) {
    store_->set(Key(phase, rank),
                std::vector<uint8_t>(value.begin(), value.end()));
  }

  // What `rank` set for `phase`, or nullopt where it has not (a get would
  // wait for it).
  std::optional<std::string> Get(const std::string& phase, int rank) {
    if (!store_->check({Key(phase, rank)})) return std::nullopt;
    const std::vector<uint8_t> value = store_->get(Key(phase, rank));
    return std::string(value.begin(), value.end());
  }

  // Waits until every rank in `ranks` has set `phase`, polling the store
  // (c10d's blocking wait cannot be abandoned on a stop).
  absl::Status Await(const std::string& phase, const std::string& verb,
                     std::vector<int> ranks, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration pause = kFirstPoll;
    while (true) {
      std::vector<int> missing;
      for (int r : ranks) {
        if (!store_->check({Key(phase, r)})) missing.push_back(r);
      }
      if (missing.empty()) return absl::OkStatus();
      ranks = std::move(missing);
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        std::vector<std::string> names;
        for (int r : ranks) names.push_back(PeerName(command_, r));
        return absl::DeadlineExceededError(absl::StrCat(
            "link test: ", absl::StrJoin(names, ", "), " did not ", verb,
            " within ", absl::FormatDuration(timeout)));
      }
      if (stop_->WaitForNotificationWithTimeout(
              std::min(pause, deadline - now))) {
        return absl::CancelledError("link test stopped");
      }
      pause = std::min(pause * 2, kMaxPoll);
    }
  }

 private:
  const ProfileCommand& command_;
  absl::Notification never_;
  const absl::Notification* const stop_;
  c10::intrusive_ptr<c10d::Store> store_;
};

// What the initiator of a pair measured (and tells the responder).
struct Figures {
  double bandwidth = 0;  // bytes/second
  double latency = 0;    // seconds
  double burst = 0;      // bytes (FitBurst)
  double peak = 0;       // bytes/second, from the fastest large round trip
  // This side's own figure, not exchanged: process CPU seconds per byte
  // sent or received over the timed large round trips.
  double cpu_per_byte = 0;
};

// The exchanged figures on the wire: bandwidth, latency, burst, peak.
constexpr int64_t kFiguresBytes = 4 * sizeof(double);

at::Tensor PackFigures(const Figures& f) {
  return torch::tensor(std::vector<double>{f.bandwidth, f.latency, f.burst, f.peak},
                       torch::kDouble)
      .view(torch::kUInt8);
}

// `bytes` holds kFiguresBytes; `cpu_per_byte` is the receiver's own.
Figures UnpackFigures(const at::Tensor& bytes, double cpu_per_byte) {
  const at::Tensor v = bytes.view(torch::kDouble);
  return Figures{v[0].item<double>(), v[1].item<double>(), v[2].item<double>(),
                 v[3].item<double>(), cpu_per_byte};
}

// Process CPU over the timed messages of `large` bytes of one side of an
// exchange, the last ones of it: from the first one's start to PerByte().
class CpuMeter {
 public:
  explicit CpuMeter(int64_t large) : large_(large) {}
  void Before(int64_t bytes, bool timed) {
    if (timed && bytes == large_ && !running_) {
      running_ = true;
      start_ = ProcessCpuSeconds();
    }
  }
  void After(int64_t bytes, bool timed) {
    if (timed && bytes == large_) handled_ += 2.0 * bytes;  // in and out
  }
  double PerByte() const {
    if (!running_ || handled_ <= 0) return 0;
    return std::max(0.0, ProcessCpuSeconds() - start_) / handled_;
  }

 private:
  const int64_t large_;
  bool running_ = false;
  double start_ = 0;
  double handled_ = 0;
};

// Whether the burst probe runs: a size between the 8-byte and the large
// messages.
bool ProbesBurst(const LinkProfileOptions& o) {
  return o.burst_probe_bytes > kSmallBytes && o.burst_probe_bytes < o.message_bytes;
}

// The messages of one pair's exchange, in order: a warm-up and the timed
// 8-byte round trips, the warm-ups and the timed burst probes (where
// ProbesBurst), then the warm-ups and the timed large ones (last, for
// CpuMeter).
std::vector<std::pair<int64_t, bool>> Exchange(const LinkProfileOptions& o) {
  std::vector<std::pair<int64_t, bool>> out;  // (bytes, timed)
  out.push_back({kSmallBytes, false});
  for (int i = 0; i < std::max(1, o.latency_round_trips); ++i) {
    out.push_back({kSmallBytes, true});
  }
  if (ProbesBurst(o)) {
    for (int i = 0; i < std::max(1, o.warmup_round_trips); ++i) {
      out.push_back({o.burst_probe_bytes, false});
    }
    for (int i = 0; i < std::max(1, o.round_trips); ++i) {
      out.push_back({o.burst_probe_bytes, true});
    }
  }
  for (int i = 0; i < std::max(1, o.warmup_round_trips); ++i) {
    out.push_back({o.message_bytes, false});
  }
  for (int i = 0; i < std::max(1, o.round_trips); ++i) {
    out.push_back({o.message_bytes, true});
  }
  return out;
}

// Rank `self` < `peer`: sends each message, times until the echo is back,
// then sends the figures. Tags: message k goes out as 2k, comes back as
// 2k+1; the figures follow as 2K.
absl::StatusOr<Figures> Initiate(Transport& t, int peer,
                                 const LinkProfileOptions& o) {
  const at::Tensor small = torch::zeros({kSmallBytes}, torch::kUInt8);
  const at::Tensor large = torch::zeros({o.message_bytes}, torch::kUInt8);
  const at::Tensor probe = large.narrow(0, 0, ProbesBurst(o) ? o.burst_probe_bytes : 1);
  std::vector<double> small_rtt, large_rtt, probe_rtt;
  const auto exchange = Exchange(o);
  CpuMeter cpu(o.message_bytes);
  int64_t tag = 0;
  for (const auto& [bytes, timed] : exchange) {
    const at::Tensor& message =
        bytes == kSmallBytes ? small : bytes == o.message_bytes ? large : probe;
    if (absl::Status s = t.ExpectRecv(peer, tag + 1, bytes); !s.ok()) return s;
    cpu.Before(bytes, timed);
    const Clock::time_point start = Clock::now();
    if (absl::Status s = t.Send(peer, tag, message); !s.ok()) return s;
    absl::StatusOr<at::Tensor> echo = t.Recv(peer, tag + 1);
    if (!echo.ok()) return echo.status();
    const double rtt =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (timed) {
      (bytes == kSmallBytes ? small_rtt : bytes == o.message_bytes ? large_rtt : probe_rtt)
          .push_back(rtt);
    }
    cpu.After(bytes, timed);
    tag += 2;
  }
  Figures f;
  f.cpu_per_byte = cpu.PerByte();
  f.latency = Median(small_rtt) / 2;
  // A large message over its one-way time, floored so a clock tick cannot
  // make the figure infinite.
  const auto rate = [&o](double round_trip) {
    return o.message_bytes / std::max(round_trip / 2, 1e-9);
  };
  f.bandwidth = rate(Median(large_rtt));
  f.peak = rate(Fastest(large_rtt));
  if (!probe_rtt.empty()) {
    f.burst = FitBurstFromRoundTrips(static_cast<double>(o.burst_probe_bytes), probe_rtt,
                                     static_cast<double>(o.message_bytes), large_rtt,
                                     small_rtt);
  }
  if (absl::Status s = t.Send(peer, tag, PackFigures(f)); !s.ok()) return s;
  if (absl::Status s = t.Flush(); !s.ok()) return s;
  return f;
}

// Rank `self` > `peer`: echoes every message, then takes the figures.
absl::StatusOr<Figures> Respond(Transport& t, int peer,
                                const LinkProfileOptions& o) {
  CpuMeter cpu(o.message_bytes);
  int64_t tag = 0;
  for (const auto& [bytes, timed] : Exchange(o)) {
    if (absl::Status s = t.ExpectRecv(peer, tag, bytes); !s.ok()) return s;
    cpu.Before(bytes, timed);
    absl::StatusOr<at::Tensor> message = t.Recv(peer, tag);
    if (!message.ok()) return message.status();
    if (absl::Status s = t.Send(peer, tag + 1, *message); !s.ok()) return s;
    cpu.After(bytes, timed);
    tag += 2;
  }
  if (absl::Status s = t.ExpectRecv(peer, tag, kFiguresBytes); !s.ok()) {
    return s;
  }
  absl::StatusOr<at::Tensor> figures = t.Recv(peer, tag);
  if (!figures.ok()) return figures.status();
  // Read once the figures are in: the initiator has the last echo by then.
  const double cpu_per_byte = cpu.PerByte();
  if (absl::Status s = t.Flush(); !s.ok()) return s;
  return UnpackFigures(*figures, cpu_per_byte);
}

// Median wall and process CPU time of `timed` all-reduces of `bytes` of
// float32 over `group` (0: every rank), after `warmups` untimed ones.
struct AllReduceTimes {
  double seconds = 0;
  double cpu_seconds = 0;
};
absl::StatusOr<AllReduceTimes> TimeAllReduce(Transport& t, int group, int64_t bytes,
                                             int warmups, int timed) {
  std::vector<at::Tensor> tensors = {
      torch::ones({std::max<int64_t>(1, bytes / 4)}, torch::kFloat)};
  std::vector<double> times, cpu_times;
  warmups = std::max(1, warmups);
  for (int i = 0; i < warmups + std::max(1, timed); ++i) {
    const Clock::time_point start = Clock::now();
    const double cpu_start = ProcessCpuSeconds();
    if (absl::Status s = t.AllReduceSum(group, tensors); !s.ok()) return s;
    const double cpu = ProcessCpuSeconds() - cpu_start;
    const double elapsed =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (i >= warmups) {
      times.push_back(elapsed);
      cpu_times.push_back(std::max(0.0, cpu));
    }
  }
  return AllReduceTimes{Median(times), Median(cpu_times)};
}

// The compute a core loses to one all-reduce of `bytes` running beside it
// (AllReduceMeasurement.compute_lost_seconds): `timed` times, a loop of
// 128 x 128 matrix products runs alone for `window` seconds, then from the
// all-reduce's start (in parts) until it has completed; the loss is that
// time less what the products done in it took alone. Over the whole
// all-reduce, not a fixed window: beside the compute the all-reduce gets
// part of the core and runs longer than alone, and a window of 1.5 times
// its time alone missed that tail (the cnn's backward at 1 Gbit/s lost
// about 13 ms to a 4.8 MB all-reduce, where the window read 8-9).
// Every rank runs the same steps, in step from the previous finish. Then
// the loop runs alone for the window again and one all-reduce follows it,
// timed, as a replica's follows its backward
// (AllReduceMeasurement.seconds_after_compute). The medians of the loss,
// of the all-reduce's time beside the loop and of its time after it.
struct ComputeLoss {
  double lost = 0;
  double seconds_beside = 0;
  double seconds_after = 0;
};
absl::StatusOr<ComputeLoss> AllReduceComputeLoss(Transport& t, int group,
                                                 int64_t bytes, double window,
                                                 int timed) {
  torch::NoGradGuard no_grad;
  const at::Tensor a = torch::rand({128, 128});
  const at::Tensor b = torch::rand({128, 128});
  at::Tensor c = torch::empty({128, 128});
  const std::vector<at::Tensor> tensors = {
      torch::ones({std::max<int64_t>(1, bytes / 4)}, torch::kFloat)};
  // A peer that stops mid-way fails the finish at the transport's timeout;
  // the loop does not outlast this much beyond the window.
  const double cap = std::max(1.0, 20 * window);
  // Products until `done(seconds so far)`: (products, seconds).
  const auto products_until = [&](const auto& done) {
    int64_t n = 0;
    const Clock::time_point start = Clock::now();
    double seconds = 0;
    do {
      at::mm_out(c, a, b);
      ++n;
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
    } while (!done(seconds));
    return std::make_pair(static_cast<double>(n), seconds);
  };
  std::vector<double> lost;
  std::vector<double> beside_seconds;
  std::vector<double> after_seconds;
  for (int i = 0; i < std::max(1, timed); ++i) {
    const auto [alone, alone_seconds] =
        products_until([&](double s) { return s >= window; });
    if (absl::Status s = t.StartAllReduceSum(group, tensors); !s.ok()) return s;
    const auto [beside, during] = products_until(
        [&](double s) { return t.AllReduceSumsDone(group) || s >= cap; });
    if (auto sums = t.FinishAllReduceSums(group); !sums.ok()) return sums.status();
    lost.push_back(std::max(0.0, during - beside * alone_seconds / alone));
    beside_seconds.push_back(during);
    products_until([&](double s) { return s >= window; });
    std::vector<at::Tensor> whole = tensors;
    const Clock::time_point start = Clock::now();
    if (absl::Status s = t.AllReduceSum(group, whole); !s.ok()) return s;
    after_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return ComputeLoss{Median(lost), Median(beside_seconds), Median(after_seconds)};
}

// The all-reduces of the link test (see the header): message_bytes, then
// large_allreduce_bytes where every rank finds it fits the budget.
apapo::v1::AllReduceMeasurement Measurement(int ranks, int64_t bytes,
                                            const AllReduceTimes& times) {
  apapo::v1::AllReduceMeasurement m;
  m.set_ranks(ranks);
  m.set_bytes(4 * std::max<int64_t>(1, bytes / 4));
  m.set_seconds(times.seconds);
  m.set_cpu_seconds(times.cpu_seconds);
  return m;
}

// The all-reduce of message_bytes over `group` of `ranks` ranks, with what
// it costs a replica computing beside it, three times (the loop alone
// timed over 1.5 times its time, at least 10 ms). The ranks' medians
// differ a little: every rank takes their mean, so all run as long; it is
// written to `mean_seconds` when not null.
absl::StatusOr<apapo::v1::AllReduceMeasurement> TimeAllReduceBesideCompute(
    Transport& t, int group, int ranks, const LinkProfileOptions& o,
    double* mean_seconds = nullptr) {
  absl::StatusOr<AllReduceTimes> small =
      TimeAllReduce(t, group, o.message_bytes, o.warmup_round_trips, o.round_trips);
  if (!small.ok()) return small.status();
  apapo::v1::AllReduceMeasurement m = Measurement(ranks, o.message_bytes, *small);
  std::vector<at::Tensor> mean = {torch::full({1}, small->seconds, torch::kFloat)};
  if (absl::Status s = t.AllReduceSum(group, mean); !s.ok()) return s;
  const double mean_of_ranks = mean[0].item<double>() / ranks;
  absl::StatusOr<ComputeLoss> lost = AllReduceComputeLoss(
      t, group, o.message_bytes, std::max(0.01, 1.5 * mean_of_ranks), 3);
  if (!lost.ok()) return lost.status();
  m.set_compute_lost_seconds(lost->lost);
  m.set_seconds_beside_compute(lost->seconds_beside);
  m.set_seconds_after_compute(lost->seconds_after);
  if (mean_seconds != nullptr) *mean_seconds = mean_of_ranks;
  return m;
}

absl::StatusOr<std::vector<apapo::v1::AllReduceMeasurement>> TimeAllReduces(
    Transport& t, int world, const LinkProfileOptions& o) {
  std::vector<apapo::v1::AllReduceMeasurement> out;
  double mean_seconds = 0;
  absl::StatusOr<apapo::v1::AllReduceMeasurement> small =
      TimeAllReduceBesideCompute(t, 0, world, o, &mean_seconds);
  if (!small.ok()) return small.status();
  out.push_back(*std::move(small));
  if (o.large_allreduce_bytes <= o.message_bytes) return out;
  const double scaled = mean_seconds *
                        static_cast<double>(o.large_allreduce_bytes) /
                        static_cast<double>(o.message_bytes);
  if (!(scaled <= o.large_allreduce_budget_seconds)) return out;
  absl::StatusOr<AllReduceTimes> large =
      TimeAllReduce(t, 0, o.large_allreduce_bytes, 1, o.round_trips);
  if (!large.ok()) return large.status();
  out.push_back(Measurement(world, o.large_allreduce_bytes, *large));
  return out;
}

// The ranks sharing a host address, for each host that some but not all
// ranks share, in the order of their first rank: every rank computes the
// same list from the same addresses.
std::vector<std::vector<int>> HostGroups(const std::vector<std::string>& hosts) {
  std::map<std::string, std::vector<int>> by_host;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) by_host[hosts[r]].push_back(r);
  std::vector<std::vector<int>> groups;
  for (auto& [host, ranks] : by_host) {
    if (ranks.size() >= 2 && ranks.size() < hosts.size()) groups.push_back(ranks);
  }
  std::sort(groups.begin(), groups.end());
  return groups;
}

// The all-reduce inside each host group (transport groups 1.., as
// `host_groups`), one host at a time so that the hosts of an emulated
// cluster do not share the CPUs while they time: the members time theirs
// (TimeAllReduceBesideCompute), then every rank waits for them in a small
// all-reduce over all. This rank's, naming its group's workers, or
// nullopt where it shares its host with no one.
absl::StatusOr<std::optional<apapo::v1::AllReduceMeasurement>> TimeHostAllReduces(
    Transport& t, const ProfileCommand& command, int self,
    const std::vector<std::vector<int>>& host_groups, const LinkProfileOptions& o) {
  std::optional<apapo::v1::AllReduceMeasurement> mine;
  for (size_t g = 0; g < host_groups.size(); ++g) {
    const std::vector<int>& members = host_groups[g];
    if (std::find(members.begin(), members.end(), self) != members.end()) {
      absl::StatusOr<apapo::v1::AllReduceMeasurement> m = TimeAllReduceBesideCompute(
          t, static_cast<int>(g) + 1, static_cast<int>(members.size()), o);
      if (!m.ok()) return m.status();
      for (int r : members) m->add_worker_ids(WorkerOf(command, r));
      mine = *std::move(m);
    }
    std::vector<at::Tensor> done = {torch::zeros({1}, torch::kFloat)};
    if (absl::Status s = t.AllReduceSum(0, done); !s.ok()) return s;
  }
  return mine;
}

absl::StatusOr<std::vector<LinkMeasurement>> MeasureOrThrow(
    const ProfileCommand& command, const LinkProfileOptions& options,
    std::vector<apapo::v1::AllReduceMeasurement>* allreduces_out) {
  const apapo::v1::Rendezvous& rv = command.rendezvous();
  const int world = rv.world_size();
  const int self = rv.rank();
  if (world <= 1) return std::vector<LinkMeasurement>();
  if (self < 0 || self >= world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link test: rank ", self, " out of range for world size ", world));
  }
  if (rv.store_port() <= 0) {
    return absl::InvalidArgumentError("link test: the rendezvous has no store port");
  }
  if (options.message_bytes < kSmallBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link test: message_bytes must be >= ", kSmallBytes));
  }
  const std::string host = options.host.empty() ? "127.0.0.1" : options.host;
  // Before joining: a worker that cannot take part says so at once, and
  // its peers wait for it only until the job is stopped.
  if (absl::Status s = CheckTransportHost(host); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("link test: ", s.message()));
  }
  const absl::Duration timeout = TimeoutOf(rv);
  std::vector<int> others;
  for (int r = 0; r < world; ++r) {
    if (r != self) others.push_back(r);
  }

  LinkStore store(command, options.stop);
  try {
    store.Connect(timeout);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "link test: cannot reach the job's rendezvous store ", rv.store_host(),
        ":", rv.store_port(), ": ", Cause(e)));
  }
  // Each rank's address, before it joins: the ranks sharing one time an
  // all-reduce among themselves too.
  if (options.publish_host) store.Set("host", self, host);
  store.Set("joined", self, WorkerOf(command, self));
  if (absl::Status s = store.Await("joined", "join", others, timeout);
      !s.ok()) {
    return s;
  }
  // A rank that joined without its address is a daemon of an earlier
  // version, which times no host's all-reduce (nor waits for them): then
  // none is timed. Every rank set its address before it joined, so every
  // rank decides alike.
  std::vector<std::string> hosts(world);
  bool every_address = true;
  for (int r = 0; r < world && every_address; ++r) {
    std::optional<std::string> h = store.Get("host", r);
    every_address = h.has_value();
    if (h.has_value()) hosts[r] = *std::move(h);
  }
  const std::vector<std::vector<int>> host_groups =
      every_address ? HostGroups(hosts) : std::vector<std::vector<int>>();

  GlooTransportOptions t;
  t.store_host = rv.store_host();
  t.store_port = rv.store_port();
  t.store_prefix = absl::StrCat(rv.prefix(), "/links");
  t.host = host;
  t.rank = self;
  t.world_size = world;
  t.timeout = timeout;
  t.recv_lookahead = 1;
  t.label = PeerName(command, self);
  // One group of every rank, for the all-reduce after the pairs.
  t.groups.emplace_back();
  for (int r = 0; r < world; ++r) t.groups.back().push_back(r);
  // Then one of the ranks on each host that some but not all share.
  t.groups.insert(t.groups.end(), host_groups.begin(), host_groups.end());
  absl::StatusOr<std::unique_ptr<Transport>> transport = CreateGlooTransport(t);
  if (!transport.ok()) {
    return absl::Status(transport.status().code(),
                        absl::StrCat("link test: ", transport.status().message()));
  }

  std::vector<LinkMeasurement> links;
  for (int i = 0; i < world; ++i) {
    for (int j = i + 1; j < world; ++j) {
      if (self != i && self != j) continue;
      const int peer = self == i ? j : i;
      absl::StatusOr<Figures> f = self == i ? Initiate(**transport, peer, options)
                                            : Respond(**transport, peer, options);
      if (!f.ok()) {
        return absl::Status(f.status().code(),
                            absl::StrCat("link test with ",
                                         PeerName(command, peer), ": ",
                                         f.status().message()));
      }
      LinkMeasurement& link = links.emplace_back();
      link.set_from_worker(WorkerOf(command, self));
      link.set_to_worker(WorkerOf(command, peer));
      link.set_bandwidth_bytes_per_second(f->bandwidth);
      link.set_latency_seconds(f->latency);
      link.set_message_bytes(options.message_bytes);
      link.set_cpu_seconds_per_byte(f->cpu_per_byte);
      link.set_burst_bytes(f->burst);
      link.set_peak_bandwidth_bytes_per_second(f->peak);
    }
  }

  // Every rank together: real all-reduces, as replicas sum their
  // gradients.
  absl::StatusOr<std::vector<apapo::v1::AllReduceMeasurement>> allreduces =
      TimeAllReduces(**transport, world, options);
  if (!allreduces.ok()) {
    return absl::Status(allreduces.status().code(),
                        absl::StrCat("link test all-reduce: ",
                                     allreduces.status().message()));
  }
  absl::StatusOr<std::optional<apapo::v1::AllReduceMeasurement>> on_host =
      TimeHostAllReduces(**transport, command, self, host_groups, options);
  if (!on_host.ok()) {
    return absl::Status(on_host.status().code(),
                        absl::StrCat("link test all-reduce on this host: ",
                                     on_host.status().message()));
  }
  if (on_host->has_value()) allreduces->push_back(**std::move(on_host));
  if (allreduces_out != nullptr) *allreduces_out = *std::move(allreduces);

  store.Set("done", self, "");
  if (absl::Status s = store.Await("done", "finish", others, timeout);
      !s.ok()) {
    return s;
  }
  transport->reset();
  store.Set("left", self, "");
  if (self == 0) {
    if (absl::Status s = store.Await("left", "leave", others, timeout);
        !s.ok()) {
      return s;
    }
  }
  return links;
}

}  // namespace

double FitBurst(double probe_bytes, double probe_half, double large_bytes,
                double large_half, double latency) {
  if (!(large_bytes > probe_bytes) || !(large_half > probe_half) || probe_bytes <= 0) {
    return 0;
  }
  const double rate = (large_bytes - probe_bytes) / (large_half - probe_half);
  const double burst = probe_bytes - rate * std::max(0.0, probe_half - latency);
  return std::clamp(burst, 0.0, probe_bytes / 2);
}

double FitBurstFromRoundTrips(double probe_bytes, const std::vector<double>& probe_rtts,
                              double large_bytes, const std::vector<double>& large_rtts,
                              const std::vector<double>& small_rtts) {
  if (probe_rtts.empty() || large_rtts.empty() || small_rtts.empty()) return 0;
  return FitBurst(probe_bytes, Fastest(probe_rtts) / 2, large_bytes,
                  Fastest(large_rtts) / 2, Fastest(small_rtts) / 2);
}

absl::StatusOr<std::vector<LinkMeasurement>> MeasureLinks(
    const ProfileCommand& command, const LinkProfileOptions& options,
    std::vector<apapo::v1::AllReduceMeasurement>* allreduces) {
  try {
    return MeasureOrThrow(command, options, allreduces);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("link test: lost the job's rendezvous store ",
                     command.rendezvous().store_host(), ":",
                     command.rendezvous().store_port(), ": ", Cause(e)));
  }
}

}  // namespace apapo::worker
