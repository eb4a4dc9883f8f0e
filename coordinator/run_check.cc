#include "coordinator/run_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planning/core_sharing.h"

namespace apapo::coordinator {
namespace {

double Clamp(double f) {
  return std::clamp(f, 1.0 / kMaxCalibration, kMaxCalibration);
}

// The training loop's seconds in a stage's counters.
double Accounted(const apapo::v1::StageMetrics& s) {
  return s.busy_seconds() + s.idle_seconds() + s.comm_exposed_seconds() +
         s.checkpoint_seconds();
}

std::string ScheduleWord(apapo::v1::ScheduleKind k) {
  switch (k) {
    case apapo::v1::SCHEDULE_KIND_ASYNC: return "async";
    case apapo::v1::SCHEDULE_KIND_2BW: return "2bw";
    case apapo::v1::SCHEDULE_KIND_GPIPE: return "gpipe";
    case apapo::v1::SCHEDULE_KIND_1F1B_FLUSH: return "1f1b_flush";
    case apapo::v1::SCHEDULE_KIND_DATA_PARALLEL: return "data parallel";
    default: return "unspecified";
  }
}

}  // namespace

double RunCheck::Error() const {
  return measured_samples_per_second > 0
             ? predicted_samples_per_second / measured_samples_per_second - 1
             : 0;
}

bool RunCheck::Within(double tolerance) const {
  // The printed figure rounds to nearest (ties to even), as nearbyint does.
  return std::abs(std::nearbyint(100 * Error())) <= std::nearbyint(100 * tolerance);
}

std::string RunCheck::Describe() const {
  std::vector<std::string> compute;
  for (const auto& [w, f] : compute_factor) {
    compute.push_back(absl::StrFormat("x%.2f on %s", f, w));
  }
  std::string s = absl::StrFormat(
      "measured %.1f samples/s over %d steps, predicted %.1f (%+.0f%%)",
      measured_samples_per_second, steps, predicted_samples_per_second, 100 * Error());
  if (!compute.empty()) absl::StrAppend(&s, "; compute ", absl::StrJoin(compute, ", "));
  if (allreduce_factor.has_value()) {
    absl::StrAppend(&s, absl::StrFormat("; all-reduce x%.2f", *allreduce_factor));
  }
  return s;
}

std::optional<RunCheck> CheckRun(
    const apapo::v1::Plan& plan, int batch_size,
    const std::map<std::string, apapo::v1::MetricsReport>& first,
    const std::map<std::string, apapo::v1::MetricsReport>& last) {
  RunCheck check;
  check.predicted_samples_per_second = plan.prediction().samples_per_second();
  double slowest = 0;
  int64_t steps = -1;
  std::vector<double> allreduce;
  for (const auto& st : plan.stages()) {
    for (const auto& p : st.placement()) {
      auto a = first.find(p.worker_id());
      auto b = last.find(p.worker_id());
      if (a == first.end() || b == last.end()) return std::nullopt;
      const apapo::v1::MetricsReport& r0 = a->second;
      const apapo::v1::MetricsReport& r1 = b->second;
      const int64_t n = r1.step() - r0.step();
      if (n <= 0 || r1.resumed_step() != r0.resumed_step()) return std::nullopt;
      const double accounted = Accounted(r1.stage()) - Accounted(r0.stage());
      const double busy = r1.stage().busy_seconds() - r0.stage().busy_seconds();
      const double exposed =
          r1.stage().comm_exposed_seconds() - r0.stage().comm_exposed_seconds();
      if (!(accounted > 0) || !(busy > 0) || !std::isfinite(accounted)) {
        return std::nullopt;
      }
      slowest = std::max(slowest, accounted / n);
      steps = steps < 0 ? n : std::min(steps, n);
      if (st.compute_seconds() > 0) {
        check.compute_factor[p.worker_id()] = Clamp(busy / n / st.compute_seconds());
      }
      if (st.replicas() > 1 && st.allreduce_seconds() > 0 && exposed >= 0) {
        allreduce.push_back(exposed / n / st.allreduce_seconds());
      }
    }
    if (st.replicas() > 1 && st.allreduce_seconds() > 0) {
      std::vector<std::string>& group = check.allreduce_groups.emplace_back();
      for (const auto& p : st.placement()) group.push_back(p.worker_id());
    }
  }
  if (steps <= 0 || !(slowest > 0)) return std::nullopt;
  check.steps = steps;
  check.measured_samples_per_second = std::max(1, batch_size) / slowest;
  if (!allreduce.empty()) {
    std::sort(allreduce.begin(), allreduce.end());
    const size_t n = allreduce.size();
    const double median =
        n % 2 ? allreduce[n / 2] : (allreduce[n / 2 - 1] + allreduce[n / 2]) / 2;
    check.allreduce_factor = Clamp(median);
  }
  return check;
}

std::map<std::string, apapo::v1::ProfileResult> CalibratedProfiles(
    const std::map<std::string, apapo::v1::ProfileResult>& profiles,
    const RunCheck& check, const std::string& reference_worker) {
  auto factor = [&](const std::string& w) {
    auto it = check.compute_factor.find(w);
    return it == check.compute_factor.end() ? 1.0 : it->second;
  };
  const double reference = factor(reference_worker);
  // Whether `group` all-reduced inside the workers `a` names.
  const auto holds = [](const apapo::v1::AllReduceMeasurement& a,
                        const std::vector<std::string>& group) {
    return a.worker_ids_size() > 0 &&
           std::all_of(group.begin(), group.end(), [&](const std::string& w) {
             return std::find(a.worker_ids().begin(), a.worker_ids().end(), w) !=
                    a.worker_ids().end();
           });
  };
  // A host's measurement where a stage stayed inside it; those over every
  // worker where a stage crossed hosts, or no stage is named.
  const auto inside = [&](const apapo::v1::AllReduceMeasurement& a) {
    return std::any_of(check.allreduce_groups.begin(), check.allreduce_groups.end(),
                       [&](const auto& group) { return holds(a, group); });
  };
  bool across = check.allreduce_groups.empty();
  for (const auto& group : check.allreduce_groups) {
    across |= std::none_of(profiles.begin(), profiles.end(), [&](const auto& p) {
      return p.second.has_host_allreduce() && holds(p.second.host_allreduce(), group);
    });
  }
  std::map<std::string, apapo::v1::ProfileResult> out;
  for (const auto& [w, r] : profiles) {
    apapo::v1::ProfileResult c = r;
    const double f = factor(w);
    planning::ScaleComputeTimes(f, c.mutable_profile());
    if (c.resources().relative_speed() > 0) {
      c.mutable_resources()->set_relative_speed(c.resources().relative_speed() *
                                                reference / f);
    }
    if (check.allreduce_factor.has_value()) {
      const double g = *check.allreduce_factor;
      // Its time beside the compute with it: the pace beside compute
      // against alone (the window factor) stays as measured.
      for (apapo::v1::AllReduceMeasurement* a :
           {c.has_allreduce() && across ? c.mutable_allreduce() : nullptr,
            c.has_large_allreduce() && across ? c.mutable_large_allreduce() : nullptr,
            c.has_host_allreduce() && inside(c.host_allreduce()) ? c.mutable_host_allreduce()
                                                                 : nullptr}) {
        if (a == nullptr) continue;
        a->set_seconds(a->seconds() * g);
        a->set_seconds_beside_compute(a->seconds_beside_compute() * g);
        a->set_seconds_after_compute(a->seconds_after_compute() * g);
      }
    }
    out[w] = std::move(c);
  }
  return out;
}

bool SameShape(const apapo::v1::Plan& a, const apapo::v1::Plan& b) {
  if (a.schedule() != b.schedule() || a.micro_batches() != b.micro_batches() ||
      a.stages_size() != b.stages_size() || a.splits_size() != b.splits_size()) {
    return false;
  }
  for (int i = 0; i < a.splits_size(); ++i) {
    if (a.splits(i).node_id() != b.splits(i).node_id() ||
        a.splits(i).parts() != b.splits(i).parts()) {
      return false;
    }
  }
  for (int s = 0; s < a.stages_size(); ++s) {
    const auto& x = a.stages(s);
    const auto& y = b.stages(s);
    if (x.replicas() != y.replicas() || x.placement_size() != y.placement_size() ||
        !std::equal(x.node_ids().begin(), x.node_ids().end(), y.node_ids().begin(),
                    y.node_ids().end())) {
      return false;
    }
    for (int r = 0; r < x.placement_size(); ++r) {
      if (x.placement(r).worker_id() != y.placement(r).worker_id()) return false;
    }
  }
  return true;
}

std::string ShapeOf(const apapo::v1::Plan& plan) {
  std::vector<int> replicas;
  for (const auto& st : plan.stages()) replicas.push_back(std::max(1, st.replicas()));
  return absl::StrFormat("%d stage(s) of %s replica(s), %s", plan.stages_size(),
                         absl::StrJoin(replicas, "+"), ScheduleWord(plan.schedule()));
}

}  // namespace apapo::coordinator
