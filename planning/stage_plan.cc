#include "planning/stage_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "partitioner/plan_proto.h"

namespace apapo::planning {

int MaxInFlight(const apapo::v1::JobSpec& spec, int micro_batches,
                const std::vector<int>& replicas) {
  return spec.schedule().has_max_staleness()
             ? schedule::MaxInFlightForStaleness(
                   spec.schedule().max_staleness(), micro_batches, replicas)
             : 0;
}

int MicroBatches(const apapo::v1::JobSpec& spec, int planned,
                 schedule::ScheduleKind kind, const std::vector<int>& replicas) {
  if (planned > 0) return planned;
  if (spec.schedule().has_micro_batches()) {
    return spec.schedule().micro_batches();
  }
  return schedule::DefaultMicroBatches(kind, replicas, spec.data().batch_size());
}

int StagePlan::RankOf(int stage, int replica) const {
  return schedule::RankOf(schedule, stage, replica);
}

std::pair<int, int> StagePlan::StageOf(int rank) const {
  int stage = 0;
  while (stage + 1 < schedule.num_stages && rank >= schedule.Replicas(stage)) {
    rank -= schedule.Replicas(stage);
    ++stage;
  }
  return {stage, rank};
}

std::string StagePlan::Describe(const apapo::v1::JobSpec& spec,
                                absl::string_view origin) const {
  std::vector<std::string> parts;
  for (int s = 0; s < static_cast<int>(stage_nodes.size()); ++s) {
    const auto& nodes = stage_nodes[s];
    const bool deeper = s < static_cast<int>(schedule.in_flight_depth.size()) &&
                        schedule.in_flight_depth[s] > 0;
    parts.push_back(absl::StrCat(
        "[", nodes.front(), "..", nodes.back(), "]",
        schedule.Replicas(s) > 1 ? absl::StrCat(" x", schedule.Replicas(s))
                                 : "",
        deeper ? absl::StrCat(" (", schedule::InFlightDepth(schedule, s),
                              " in flight)")
               : ""));
  }
  std::vector<std::string> split_names;
  for (const auto& [id, n] : splits) {
    split_names.push_back(absl::StrCat(id, "/", n));
  }
  const bool predicting = schedule.kind == schedule::ScheduleKind::kAsync &&
                          WeightPredictionRequested(spec);
  return absl::StrCat(
      schedule::ScheduleKindName(schedule.kind),
      !origin.empty() ? absl::StrCat(" (", origin, ")")
      : spec.schedule().kind() == apapo::v1::SCHEDULE_KIND_UNSPECIFIED
          ? " (auto)"
          : "",
      ", ", schedule.num_stages, " stage(s), m=",
      schedule.micro_batches_per_iteration, ": ", absl::StrJoin(parts, " | "),
      split_names.empty() ? ""
                          : absl::StrCat(", split ", absl::StrJoin(split_names, " ")),
      predicting ? ", weight prediction" : "",
      split_backward && schedule.num_stages > 1 ? ", split backward" : "",
      split_backward && !allreduce_in_parts && !schedule.replicas.empty()
          ? ", one all-reduce after the backward"
          : "");
}

absl::StatusOr<StagePlan> StagePlanFor(const apapo::v1::JobSpec& spec,
                                       const apapo::v1::Plan& plan) {
  StagePlan out;
  if (plan.stages_size() == 0) {
    return absl::InvalidArgumentError("plan.stages: no stages");
  }
  auto kind = partitioner::ScheduleFromProto(plan.schedule(), "plan.schedule");
  if (!kind.ok()) return kind.status();
  if (*kind == schedule::ScheduleKind::kDataParallel &&
      plan.stages_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan.stages: data parallelism needs exactly one stage, got ",
        plan.stages_size()));
  }
  out.schedule.kind = *kind;
  out.schedule.num_stages = plan.stages_size();
  bool replicated = false, deeper = false;
  std::vector<int> replicas, depths;
  for (int i = 0; i < plan.stages_size(); ++i) {
    const apapo::v1::Stage& st = plan.stages(i);
    if (st.node_ids().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan.stages[", i, "]: no node ids"));
    }
    out.stage_nodes.emplace_back(st.node_ids().begin(), st.node_ids().end());
    replicas.push_back(std::max(1, st.replicas()));
    replicated |= replicas.back() > 1;
    out.world_size += replicas.back();
    if (st.in_flight_depth() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan.stages[", i, "].in_flight_depth: ",
                       st.in_flight_depth(), " is negative"));
    }
    depths.push_back(st.in_flight_depth());
    deeper |= depths.back() > 0;
  }
  if (replicated) out.schedule.replicas = replicas;
  // A depth only the async schedule takes; ValidateScheduleOptions refuses
  // it for the others.
  if (deeper) out.schedule.in_flight_depth = depths;
  out.schedule.micro_batches_per_iteration =
      MicroBatches(spec, plan.micro_batches(), *kind, replicas);
  out.schedule.max_in_flight =
      MaxInFlight(spec, out.schedule.micro_batches_per_iteration, replicas);
  // SplitLinearLayers checks the splits against the model.
  for (const apapo::v1::LayerSplit& split : plan.splits()) {
    out.splits.emplace_back(split.node_id(), split.parts());
  }
  out.skip_zeros = plan.skip_zeros();
  out.split_backward = plan.split_backward();
  out.allreduce_in_parts = plan.split_backward() && !plan.allreduce_after_backward();
  if (absl::Status s = schedule::ValidateScheduleOptions(out.schedule);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", s.message()));
  }
  return out;
}

bool WeightPredictionRequested(const apapo::v1::JobSpec& spec) {
  return !spec.schedule().has_weight_prediction() ||
         spec.schedule().weight_prediction();
}

bool SkipZerosRequested(const apapo::v1::JobSpec& spec) {
  return !spec.schedule().has_skip_zeros() || spec.schedule().skip_zeros();
}

bool SplitBackwardRequested(const apapo::v1::JobSpec& spec) {
  return !spec.schedule().has_split_backward() ||
         spec.schedule().split_backward();
}

std::optional<bool> AllReduceInBackwardRequested(const apapo::v1::JobSpec& spec) {
  if (!SplitBackwardRequested(spec)) return false;
  if (!spec.schedule().has_allreduce_in_backward()) return std::nullopt;
  return spec.schedule().allreduce_in_backward();
}

double TransferCompressionRatio(apapo::v1::TransferPrecision precision) {
  return precision == apapo::v1::TRANSFER_PRECISION_BFLOAT16 ? 2.0 : 1.0;
}

}  // namespace apapo::planning
