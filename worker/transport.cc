#include "worker/transport.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace apapo {
namespace worker {
namespace {

// A LibTorch / c10d error's message without the C++ backtrace that
// c10::Error::what() appends (users see these messages).
std::string Cause(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string msg = c10 != nullptr ? c10->what_without_backtrace() : e.what();
  absl::StripTrailingAsciiWhitespace(&msg);
  return msg;
}

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// absl::Condition over a std::function.
bool CallPredicate(std::function<bool()>* f) { return (*f)(); }

int64_t ElementSize(DType d) { return d == DType::kInt64 ? 8 : 4; }
int64_t Align8(int64_t n) { return (n + 7) / 8 * 8; }

// A Gloo TCP device bound to `host`.
absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> DeviceFor(
    const std::string& host) {
  try {
    return c10d::ProcessGroupGloo::createDeviceForHostname(host);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot bind the Gloo transport to host '", host,
        "' (it must be an address of this machine): ", Cause(e)));
  }
}

class GlooTransport : public Transport {
 public:
  explicit GlooTransport(GlooTransportOptions options)
      : options_(std::move(options)) {}

  ~GlooTransport() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      // Unblock transfers still waiting on a peer.
      for (auto& [peer, ch] : sends_) {
        if (ch->current) ch->current->abort();
      }
      for (auto& [peer, ch] : recvs_) {
        for (auto& item : ch->inflight) item.work->abort();
      }
    }
    for (auto& [peer, ch] : sends_) {
      if (ch->thread.joinable()) ch->thread.join();
    }
    for (auto& [peer, ch] : recvs_) {
      if (ch->thread.joinable()) ch->thread.join();
    }
  }

  absl::Status Connect() {
    // The device first: a host this machine cannot bind fails here, at
    // once, rather than after the peers have waited for our address.
    absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> device =
        DeviceFor(options_.host);
    if (!device.ok()) {
      return absl::Status(device.status().code(),
                          absl::StrCat(options_.label, ": ",
                                       device.status().message()));
    }
    try {
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(options_.store_port);
      so.isServer = false;
      so.timeout = ToChrono(options_.timeout);
      auto tcp = c10::make_intrusive<c10d::TCPStore>(options_.store_host, so);
      store_ = c10::make_intrusive<c10d::PrefixStore>(options_.store_prefix,
                                                      tcp);
      auto opts = c10d::ProcessGroupGloo::Options::create(
          ToChrono(options_.timeout));
      opts->devices.push_back(*device);
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("pp", store_),
          options_.rank, options_.world_size, opts);
      for (size_t g = 0; g < options_.groups.size(); ++g) {
        const auto& members = options_.groups[g];
        auto it = std::find(members.begin(), members.end(), options_.rank);
        if (it == members.end() || members.size() < 2) {
          groups_.push_back(c10::intrusive_ptr<c10d::ProcessGroupGloo>());
          continue;
        }
        auto gopts = c10d::ProcessGroupGloo::Options::create(
            ToChrono(options_.timeout));
        gopts->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForHostname(options_.host));
        groups_.push_back(c10::make_intrusive<c10d::ProcessGroupGloo>(
            c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("group", g),
                                                   store_),
            static_cast<int>(it - members.begin()),
            static_cast<int>(members.size()), gopts));
      }
      for (size_t g = 0; g < groups_.size(); ++g) {
        buffers_.push_back(std::make_unique<GroupBuffer>());
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat(options_.label, ": cannot connect to the other ",
                       options_.world_size - 1, " rank(s) via store ",
                       options_.store_host, ":", options_.store_port, ": ",
                       Cause(e)));
    }
    return absl::OkStatus();
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  absl::Status Send(int dst, int64_t tag, at::Tensor bytes) override {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (absl::Status s = CheckPeer(dst); !s.ok()) return s;
    SendChannel& ch = SendChannelFor(dst);
    ch.queue.push_back({tag, std::move(bytes), absl::Now()});
    return absl::OkStatus();
  }

  absl::Status ExpectRecv(int src, int64_t tag, int64_t nbytes) override {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (absl::Status s = CheckPeer(src); !s.ok()) return s;
    RecvChannelFor(src).expected.push_back({tag, nbytes});
    return absl::OkStatus();
  }

  absl::StatusOr<at::Tensor> Recv(int src, int64_t tag) override {
    const absl::Time start = absl::Now();
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPeer(src); !s.ok()) return s;
    RecvChannel& ch = RecvChannelFor(src);
    std::function<bool()> ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !failure_.ok() || ch.ready.contains(tag);
    };
    const bool ok = mu_.AwaitWithTimeout(
        absl::Condition(&CallPredicate, &ready), options_.timeout);
    stats_.recv_wait_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    auto it = ch.ready.find(tag);
    if (it != ch.ready.end()) {
      at::Tensor t = std::move(it->second);
      ch.ready.erase(it);
      --ch.outstanding;
      return t;
    }
    if (!failure_.ok()) return failure_;
    if (!ok) {
      FailLocked(absl::DeadlineExceededError(absl::StrCat(
          options_.label, ": no message from ", PeerName(src), " (tag ", tag,
          ") within ", absl::FormatDuration(options_.timeout))));
    }
    return failure_;
  }

  absl::Status Flush() override {
    const absl::Time start = absl::Now();
    absl::MutexLock lock(&mu_);
    std::function<bool()> done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!failure_.ok()) return true;
      for (auto& [peer, ch] : sends_) {
        if (!ch->queue.empty()) return false;
      }
      return true;
    };
    const bool ok = mu_.AwaitWithTimeout(
        absl::Condition(&CallPredicate, &done), options_.timeout);
    stats_.flush_wait_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    if (!failure_.ok()) return failure_;
    if (!ok) {
      FailLocked(absl::DeadlineExceededError(
          absl::StrCat(options_.label, ": sends not delivered within ",
                       absl::FormatDuration(options_.timeout))));
      return failure_;
    }
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(int group,
                            std::vector<at::Tensor>& tensors) override {
    {
      absl::MutexLock lock(&mu_);
      if (!failure_.ok()) return failure_;
    }
    if (group < 0 || group >= static_cast<int>(groups_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(options_.label, ": no replica group ", group));
    }
    if (!groups_[group] || tensors.empty()) return absl::OkStatus();
    const absl::Time start = absl::Now();
    GroupBuffer& buffer = *buffers_[group];
    absl::MutexLock buffer_lock(&buffer.mu);
    try {
      torch::NoGradGuard no_grad;
      // The group's buffer, kept from call to call: Gloo all-reduced a
      // buffer it had seen before 4-6 ms a call (4 MiB, two ranks, loopback),
      // a fresh one (torch::cat's, every call) 13-50 ms.
      int64_t total = 0;
      for (const auto& t : tensors) total += t.numel();
      const at::TensorOptions like = tensors.front().options();
      if (!buffer.flat.defined() || buffer.flat.numel() != total ||
          buffer.flat.options().dtype() != like.dtype()) {
        buffer.flat = torch::empty({total}, like);
      }
      int64_t offset = 0;
      for (const auto& t : tensors) {
        buffer.flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
        offset += t.numel();
      }
      std::vector<at::Tensor> flat{buffer.flat};
      groups_[group]->allreduce(flat)->wait(ToChrono(options_.timeout));
      offset = 0;
      for (auto& t : tensors) {
        const int64_t n = t.numel();
        t = buffer.flat.narrow(0, offset, n).view(t.sizes());
        offset += n;
      }
    } catch (const std::exception& e) {
      absl::MutexLock lock(&mu_);
      FailLocked(absl::UnavailableError(
          absl::StrCat(options_.label, ": gradient all-reduce in replica group ",
                       group, " failed: ", Cause(e))));
      return failure_;
    }
    absl::MutexLock lock(&mu_);
    stats_.allreduce_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    return absl::OkStatus();
  }

  TransportStats Stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  struct SendItem {
    int64_t tag;
    at::Tensor bytes;
    absl::Time enqueued;
  };
  struct SendChannel {
    int peer = 0;
    std::deque<SendItem> queue;  // front is in flight
    c10::intrusive_ptr<c10d::Work> current;
    std::thread thread;
  };
  struct Posted {
    int64_t tag;
    at::Tensor buffer;
    c10::intrusive_ptr<c10d::Work> work;
    absl::Time posted;
  };
  struct RecvChannel {
    int peer = 0;
    std::deque<std::pair<int64_t, int64_t>> expected;  // (tag, bytes)
    std::deque<Posted> inflight;
    absl::flat_hash_map<int64_t, at::Tensor> ready;
    int outstanding = 0;  // posted and not yet returned by Recv()
    std::thread thread;
  };

  std::string PeerName(int rank) const {
    return absl::StrCat("rank ", rank);
  }

  absl::Status CheckPeer(int peer) const {
    if (peer < 0 || peer >= options_.world_size || peer == options_.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(options_.label, ": bad peer rank ", peer));
    }
    return absl::OkStatus();
  }

  void FailLocked(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (failure_.ok()) failure_ = std::move(s);
  }

  SendChannel& SendChannelFor(int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto& ch = sends_[peer];
    if (!ch) {
      ch = std::make_unique<SendChannel>();
      ch->peer = peer;
      ch->thread = std::thread([this, c = ch.get()] { SendLoop(c); });
    }
    return *ch;
  }

  RecvChannel& RecvChannelFor(int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto& ch = recvs_[peer];
    if (!ch) {
      ch = std::make_unique<RecvChannel>();
      ch->peer = peer;
      ch->thread = std::thread([this, c = ch.get()] { RecvLoop(c); });
    }
    return *ch;
  }

  void SendLoop(SendChannel* ch) {
    while (true) {
      SendItem item;
      {
        absl::MutexLock lock(&mu_);
        std::function<bool()> wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !failure_.ok() || !ch->queue.empty();
        };
        mu_.Await(absl::Condition(&CallPredicate, &wake));
        if (stopping_ || !failure_.ok()) return;
        item = ch->queue.front();
        std::vector<at::Tensor> v{item.bytes};
        try {
          ch->current = pg_->send(v, ch->peer, static_cast<int>(item.tag));
        } catch (const std::exception& e) {
          FailLocked(absl::UnavailableError(absl::StrCat(
              options_.label, ": send to ", PeerName(ch->peer), " (tag ",
              item.tag, ") failed: ", Cause(e))));
          return;
        }
      }
      const absl::Time posted = absl::Now();
      std::string error;
      try {
        ch->current->wait(ToChrono(options_.timeout));
      } catch (const std::exception& e) {
        error = Cause(e);
      }
      absl::MutexLock lock(&mu_);
      ch->current.reset();
      if (!error.empty()) {
        if (!stopping_) {
          FailLocked(absl::UnavailableError(absl::StrCat(
              options_.label, ": send to ", PeerName(ch->peer), " (tag ",
              item.tag, ") failed: ", error)));
        }
        return;
      }
      stats_.bytes_sent += item.bytes.numel();
      stats_.send_seconds += absl::ToDoubleSeconds(absl::Now() - posted);
      ch->queue.pop_front();
    }
  }

  void RecvLoop(RecvChannel* ch) {
    const int lookahead = std::max(1, options_.recv_lookahead);
    while (true) {
      Posted front;
      {
        absl::MutexLock lock(&mu_);
        std::function<bool()> wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !failure_.ok() || !ch->inflight.empty() ||
                 (!ch->expected.empty() && ch->outstanding < lookahead);
        };
        mu_.Await(absl::Condition(&CallPredicate, &wake));
        if (stopping_ || !failure_.ok()) return;
        try {
          while (!ch->expected.empty() && ch->outstanding < lookahead) {
            auto [tag, nbytes] = ch->expected.front();
            ch->expected.pop_front();
            Posted p{tag, torch::empty({nbytes}, torch::kUInt8), {},
                     absl::Now()};
            std::vector<at::Tensor> v{p.buffer};
            p.work = pg_->recv(v, ch->peer, static_cast<int>(tag));
            ch->inflight.push_back(std::move(p));
            ++ch->outstanding;
          }
        } catch (const std::exception& e) {
          FailLocked(absl::UnavailableError(
              absl::StrCat(options_.label, ": posting a receive from ",
                           PeerName(ch->peer), " failed: ", Cause(e))));
          return;
        }
        front = ch->inflight.front();
      }
      std::string error;
      try {
        front.work->wait(ToChrono(options_.timeout));
      } catch (const std::exception& e) {
        error = Cause(e);
      }
      absl::MutexLock lock(&mu_);
      if (!error.empty()) {
        if (!stopping_) {
          FailLocked(absl::UnavailableError(absl::StrCat(
              options_.label, ": receive from ", PeerName(ch->peer), " (tag ",
              front.tag, ") failed: ", error)));
        }
        return;
      }
      stats_.bytes_received += front.buffer.numel();
      stats_.recv_seconds += absl::ToDoubleSeconds(absl::Now() - front.posted);
      ch->ready[front.tag] = front.buffer;
      ch->inflight.pop_front();
    }
  }

  // Constant after Connect().
  const GlooTransportOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::vector<c10::intrusive_ptr<c10d::ProcessGroupGloo>> groups_;
  // One per entry of groups_: the flat buffer its all-reduces run in.
  struct GroupBuffer {
    absl::Mutex mu;
    at::Tensor flat ABSL_GUARDED_BY(mu);
  };
  std::vector<std::unique_ptr<GroupBuffer>> buffers_;

  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int, std::unique_ptr<SendChannel>> sends_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::unique_ptr<RecvChannel>> recvs_ ABSL_GUARDED_BY(mu_);
  TransportStats stats_ ABSL_GUARDED_BY(mu_);
};

