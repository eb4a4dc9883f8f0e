#include "planning/partitioner_planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "partitioner/optimizer.h"
#include "partitioner/plan_proto.h"
#include "partitioner/simulator.h"
#include "planning/core_sharing.h"
#include "planning/network_levels.h"
#include "planning/stage_plan.h"

namespace apapo::planning {
namespace {

namespace pt = apapo::partitioner;

absl::StatusOr<pt::Cluster> ToCluster(const apapo::v1::ClusterSpec& spec) {
  const int n = spec.workers_size();
  if (n == 0) return absl::InvalidArgumentError("cluster: no workers");
  pt::Cluster cluster;
  cluster.levels = ClusterLevels(spec);
  double memory = 0;
  bool heterogeneous = false;
  for (const auto& w : spec.workers()) {
    double speed = SpeedOf(w);
    cluster.speeds.push_back(speed);
    heterogeneous |= speed != 1.0;
    if (w.memory_bytes() > 0) {
      memory = memory == 0 ? w.memory_bytes()
                           : std::min<double>(memory, w.memory_bytes());
    }
  }
  if (!heterogeneous) cluster.speeds.clear();
  cluster.memory_bytes = memory;
  SetMeasuredCosts(spec, &cluster);
  return cluster;
}

absl::StatusOr<pt::Plan> PlanWith(const pt::Graph& graph,
                                  const pt::Cluster& cluster,
                                  pt::PlannerOptions options) {
  if (options.schedule == apapo::schedule::ScheduleKind::kDataParallel) {
    return pt::DataParallelPlan(graph, cluster, options);
  }
  return pt::PlanPipeline(graph, cluster, options);
}

// The async schedule on whole mini-batches (m = 1 without replication)
// keeps 1F1B's depth in flight; where that leaves a slow link's round trips
// uncovered (plan->depth_bound), m micro-batches a mini-batch let a stage
// keep up to m - 1 more in flight at the same staleness
// (CoverTransferRoundTrips), each computing its rows at the cost measured
// for its size (ModelProfile.micro_batch_costs). Weighed where the spec
// leaves micro_batches unset: 2, 4 and 8 times the plan's m, where they
// divide the batch into at least kMinMicroRows rows; taken at kMinMicroGain
// over the whole mini-batches' prediction, and then `options` and `plan`
// are replaced. Returns the note saying what was weighed (empty: nothing
// worth saying). Measured (bench/cluster, 2026-12-04 17:00): the mlp at
// 100 Mbit/s ran 1,289 samples/s as 2 x 64 with 3 in flight against 863 as
// 1 x 128 with 2, both one update stale.
std::string WeighMicroBatches(const apapo::v1::JobSpec& spec, const pt::Graph& graph,
                              const pt::Cluster& cluster, pt::PlannerOptions* options,
                              pt::Plan* plan) {
  constexpr int64_t kMinMicroRows = 16;
  constexpr double kMinMicroGain = 1.10;
  if (options->schedule != apapo::schedule::ScheduleKind::kAsync ||
      spec.schedule().has_micro_batches() || !plan->depth_bound ||
      plan->stages.size() < 2) {
    return "";
  }
  // A finer m replaces a coarser one only where predicted kMinFinerGain
  // faster: the runtime's per-micro-batch work (each op's dispatch, each
  // transfer's setup) is not charged, and the mlp at 100 Mbit/s ran 2 x 64
  // at 1,142-1,289 samples/s (predicted 3-8% below) and 4 x 32 at 977-1,166
  // (predicted 3% below to 17% above) in the same rounds (bench/cluster,
  // 2026-12-04 18:45). At 1.05x it took 4 x 32, predicted 1.07x 2 x 64,
  // which ran 1,074 samples/s (+21%) where 2 x 64 had run 1,234-1,298
  // (2026-12-04 23:48); 1.1x is the margin every other choice of the
  // planner's needs.
  constexpr double kMinFinerGain = 1.10;
  const int64_t batch = spec.data().batch_size();
  const double whole_rate = plan->samples_per_second;
  const int whole_m = plan->micro_batches;
  std::optional<pt::Plan> best;
  pt::PlannerOptions best_options;
  std::vector<std::string> weighed;
  for (int f : {2, 4, 8}) {
    const int64_t m = int64_t{whole_m} * f;
    if (batch <= 0 || batch % m != 0 || batch / m < kMinMicroRows) continue;
    pt::PlannerOptions o = *options;
    o.micro_batches = static_cast<int>(m);
    absl::StatusOr<pt::Plan> alt = PlanWith(graph, cluster, o);
    if (!alt.ok()) continue;
    weighed.push_back(absl::StrFormat("%d x %d rows %.0f", m, batch / m,
                                      alt->samples_per_second));
    if (!best || alt->samples_per_second > kMinFinerGain * best->samples_per_second) {
      best = *std::move(alt);
      best_options = o;
    }
  }
  if (best && best->samples_per_second >= kMinMicroGain * whole_rate) {
    int depth = 0;
    for (const pt::StagePlan& st : best->stages) {
      depth = std::max(depth, st.in_flight_depth);
    }
    std::string note = absl::StrFormat(
        "micro-batches: %d of %d rows, a stage keeping up to %d in flight at "
        "the same staleness, to hide the link's round trips: predicted %.0f "
        "samples/s against %.0f as %d of %d rows (%.2fx; %.2fx needed); "
        "weighed %s samples/s (a finer one needs %.2fx)",
        best->micro_batches, batch / best->micro_batches, depth,
        best->samples_per_second, whole_rate, whole_m, batch / whole_m,
        best->samples_per_second / whole_rate, kMinMicroGain,
        absl::StrJoin(weighed, ", "), kMinFinerGain);
    *options = best_options;
    *plan = *std::move(best);
    return note;
  }
  if (best && best->samples_per_second > 1.01 * whole_rate) {
    return absl::StrFormat(
        "micro-batches: %d of %d rows kept: %d micro-batches, the best of "
        "smaller ones, predicted %.0f samples/s against %.0f (%.2fx needed)",
        whole_m, batch / whole_m, best->micro_batches, best->samples_per_second,
        whole_rate, kMinMicroGain);
  }
  return "";
}

using pt::Replicated;

// Where the spec leaves ScheduleSpec.allreduce_in_backward unset, a
// replicated stage starts its all-reduce in parts during the backward only
// where that is predicted kMinPartsGain over one all-reduce after it:
// `plan` (planned with the parts, `options`) against the same job planned
// without them, each with its own micro-batches. Beside the compute the
// parts slow it, which the cost model does not charge: the probe reads
// 2-3 ms of loss where the cnn's backward grew 7-15 ms with them. On the
// lab's fast links, where the parts were predicted at 1.00x, one
// all-reduce after ran 0.97-1.06x them (9 of 11 pairs at or above 1.00x):
// that bias, not the model's 10% error, is what the margin covers. Where
// the link binds, the parts ran what was predicted: 1.06x (predicted
// 1.08x, the mlp at 1 Gbit/s), 1.09x (1.10x, the cnn at 100 Mbit/s) and
// 1.31x (1.45x, the cnn at 1 Gbit/s) one all-reduce after (bench/cluster,
// 2026-12-07 07:51-11:40). Replaces `options` and `plan` where it takes one
// all-reduce after, and `micro_note` with that plan's; returns the note
// (empty: nothing replicated either way) and sets *other_rate to the rate
// of the way not taken.
std::string WeighAllReduceParts(const apapo::v1::JobSpec& spec, const pt::Graph& graph,
                                const pt::Cluster& cluster, pt::PlannerOptions* options,
                                pt::Plan* plan, std::string* micro_note,
                                double* other_rate) {
  constexpr double kMinPartsGain = 1.05;
  if (AllReduceInBackwardRequested(spec).has_value() || !options->allreduce_in_backward ||
      options->cost_model != pt::CostModel::kApapo) {
    return "";
  }
  pt::PlannerOptions after = *options;
  after.allreduce_in_backward = false;
  absl::StatusOr<pt::Plan> after_plan = PlanWith(graph, cluster, after);
  if (!after_plan.ok()) return "";
  std::string after_note = WeighMicroBatches(spec, graph, cluster, &after, &*after_plan);
  if (!Replicated(*plan) && !Replicated(*after_plan)) {
    *options = after;  // the same plans: what follows prices no parts
    return "";
  }
  const double parts_rate = plan->samples_per_second;
  const double after_rate = after_plan->samples_per_second;
  const double gain = after_rate > 0 ? parts_rate / after_rate : 0.0;
  if (Replicated(*plan) && parts_rate >= kMinPartsGain * after_rate) {
    *other_rate = after_rate;
    return absl::StrFormat(
        "all-reduce in parts during the backward (behind the last weight "
        "gradients): predicted %.0f samples/s against %.0f with one "
        "all-reduce after it (%.2fx; %.2fx needed)",
        parts_rate, after_rate, gain, kMinPartsGain);
  }
  std::string note = absl::StrFormat(
      "one all-reduce after the backward: in parts during it was predicted "
      "%.0f samples/s against %.0f (%.2fx, under the %.2fx it must gain: "
      "beside the compute the parts slow it, which is not charged)",
      parts_rate, after_rate, gain, kMinPartsGain);
  *other_rate = parts_rate;
  *options = after;
  *plan = *std::move(after_plan);
  *micro_note = std::move(after_note);
  return note;
}

// The registry ids of the workers `plan` places.
std::set<std::string> PlacedWorkers(const apapo::v1::Plan& plan) {
  std::set<std::string> placed;
  for (const auto& st : plan.stages()) {
    for (const auto& r : st.placement()) placed.insert(r.worker_id());
  }
  return placed;
}

// The DP's options for `spec` on n workers. Where the spec asks for more
// stages x replicas than n, fewer, and *fewer_note says so.
absl::StatusOr<pt::PlannerOptions> OptionsFor(const apapo::v1::JobSpec& spec, int n,
                                              pt::PlannerOptions::Budget budget,
                                              std::string* fewer_note) {
  pt::PlannerOptions options;
  options.cost_model = pt::CostModel::kApapo;
  options.budget = budget;
  absl::StatusOr<apapo::schedule::ScheduleKind> kind =
      pt::ScheduleFromProto(spec.schedule().kind(), "spec.schedule.kind");
  if (!kind.ok()) return kind.status();
  options.schedule = *kind;
  // Unset: 0, and the DP picks its schedule's default for the replication
  // it chooses (the same schedule::DefaultMicroBatches StagePlanFor uses).
  options.micro_batches =
      spec.schedule().has_micro_batches() ? spec.schedule().micro_batches() : 0;
  options.batch_size = spec.data().batch_size();
  options.max_staleness =
      spec.schedule().has_max_staleness() ? spec.schedule().max_staleness() : -1;
  // Deeper than the natural 1F1B staleness only within one the spec asks
  // for (bench/cluster: the mlp at 100 Mbit/s lost 0.9-1.2 point at the
  // staleness of 3 that hid its link with whole mini-batches).
  options.deepen_for_links = spec.schedule().has_max_staleness();
  options.activation_compression_ratio =
      TransferCompressionRatio(spec.schedule().transfer_precision());
  options.split_backward = SplitBackwardRequested(spec);
  options.allreduce_in_backward = AllReduceInBackwardRequested(spec).value_or(true);
  options.weight_prediction = WeightPredictionRequested(spec);
  if (spec.schedule().stages() == 1 && spec.schedule().replicas() > 1) {
    options.schedule = apapo::schedule::ScheduleKind::kDataParallel;
  }
  // A stage count and a replica count asked for are the DP's: the best
  // plan with exactly that many. The validator keeps stages x replicas
  // within spec.resources.workers; a re-plan after losing workers may have
  // fewer, and then the job goes on with fewer replicas, then fewer stages,
  // rather than failing.
  options.stages = std::max(0, spec.schedule().stages());
  options.replicas = std::max(0, spec.schedule().replicas());
  if (std::max(1, options.stages) * std::max(1, options.replicas) > n) {
    const int asked_stages = options.stages, asked_replicas = options.replicas;
    if (options.replicas > 0) {
      options.replicas = std::max(1, n / std::max(1, options.stages));
    }
    options.stages = std::min(options.stages, n);
    *fewer_note = absl::StrCat("spec.schedule asks for ", asked_stages,
                               " stage(s) x ", asked_replicas, " replica(s) (0: any); ",
                               n, " worker(s) are left: planned with ",
                               options.stages, " x ", options.replicas);
  }
  return options;
}

// Iterations simulated for a checkpoint interval's fill and drain: they do
// not grow with the interval once the pipeline has filled.
constexpr int64_t kCheckpointSimIterations = 32;

// PlanPrediction's checkpoint figures for a job that checkpoints every
// spec.checkpoint.every_steps steps (see plan.proto), and a note. The
// runtime trains each interval as one phase, from an empty pipeline to a
// drained one (stage_executor.cc, Train), so the interval's fill and drain
// are the simulated phase's makespan less its steady iterations. Then
// replica 0 of each stage copies its part of the state (the share of the
// parameter bytes it holds), blocking, and its writer's CPU time is taken
// from training in the share of the time the stage computes (a stage that
// waits on its link half the time absorbs half the write: bench/cluster,
// the mlp at 100 Mbit/s, 2026-12-03). Stages pause in parallel, so the
// slowest sets the cost. Measured on replica 0's worker, or the slowest
// worker measured where its own is missing.
void PredictCheckpoints(const apapo::v1::JobSpec& spec, const pt::Plan& plan,
                        const pt::Cluster& cluster,
                        const apapo::v1::ClusterSpec& cluster_spec,
                        apapo::v1::Plan* out) {
  const int64_t every = spec.checkpoint().every_steps();
  if (spec.checkpoint().directory().empty() || every <= 0 ||
      plan.seconds_per_mini_batch <= 0 || plan.stages.empty()) {
    return;
  }
  double fill_drain = 0;
  pt::SimulationOptions sim;
  sim.iterations = std::max<int64_t>(2, std::min(every, kCheckpointSimIterations));
  if (absl::StatusOr<pt::SimulationResult> r = pt::Simulate(plan, cluster, plan.schedule, sim);
      r.ok()) {
    fill_drain = std::max(
        0.0, r->makespan_seconds - static_cast<double>(sim.iterations) * r->seconds_per_iteration);
  }
  const apapo::v1::CheckpointMeasurement* slowest = nullptr;
  std::map<std::string, const apapo::v1::CheckpointMeasurement*> measured;
  for (const auto& c : cluster_spec.checkpoints()) {
    // A worker's figures, not trusted: one that is not a finite,
    // non-negative time of a positive size is left out.
    if (c.bytes() <= 0 || !std::isfinite(c.snapshot_seconds()) ||
        !std::isfinite(c.write_cpu_seconds()) || c.snapshot_seconds() < 0 ||
        c.write_cpu_seconds() < 0) {
      continue;
    }
    measured[c.worker_id()] = &c;
    if (slowest == nullptr || c.snapshot_seconds() + c.write_cpu_seconds() >
                                  slowest->snapshot_seconds() + slowest->write_cpu_seconds()) {
      slowest = &c;
    }
  }
  double total_bytes = 0;
  for (const pt::StagePlan& st : plan.stages) total_bytes += st.parameter_bytes;
  double pause = 0, state_bytes = 0;
  if (slowest != nullptr && total_bytes > 0) {
    for (const pt::StagePlan& st : plan.stages) {
      const apapo::v1::CheckpointMeasurement* m = slowest;
      if (!st.workers.empty() && st.workers[0] >= 0 &&
          st.workers[0] < cluster_spec.workers_size()) {
        auto it = measured.find(cluster_spec.workers(st.workers[0]).worker_id());
        if (it != measured.end()) m = it->second;
      }
      const double busy =
          std::clamp(st.compute_seconds / plan.seconds_per_mini_batch, 0.0, 1.0);
      pause = std::max(pause, st.parameter_bytes / total_bytes *
                                  (m->snapshot_seconds() + busy * m->write_cpu_seconds()));
    }
    state_bytes = static_cast<double>(slowest->bytes());
  }
  const double seconds = fill_drain + pause;
  const double t = plan.seconds_per_mini_batch;
  const double with = plan.samples_per_second * t / (t + seconds / static_cast<double>(every));
  apapo::v1::PlanPrediction* p = out->mutable_prediction();
  p->set_checkpoint_seconds(seconds);
  p->set_checkpoint_every_steps(every);
  p->set_samples_per_second_with_checkpoints(with);
  std::string write =
      slowest == nullptr
          ? "the state's copy and write were not timed while profiling, so "
            "only the drain is counted"
          : absl::StrFormat("the slowest stage copies and writes its part of %.3g MB "
                            "of state (%.3g ms)",
                            state_bytes / 1e6, 1e3 * pause);
  out->add_notes(absl::StrFormat(
      "checkpoints every %d steps cost %.3g ms each: the pipeline drains and "
      "refills (%.3g ms) and %s; %.0f samples/s over a whole run, %.0f between "
      "checkpoints",
      every, 1e3 * seconds, 1e3 * fill_drain, write, with, plan.samples_per_second));
}

// A setting the planner never takes on its own is listed as an alternative
// where predicted at this multiple of the plan or more.
constexpr double kMinKnobGain = 1.05;

// For an async pipeline, a first estimate of what the two settings the
// planner never takes on its own would buy where a slow link binds it:
// bfloat16 transfers (they round what crosses) as alternatives["bfloat16"],
// and one more update of staleness as alternatives["staleness_2"] (on the
// mlp across 100 Mbit/s 1.24x, at 0.25-0.37 point of test accuracy on
// three seeds: bench/cluster, 2026-12-07 20:24). Each on the chosen plan's
// graph and options, its micro-batches weighed again from the spec's count
// (`asked_micro_batches`); listed at kMinKnobGain over the plan or more (a
// link that barely binds buys nothing worth a setting), neither where the
// spec already sets it. MakePlan then plans each one listed as a job that
// sets it, zeros and splits weighed again, and lists that instead: the
// cheap estimate keeps that to where a setting is worth a look.
void AddLinkKnobs(const apapo::v1::JobSpec& spec, const pt::Graph& graph,
                  const pt::Cluster& cluster, const pt::PlannerOptions& options,
                  int asked_micro_batches, const pt::Plan& plan, apapo::v1::Plan* out) {
  if (plan.stages.size() < 2 || options.schedule != apapo::schedule::ScheduleKind::kAsync) {
    return;
  }
  auto& alternatives = *out->mutable_prediction()->mutable_alternatives_samples_per_second();
  const auto list = [&](const char* name, pt::PlannerOptions o) {
    o.micro_batches = asked_micro_batches;
    absl::StatusOr<pt::Plan> p = PlanWith(graph, cluster, o);
    if (!p.ok()) return;
    WeighMicroBatches(spec, graph, cluster, &o, &*p);
    if (p->samples_per_second >= kMinKnobGain * plan.samples_per_second) {
      alternatives[name] = p->samples_per_second;
    }
  };
  // Unset precision: float32, compression ratio 1 (OptionsFor).
  if (spec.schedule().transfer_precision() == apapo::v1::TRANSFER_PRECISION_UNSPECIFIED) {
    pt::PlannerOptions bf16 = options;
    bf16.activation_compression_ratio = 2;
    list("bfloat16", bf16);
  }
  if (!spec.schedule().has_max_staleness()) {
    pt::PlannerOptions deeper = options;
    deeper.max_staleness = 2;
    deeper.deepen_for_links = true;
    list("staleness_2", deeper);
  }
}

}  // namespace

absl::StatusOr<apapo::v1::Plan> PartitionerPlanner::MakePlan(
    const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
    const apapo::v1::ClusterSpec& cluster_spec) {
  absl::StatusOr<apapo::v1::Plan> plan = MakePlanOnce(spec, profile, cluster_spec);
  if (!plan.ok()) return plan;
  // A setting the plan's own figures list (AddLinkKnobs) is weighed as a
  // job that sets it is planned (its zeros, splits and micro-batches
  // weighed again), and listed at that; dropped under kMinKnobGain. On
  // four 100 Mbit/s mlp profiles the plan's own cuts and zeros with the
  // setting read from 10% below that to 10% above.
  auto& alternatives = *plan->mutable_prediction()->mutable_alternatives_samples_per_second();
  const double rate = plan->prediction().samples_per_second();
  const std::pair<const char*, void (*)(apapo::v1::ScheduleSpec*)> knobs[] = {
      {"bfloat16",
       [](apapo::v1::ScheduleSpec* s) {
         s->set_transfer_precision(apapo::v1::TRANSFER_PRECISION_BFLOAT16);
       }},
      {"staleness_2", [](apapo::v1::ScheduleSpec* s) { s->set_max_staleness(2); }},
  };
  for (const auto& [name, set] : knobs) {
    auto it = alternatives.find(name);
    if (it == alternatives.end()) continue;
    apapo::v1::JobSpec with = spec;
    set(with.mutable_schedule());
    absl::StatusOr<apapo::v1::Plan> p = MakePlanOnce(with, profile, cluster_spec);
    if (p.ok() && p->prediction().samples_per_second() >= kMinKnobGain * rate) {
      it->second = p->prediction().samples_per_second();
    } else {
      alternatives.erase(it);
    }
  }
  return plan;
}

absl::StatusOr<apapo::v1::Plan> PartitionerPlanner::MakePlanOnce(
    const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
    const apapo::v1::ClusterSpec& cluster_spec) {
  // A gain the cost model's error could make: skipping is weighed as the
  // planner weighs more workers (PlanOn's kMinMoreWorkersGain).
  constexpr double kMinSkipZerosGain = 1.10;
  bool shares = false;
  for (const auto& n : profile.nodes()) shares |= n.nonzero_share() > 0;
  if (!shares || !SkipZerosRequested(spec)) {
    return MakePlanAsAsked(spec, profile, cluster_spec);
  }
  apapo::v1::JobSpec whole_spec = spec;
  whole_spec.mutable_schedule()->set_skip_zeros(false);
  absl::StatusOr<apapo::v1::Plan> whole = MakePlanAsAsked(whole_spec, profile, cluster_spec);
  absl::StatusOr<apapo::v1::Plan> skipping = MakePlanAsAsked(spec, profile, cluster_spec);
  if (!skipping.ok() || !whole.ok()) return skipping.ok() ? skipping : whole;
  const double with = skipping->prediction().samples_per_second();
  const double without = whole->prediction().samples_per_second();
  if (with >= kMinSkipZerosGain * without) {
    skipping->add_notes(absl::StrFormat(
        "predicted at %.1f samples/s with a ReLU's zeros skipped, %.2fx the "
        "%.1f of whole tensors",
        with, with / without, without));
    return skipping;
  }
  whole->add_notes(absl::StrFormat(
      "ReLU outputs cross whole: skipping their zeros was predicted at "
      "%.1f samples/s, %.2fx the %.1f of whole tensors, under the %.2fx it "
      "must gain",
      with, without > 0 ? with / without : 0.0, without, kMinSkipZerosGain));
  return whole;
}

absl::StatusOr<apapo::v1::Plan> PartitionerPlanner::MakePlanAsAsked(
    const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
    const apapo::v1::ClusterSpec& cluster_spec) {
  // Workers share cores: weigh all of them busy, each at its share, against
  // fewer per core set at larger shares (core_sharing.h). Else, workers of
  // different speeds: weigh all of them against the faster ones alone (the
  // DP cuts for one speed; a much slower worker binds whatever stage it
  // gets). On the DP alone; the one chosen is then planned in full (layer
  // splits, the schedule auto weighs, alternatives), once. The first
  // subset is every worker; a smaller one must predict more than 0.1%
  // above. One with fewer workers than the spec's stages x replicas is not
  // weighed (the whole cluster may be, with PlanOn's fewer note).
  std::vector<std::vector<int>> subsets = CoreSharingSubsets(cluster_spec);
  const bool sharing = !subsets.empty();
  if (!sharing) subsets = SpeedSubsets(cluster_spec);
  if (subsets.empty()) return PlanOn(spec, profile, cluster_spec);
  absl::StatusOr<pt::Graph> graph = pt::GraphFromProfile(profile, SkipZerosRequested(spec));
  if (!graph.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("measured profile: ", graph.status().message()));
  }
  const size_t asked = static_cast<size_t>(std::max(1, spec.schedule().stages())) *
                       static_cast<size_t>(std::max(1, spec.schedule().replicas()));
  std::optional<apapo::v1::ClusterSpec> best;
  double best_rate = 0;
  std::vector<std::string> weighed;
  for (const std::vector<int>& subset : subsets) {
    const bool all = static_cast<int>(subset.size()) == cluster_spec.workers_size();
    if (!all && subset.size() < asked) continue;
    apapo::v1::ClusterSpec sub = SubCluster(cluster_spec, subset);
    absl::StatusOr<pt::Cluster> cluster = ToCluster(sub);
    std::string fewer_note;
    absl::StatusOr<pt::PlannerOptions> options =
        OptionsFor(spec, static_cast<int>(subset.size()), budget_, &fewer_note);
    if (!cluster.ok() || !options.ok()) continue;
    absl::StatusOr<pt::Plan> plan = PlanWith(*graph, *cluster, *options);
    if (!plan.ok()) continue;
    // Micro-batches may hide a slow link for the larger subset: weighed
    // here too, or the link that binds the whole-batch pipeline would drop
    // workers that the pipeline PlanOn makes of them needs (bench/cluster,
    // 2026-12-04 17:30: the transformer_lm at 100 Mbit/s planned on 1
    // worker at 152 samples/s, where 2 with micro-batches ran 326).
    WeighMicroBatches(spec, *graph, *cluster, &*options, &*plan);
    const double rate = plan->samples_per_second;
    weighed.push_back(absl::StrFormat("%.0f samples/s on %d", rate, subset.size()));
    if (!best.has_value() || rate > 1.001 * best_rate) {
      best = std::move(sub);
      best_rate = rate;
    }
  }
  // None planned: the whole cluster, for PlanOn's error.
  absl::StatusOr<apapo::v1::Plan> plan =
      PlanOn(spec, profile, best.has_value() ? *best : SubCluster(cluster_spec, subsets[0]));
  if (plan.ok() && weighed.size() > 1) {
    const std::set<std::string> busy = PlacedWorkers(*plan);
    std::string why =
        "workers share cores (their core sets hold fewer cores than threads "
        "with all of them busy)";
    if (!sharing) {
      why = absl::StrFormat("workers differ in speed (the slowest at %.2fx the fastest)",
                            SlowestOverFastest(cluster_spec));
    }
    plan->add_notes(absl::StrFormat("%s: the DP predicted %s worker(s); planned on %d", why,
                                    absl::StrJoin(weighed, ", "), busy.size()));
    if (best.has_value() && best->allreduces_size() < cluster_spec.allreduces_size()) {
      int ranks = 0;
      for (const auto& a : cluster_spec.allreduces()) ranks = std::max(ranks, a.ranks());
      plan->add_notes(absl::StrFormat(
          "the all-reduces timed while profiling spanned %d workers, over links and "
          "cores these %d do not share: theirs is charged %s",
          ranks, best->workers_size(),
          best->allreduces_size() > 0 ? absl::StrFormat("as these %d timed theirs among "
                                                        "themselves",
                                                        best->workers_size())
                                      : std::string("as the ring over their own links")));
    }
  }
  return plan;
}

