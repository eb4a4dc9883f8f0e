#include "worker/daemon/cgroup.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace apapo::worker {
namespace {

bool Lists(absl::string_view comma_separated, absl::string_view item) {
  for (absl::string_view c : absl::StrSplit(comma_separated, ',')) {
    if (c == item) return true;
  }
  return false;
}

// The folders from `cgroup` up to `mount_point`, nearest first.
std::vector<std::string> FoldersUp(const std::string& mount_point,
                                   const std::string& mount_root,
                                   const std::string& cgroup) {
  std::string rel;
  if (mount_root == "/") {
    rel = cgroup;
  } else if (absl::StartsWith(cgroup, mount_root) &&
             (cgroup.size() == mount_root.size() || cgroup[mount_root.size()] == '/')) {
    rel = cgroup.substr(mount_root.size());
  }
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(rel, '/', absl::SkipEmpty())) {
    if (part == "." || part == "..") return {mount_point};
    parts.emplace_back(part);
  }
  std::vector<std::string> folders;
  for (size_t n = parts.size() + 1; n-- > 0;) {
    std::string f = mount_point == "/" ? "" : mount_point;
    for (size_t i = 0; i < n; ++i) absl::StrAppend(&f, "/", parts[i]);
    folders.push_back(f.empty() ? "/" : f);
  }
  return folders;
}

std::string ReadAll(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::vector<CgroupFolder> CgroupFolders(absl::string_view mountinfo,
                                        absl::string_view proc_cgroup,
                                        absl::string_view controller) {
  // "ID:cpu,cpuacct:/path" per v1 hierarchy, "0::/path" for v2.
  std::optional<std::string> v1_path, v2_path;
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3 || f[2].empty() || f[2][0] != '/') continue;
    if (f[0] == "0" && f[1].empty()) {
      v2_path = std::string(f[2]);
    } else if (Lists(f[1], controller)) {
      v1_path = std::string(f[2]);
    }
  }
  std::vector<CgroupFolder> folders;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER"
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 6 || dash - f.begin() < 6 || f.end() - dash < 4) continue;
    const bool v2 = dash[1] == "cgroup2";
    const std::optional<std::string>& path = v2 ? v2_path : v1_path;
    if (!path.has_value() || f[4].empty() || f[4][0] != '/' ||
        !(v2 || (dash[1] == "cgroup" && Lists(dash[3], controller)))) {
      continue;
    }
    for (std::string& folder : FoldersUp(std::string(f[4]), std::string(f[3]), *path)) {
      folders.push_back({std::move(folder), v2});
    }
  }
  return folders;
}

std::vector<CgroupFolder> ThisProcessCgroupFolders(absl::string_view controller) {
  return CgroupFolders(ReadAll("/proc/self/mountinfo"), ReadAll("/proc/self/cgroup"),
                       controller);
}

std::optional<std::string> ReadCgroupFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text(4096, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace apapo::worker
