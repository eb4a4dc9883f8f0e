#include "planning/simulated_trace.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "partitioner/cluster.h"
#include "partitioner/graph.h"
#include "partitioner/optimizer.h"
#include "partitioner/plan_proto.h"
#include "partitioner/simulator.h"
#include "planning/core_sharing.h"
#include "planning/network_levels.h"
#include "planning/stage_plan.h"
#include "schedule/span_kind.h"

namespace apapo::planning {
namespace {

namespace pt = apapo::partitioner;
using apapo::schedule::Op;

// The simulator's run of the stored plan over `steps` iterations.
absl::StatusOr<pt::SimulationResult> SimulateStored(
    const apapo::v1::GetPlanResponse& response, int steps, bool record_trace) {
  const apapo::v1::Plan& plan = response.plan();
  if (plan.stages_size() == 0) {
    return absl::FailedPreconditionError("the plan has no stages");
  }
  apapo::v1::ModelProfile profile = response.profile();
  if (plan.splits_size() > 0) {
    std::vector<std::pair<std::string, int>> splits;
    for (const auto& s : plan.splits()) splits.emplace_back(s.node_id(), s.parts());
    absl::StatusOr<apapo::v1::ModelProfile> split = pt::SplitProfile(profile, splits);
    if (!split.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the plan's splits: ", split.status().message()));
    }
    profile = *std::move(split);
  }
  absl::StatusOr<pt::Graph> graph = pt::GraphFromProfile(profile, plan.skip_zeros());
  if (!graph.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("measured profile: ", graph.status().message()));
  }
  absl::StatusOr<apapo::schedule::ScheduleKind> kind =
      pt::ScheduleFromProto(plan.schedule(), "plan.schedule");
  if (!kind.ok()) return kind.status();

  const apapo::v1::ClusterSpec& spec = response.cluster();
  pt::Cluster cluster;
  std::map<std::string, int> worker_index;
  for (const auto& w : spec.workers()) {
    worker_index[w.worker_id()] = static_cast<int>(worker_index.size());
  }
  // Each worker at its speed with the plan's workers busy (workers that
  // share cores run at their share: core_sharing.h).
  std::vector<bool> busy(spec.workers_size(), false);
  for (const auto& stage : plan.stages()) {
    for (const auto& replica : stage.placement()) {
      auto it = worker_index.find(replica.worker_id());
      if (it != worker_index.end()) busy[it->second] = true;
    }
  }
  cluster.speeds = SpeedsUnderLoad(spec, busy);
  // The planner's hierarchy: each stage's links are those of the level
  // that spans its workers and the next stage's (its all-reduce: its own).
  cluster.levels = ClusterLevels(spec);
  if (cluster.speeds.empty()) cluster.speeds.push_back(1.0);

