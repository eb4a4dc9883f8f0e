#include "worker/daemon/stage_channel.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace apapo::worker