absl::StatusOr<apapo::v1::Plan> PartitionerPlanner::PlanOn(
    const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
    const apapo::v1::ClusterSpec& cluster_spec) {
  // A second worker pays for itself only above the cost model's error: the
  // cnn at 100 Mbit/s was planned on 2 stages at 1.004x its one-worker
  // prediction and ran at 0.72-0.83x one process (bench/cluster,
  // 2026-12-04 22:05); predictions there are within 10%, not closer.
  constexpr double kMinMoreWorkersGain = 1.10;
  absl::StatusOr<apapo::v1::Plan> plan = PlanOnAll(spec, profile, cluster_spec);
  const apapo::v1::ScheduleSpec& asked = spec.schedule();
  if (!plan.ok() || cluster_spec.workers_size() < 2 || asked.stages() > 0 ||
      asked.replicas() > 0 ||
      asked.kind() == apapo::v1::SCHEDULE_KIND_DATA_PARALLEL ||
      (spec.fault_tolerance().has_min_workers() &&
       spec.fault_tolerance().min_workers() > 1)) {
    return plan;
  }
  const std::set<std::string> busy = PlacedWorkers(*plan);
  if (busy.size() < 2) return plan;
  int fastest = 0;
  for (int i = 1; i < cluster_spec.workers_size(); ++i) {
    if (SpeedOf(cluster_spec.workers(i)) > SpeedOf(cluster_spec.workers(fastest))) {
      fastest = i;
    }
  }
  absl::StatusOr<apapo::v1::Plan> one =
      PlanOnAll(spec, profile, SubCluster(cluster_spec, {fastest}));
  const double more_rate = plan->prediction().samples_per_second();
  const double one_rate = one.ok() ? one->prediction().samples_per_second() : 0;
  if (!one.ok() || !(one_rate > 0)) return plan;
  (*plan->mutable_prediction()->mutable_alternatives_samples_per_second())["one_worker"] =
      one_rate;
  if (more_rate >= kMinMoreWorkersGain * one_rate) return plan;
  (*one->mutable_prediction()->mutable_alternatives_samples_per_second())["one_worker"] =
      one_rate;
  one->add_notes(absl::StrFormat(
      "planned on one worker (%s, the fastest): %d workers were predicted %.0f "
      "samples/s, %.2fx the %.0f of one (%.2fx needed for more than one)",
      cluster_spec.workers(fastest).worker_id(), busy.size(), more_rate,
      more_rate / one_rate, one_rate, kMinMoreWorkersGain));
  return one;
}

