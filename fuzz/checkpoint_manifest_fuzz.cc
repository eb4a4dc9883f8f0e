// libFuzzer target: a checkpoint manifest as read from disk (a shared
// volume another job or a crash may have left in any state). It must parse
// into a manifest whose every tensor lies within its data file, or fail with
// DATA_LOSS naming the file; what parses must write back to the same.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "worker/checkpoint_manifest.h"

using apapo::worker::CheckpointManifest;
using apapo::worker::ParseCheckpointManifest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<CheckpointManifest> m =
      ParseCheckpointManifest("/ckpt/step-1/stage-0.manifest", "/ckpt/step-1", text);
  if (!m.ok()) {
    if (m.status().code() != absl::StatusCode::kDataLoss ||
        m.status().message().find("/ckpt/step-1/stage-0.manifest") == std::string::npos) {
      std::abort();
    }
    return 0;
  }
  for (const auto& e : m->entries) {
    if (e.offset < 0 || e.bytes < 0 || e.offset > m->data_bytes ||
        e.bytes > m->data_bytes - e.offset || e.rows.begin < 0 ||
        e.rows.end > e.total_rows) {
      std::abort();  // the parser let an out-of-file tensor through
    }
  }
  // Round trip: what parsed, written again, parses to the same records.
  const std::string name = m->data_path.substr(m->data_path.rfind('/') + 1);
  absl::StatusOr<CheckpointManifest> again = ParseCheckpointManifest(
      "/ckpt/step-1/stage-0.manifest", "/ckpt/step-1",
      apapo::worker::CheckpointManifestText(*m, 0, name));
  if (!again.ok() || again->entries.size() != m->entries.size() ||
      again->data_bytes != m->data_bytes || again->step != m->step) {
    std::abort();
  }
  return 0;
}
