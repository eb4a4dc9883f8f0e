#include "worker/daemon/cores.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace apapo::worker {

namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::string text(256, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

// A limit of `quota` over `period` (the same unit) in cores; 0 for none.
double Cores(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<double>(quota) / static_cast<double>(period);
}

// Where one hierarchy holds this process: its mount point, the cgroup
// path the mount's root stands for, and the process's cgroup path.
struct Placement {
  std::string mount_point;
  std::string mount_root;
  std::string cgroup;
  bool v2 = false;
};

// The folders from the process's cgroup up to the mount point, nearest
// first. A cgroup outside the mount's root (another namespace's view)
// leaves only the mount point.
std::vector<std::string> FoldersUp(const Placement& p, const std::string& root) {
  std::string rel;
  if (p.mount_root == "/") {
    rel = p.cgroup;
  } else if (absl::StartsWith(p.cgroup, p.mount_root) &&
             (p.cgroup.size() == p.mount_root.size() ||
              p.cgroup[p.mount_root.size()] == '/')) {
    rel = p.cgroup.substr(p.mount_root.size());
  }
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(rel, '/', absl::SkipEmpty())) {
    // A path climbing out of its mount is not followed.
    if (part == "." || part == "..") return {root + p.mount_point};
    parts.emplace_back(part);
  }
  std::vector<std::string> folders;
  for (size_t n = parts.size() + 1; n-- > 0;) {
    std::string f = root + p.mount_point;
    for (size_t i = 0; i < n; ++i) absl::StrAppend(&f, "/", parts[i]);
    folders.push_back(std::move(f));
  }
  return folders;
}

}  // namespace

double ParseCpuMax(absl::string_view cpu_max) {
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::StripAsciiWhitespace(cpu_max), ' ', absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (f.size() != 2 || f[0] == "max" || !absl::SimpleAtoi(f[0], &quota) ||
      !absl::SimpleAtoi(f[1], &period)) {
    return 0;
  }
  return Cores(quota, period);
}

double ParseCfsQuota(absl::string_view quota_us, absl::string_view period_us) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(quota_us), &quota) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(period_us), &period)) {
    return 0;
  }
  return Cores(quota, period);
}

double CpuQuotaFrom(absl::string_view mountinfo, absl::string_view proc_cgroup,
                    const std::string& root) {
  // The process's cgroup per hierarchy: v1's "ID:cpu,cpuacct:/path" for
  // the cpu controller, v2's "0::/path".
  std::string v1_path, v2_path;
  bool has_v1 = false, has_v2 = false;
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[1].empty() && f[0] == "0") {
      v2_path = std::string(f[2]);
      has_v2 = true;
    } else {
      for (absl::string_view c : absl::StrSplit(f[1], ',')) {
        if (c == "cpu") {
          v1_path = std::string(f[2]);
          has_v1 = true;
        }
      }
    }
  }
  std::vector<Placement> placements;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER"
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 6 || dash == f.end() || f.end() - dash < 4) continue;
    const absl::string_view type = dash[1];
    Placement p;
    p.mount_root = std::string(f[3]);
    p.mount_point = std::string(f[4]);
    if (type == "cgroup2" && has_v2) {
      p.cgroup = v2_path;
      p.v2 = true;
      placements.push_back(std::move(p));
    } else if (type == "cgroup" && has_v1) {
      for (absl::string_view o : absl::StrSplit(dash[3], ',')) {
        if (o == "cpu") {
          p.cgroup = v1_path;
          placements.push_back(std::move(p));
          break;
        }
      }
    }
  }
  double quota = 0;
  for (const Placement& p : placements) {
    for (const std::string& folder : FoldersUp(p, root)) {
      const double q =
          p.v2 ? ParseCpuMax(ReadSmallFile(folder + "/cpu.max"))
               : ParseCfsQuota(ReadSmallFile(folder + "/cpu.cfs_quota_us"),
                               ReadSmallFile(folder + "/cpu.cfs_period_us"));
      if (q > 0 && (quota == 0 || q < quota)) quota = q;
    }
  }
  return quota;
}

double ThisProcessCpuQuota() {
  std::ifstream mi("/proc/self/mountinfo");
  std::stringstream mountinfo;
  mountinfo << mi.rdbuf();
  std::ifstream cg("/proc/self/cgroup");
  std::stringstream cgroup;
  cgroup << cg.rdbuf();
  return CpuQuotaFrom(mountinfo.str(), cgroup.str(), "");
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    absl::StrAppend(&out, cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

CoreSet MakeCoreSet(absl::string_view boot_id, std::vector<int> cpus) {
  boot_id = absl::StripAsciiWhitespace(boot_id);
  // A boot id is a UUID (36 characters); the cap keeps the set's id within
  // the 128 characters the coordinator accepts with a long CPU list cut.
  if (boot_id.empty() || boot_id.size() > 40 || cpus.empty()) return {};
  for (char c : boot_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') return {};
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  CoreSet set;
  set.size = static_cast<int>(cpus.size());
  std::string list = FormatCpuList(cpus);
  // Past 80 characters (a sparse mask of many CPUs) the list is cut; two
  // sets that differ only beyond it are taken for one, which errs on the
  // side of sharing.
  if (list.size() > 80) list = absl::StrCat(list.substr(0, 80), "...");
  set.id = absl::StrCat(boot_id, "/", list);
  return set;
}

CoreSet ThisProcessCores() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::stringstream boot;
  boot << in.rdbuf();
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (!in || sched_getaffinity(0, sizeof(mask), &mask) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  }
  return MakeCoreSet(boot.str(), std::move(cpus));
}

}  // namespace apapo::worker
