// Conversions between the partitioner's types and the apapo.v1 protos:
// Plan -> apapo.v1.Plan (and its protobuf JSON mapping), and
// apapo.v1.ModelProfile (text or JSON) -> Graph.
//
// Thread-safety: stateless functions, safe to call concurrently.

#ifndef APAPO_PARTITIONER_PLAN_PROTO_H_
#define APAPO_PARTITIONER_PLAN_PROTO_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "partitioner/graph.h"
#include "partitioner/optimizer.h"
#include "proto/apapo/v1/plan.pb.h"
#include "proto/apapo/v1/profile.pb.h"

namespace apapo {
namespace partitioner {

apapo::v1::ScheduleKind ScheduleToProto(schedule::ScheduleKind kind);
// The schedule a proto kind names; UNSPECIFIED ("auto") is APapo's async.
// INVALID_ARGUMENT "<field>: unknown value N" for values outside the enum.
absl::StatusOr<schedule::ScheduleKind> ScheduleFromProto(
    apapo::v1::ScheduleKind kind, absl::string_view field = "schedule.kind");

// Stage node ids are written as in the input; worker ids are "w<index>" and
// ranks count replicas in pipeline order.
apapo::v1::Plan PlanToProto(const Plan& plan, const Graph& graph,
                            absl::string_view model);

// Protobuf JSON mapping (camelCase names, e.g. "nodeIds").
absl::StatusOr<std::string> PlanToJson(const apapo::v1::Plan& plan);

// Builds a validated graph from a profile (edges from NodeProfile.inputs).
// `skip_zeros`: whether the nodes' nonzero_share is charged at the cuts
// (ScheduleSpec.skip_zeros); false: every value crosses.
absl::StatusOr<Graph> GraphFromProfile(const apapo::v1::ModelProfile& profile,
                                       bool skip_zeros = true);

// Nodes worth splitting column-wise (plan.proto's LayerSplit): those with a
// split_width of at least 2 whose forward + backward time is at least
// `min_share` of the model's, in profile order.
std::vector<std::string> SplitCandidates(const apapo::v1::ModelProfile& profile,
                                         double min_share);

// The most a split may cost, as a multiple of the whole layer (ModelProfile.
// split_costs; the worker's measurements are bounded by it too).
inline constexpr double kMaxSplitScale = 4.0;

// What a node split in `parts` computes as a multiple of the whole node:
// the profile's split_costs entry for `parts`, else the nearest below it,
// else 1.
double SplitScale(const apapo::v1::ModelProfile& profile, int parts);

// The profile of the split graph (worker/model_graph.h's SplitLinearLayers
// applied to the measured model): each split node's activation and
// parameter bytes are shared evenly by its parts "<id>/i", and its time
// too, times SplitScale (the optimizer's update in its backward is not
// scaled); the concat that keeps the id costs no time (its copy is in the
// scale) and outputs the node's activations. Errors name the split
// (unknown node, not splittable, parts out of range).
absl::StatusOr<apapo::v1::ModelProfile> SplitProfile(
    const apapo::v1::ModelProfile& profile,
    const std::vector<std::pair<std::string, int>>& splits);

// Reads a ModelProfile from a file: JSON if it starts with '{', else text
// format. Errors are "FILE:LINE: reason" (LINE 0 when unknown).
absl::StatusOr<Graph> ReadModelProfile(const std::string& path);

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_PLAN_PROTO_H_