  std::vector<int> stage_of(graph->num_nodes(), -1);
  pt::Plan p;
  p.schedule = *kind;
  p.micro_batches = std::max(1, plan.micro_batches());
  // The profile's figures are per mini-batch (profile.proto); the
  // simulator's ops are micro-batches: 1/m of one each.
  const double per_micro = 1.0 / p.micro_batches;
  // Each row at its micro-batch size's cost, as the planner charges it
  // (ModelProfile.micro_batch_costs).
  const double row_scale = graph->MicroBatchScale(
      static_cast<double>(profile.batch_size()) * per_micro);
  double total_params = 0;
  for (const pt::Node& n : graph->nodes()) total_params += n.parameter_bytes;
  const std::vector<double> pass_one_products = graph->PassOneProductBytes();
  for (int s = 0; s < plan.stages_size(); ++s) {
    const apapo::v1::Stage& stage = plan.stages(s);
    pt::StagePlan st;
    st.replicas = std::max(1, stage.replicas());
    double pass_one_bytes = 0;  // the first stage's (AllReduceWindowSeconds)
    for (const auto& replica : stage.placement()) {
      auto it = worker_index.find(replica.worker_id());
      st.workers.push_back(it == worker_index.end() ? 0 : it->second);
    }
    for (const std::string& id : stage.node_ids()) {
      const int v = graph->FindNode(id);
      if (v < 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "plan stage ", s, " names node \"", id, "\", not in the profile"));
      }
      stage_of[v] = s;
      st.nodes.push_back(v);
      st.forward_seconds += graph->node(v).forward_seconds * per_micro;
      st.backward_seconds += graph->node(v).backward_seconds * per_micro;
      st.parameter_bytes += graph->node(v).parameter_bytes;
      st.backward_weight_seconds += graph->node(v).weight_gradient_seconds() * per_micro;
      if (s == 0) pass_one_bytes += pass_one_products[v];
    }
    // A replicated stage's all-reduce starts in parts behind its last
    // micro-batch's weight gradients, on every stage (the optimizer's
    // pt::StagePlan::allreduce_window_seconds).
    const bool parts = plan.split_backward() && !plan.allreduce_after_backward();
    double window = parts ? st.backward_weight_seconds : 0.0;
    // What a split backward computes after sending the input gradients
    // (pt::StagePlan::backward_weight_seconds): none on the first stage.
    if (!plan.split_backward() || s == 0) st.backward_weight_seconds = 0;
    // Each replica runs the update of all of the stage's parameters at
    // its kUpdate, as the planner charges it; the profile counts it in
    // the backward (pt::StagePlan::update_seconds).
    if (total_params > 0) {
      st.update_seconds =
          graph->update_seconds() * st.parameter_bytes / total_params;
      st.backward_seconds =
          std::max(0.0, st.backward_seconds - st.update_seconds * per_micro);
      // Stages but the last predict their weights with the update.
      if (plan.weight_prediction() && p.schedule == apapo::schedule::ScheduleKind::kAsync &&
          s + 1 < plan.stages_size()) {
        st.update_seconds +=
            graph->update_prediction_seconds() * st.parameter_bytes / total_params;
      }
    }
    st.forward_seconds *= row_scale;
    st.backward_weight_seconds =
        row_scale * std::min(st.backward_weight_seconds, st.backward_seconds);
    if (st.replicas > 1 && parts) {
      st.allreduce_window_seconds =
          row_scale * pt::AllReduceWindowSeconds(std::min(window, st.backward_seconds),
                                                 st.backward_seconds, pass_one_bytes,
                                                 st.parameter_bytes);
    }
    st.backward_seconds *= row_scale;
    // A replica's later micro-batches add their gradients into the first's
    // (the planner's StagePlan::accumulate_seconds), spread over its k.
    const double k = static_cast<double>(p.micro_batches) / st.replicas;
    if (k > 1) {
      const double adds = (k - 1) / k *
                          pt::AddedGradientBytes(*graph, st.nodes, plan.split_backward()) *
                          graph->accumulate_seconds_per_byte();
      st.backward_seconds += adds;
      if (st.backward_weight_seconds > 0) st.backward_weight_seconds += adds;
    }
    st.allreduce_bandwidth = cluster.levels[pt::SpanLevel(cluster, st.workers)].bandwidth;
    st.in_flight_depth = stage.in_flight_depth();
    p.stages.push_back(std::move(st));
  }
  for (size_t s = 0; s < p.stages.size(); ++s) {
    std::vector<int> both = p.stages[s].workers;
    if (s + 1 < p.stages.size()) {
      both.insert(both.end(), p.stages[s + 1].workers.begin(), p.stages[s + 1].workers.end());
    }
    const pt::Level& link = cluster.levels[pt::SpanLevel(cluster, both)];
    p.stages[s].output_bandwidth = link.bandwidth;
    p.stages[s].output_burst_bytes = link.burst_bytes;
  }
  // The bytes that cross the wire (plan.transfer_precision, skip_zeros).
  // Copies touch every value, zeros too: `whole` per stage.
  const double compression = TransferCompressionRatio(plan.transfer_precision());
  std::vector<double> whole(p.stages.size(), 0.0);
  for (int v = 0; v < graph->num_nodes(); ++v) {
    if (stage_of[v] < 0) continue;
    for (int w : graph->successors(v)) {
      if (stage_of[w] > stage_of[v]) {
        const pt::Node& node = graph->node(v);
        p.stages[stage_of[v]].output_bytes +=
            node.cut_bytes(compression) * per_micro / compression;
        whole[stage_of[v]] += node.activation_bytes * per_micro / compression;
        break;
      }
    }
  }
  // What the planner charges too: the copies of a stage's transfers take
  // its CPU, activations in and out forward, their gradients backward.
  // Each is one micro-batch's message, whose CPU per byte
  // grows with its size (pt::Cluster::TransferCpuPerByte).
  // The all-reduces the planner weighed for the plan's workers: none
  // timed over more of them (SubCluster).
  apapo::v1::ClusterSpec measured = spec;
  std::vector<std::string> planned;
  for (int i = 0; i < spec.workers_size(); ++i) {
    if (busy[i]) planned.push_back(spec.workers(i).worker_id());
  }
  KeepAllReducesWithin(planned, &measured);
  SetMeasuredCosts(measured, &cluster);
  const double cpu_per_byte = cluster.transfer_cpu_seconds_per_byte;
  for (size_t s = 0; s < p.stages.size() && cpu_per_byte > 0; ++s) {
    double cpu = cluster.TransferCpuSeconds(whole[s]);
    if (s > 0) cpu += cluster.TransferCpuSeconds(whole[s - 1]);
    p.stages[s].transfer_cpu_seconds = cpu;
    p.stages[s].forward_seconds += p.stages[s].transfer_cpu_seconds;
    p.stages[s].backward_seconds += p.stages[s].transfer_cpu_seconds;
  }

  pt::SimulationOptions options;
  options.iterations = std::max(2, steps);
  options.micro_batches = p.micro_batches;
  options.max_in_flight = plan.in_flight();
  options.record_trace = record_trace;
  return pt::Simulate(p, cluster, *kind, options);
}

}  // namespace

