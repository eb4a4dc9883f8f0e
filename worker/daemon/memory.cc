#include "worker/daemon/memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace apapo::worker {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<int64_t> Number(const std::optional<std::string>& text) {
  if (!text.has_value()) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) return std::nullopt;
  return value;
}

// The value of `key` in a memory.stat text ("key value" lines); 0 if absent.
int64_t StatField(absl::string_view stat, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(stat, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, " ")) continue;
    int64_t value = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &value) && value > 0) return value;
  }
  return 0;
}

}  // namespace

std::optional<int64_t> ParseMemAvailable(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (!parts.empty() && absl::SimpleAtoi(parts[0], &kib)) return kib * 1024;
  }
  return std::nullopt;
}

std::optional<int64_t> CgroupHeadroom(const std::vector<CgroupFolder>& folders,
                                      const CgroupReader& read) {
  std::optional<int64_t> headroom;
  for (const CgroupFolder& f : folders) {
    // v2's "max" (no limit) parses as none.
    std::optional<int64_t> limit =
        Number(read(f.path + (f.v2 ? "/memory.max" : "/memory.limit_in_bytes")));
    if (!limit.has_value() || (!f.v2 && *limit >= (int64_t{1} << 62))) continue;
    // The usage counts the page cache; its inactive files are what the
    // kernel reclaims first, as kubelet's working set leaves them out.
    const int64_t usage =
        Number(read(f.path + (f.v2 ? "/memory.current" : "/memory.usage_in_bytes"))).value_or(0);
    const int64_t used = std::max<int64_t>(
        0, usage - StatField(read(f.path + "/memory.stat").value_or(""),
                             f.v2 ? "inactive_file" : "total_inactive_file"));
    const int64_t room = std::max<int64_t>(0, *limit - used);
    headroom = headroom.has_value() ? std::min(*headroom, room) : room;
  }
  return headroom;
}

int64_t AvailableMemoryBytes() {
  int64_t bytes = ParseMemAvailable(ReadFile("/proc/meminfo").value_or("")).value_or(0);
  std::optional<int64_t> headroom =
      CgroupHeadroom(ThisProcessCgroupFolders("memory"), ReadCgroupFile);
  if (headroom.has_value()) bytes = bytes > 0 ? std::min(bytes, *headroom) : *headroom;
  return bytes;
}

}  // namespace apapo::worker
