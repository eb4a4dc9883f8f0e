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

// A limit of `quota` over `period` (the same unit) in cores; 0 for none.
double Cores(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<double>(quota) / static_cast<double>(period);
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

double CpuQuota(const std::vector<CgroupFolder>& folders, const CgroupReader& read) {
  double quota = 0;
  for (const CgroupFolder& f : folders) {
    const double q =
        f.v2 ? ParseCpuMax(read(f.path + "/cpu.max").value_or(""))
             : ParseCfsQuota(read(f.path + "/cpu.cfs_quota_us").value_or(""),
                             read(f.path + "/cpu.cfs_period_us").value_or(""));
    if (q > 0 && (quota == 0 || q < quota)) quota = q;
  }
  return quota;
}

double ThisProcessCpuQuota() {
  return CpuQuota(ThisProcessCgroupFolders("cpu"), ReadCgroupFile);
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
