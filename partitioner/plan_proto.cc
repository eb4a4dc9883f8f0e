#include "partitioner/plan_proto.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace apapo {

namespace {

// Bytes the planner computed in doubles, as the proto's int64: clamped, since
// sums of a hostile profile's sizes can pass int64's range, where a cast is
// undefined.
int64_t SaturatedBytes(double bytes) {
  if (!(bytes > 0)) return 0;
  if (bytes >= 9.2e18) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(bytes);
}

}  // namespace
namespace partitioner {

apapo::v1::ScheduleKind ScheduleToProto(schedule::ScheduleKind kind) {
  switch (kind) {
    case schedule::ScheduleKind::kAsync:
      return apapo::v1::SCHEDULE_KIND_ASYNC;
    case schedule::ScheduleKind::k2BW:
      return apapo::v1::SCHEDULE_KIND_2BW;
    case schedule::ScheduleKind::kGPipe:
      return apapo::v1::SCHEDULE_KIND_GPIPE;
    case schedule::ScheduleKind::k1F1BFlush:
      return apapo::v1::SCHEDULE_KIND_1F1B_FLUSH;
    case schedule::ScheduleKind::kDataParallel:
      return apapo::v1::SCHEDULE_KIND_DATA_PARALLEL;
  }
  return apapo::v1::SCHEDULE_KIND_UNSPECIFIED;
}

absl::StatusOr<schedule::ScheduleKind> ScheduleFromProto(
    apapo::v1::ScheduleKind kind, absl::string_view field) {
  switch (kind) {
    case apapo::v1::SCHEDULE_KIND_UNSPECIFIED:  // auto: APapo's schedule
    case apapo::v1::SCHEDULE_KIND_ASYNC:
      return schedule::ScheduleKind::kAsync;
    case apapo::v1::SCHEDULE_KIND_2BW:
      return schedule::ScheduleKind::k2BW;
    case apapo::v1::SCHEDULE_KIND_GPIPE:
      return schedule::ScheduleKind::kGPipe;
    case apapo::v1::SCHEDULE_KIND_1F1B_FLUSH:
      return schedule::ScheduleKind::k1F1BFlush;
    case apapo::v1::SCHEDULE_KIND_DATA_PARALLEL:
      return schedule::ScheduleKind::kDataParallel;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown value ", static_cast<int>(kind)));
  }
}

apapo::v1::Plan PlanToProto(const Plan& plan, const Graph& graph,
                            absl::string_view model) {
  apapo::v1::Plan out;
  out.set_model(std::string(model));
  out.set_schedule(ScheduleToProto(plan.schedule));
  out.set_micro_batches(plan.micro_batches);
  int in_flight = 0;
  int rank = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    apapo::v1::Stage* stage = out.add_stages();
    stage->set_index(s);
    for (int v : st.nodes) stage->add_node_ids(graph.node(v).id);
    stage->set_replicas(st.replicas);
    for (int w : st.workers) {
      apapo::v1::StageReplica* replica = stage->add_placement();
      replica->set_worker_id(absl::StrCat("w", w));
      replica->set_rank(rank++);
    }
    stage->set_compute_seconds(st.compute_seconds);
    stage->set_allreduce_seconds(st.allreduce_seconds);
    stage->set_comm_seconds(st.comm_seconds);
    stage->set_peak_memory_bytes(SaturatedBytes(st.peak_memory_bytes));
    stage->set_parameter_bytes(SaturatedBytes(st.parameter_bytes));
    stage->set_weight_versions(st.weight_versions);
    stage->set_in_flight_micro_batches(st.in_flight);
    stage->set_staleness(static_cast<int32_t>(st.staleness));
    stage->set_in_flight_depth(st.in_flight_depth);
    in_flight = std::max(in_flight, st.in_flight);
  }
  out.set_in_flight(in_flight);
  apapo::v1::PlanPrediction* prediction = out.mutable_prediction();
  prediction->set_seconds_per_mini_batch(plan.seconds_per_mini_batch);
  prediction->set_samples_per_second(plan.samples_per_second);
  prediction->set_bubble_fraction(plan.bubble_fraction);
  if (plan.seconds_per_mini_batch > 0) {
    prediction->set_speedup_over_single_worker(plan.single_worker_seconds /
                                               plan.seconds_per_mini_batch);
  }
  out.set_cost_model(std::string(CostModelName(plan.cost_model)));
  out.set_num_workers(plan.num_workers);
  out.add_notes(absl::StrCat("search: ", plan.search));
  for (const std::string& note : plan.notes) out.add_notes(note);
  return out;
}

