#include "worker/daemon/stage_channel.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace apapo::worker {
namespace {

void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return v;
}

absl::Status WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("writing to the daemon's pipe: ", std::strerror(errno)));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FrameWriter::Write(FrameType type, absl::string_view payload) {
  if (payload.size() > kMaxFramePayload) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", payload.size(), " bytes is too large"));
  }
  std::string frame(5, '\0');
  frame[0] = static_cast<char>(type);
  PutU32(static_cast<uint32_t>(payload.size()), &frame[1]);
  frame.append(payload.data(), payload.size());
  absl::MutexLock lock(&mu_);
  return WriteAll(fd_, frame.data(), frame.size());
}

bool FrameReader::Next(FrameType* type, std::string* payload,
                       absl::Status* error) {
  if (buffer_.size() < 5) return false;
  const uint8_t t = static_cast<uint8_t>(buffer_[0]);
  const uint32_t length = GetU32(&buffer_[1]);
  if (t < static_cast<uint8_t>(FrameType::kMetrics) ||
      t > static_cast<uint8_t>(FrameType::kProfile) ||
      length > kMaxFramePayload) {
    *error = absl::DataLossError(absl::StrCat(
        "corrupt frame from the stage process (type ", t, ", length ", length,
        ")"));
    return false;
  }
  if (buffer_.size() < 5 + static_cast<size_t>(length)) return false;
  *type = static_cast<FrameType>(t);
  payload->assign(buffer_, 5, length);
  buffer_.erase(0, 5 + static_cast<size_t>(length));
  return true;
}

std::string EncodeStatus(const absl::Status& status) {
  std::string out(4, '\0');
  PutU32(static_cast<uint32_t>(status.code()), &out[0]);
  out.append(status.message().data(), status.message().size());
  return out;
}

absl::Status DecodeStatus(absl::string_view bytes) {
  if (bytes.size() < 4) {
    return absl::DataLossError("truncated status from the stage process");
  }
  const uint32_t code = GetU32(bytes.data());
  if (code == 0) return absl::OkStatus();
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(
        absl::StrCat("unknown status code ", code, " from the stage process"));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), bytes.substr(4));
}

absl::Status EscapedExceptionStatus(absl::string_view what) {
  // One line, bounded: what() is a library's text, not ours.
  std::string text(what.substr(0, 400));
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  // gloo/transport/tcp/pair.cc enforces that a message fits the receive
  // posted for it ("op.preamble.length <= op.nbytes. 400 vs 40").
  if (absl::StrContains(text, "op.preamble.length <= op.nbytes")) {
    return absl::DataLossError(absl::StrCat(
        "a peer sent a message longer than the buffer this process posted for it; "
        "Gloo refused it in its I/O thread (",
        text, ")"));
  }
  return absl::InternalError(
      absl::StrCat("an exception escaped a thread of this process (", text, ")"));
}

namespace {

std::atomic<FrameWriter*> terminate_writer{nullptr};
std::atomic<const char*> terminate_process{"child process"};

[[noreturn]] void ReportTerminate() {
  absl::Status status = absl::InternalError(
      "std::terminate was called without an exception (a joinable thread "
      "destroyed, or a noexcept function threw)");
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      status = EscapedExceptionStatus(x.what());
    } catch (...) {
      status = absl::InternalError(
          "an exception of a type that is not std::exception escaped a thread of "
          "this process");
    }
  }
  std::fprintf(stderr, "apapo-worker %s: %s\n", terminate_process.load(),
               status.ToString().c_str());
  std::fflush(stderr);
  if (FrameWriter* w = terminate_writer.load()) {
    (void)w->Write(FrameType::kStatus, EncodeStatus(status));
  }
  _exit(1);
}

}  // namespace

void ReportUncaughtExceptions(FrameWriter* writer, const char* process) {
  terminate_writer.store(writer);
  terminate_process.store(process);
  std::set_terminate(ReportTerminate);
}

}  // namespace apapo::worker
