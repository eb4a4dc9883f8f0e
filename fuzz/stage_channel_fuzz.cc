// libFuzzer target: the pipe from a stage or profiling child to its daemon
// (stage_channel.h), as the daemon reads it: bytes in arbitrary chunks, each
// frame's payload parsed as what its type says. A corrupt stream must end
// in a DATA_LOSS error, never a crash or an unbounded buffer.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "proto/apapo/v1/metrics.pb.h"
#include "proto/apapo/v1/worker.pb.h"
#include "worker/daemon/stage_channel.h"

using apapo::worker::FrameReader;
using apapo::worker::FrameType;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the chunk size the pipe delivers (1..256 bytes).
  const size_t chunk = static_cast<size_t>(data[0]) + 1;
  FrameReader reader;
  for (size_t at = 1; at < size; at += chunk) {
    reader.Append(reinterpret_cast<const char*>(data) + at, std::min(chunk, size - at));
    FrameType type;
    std::string payload;
    absl::Status error;
    while (reader.Next(&type, &payload, &error)) {
      switch (type) {
        case FrameType::kMetrics:
        case FrameType::kFinal: {
          apapo::v1::MetricsReport m;
          (void)m.ParseFromString(payload);
          break;
        }
        case FrameType::kProfile: {
          apapo::v1::ProfileResult p;
          (void)p.ParseFromString(payload);
          break;
        }
        case FrameType::kStatus:
          (void)apapo::worker::DecodeStatus(payload);
          break;
        default:
          std::abort();  // Next returned a type it should have refused
      }
    }
    if (!error.ok()) {
      if (error.code() != absl::StatusCode::kDataLoss) std::abort();
      return 0;  // the daemon kills the child here
    }
    // An incomplete frame is at most one header plus its payload limit.
    if (reader.pending() > 5 + apapo::worker::kMaxFramePayload) std::abort();
  }
  return 0;
}
