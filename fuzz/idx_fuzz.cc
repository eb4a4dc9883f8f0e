// libFuzzer target: an IDX data file (Fashion-MNIST's format) as the stage
// reads it from a data root, raw and gzip-compressed (through a memfd, so
// zlib's own reader is fuzzed too). It must load with dimensions that
// describe its bytes exactly, or fail with DATA_LOSS naming the file.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/data.h"

namespace {

void Check(const absl::StatusOr<apapo::worker::IdxFile>& f, const std::string& path) {
  if (!f.ok()) {
    if (f.status().message().find(path) == std::string::npos) std::abort();
    return;
  }
  uint64_t total = 1;
  for (int64_t d : f->dims) {
    if (d < 0) std::abort();
    total *= static_cast<uint64_t>(d);
  }
  if (total != f->bytes.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Check(apapo::worker::ParseIdx(bytes, "raw.idx"), "raw.idx");
  const int fd = memfd_create("idx", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (write(fd, data, size) == static_cast<ssize_t>(size)) {
    const std::string path = absl::StrCat("/proc/self/fd/", fd);
    Check(apapo::worker::ReadIdxGz(path), path);
  }
  close(fd);
  return 0;
}
