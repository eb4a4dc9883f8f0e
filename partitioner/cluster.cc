#include "partitioner/cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace apapo {
namespace partitioner {

namespace {

// The value of `points` (ascending in bytes, not empty) at `bytes`: linear
// in log bytes between two points; the first point's below them, the
// last's above.
double InterpolateLogBytes(const std::vector<std::pair<double, double>>& points,
                           double bytes) {
  if (!(bytes > points.front().first)) return points.front().second;
  if (bytes >= points.back().first) return points.back().second;
  // The first point at or above the size (not the first: it is below).
  const auto at = std::lower_bound(
      points.begin(), points.end(), bytes,
      [](const std::pair<double, double>& p, double b) { return p.first < b; });
  const auto& [b0, f0] = *(at - 1);
  const auto& [b1, f1] = *at;
  const double t = std::log(bytes / b0) / std::log(b1 / b0);
  return f0 + t * (f1 - f0);
}

}  // namespace

double Cluster::TransferCpuPerByte(double message_bytes) const {
  if (!(transfer_cpu_seconds_per_byte > 0)) return 0;
  const auto& points = transfer_cpu_scale;
  if (points.empty()) return transfer_cpu_seconds_per_byte;
  double factor = InterpolateLogBytes(points, message_bytes);
  if (message_bytes > points.back().first && points.size() >= 2) {
    const auto& [b0, f0] = points[points.size() - 2];
    const auto& [b1, f1] = points.back();
    if (f1 > f0 && b1 > b0) {
      const double t = std::log(message_bytes / b1) / std::log(b1 / b0);
      factor = std::min(f1 + t * (f1 - f0), std::max(f1, kMaxTransferCpuFactor));
    }
  }
  return transfer_cpu_seconds_per_byte * factor;
}

double Cluster::AllReduceCpuShare(double bandwidth) const {
  return RingAllReduceCpuShare(bandwidth, allreduce_cpu_seconds_per_byte > 0
                                              ? allreduce_cpu_seconds_per_byte / 2
                                              : transfer_cpu_seconds_per_byte);
}

double Cluster::AllReduceFactor(double parameter_bytes) const {
  if (allreduce_factor.empty()) return 1;
  return InterpolateLogBytes(allreduce_factor, parameter_bytes);
}

double Cluster::AllReduceFactor(double parameter_bytes, int level) const {
  if (level >= 0 && level < static_cast<int>(allreduce_factor_by_level.size()) &&
      !allreduce_factor_by_level[level].empty()) {
    return InterpolateLogBytes(allreduce_factor_by_level[level], parameter_bytes);
  }
  return AllReduceFactor(parameter_bytes);
}

bool Cluster::allreduce_measured() const {
  if (!allreduce_factor.empty()) return true;
  for (const auto& points : allreduce_factor_by_level) {
    if (!points.empty()) return true;
  }
  return false;
}

int Cluster::num_workers() const {
  int64_t n = 1;
  for (const Level& level : levels) n *= level.fanout;
  return static_cast<int>(n);
}

bool Cluster::heterogeneous() const {
  for (double s : speeds) {
    if (s != speeds.front()) return true;
  }
  return false;
}

absl::StatusOr<double> ParseQuantity(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  double scale = 1;
  struct Suffix {
    const char* name;
    double scale;
  };
  static constexpr Suffix kSuffixes[] = {
      {"Ki", 1024.0},     {"Mi", 1048576.0}, {"Gi", 1073741824.0},
      {"Ti", 1099511627776.0}, {"K", 1e3},   {"M", 1e6},
      {"G", 1e9},         {"T", 1e12}};
  for (const Suffix& s : kSuffixes) {
    if (absl::ConsumeSuffix(&t, s.name)) {
      scale = s.scale;
      break;
    }
  }
  double value = 0;
  if (t.empty() || !absl::SimpleAtod(t, &value) || !std::isfinite(value) ||
      value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a non-negative number"));
  }
  return value * scale;
}

absl::StatusOr<Cluster> MakeCluster(int workers, absl::string_view levels,
                                    absl::string_view memory,
                                    absl::string_view speeds) {
  Cluster cluster;
  if (absl::StripAsciiWhitespace(levels).empty()) {
    if (workers <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workers must be >= 1, got ", workers));
    }
    cluster.levels.push_back(Level{workers, kDefaultBandwidth});
  } else {
    int64_t product = 1;
    for (absl::string_view item : absl::StrSplit(levels, ',')) {
      std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
      if (parts.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "level '", item, "' must be FANOUT:BANDWIDTH, e.g. 8:300e9"));
      }
      Level level;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]),
                            &level.fanout) ||
          level.fanout < 1 || level.fanout > 65536) {
        return absl::InvalidArgumentError(
            absl::StrCat("level '", item, "': fan-out must be 1..65536"));
      }
      absl::StatusOr<double> bw = ParseQuantity(parts[1]);
      if (!bw.ok() || *bw <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("level '", item, "': bandwidth must be > 0"));
      }
      level.bandwidth = *bw;
      product *= level.fanout;
      if (product > (1 << 20)) {
        return absl::InvalidArgumentError("more than 2^20 workers");
      }
      cluster.levels.push_back(level);
    }
    if (workers > 0 && product != workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--levels describe ", product, " workers but --workers=",
                       workers));
    }
  }
  if (!absl::StripAsciiWhitespace(memory).empty()) {
    absl::StatusOr<double> mem = ParseQuantity(memory);
    if (!mem.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--memory: ", mem.status().message()));
    }
    cluster.memory_bytes = *mem;
  }
  if (!absl::StripAsciiWhitespace(speeds).empty()) {
    for (absl::string_view item : absl::StrSplit(speeds, ',')) {
      int repeat = 1;
      absl::string_view value = item;
      std::vector<absl::string_view> parts = absl::StrSplit(item, '*');
      if (parts.size() == 2) {
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &repeat) ||
            repeat < 1 || repeat > (1 << 20)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--speeds item '", item, "': bad repeat count"));
        }
        value = parts[1];
      } else if (parts.size() > 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("--speeds item '", item, "' must be N*SPEED"));
      }
      double speed = 0;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(value), &speed) ||
          !std::isfinite(speed) || speed <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--speeds item '", item, "': speed must be > 0"));
      }
      if (cluster.speeds.size() + repeat > (1u << 20)) {
        return absl::InvalidArgumentError("--speeds lists too many workers");
      }
      cluster.speeds.insert(cluster.speeds.end(), repeat, speed);
    }
    if (static_cast<int>(cluster.speeds.size()) != cluster.num_workers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speeds lists ", cluster.speeds.size(),
                       " workers but the cluster has ", cluster.num_workers()));
    }
  }
  return cluster;
}