absl::StatusOr<std::string> PlanToJson(const apapo::v1::Plan& plan) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = false;
  auto status = google::protobuf::util::MessageToJsonString(plan, &json, options);
  if (!status.ok()) {
    return absl::InternalError(std::string(status.message()));
  }
  return json;
}

absl::StatusOr<Graph> GraphFromProfile(const apapo::v1::ModelProfile& profile,
                                       bool skip_zeros) {
  Graph graph;
  for (const apapo::v1::NodeProfile& n : profile.nodes()) {
    if (!(n.nonzero_share() >= 0 && n.nonzero_share() <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node '", n.id(), "': nonzero_share must be in [0, 1], got ", n.nonzero_share()));
    }
    Node node;
    node.id = n.id();
    node.description = n.description();
    node.forward_seconds = n.forward_seconds();
    node.backward_seconds = n.backward_seconds();
    node.activation_bytes = static_cast<double>(n.activation_bytes());
    node.parameter_bytes = static_cast<double>(n.parameter_bytes());
    if (skip_zeros) node.nonzero_share = n.nonzero_share();
    node.weights_after_send = n.weight_gradients_after_send();
    node.weights_in_product = n.weight_gradients_in_product();
    graph.AddNode(std::move(node));
  }
  graph.set_update_seconds(profile.update_seconds());
  graph.set_update_prediction_seconds(profile.update_prediction_seconds());
  std::vector<std::pair<double, double>> costs;
  for (const apapo::v1::MicroBatchCost& c : profile.micro_batch_costs()) {
    costs.emplace_back(static_cast<double>(c.rows()), c.scale());
  }
  graph.set_micro_batch_costs(std::move(costs));
  // Read by SplitProfile, not the graph: checked here so that a profile
  // with a bad one fails planning naming it, rather than never splitting.
  for (int i = 0; i < profile.split_costs_size(); ++i) {
    const apapo::v1::SplitCost& c = profile.split_costs(i);
    if (c.parts() < 2 || (i > 0 && c.parts() <= profile.split_costs(i - 1).parts())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split_costs[", i, "].parts must be >= 2 and ascending, got ", c.parts()));
    }
    if (!std::isfinite(c.scale()) || c.scale() < 1 || c.scale() > kMaxSplitScale) {
      return absl::InvalidArgumentError(absl::StrCat("split_costs[", i,
                                                     "].scale must be in [1, ",
                                                     kMaxSplitScale, "], got ", c.scale()));
    }
  }
  graph.set_accumulate_seconds_per_byte(profile.accumulate_seconds_per_byte());
  for (const apapo::v1::NodeProfile& n : profile.nodes()) {
    const int to = graph.FindNode(n.id());
    for (const std::string& input : n.inputs()) {
      const int from = graph.FindNode(input);
      if (from < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node '", n.id(), "': dangling input '", input, "'"));
      }
      if (absl::Status s = graph.AddEdge(from, to); !s.ok()) return s;
    }
  }
  if (absl::Status s = graph.Validate(); !s.ok()) return s;
  return graph;
}

std::vector<std::string> SplitCandidates(const apapo::v1::ModelProfile& profile,
                                         double min_share) {
  double total = 0;
  for (const auto& n : profile.nodes()) {
    total += n.forward_seconds() + n.backward_seconds();
  }
  std::vector<std::string> out;
  for (const auto& n : profile.nodes()) {
    if (n.split_width() >= 2 &&
        n.forward_seconds() + n.backward_seconds() >= min_share * total) {
      out.push_back(n.id());
    }
  }
  return out;
}

double SplitScale(const apapo::v1::ModelProfile& profile, int parts) {
  double scale = 1;
  for (const apapo::v1::SplitCost& c : profile.split_costs()) {
    if (c.parts() > parts) break;
    if (std::isfinite(c.scale()) && c.scale() >= 1 && c.scale() <= kMaxSplitScale) {
      scale = c.scale();
    }
  }
  return scale;
}

absl::StatusOr<apapo::v1::ModelProfile> SplitProfile(
    const apapo::v1::ModelProfile& profile,
    const std::vector<std::pair<std::string, int>>& splits) {
  apapo::v1::ModelProfile out = profile;
  std::set<std::string> ids;
  double total_params = 0;
  for (const auto& n : profile.nodes()) {
    ids.insert(n.id());
    total_params += static_cast<double>(n.parameter_bytes());
  }
  std::set<std::string> done;
  for (const auto& [id, parts] : splits) {
    const std::string where = absl::StrCat("split of '", id, "'");
    if (!done.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": split twice"));
    }
    int pos = -1;
    for (int i = 0; i < out.nodes_size(); ++i) {
      if (out.nodes(i).id() == id) pos = i;
    }
    if (pos < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no such node in the profile"));
    }
    const apapo::v1::NodeProfile node = out.nodes(pos);
    if (parts < 2 || parts > node.split_width()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parts must be in [2, split_width = ", node.split_width(),
          "], got ", parts));
    }
    // The parts together compute `scale` times the node (split_costs);
    // the optimizer's update, in the backward by parameter bytes, does not
    // change with the split.
    const double scale = SplitScale(profile, parts);
    const double update =
        total_params > 0 ? profile.update_seconds() *
                               static_cast<double>(node.parameter_bytes()) / total_params
                         : 0;
    const double backward = std::max(0.0, node.backward_seconds() - update);
    apapo::v1::NodeProfile concat;
    concat.set_id(id);
    concat.set_activation_bytes(node.activation_bytes());
    concat.set_description(
        absl::StrCat(node.description(), ", split into ", parts, " parts"));
    for (int i = 0; i < parts; ++i) {
      apapo::v1::NodeProfile part = node;
      part.set_id(absl::StrCat(id, "/", i));
      if (ids.count(part.id())) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the profile already has a node '", part.id(), "'"));
      }
      part.set_forward_seconds(node.forward_seconds() * scale / parts);
      part.set_backward_seconds((backward * scale + update) / parts);
      part.set_activation_bytes(node.activation_bytes() / parts);
      part.set_parameter_bytes(node.parameter_bytes() / parts);
      part.set_workspace_bytes(node.workspace_bytes() / parts);
      part.set_split_width(0);
      concat.add_inputs(part.id());
      *out.add_nodes() = std::move(part);
    }
    *out.mutable_nodes(pos) = std::move(concat);
  }
  return out;
}

