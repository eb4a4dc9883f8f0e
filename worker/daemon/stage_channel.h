// The pipe protocol between the worker daemon and a stage child process
// (TorchJobRunner forks the worker binary in its hidden --run_assignment
// mode). The child writes frames to the pipe that replaced its stdout; the
// daemon reads them on the thread that waits for the child.
//
// A frame is one type byte, a 4-byte little-endian payload length and the
// payload:
//   kMetrics  a serialized MetricsReport (progress while training)
//   kFinal    the serialized final MetricsReport (StageExecutor::Report)
//   kStatus   the stage's outcome: EncodeStatus() of an absl::Status; the
//             last frame a child writes.
//
// Thread-safety: WriteFrame is safe from several threads if they share a
// FrameWriter (it holds a mutex); FrameReader is not thread-safe.
#ifndef APAPO_WORKER_DAEMON_STAGE_CHANNEL_H_
#define APAPO_WORKER_DAEMON_STAGE_CHANNEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace apapo::worker {

// kProfile: a serialized ProfileResult (a profiling child's one result).
enum class FrameType : uint8_t { kMetrics = 1, kFinal = 2, kStatus = 3, kProfile = 4 };

// Largest payload accepted; a longer length means a corrupt stream.
inline constexpr uint32_t kMaxFramePayload = 64 << 20;

// Writes frames to a file descriptor (blocking; retries short writes and
// EINTR).
class FrameWriter {
 public:
  explicit FrameWriter(int fd) : fd_(fd) {}
  absl::Status Write(FrameType type, absl::string_view payload);

 private:
  const int fd_;
  absl::Mutex mu_;
};

// Splits a byte stream into frames.
class FrameReader {
 public:
  void Append(const char* data, size_t size) { buffer_.append(data, size); }
  // Returns true and one complete frame if there is one. A corrupt header
  // (unknown type, oversized length) sets *error and returns false.
  bool Next(FrameType* type, std::string* payload, absl::Status* error);
  // Bytes of an incomplete frame still buffered.
  size_t pending() const { return buffer_.size(); }

 private:
  std::string buffer_;
};

// A Status as bytes and back (4-byte code, then the message).
std::string EncodeStatus(const absl::Status& status);
absl::Status DecodeStatus(absl::string_view bytes);

// What an exception that escaped a thread of a child process means, from
// its what(): DATA_LOSS for Gloo refusing a peer's message longer than the
// buffer posted for it (it throws that in its I/O thread, where nothing can
// catch it), else INTERNAL; the message quotes what().
absl::Status EscapedExceptionStatus(absl::string_view what);

// From here on, an exception no thread catches (std::terminate) ends this
// child process with exit code 1 after writing its EscapedExceptionStatus
// as the status frame to `writer` and one line naming `process` to stderr,
// instead of an abort the daemon could only report as SIGABRT. `writer`
// must outlive the process; the last call wins.
void ReportUncaughtExceptions(FrameWriter* writer, const char* process);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_STAGE_CHANNEL_H_