double RingAllReduceSeconds(double parameter_bytes, int replicas,
                            double bandwidth, double cpu_seconds_per_byte) {
  if (replicas <= 1 || parameter_bytes <= 0) return 0;
  const double moved = 2.0 * (replicas - 1) / replicas * parameter_bytes;
  const double per_byte = std::max(bandwidth > 0 ? 1.0 / bandwidth : 0.0,
                                   2.0 * cpu_seconds_per_byte);
  return moved * per_byte;
}

double RingAllReduceCpuShare(double bandwidth, double cpu_seconds_per_byte) {
  const double cpu = 2.0 * std::max(0.0, cpu_seconds_per_byte);
  const double per_byte = std::max(bandwidth > 0 ? 1.0 / bandwidth : 0.0, cpu);
  return per_byte > 0 ? std::min(1.0, cpu / per_byte) : 0.0;
}

std::string DescribeCluster(const Cluster& cluster) {
  std::string out;
  for (size_t i = 0; i < cluster.levels.size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", cluster.levels[i].fanout, ":",
                    cluster.levels[i].bandwidth);
  }
  absl::StrAppend(&out, " (", cluster.num_workers(), " workers)");
  if (cluster.memory_bytes > 0) {
    absl::StrAppend(&out, ", memory ", cluster.memory_bytes, " B");
  }
  if (cluster.heterogeneous()) absl::StrAppend(&out, ", heterogeneous");
  if (cluster.transfer_cpu_seconds_per_byte > 0) {
    absl::StrAppend(&out, ", transfers ",
                    cluster.transfer_cpu_seconds_per_byte * 1e9,
                    " ns of CPU per byte");
    if (!cluster.transfer_cpu_scale.empty()) {
      const auto& last = cluster.transfer_cpu_scale.back();
      absl::StrAppend(&out, " (x", last.second, " at ", last.first, " B)");
    }
  }
  for (const auto& [bytes, factor] : cluster.allreduce_factor) {
    absl::StrAppend(&out, ", all-reduce x", factor, " at ", bytes, " B");
  }
  for (size_t l = 0; l < cluster.allreduce_factor_by_level.size(); ++l) {
    for (const auto& [bytes, factor] : cluster.allreduce_factor_by_level[l]) {
      absl::StrAppend(&out, ", all-reduce inside level ", l, " x", factor, " at ", bytes,
                      " B");
    }
  }
  if (cluster.allreduce_window_factor < 1) {
    absl::StrAppend(&out, ", all-reduce window x", cluster.allreduce_window_factor);
  }
  return out;
}

int SpanLevel(const Cluster& cluster, const std::vector<int>& workers) {
  if (workers.empty()) return 0;
  int64_t group = 1;
  for (size_t l = 0; l < cluster.levels.size(); ++l) {
    group *= cluster.levels[l].fanout;
    bool same = true;
    for (int w : workers) {
      if (w / group != workers.front() / group) {
        same = false;
        break;
      }
    }
    if (same) return static_cast<int>(l);
  }
  return static_cast<int>(cluster.levels.size()) - 1;
}

}  // namespace partitioner
}  // namespace apapo