absl::StatusOr<apapo::v1::Plan> PartitionerPlanner::PlanOnAll(
    const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
    const apapo::v1::ClusterSpec& cluster_spec) {
  absl::StatusOr<pt::Graph> graph = pt::GraphFromProfile(profile, SkipZerosRequested(spec));
  if (!graph.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("measured profile: ", graph.status().message()));
  }
  absl::StatusOr<pt::Cluster> cluster = ToCluster(cluster_spec);
  if (!cluster.ok()) return cluster.status();

  std::string fewer_note;
  absl::StatusOr<pt::PlannerOptions> asked_options =
      OptionsFor(spec, cluster->num_workers(), budget_, &fewer_note);
  if (!asked_options.ok()) return asked_options.status();
  pt::PlannerOptions options = *asked_options;
  absl::StatusOr<pt::Plan> plan = PlanWith(*graph, *cluster, options);
  if (!plan.ok()) {
    if (absl::StartsWith(plan.status().message(), "stages: ") ||
        absl::StartsWith(plan.status().message(), "replicas: ")) {
      return absl::Status(plan.status().code(),
                          absl::StrCat("spec.schedule.", plan.status().message()));
    }
    return plan.status();
  }
  std::string micro_note = WeighMicroBatches(spec, *graph, *cluster, &options, &*plan);
  double allreduce_other_rate = 0;
  const std::string allreduce_note = WeighAllReduceParts(
      spec, *graph, *cluster, &options, &*plan, &micro_note, &allreduce_other_rate);

  // Auto: the async schedule, unless 1F1B with flushes is predicted
  // kMinSyncGain faster. That happens where a slow link, not compute,
  // binds: a flush's micro-batches keep the link busy where the async
  // schedule's in-flight depth does not hide it (bench/cluster, the
  // transformer_lm at 100 Mbit/s: 1.34-1.44x). It trains without
  // staleness, so a gain is all it needs; the margin covers the flush
  // model's errors (+8% and +7% at 100 Mbit/s). The flush's micro-batches
  // are charged their measured per-row cost (ModelProfile.
  // micro_batch_costs): at one cost for every size the mlp's was
  // predicted 1.37x the async plan and ran 0.78-0.82x of it.
  constexpr double kMinSyncGain = 1.10;
  std::string schedule_note;
  if (spec.schedule().kind() == apapo::v1::SCHEDULE_KIND_UNSPECIFIED &&
      options.schedule == apapo::schedule::ScheduleKind::kAsync &&
      cluster->num_workers() > 1) {
    pt::PlannerOptions flush = options;
    flush.schedule = apapo::schedule::ScheduleKind::k1F1BFlush;
    flush.deepen_for_links = false;
    absl::StatusOr<pt::Plan> flush_plan = PlanWith(*graph, *cluster, flush);
    const double async_rate = plan->samples_per_second;
    if (flush_plan.ok() && flush_plan->stages.size() > 1 &&
        flush_plan->samples_per_second > kMinSyncGain * async_rate) {
      schedule_note = absl::StrFormat(
          "schedule auto: 1F1B with flushes, %d micro-batches (synchronous, no "
          "stale weights): predicted %.0f samples/s against %.0f for async "
          "1F1B with weight stashing (%.2fx; %.2fx needed)",
          flush_plan->micro_batches, flush_plan->samples_per_second, async_rate,
          flush_plan->samples_per_second / async_rate, kMinSyncGain);
      options = flush;
      plan = std::move(flush_plan);
    } else if (flush_plan.ok() && flush_plan->stages.size() > 1) {
      schedule_note = absl::StrFormat(
          "schedule auto: async 1F1B with weight stashing, predicted %.0f "
          "samples/s; 1F1B with flushes %.0f (%.2fx needed to choose it)",
          async_rate, flush_plan->samples_per_second, kMinSyncGain);
    }
  }
  if (schedule_note.empty() &&
      spec.schedule().kind() == apapo::v1::SCHEDULE_KIND_UNSPECIFIED) {
    schedule_note = "schedule auto: async 1F1B with weight stashing";
  }

  // Wide Linear layers split column-wise give the DP finer cut points: an
  // mlp whose whole-layer cuts leave 38% | 62% of the work balances to
  // ~50% | 50% with a layer cut in eighths. The parts cost what the worker
  // measured the model split that way to cost (ModelProfile.split_costs:
  // each part's GEMM is smaller). Kept only when the predicted throughput
  // gains more than kMinSplitGain, the margin of the cost model's error.
  constexpr double kMinSplitGain = 1.03;
  std::vector<std::pair<std::string, int>> splits;
  std::string split_note;
  const double unsplit_samples_per_second = plan->samples_per_second;
  const bool may_split = !spec.schedule().has_split_layers() ||
                         spec.schedule().split_layers();
  // Tried whenever there is more than one worker, also when the unsplit
  // plan is one replicated stage: a balanced cut inside a layer may beat
  // the replication that beat every whole-layer cut.
  if (may_split && cluster->num_workers() > 1 &&
      options.schedule != apapo::schedule::ScheduleKind::kDataParallel) {
    // Each split graph weighs micro-batches of its own, from the spec's m:
    // a cut inside a layer carries more bytes, which whole mini-batches
    // may leave uncovered where smaller ones hide them. Weighed on the
    // unsplit graph alone, a split backward's shorter round trip left the
    // mlp at 100 Mbit/s on whole mini-batches and whole layers, 0.77 of
    // its unshaped rate, where 2 x 64 with fc3 in 4 parts ran 1.15x that
    // (bench/cluster, 2026-12-06 11:44).
    pt::PlannerOptions trial_base = options;
    if (trial_base.schedule == apapo::schedule::ScheduleKind::kAsync) {
      trial_base.micro_batches = asked_options->micro_batches;
    }
    const std::vector<std::string> candidates = pt::SplitCandidates(profile, 0.05);
    // The splits of `trial` that `p`'s stage boundaries run through: a
    // layer whose parts all land in one stage computes faster whole (one
    // larger GEMM, no concat).
    const auto crossed = [](const std::vector<std::pair<std::string, int>>& trial,
                            const pt::Plan& p, const pt::Graph& g) {
      std::vector<std::pair<std::string, int>> needed;
      for (const auto& [id, parts] : trial) {
        std::set<int> stages_of_parts;
        for (size_t st = 0; st < p.stages.size(); ++st) {
          for (int node : p.stages[st].nodes) {
            if (absl::StartsWith(g.node(node).id, id + "/")) {
              stages_of_parts.insert(static_cast<int>(st));
            }
          }
        }
        if (stages_of_parts.size() > 1) needed.emplace_back(id, parts);
      }
      return needed;
    };
    // A trial planned with `trial`'s layers split: its plan, graph, options
    // and micro-batch note.
    struct Trial {
      absl::StatusOr<pt::Plan> plan = absl::InternalError("not planned");
      absl::StatusOr<pt::Graph> graph = absl::InternalError("not built");
      pt::PlannerOptions options;
      std::string note;
    };
    const auto plan_split = [&](const std::vector<std::pair<std::string, int>>& trial) {
      Trial t;
      t.options = trial_base;
      absl::StatusOr<apapo::v1::ModelProfile> split_profile = pt::SplitProfile(profile, trial);
      if (!split_profile.ok()) return t;
      t.graph = pt::GraphFromProfile(*split_profile, SkipZerosRequested(spec));
      if (!t.graph.ok()) return t;
      t.plan = PlanWith(*t.graph, *cluster, t.options);
      if (t.plan.ok()) t.note = WeighMicroBatches(spec, *t.graph, *cluster, &t.options, &*t.plan);
      return t;
    };
    // The best trial, kept or not: where none gains the margin, the plan
    // says what splitting would have given (a slower worker's stage may
    // then compute for less time than the other's: no cut inside a layer
    // moves less than one part, and every part costs the split's scale).
    std::string best_trial;
    double best_trial_rate = 0;
    for (int parts : {2, 4, 8}) {
      std::vector<std::pair<std::string, int>> trial;
      for (const auto& node : profile.nodes()) {
        if (std::count(candidates.begin(), candidates.end(), node.id()) &&
            node.split_width() >= parts) {
          trial.emplace_back(node.id(), parts);
        }
      }
      if (trial.empty()) continue;
      Trial t = plan_split(trial);
      if (!t.plan.ok() || t.plan->stages.size() < 2) continue;
      // Every candidate is split for the DP to find the cut; judged with
      // only the layers it cut through split, the rest whole: each split
      // layer costs its parts' scale (the lab's mlp: 1.04-1.11x in 4
      // parts), which a layer no cut runs through pays for nothing.
      std::vector<std::pair<std::string, int>> needed = crossed(trial, *t.plan, *t.graph);
      const bool cut_through_split = !needed.empty();
      if (cut_through_split && needed.size() < trial.size()) {
        Trial fewer = plan_split(needed);
        if (fewer.plan.ok() && fewer.plan->stages.size() > 1 &&
            fewer.plan->samples_per_second >= 0.999 * t.plan->samples_per_second) {
          t = std::move(fewer);
          trial = std::move(needed);
        }
      }
      if (t.plan->samples_per_second > best_trial_rate) {
        best_trial_rate = t.plan->samples_per_second;
        std::vector<std::string> names;
        for (const auto& [id, n] : trial) names.push_back(id);
        best_trial = absl::StrFormat("%s in %d parts each", absl::StrJoin(names, ", "), parts);
      }
      // The best of the part counts, if it beats the unsplit plan by the
      // margin (not each count against the previous one). One whose cut
      // runs through no split is the unsplit plan's cut with the parts'
      // costs: noted, never taken.
      if (cut_through_split &&
          t.plan->samples_per_second > unsplit_samples_per_second * kMinSplitGain &&
          t.plan->samples_per_second > plan->samples_per_second) {
        plan = *std::move(t.plan);
        graph = *std::move(t.graph);
        splits = std::move(trial);
        options = t.options;
        micro_note = std::move(t.note);
      }
    }
    if (splits.empty() && !best_trial.empty()) {
      split_note = absl::StrFormat(
          "layers kept whole: the best column split weighed, %s, was predicted "
          "at %.0f samples/s against %.0f unsplit (%.2fx needed)",
          best_trial, best_trial_rate, unsplit_samples_per_second, kMinSplitGain);
    }
  }

  apapo::v1::Plan out = pt::PlanToProto(*plan, *graph, profile.model());
  if (!splits.empty()) {
    std::vector<std::string> names;
    for (const auto& [id, parts] : splits) {
      apapo::v1::LayerSplit* split = out.add_splits();
      split->set_node_id(id);
      split->set_parts(parts);
      names.push_back(id);
    }
    // %.0f, not a cast: a worker's profile may predict any figure (a
    // hostile one, 1e43 samples/s), and a double past int64's range does
    // not convert (found by fuzz/planner_fuzz.cc).
    out.add_notes(absl::StrFormat(
        "split %s column-wise into %d parts each: predicted %.0f samples/s vs "
        "%.0f unsplit",
        absl::StrJoin(names, ", "), splits.front().second, plan->samples_per_second,
        unsplit_samples_per_second));
  } else if (!split_note.empty()) {
    out.add_notes(split_note);
  }
  // "w<index>" -> the registry's worker ids.
  for (auto& stage : *out.mutable_stages()) {
    for (auto& replica : *stage.mutable_placement()) {
      int index = -1;
      if (replica.worker_id().size() > 1 &&
          absl::SimpleAtoi(replica.worker_id().substr(1), &index) && index >= 0 &&
          index < cluster_spec.workers_size()) {
        replica.set_worker_id(cluster_spec.workers(index).worker_id());
      }
    }
  }
  if (!fewer_note.empty()) out.add_notes(fewer_note);
  out.set_transfer_precision(spec.schedule().transfer_precision());
  out.set_skip_zeros(SkipZerosRequested(spec));
  out.set_split_backward(SplitBackwardRequested(spec));
  out.set_allreduce_after_backward(out.split_backward() && !options.allreduce_in_backward &&
                                   Replicated(*plan));
  out.set_weight_prediction(pt::PredictsWeights(options));
  if (options.activation_compression_ratio != 1) {
    out.add_notes(
        "activations and gradients cross the cuts in bfloat16: the links "
        "are charged half the profile's bytes");
  }
  if (out.skip_zeros()) {
    double low = 1, high = 0;
    for (const auto& n : profile.nodes()) {
      if (n.nonzero_share() <= 0) continue;
      const double share =
          std::min(1.0, n.nonzero_share() + options.activation_compression_ratio / 32);
      low = std::min(low, share);
      high = std::max(high, share);
    }
    if (high > 0) {
      out.add_notes(absl::StrFormat(
          "ReLU outputs cross the cuts without their zeros: a cut after one "
          "is charged %.0f%%-%.0f%% of its bytes (the nonzero values measured "
          "while profiling, and the mask)",
          100 * low, 100 * high));
    }
  }
  if (!allreduce_note.empty()) {
    out.add_notes(allreduce_note);
    (*out.mutable_prediction()->mutable_alternatives_samples_per_second())
        [options.allreduce_in_backward ? "allreduce_after_backward"
                                       : "allreduce_in_backward"] = allreduce_other_rate;
  }
  if (!schedule_note.empty()) out.add_notes(schedule_note);
  if (!micro_note.empty()) out.add_notes(micro_note);
  PredictCheckpoints(spec, *plan, *cluster, cluster_spec, &out);
  // Predicted throughput of the alternatives on the same cluster.
  for (auto [name, kind] :
       {std::pair<const char*, apapo::schedule::ScheduleKind>{
            "async", apapo::schedule::ScheduleKind::kAsync},
        {"gpipe", apapo::schedule::ScheduleKind::kGPipe},
        {"1f1b_flush", apapo::schedule::ScheduleKind::k1F1BFlush},
        {"dp", apapo::schedule::ScheduleKind::kDataParallel}}) {
    pt::PlannerOptions alt = *asked_options;
    alt.schedule = kind;
    alt.micro_batches = 0;  // each schedule's own default
    absl::StatusOr<pt::Plan> p = PlanWith(*graph, *cluster, alt);
    if (p.ok()) {
      (*out.mutable_prediction()->mutable_alternatives_samples_per_second())[name] =
          p->samples_per_second;
    }
  }
  AddLinkKnobs(spec, *graph, *cluster, options, asked_options->micro_batches, *plan, &out);
  return out;
}

}  // namespace apapo::planning