class TcpStoreServer : public StoreServer {
 public:
  explicit TcpStoreServer(c10::intrusive_ptr<c10d::TCPStore> store)
      : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    try {
      store_->wait({key}, ToChrono(timeout));
      auto v = store_->get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(
          absl::StrCat("store key '", key, "' not set: ", Cause(e)));
    }
  }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateGlooTransport(
    const GlooTransportOptions& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options.rank, " out of range for world size ",
        options.world_size));
  }
  auto t = std::make_unique<GlooTransport>(options);
  if (absl::Status s = t->Connect(); !s.ok()) return s;
  return std::unique_ptr<Transport>(std::move(t));
}

absl::Status CheckTransportHost(const std::string& host) {
  return DeviceFor(host).status();
}

absl::StatusOr<std::unique_ptr<StoreServer>> StartStoreServer(
    const std::string& host) {
  try {
    c10d::TCPStoreOptions so;
    so.port = 0;
    so.isServer = true;
    so.waitWorkers = false;
    auto store = c10::make_intrusive<c10d::TCPStore>(host, so);
    return std::unique_ptr<StoreServer>(new TcpStoreServer(store));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot start a TCPStore on ", host, ": ", Cause(e)));
  }
}

absl::Status PutToStore(const std::string& host, int port,
                        const std::string& key, const std::string& value) {
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = false;
    so.timeout = std::chrono::seconds(30);
    c10d::TCPStore store(host, so);
    store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot write '", key, "' to store ", host, ":", port, ": ", Cause(e)));
  }
  return absl::OkStatus();
}