namespace {

class LineCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) {
      first_ = message;
      line_ = line + 1;
    }
  }
  std::string first_;
  int line_ = 0;
};

}  // namespace

absl::StatusOr<Graph> ReadModelProfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ":0: cannot open file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  apapo::v1::ModelProfile profile;
  const std::string trimmed(absl::StripLeadingAsciiWhitespace(text));
  if (!trimmed.empty() && trimmed[0] == '{') {
    auto status = google::protobuf::util::JsonStringToMessage(text, &profile);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":0: ", std::string(status.message())));
    }
  } else {
    google::protobuf::TextFormat::Parser parser;
    LineCollector errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(text, &profile)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", errors.line_, ": ", errors.first_));
    }
  }
  for (const apapo::v1::NodeProfile& n : profile.nodes()) {
    for (double v : {n.forward_seconds(), n.backward_seconds()}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":0: node '", n.id(), "': times must be finite and >= 0"));
      }
    }
    if (n.activation_bytes() < 0 || n.parameter_bytes() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":0: node '", n.id(), "': sizes must be >= 0"));
    }
  }
  absl::StatusOr<Graph> graph = GraphFromProfile(profile);
  if (!graph.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":0: ", graph.status().message()));
  }
  return graph;
}

}  // namespace partitioner
}  // namespace apapo
