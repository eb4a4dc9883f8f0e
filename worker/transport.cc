#include "worker/transport.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
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

// The length a length-prefixed message starts with (ExpectRecvUpTo).
constexpr int64_t kLengthPrefixBytes = 8;

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
    RecvChannelFor(src).expected.push_back({tag, nbytes, false});
    return absl::OkStatus();
  }

  absl::Status ExpectRecvUpTo(int src, int64_t tag, int64_t max_bytes) override {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (absl::Status s = CheckPeer(src); !s.ok()) return s;
    if (max_bytes < kLengthPrefixBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          options_.label, ": a length-prefixed message needs at least ",
          kLengthPrefixBytes, " bytes, not ", max_bytes));
    }
    RecvChannelFor(src).expected.push_back({tag, max_bytes, true});
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
    if (absl::Status st = CheckGroup(group); !st.ok()) return st;
    if (!groups_[group] || tensors.empty()) return absl::OkStatus();
    const absl::Time start = absl::Now();
    GroupBuffer& buffer = *buffers_[group];
    absl::MutexLock buffer_lock(&buffer.mu);
    try {
      torch::NoGradGuard no_grad;
      // The group's buffer, kept from call to call: Gloo all-reduced a
      // buffer it had seen before 4-6 ms a call (4 MiB, two ranks, loopback),
      // a fresh one (torch::cat's, every call) 13-50 ms.
      CopyIn(tensors, buffer.flat);
      std::vector<at::Tensor> flat{buffer.flat};
      groups_[group]->allreduce(flat)->wait(ToChrono(options_.timeout));
      tensors = ViewsOf(buffer.flat, tensors);
    } catch (const std::exception& e) {
      return AllReduceFailed(group, e);
    }
    absl::MutexLock lock(&mu_);
    stats_.allreduce_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    return absl::OkStatus();
  }

  absl::Status StartAllReduceSum(int group,
                                 const std::vector<at::Tensor>& tensors) override {
    if (absl::Status st = CheckGroup(group); !st.ok()) return st;
    if (!groups_[group]) return absl::OkStatus();
    const absl::Time start = absl::Now();
    GroupBuffer& buffer = *buffers_[group];
    absl::MutexLock buffer_lock(&buffer.mu);
    const size_t k = buffer.started.size();
    if (buffer.parts.size() <= k) buffer.parts.resize(k + 1);
    try {
      torch::NoGradGuard no_grad;
      // A part's buffer is kept from iteration to iteration (see above).
      if (!tensors.empty()) CopyIn(tensors, buffer.parts[k]);
      Started part;
      part.like = tensors;
      if (!tensors.empty()) {
        std::vector<at::Tensor> flat{buffer.parts[k]};
        part.work = groups_[group]->allreduce(flat);
      }
      buffer.started.push_back(std::move(part));
    } catch (const std::exception& e) {
      return AllReduceFailed(group, e);
    }
    absl::MutexLock lock(&mu_);
    stats_.allreduce_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    return absl::OkStatus();
  }

  bool AllReduceSumsDone(int group) override {
    if (!CheckGroup(group).ok() || !groups_[group]) return true;
    GroupBuffer& buffer = *buffers_[group];
    absl::MutexLock buffer_lock(&buffer.mu);
    for (const Started& part : buffer.started) {
      if (part.work && !part.work->isCompleted()) return false;
    }
    return true;
  }

  absl::StatusOr<std::vector<std::vector<at::Tensor>>> FinishAllReduceSums(
      int group) override {
    if (absl::Status st = CheckGroup(group); !st.ok()) return st;
    std::vector<std::vector<at::Tensor>> sums;
    if (!groups_[group]) return sums;
    const absl::Time start = absl::Now();
    GroupBuffer& buffer = *buffers_[group];
    absl::MutexLock buffer_lock(&buffer.mu);
    std::vector<Started> started = std::move(buffer.started);
    buffer.started.clear();
    try {
      for (size_t k = 0; k < started.size(); ++k) {
        if (started[k].work) started[k].work->wait(ToChrono(options_.timeout));
        sums.push_back(started[k].like.empty()
                           ? std::vector<at::Tensor>()
                           : ViewsOf(buffer.parts[k], started[k].like));
      }
    } catch (const std::exception& e) {
      return AllReduceFailed(group, e);
    }
    absl::MutexLock lock(&mu_);
    stats_.allreduce_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    return sums;
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
  struct Expected {
    int64_t tag;
    int64_t bytes;  // the size, or the most a length-prefixed one takes
    bool length_prefixed;
  };
  struct Posted {
    int64_t tag;
    bool length_prefixed;
    at::Tensor buffer;
    c10::intrusive_ptr<c10d::Work> work;
    absl::Time posted;
  };
  struct RecvChannel {
    int peer = 0;
    std::deque<Expected> expected;
    std::deque<Posted> inflight;
    absl::flat_hash_map<int64_t, at::Tensor> ready;
    int outstanding = 0;  // posted and not yet returned by Recv()
    std::thread thread;
  };

  absl::Status CheckGroup(int group) const {
    {
      absl::MutexLock lock(&mu_);
      if (!failure_.ok()) return failure_;
    }
    if (group < 0 || group >= static_cast<int>(groups_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(options_.label, ": no replica group ", group));
    }
    return absl::OkStatus();
  }

  // Copies `tensors` end to end into `flat`, (re)made when its size or
  // dtype does not fit.
  static void CopyIn(const std::vector<at::Tensor>& tensors, at::Tensor& flat) {
    int64_t total = 0;
    for (const auto& t : tensors) total += t.numel();
    const at::TensorOptions like = tensors.front().options();
    if (!flat.defined() || flat.numel() != total ||
        flat.options().dtype() != like.dtype()) {
      flat = torch::empty({total}, like);
    }
    int64_t offset = 0;
    for (const auto& t : tensors) {
      flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
      offset += t.numel();
    }
  }

  // Views of `flat` shaped as `like`, end to end.
  static std::vector<at::Tensor> ViewsOf(const at::Tensor& flat,
                                         const std::vector<at::Tensor>& like) {
    std::vector<at::Tensor> out;
    int64_t offset = 0;
    for (const auto& t : like) {
      const int64_t n = t.numel();
      out.push_back(flat.narrow(0, offset, n).view(t.sizes()));
      offset += n;
    }
    return out;
  }

  absl::Status AllReduceFailed(int group, const std::exception& e) {
    absl::MutexLock lock(&mu_);
    FailLocked(absl::UnavailableError(
        absl::StrCat(options_.label, ": gradient all-reduce in replica group ",
                     group, " failed: ", Cause(e))));
    return failure_;
  }

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
            const Expected e = ch->expected.front();
            ch->expected.pop_front();
            Posted p{e.tag, e.length_prefixed,
                     torch::empty({e.bytes}, torch::kUInt8), {}, absl::Now()};
            std::vector<at::Tensor> v{p.buffer};
            p.work = pg_->recv(v, ch->peer, static_cast<int>(e.tag));
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
      if (front.length_prefixed) {
        // Gloo fills a posted buffer with a shorter message and leaves the
        // rest as it was; the message's own length says how much came.
        int64_t length = 0;
        std::memcpy(&length, front.buffer.data_ptr<uint8_t>(), sizeof(length));
        if (length < kLengthPrefixBytes || length > front.buffer.numel()) {
          FailLocked(absl::DataLossError(absl::StrCat(
              options_.label, ": message from ", PeerName(ch->peer), " (tag ",
              front.tag, ") gives its length as ", length,
              " bytes; it was posted for ", kLengthPrefixBytes, " to ",
              front.buffer.numel())));
          return;
        }
        front.buffer = front.buffer.narrow(0, 0, length);
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
  // One per entry of groups_: the buffers its all-reduces run in.
  // A part started by StartAllReduceSum: the tensors it was given (their
  // shapes, for the views FinishAllReduceSums returns) and its sum.
  struct Started {
    std::vector<at::Tensor> like;
    c10::intrusive_ptr<c10d::Work> work;  // null for an empty part
  };
  struct GroupBuffer {
    absl::Mutex mu;
    at::Tensor flat ABSL_GUARDED_BY(mu);
    // StartAllReduceSum's buffers, by position since the last finish.
    std::vector<at::Tensor> parts ABSL_GUARDED_BY(mu);
    std::vector<Started> started ABSL_GUARDED_BY(mu);
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

namespace {

// A float's bits on the wire (float32 or bfloat16) with its sign masked
// off: zero for +0 and -0 only.
template <typename Bits>
struct WireBits;
template <>
struct WireBits<uint32_t> {
  static constexpr uint32_t kMagnitude = 0x7fffffffu;
  static float Widen(uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    return f;
  }
};
template <>
struct WireBits<uint16_t> {
  static constexpr uint16_t kMagnitude = 0x7fffu;
  static float Widen(uint16_t b) {
    const uint32_t wide = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &wide, sizeof(f));
    return f;
  }
};

// `t` (float32) as it travels: float32, or rounded to bfloat16.
at::Tensor OnWire(const at::Tensor& t, WirePrecision wire) {
  at::Tensor w = t.detach();
  if (wire == WirePrecision::kBFloat16) w = w.to(torch::kBFloat16);
  return w.contiguous();
}

int64_t Numel(const BundleEntry& e, int64_t batch) {
  int64_t n = batch;
  for (int64_t d : e.sample_shape) n *= d;
  return n;
}

// The loops below are branch-free: a ReLU's zeros fall at random, and
// branching on them mispredicts about every other value.

// Writes the mask bits of `src`'s nonzeros at `bits` (n bits, zero
// padded to whole bytes) and their values at `values` (room for n: each
// value is written, and kept by advancing past it); fills `mask`.
// Returns how many values it kept.
template <typename Bits>
int64_t PackNonzeros(const Bits* src, int64_t n, uint8_t* bits, bool* mask,
                     Bits* values) {
  int64_t k = 0;
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int64_t end = std::min<int64_t>(n, i0 + 8);
    uint8_t byte = 0;
    for (int64_t i = i0; i < end; ++i) {
      const Bits b = src[i];
      const bool nonzero = (b & WireBits<Bits>::kMagnitude) != 0;
      mask[i] = nonzero;
      byte |= static_cast<uint8_t>(nonzero) << (i - i0);
      values[k] = b;
      k += nonzero;
    }
    bits[i0 >> 3] = byte;
  }
  return k;
}

// Writes `src`'s values where `mask` is set (room for n, as above);
// returns how many it kept.
template <typename Bits>
int64_t PackMasked(const Bits* src, int64_t n, const bool* mask, Bits* values) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    values[k] = src[i];
    k += mask[i];
  }
  return k;
}