absl::StatusOr<double> SimulatedSamplesPerSecond(
    const apapo::v1::GetPlanResponse& response) {
  if (response.profile().batch_size() <= 0) {
    return absl::FailedPreconditionError("the profile has no batch size");
  }
  absl::StatusOr<pt::SimulationResult> result =
      SimulateStored(response, kRateIterations, /*record_trace=*/false);
  if (!result.ok()) return result.status();
  return result->mini_batches_per_second *
         static_cast<double>(response.profile().batch_size());
}

absl::StatusOr<std::vector<apapo::v1::StageTrace>> SimulatedTrace(
    const apapo::v1::GetPlanResponse& response, int steps) {
  absl::StatusOr<pt::SimulationResult> result =
      SimulateStored(response, steps, /*record_trace=*/true);
  if (!result.ok()) return result.status();

  std::map<std::pair<int, int>, apapo::v1::StageTrace> traces;
  std::map<std::pair<int, int>, int64_t> updates;
  std::vector<pt::TraceEvent> events = result->trace;
  std::stable_sort(events.begin(), events.end(),
                   [](const pt::TraceEvent& a, const pt::TraceEvent& b) {
                     return a.start < b.start;
                   });
  for (const pt::TraceEvent& e : events) {
    const apapo::v1::SpanKind span_kind = apapo::schedule::SpanKindOf(e.op.type);
    // The simulator gives the final flush no duration: not a span here.
    if (span_kind == apapo::v1::SPAN_KIND_UNSPECIFIED ||
        span_kind == apapo::v1::SPAN_KIND_FLUSH) {
      continue;
    }
    const std::pair<int, int> key(e.stage, e.replica);
    apapo::v1::StageTrace& t = traces[key];
    t.set_stage(e.stage);
    t.set_replica(e.replica);
    apapo::v1::TraceSpan* span = t.add_spans();
    span->set_kind(span_kind);
    const bool per_batch = e.op.type != Op::kUpdate && e.op.type != Op::kAllReduce;
    span->set_micro_batch(per_batch ? e.op.micro_batch : -1);
    span->set_step(updates[key]);
    // Rounded ends, not durations: a span ends where the next one starts.
    const int64_t start_ns = std::llround(e.start * 1e9);
    span->set_start_ns(start_ns);
    span->set_duration_ns(std::llround(e.end * 1e9) - start_ns);
    if (e.op.type == Op::kUpdate) ++updates[key];
  }
  std::vector<apapo::v1::StageTrace> out;
  for (auto& [key, t] : traces) {
    t.set_first_step(0);
    t.set_end_step(std::max(2, steps));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace apapo::planning