WirePrecision WirePrecisionFor(const apapo::v1::JobSpec& spec) {
  return spec.schedule().transfer_precision() ==
                 apapo::v1::TRANSFER_PRECISION_BFLOAT16
             ? WirePrecision::kBFloat16
             : WirePrecision::kFloat32;
}

namespace {

// Bytes one element of `dtype` takes on the wire.
int64_t WireElementSize(DType dtype, WirePrecision wire) {
  if (dtype == DType::kFloat32 && wire == WirePrecision::kBFloat16) return 2;
  return ElementSize(dtype);
}

}  // namespace

int64_t BundleBytes(const std::vector<BundleEntry>& entries, int64_t batch,
                    WirePrecision wire) {
  int64_t total = 0;
  for (const BundleEntry& e : entries) {
    int64_t n = batch;
    for (int64_t d : e.sample_shape) n *= d;
    total += Align8(n * WireElementSize(e.dtype, wire));
  }
  return total;
}

at::Tensor PackBundle(const std::vector<at::Tensor>& tensors,
                      WirePrecision wire) {
  torch::NoGradGuard no_grad;
  // The type each tensor travels in.
  auto wire_type = [wire](const at::Tensor& t) {
    return wire == WirePrecision::kBFloat16 && t.scalar_type() == torch::kFloat
               ? torch::kBFloat16
               : t.scalar_type();
  };
  int64_t total = 0;
  for (const auto& t : tensors) {
    total += Align8(t.numel() * static_cast<int64_t>(c10::elementSize(wire_type(t))));
  }
  // Each tensor is copied once, straight into its place in the message
  // (rounded on the way where `wire` asks); only the padding is zeroed.
  at::Tensor out = torch::empty({total}, torch::kUInt8);
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const at::ScalarType type = wire_type(t);
    const int64_t nbytes = t.numel() * static_cast<int64_t>(c10::elementSize(type));
    out.narrow(0, offset, nbytes).view(type).view(t.sizes()).copy_(t.detach());
    const int64_t padded = Align8(nbytes);
    if (padded > nbytes) out.narrow(0, offset + nbytes, padded - nbytes).zero_();
    offset += padded;
  }
  return out;
}

absl::StatusOr<std::vector<at::Tensor>> UnpackBundle(
    const at::Tensor& bytes, const std::vector<BundleEntry>& entries,
    int64_t batch, WirePrecision wire) {
  const int64_t want = BundleBytes(entries, batch, wire);
  if (bytes.numel() != want) {
    return absl::InternalError(absl::StrCat("bundle has ", bytes.numel(),
                                            " bytes, expected ", want));
  }
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const BundleEntry& e : entries) {
    std::vector<int64_t> shape{batch};
    shape.insert(shape.end(), e.sample_shape.begin(), e.sample_shape.end());
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t nbytes = n * WireElementSize(e.dtype, wire);
    at::Tensor raw = bytes.narrow(0, offset, nbytes);
    at::Tensor t;
    if (e.dtype == DType::kInt64) {
      t = raw.view(torch::kLong).view(shape);
    } else if (wire == WirePrecision::kBFloat16) {
      t = raw.view(torch::kBFloat16).view(shape).to(torch::kFloat);
    } else {
      t = raw.view(torch::kFloat).view(shape);
    }
    out.push_back(t);
    offset += Align8(nbytes);
  }
  return out;
}

}  // namespace worker
}  // namespace apapo