// out[i] = the next of the `count` values where mask[i], else 0.
template <typename Bits>
void Scatter(const Bits* values, int64_t count, int64_t n, const bool* mask,
             float* out) {
  if (count == 0) {
    std::fill(out, out + n, 0.0f);
    return;
  }
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = WireBits<Bits>::Widen(values[std::min(k, count - 1)]);
    out[i] = mask[i] ? v : 0.0f;
    k += mask[i];
  }
}

int64_t WireSize(WirePrecision wire) {
  return wire == WirePrecision::kBFloat16 ? 2 : 4;
}

}  // namespace

bool AnySkipsZeros(const std::vector<BundleEntry>& entries) {
  for (const BundleEntry& e : entries) {
    if (e.skip_zeros) return true;
  }
  return false;
}

int64_t SkipZerosCapacity(const std::vector<BundleEntry>& entries,
                          int64_t batch, WirePrecision wire, BundleKind kind) {
  int64_t total = kLengthPrefixBytes;
  for (const BundleEntry& e : entries) {
    const int64_t n = Numel(e, batch);
    total += Align8(n * WireElementSize(e.dtype, wire));
    if (e.skip_zeros && kind == BundleKind::kActivations) total += Align8((n + 7) / 8);
  }
  return total;
}

at::Tensor PackSkippingZeros(const std::vector<at::Tensor>& tensors,
                             const std::vector<BundleEntry>& entries,
                             WirePrecision wire, BundleKind kind,
                             std::vector<at::Tensor>& masks) {
  torch::NoGradGuard no_grad;
  const bool activations = kind == BundleKind::kActivations;
  if (activations) masks.assign(entries.size(), at::Tensor());
  const int64_t batch = tensors.empty() ? 0 : tensors[0].size(0);
  at::Tensor out =
      torch::empty({SkipZerosCapacity(entries, batch, wire, kind)}, torch::kUInt8);
  uint8_t* base = out.data_ptr<uint8_t>();
  int64_t offset = kLengthPrefixBytes;
  // Zeroes the padding after `used` bytes at `offset` and moves past it.
  auto advance = [&](int64_t used) {
    const int64_t padded = Align8(used);
    if (padded > used) std::memset(base + offset + used, 0, padded - used);
    offset += padded;
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const int64_t n = t.numel();
    if (!entries[i].skip_zeros || t.scalar_type() != torch::kFloat) {
      const at::ScalarType type =
          t.scalar_type() == torch::kFloat && wire == WirePrecision::kBFloat16
              ? torch::kBFloat16
              : t.scalar_type();
      const int64_t nbytes = n * static_cast<int64_t>(c10::elementSize(type));
      out.narrow(0, offset, nbytes).view(type).view(t.sizes()).copy_(t.detach());
      advance(nbytes);
      continue;
    }
    const at::Tensor w = OnWire(t, wire);
    int64_t k = 0;
    if (activations) {
      at::Tensor mask = torch::empty(t.sizes(), torch::kBool);
      uint8_t* bits = base + offset;
      advance((n + 7) / 8);
      if (wire == WirePrecision::kBFloat16) {
        k = PackNonzeros(static_cast<const uint16_t*>(w.data_ptr()), n, bits,
                         mask.data_ptr<bool>(),
                         reinterpret_cast<uint16_t*>(base + offset));
      } else {
        k = PackNonzeros(static_cast<const uint32_t*>(w.data_ptr()), n, bits,
                         mask.data_ptr<bool>(),
                         reinterpret_cast<uint32_t*>(base + offset));
      }
      masks[i] = std::move(mask);
    } else {
      const at::Tensor mask = masks.at(i).contiguous();
      if (wire == WirePrecision::kBFloat16) {
        k = PackMasked(static_cast<const uint16_t*>(w.data_ptr()), n,
                       mask.data_ptr<bool>(),
                       reinterpret_cast<uint16_t*>(base + offset));
      } else {
        k = PackMasked(static_cast<const uint32_t*>(w.data_ptr()), n,
                       mask.data_ptr<bool>(),
                       reinterpret_cast<uint32_t*>(base + offset));
      }
    }
    advance(k * WireSize(wire));
  }
  std::memcpy(base, &offset, sizeof(offset));
  return out.narrow(0, 0, offset);
}

