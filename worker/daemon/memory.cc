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

std::optional<int64_t> CgroupHeadroom(
    absl::string_view proc_self_cgroup,
    const std::function<std::optional<std::string>(const std::string&)>& read) {
  std::string path;
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    if (absl::ConsumePrefix(&line, "0::")) path = std::string(absl::StripAsciiWhitespace(line));
  }
  if (path.empty()) return std::nullopt;  // cgroup v1 or none
  std::optional<int64_t> headroom;
  while (true) {
    const std::string dir = path == "/" ? "" : path;
    std::optional<std::string> max = read(dir + "/memory.max");
    std::optional<int64_t> limit = Number(max);  // "max" (no limit) parses as none
    if (limit.has_value()) {
      const int64_t used = Number(read(dir + "/memory.current")).value_or(0);
      const int64_t room = std::max<int64_t>(0, *limit - used);
      headroom = headroom.has_value() ? std::min(*headroom, room) : room;
    }
    if (path == "/" || path.empty()) break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return headroom;
}

int64_t AvailableMemoryBytes() {
  int64_t bytes = ParseMemAvailable(ReadFile("/proc/meminfo").value_or("")).value_or(0);
  std::optional<int64_t> headroom = CgroupHeadroom(
      ReadFile("/proc/self/cgroup").value_or(""),
      [](const std::string& relative) { return ReadFile("/sys/fs/cgroup" + relative); });
  if (headroom.has_value()) bytes = bytes > 0 ? std::min(bytes, *headroom) : *headroom;
  return bytes;
}

}  // namespace apapo::worker
