#include "worker/daemon/transfer_cpu_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace apapo {
namespace worker {
namespace {

absl::Status Errno(const char* call) {
  return absl::UnavailableError(
      absl::StrCat("transfer probe: ", call, ": ", std::strerror(errno)));
}

bool WriteAll(int fd, const uint8_t* data, int64_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, data, static_cast<size_t>(n), MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    data += k;
    n -= k;
  }
  return true;
}

bool ReadAll(int fd, uint8_t* data, int64_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, data, static_cast<size_t>(n), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    data += k;
    n -= k;
  }
  return true;
}

}  // namespace

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

absl::StatusOr<double> MeasureTransferCpu(int64_t bytes, int warmups,
                                          int timed) {
  if (bytes < 1 || bytes > kMaxTransferProbeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer probe: bytes ", bytes, " outside [1, ",
        kMaxTransferProbeBytes, "]"));
  }
  if (warmups < 0 || timed < 1 || warmups + timed > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer probe: ", warmups, " warm-ups and ", timed,
        " timed messages (timed >= 1, at most 64 in all)"));
  }
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return Errno("socket");
  absl::Cleanup close_listener = [listener] { ::close(listener); };
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("bind");
  }
  if (::listen(listener, 1) != 0) return Errno("listen");
  if (::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("getsockname");
  }
  const int sender = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sender < 0) return Errno("socket");
  absl::Cleanup close_sender = [sender] { ::close(sender); };
  if (::connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("connect");
  }
  const int receiver = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (receiver < 0) return Errno("accept");
  absl::Cleanup close_receiver = [receiver] { ::close(receiver); };
  const int one = 1;
  ::setsockopt(sender, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(receiver, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  const int total = warmups + timed;
  // The sender writes each message, then waits for its 1-byte
  // acknowledgement, so the timed span holds exactly the timed messages.
  bool sent_ok = true;
  std::thread send_thread([&] {
    const at::Tensor message = torch::ones({bytes}, torch::kUInt8);
    const uint8_t* data = message.data_ptr<uint8_t>();
    for (int i = 0; i < total && sent_ok; ++i) {
      uint8_t ack = 0;
      sent_ok = WriteAll(sender, data, bytes) && ReadAll(sender, &ack, 1);
    }
    // Unblocks a receiver still waiting if this side gave up.
    ::shutdown(sender, SHUT_RDWR);
  });
  double start = 0;
  bool received_ok = true;
  for (int i = 0; i < total && received_ok; ++i) {
    if (i == warmups) start = ProcessCpuSeconds();
    at::Tensor buffer = torch::empty({bytes}, torch::kUInt8);
    const uint8_t ack = 1;
    received_ok = ReadAll(receiver, buffer.data_ptr<uint8_t>(), bytes) &&
                  WriteAll(receiver, &ack, 1);
  }
  const double cpu = ProcessCpuSeconds() - start;
  if (!received_ok) ::shutdown(receiver, SHUT_RDWR);
  send_thread.join();
  if (!received_ok || !sent_ok) {
    return absl::UnavailableError(absl::StrCat(
        "transfer probe: the loopback connection broke after ", bytes,
        "-byte messages"));
  }
  return std::max(0.0, cpu) / (2.0 * static_cast<double>(bytes) * timed);
}

std::vector<int64_t> TransferProbeSizes(int64_t largest_message_bytes,
                                        int64_t reference_bytes) {
  if (reference_bytes < 1 || reference_bytes > kMaxTransferProbeBytes ||
      largest_message_bytes <= 2 * reference_bytes) {
    return {};
  }
  const int64_t top = std::min(largest_message_bytes, kMaxTransferProbeBytes);
  const int64_t middle = static_cast<int64_t>(
      std::sqrt(static_cast<double>(reference_bytes) * static_cast<double>(top)));
  return {reference_bytes, middle, top};
}

std::vector<apapo::v1::TransferCpuMeasurement> MeasureTransferCpuBySize(
    int64_t largest_message_bytes, int64_t reference_bytes) {
  std::vector<apapo::v1::TransferCpuMeasurement> out;
  for (int64_t bytes :
       TransferProbeSizes(largest_message_bytes, reference_bytes)) {
    absl::StatusOr<double> cpu = MeasureTransferCpu(bytes);
    if (!cpu.ok() || !(*cpu > 0) || !std::isfinite(*cpu)) {
      std::fprintf(stderr, "profiling: transfers of %lld bytes not timed: %s\n",
                   static_cast<long long>(bytes),
                   cpu.ok() ? "no CPU time measured"
                            : std::string(cpu.status().message()).c_str());
      if (bytes == reference_bytes) return {};
      continue;
    }
    apapo::v1::TransferCpuMeasurement m;
    m.set_message_bytes(bytes);
    m.set_cpu_seconds_per_byte(*cpu);
    out.push_back(m);
  }
  return out;
}

}  // namespace worker
}  // namespace apapo