absl::StatusOr<std::vector<at::Tensor>> UnpackSkippingZeros(
    const at::Tensor& bytes, const std::vector<BundleEntry>& entries,
    int64_t batch, WirePrecision wire, BundleKind kind,
    std::vector<at::Tensor>& masks) {
  const bool activations = kind == BundleKind::kActivations;
  if (activations) masks.assign(entries.size(), at::Tensor());
  if (masks.size() != entries.size()) {
    return absl::InternalError(absl::StrCat("bundle of ", entries.size(),
                                            " entries given ", masks.size(),
                                            " masks"));
  }
  const int64_t size = bytes.numel();
  const uint8_t* base = bytes.data_ptr<uint8_t>();
  int64_t length = 0;
  if (size >= kLengthPrefixBytes) std::memcpy(&length, base, sizeof(length));
  if (size < kLengthPrefixBytes || length != size) {
    return absl::InternalError(absl::StrCat("bundle of ", size,
                                            " bytes gives its length as ", length));
  }
  std::vector<at::Tensor> out;
  int64_t offset = kLengthPrefixBytes;
  // Claims `nbytes` (padded) at `offset`; fails past the end.
  auto take = [&](int64_t nbytes, const BundleEntry& e) -> absl::StatusOr<int64_t> {
    const int64_t start = offset;
    if (start + Align8(nbytes) > size) {
      return absl::InternalError(absl::StrCat(
          "bundle of ", size, " bytes ends inside entry '", e.name, "'"));
    }
    offset += Align8(nbytes);
    return start;
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    const BundleEntry& e = entries[i];
    std::vector<int64_t> shape{batch};
    shape.insert(shape.end(), e.sample_shape.begin(), e.sample_shape.end());
    const int64_t n = Numel(e, batch);
    if (!e.skip_zeros || e.dtype != DType::kFloat32) {
      auto pos = take(n * WireElementSize(e.dtype, wire), e);
      if (!pos.ok()) return pos.status();
      at::Tensor raw = bytes.narrow(0, *pos, n * WireElementSize(e.dtype, wire));
      if (e.dtype == DType::kInt64) {
        out.push_back(raw.view(torch::kLong).view(shape));
      } else if (wire == WirePrecision::kBFloat16) {
        out.push_back(raw.view(torch::kBFloat16).view(shape).to(torch::kFloat));
      } else {
        out.push_back(raw.view(torch::kFloat).view(shape));
      }
      continue;
    }
    at::Tensor mask;
    if (activations) {
      auto pos = take((n + 7) / 8, e);
      if (!pos.ok()) return pos.status();
      const uint8_t* bits = base + *pos;
      mask = torch::empty(shape, torch::kBool);
      bool* m = mask.data_ptr<bool>();
      for (int64_t j = 0; j < n; ++j) m[j] = (bits[j >> 3] >> (j & 7)) & 1;
      if ((n & 7) != 0 && (bits[n >> 3] >> (n & 7)) != 0) {
        return absl::InternalError(
            absl::StrCat("entry '", e.name, "' has mask bits past its ", n, " values"));
      }
      masks[i] = mask;
    } else {
      mask = masks[i].defined() ? masks[i].contiguous() : at::Tensor();
      if (!mask.defined() || mask.numel() != n || mask.scalar_type() != torch::kBool) {
        return absl::InternalError(
            absl::StrCat("entry '", e.name, "' has no mask of its ", n, " values"));
      }
    }
    const int64_t k = mask.sum().item<int64_t>();
    auto pos = take(k * WireSize(wire), e);
    if (!pos.ok()) return pos.status();
    at::Tensor full = torch::empty(shape, torch::kFloat);
    if (wire == WirePrecision::kBFloat16) {
      Scatter(reinterpret_cast<const uint16_t*>(base + *pos), k, n,
              mask.data_ptr<bool>(), full.data_ptr<float>());
    } else {
      Scatter(reinterpret_cast<const uint32_t*>(base + *pos), k, n,
              mask.data_ptr<bool>(), full.data_ptr<float>());
    }
    out.push_back(std::move(full));
  }
  if (offset != size) {
    return absl::InternalError(absl::StrCat("bundle of ", size, " bytes has ",
                                            size - offset, " bytes past its entries"));
  }
  return out;
}

}  // namespace worker
}  // namespace apapo
