#include "worker/daemon/profiler.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/model_builder.h"
#include "worker/model_graph.h"
#include "worker/torchscript_model.h"

namespace apapo::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kDefaultIterations = 3;
// Without micro_batches in the spec the planner picks them per schedule (1
// for an async pipeline): profile whole mini-batches then.
constexpr int kDefaultMicroBatches = 1;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t Bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

std::vector<int64_t> WithBatch(int64_t batch, const Shape& shape) {
  std::vector<int64_t> out = {batch};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

std::string Describe(const NodeInfo& n) {
  if (!n.node->description().empty()) return n.node->description();
  const std::string name = apapo::v1::LayerKind_Name(n.kind());
  absl::string_view kind = name;
  absl::ConsumePrefix(&kind, "LAYER_KIND_");
  return absl::StrCat(absl::AsciiStrToLower(kind), " -> ",
                      ShapeToString(n.out_shape));
}

// Per-node figures of the fastest timed pass.
struct NodeTimes {
  double forward = 0;
  double backward = 0;
  int64_t activation_bytes = 0;  // per micro-batch
  int64_t parameter_bytes = 0;
};

absl::StatusOr<apapo::v1::ProfileResult> ProfileOrThrow(
    const apapo::v1::ProfileCommand& command, const ProfileOptions& options) {
  const apapo::v1::JobSpec& spec = command.spec();
  const int64_t batch = spec.data().batch_size();
  const int m = spec.schedule().has_micro_batches()
                    ? spec.schedule().micro_batches()
                    : kDefaultMicroBatches;
  if (batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.data.batch_size: must be >= 1, got ", batch));
  }
  if (m < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.schedule.micro_batches: must be >= 1, got ", m));
  }
  const int64_t micro = std::max<int64_t>(1, batch / m);
  // Per-micro-batch figures times micro-batches per mini-batch.
  const double scale = static_cast<double>(batch) / static_cast<double>(micro);
  const int iterations =
      command.iterations() > 0 ? command.iterations() : kDefaultIterations;

  auto proto_graph = GraphForJob(spec, TorchScriptGraph);
  if (!proto_graph.ok()) return proto_graph.status();
  auto graph = AnalyzedGraph::Create(*std::move(proto_graph));
  if (!graph.ok()) return graph.status();
  auto data_shape = DataShapeForJob(spec.data());
  if (!data_shape.ok()) return data_shape.status();

  // One stage per node, in topological order: each node runs (and is timed)
  // on its own, with the real kernels the runtime uses.
  const std::vector<NodeInfo>& nodes = graph->nodes();
  const int n = static_cast<int>(nodes.size());
  std::vector<std::vector<std::string>> singletons;
  for (const NodeInfo& node : nodes) singletons.push_back({node.id()});
  auto layouts = LayoutStages(*graph, singletons);
  if (!layouts.ok()) {
    return absl::InternalError(absl::StrCat(
        "profiling: cannot run the graph node by node: ",
        layouts.status().message()));
  }
  std::vector<std::unique_ptr<StageModel>> models;
  std::vector<std::vector<at::Tensor>> params;
  for (int k = 0; k < n; ++k) {
    auto model = StageModel::Create(*graph, (*layouts)[k]);
    if (!model.ok()) return model.status();
    params.push_back((*model)->InitParameters(spec.seed()));
    models.push_back(*std::move(model));
  }

  if (options.threads > 0) at::set_num_threads(options.threads);
  torch::AutoGradMode grad_mode(true);
  torch::manual_seed(spec.seed());
  const DataShape& ds = *data_shape;
  at::Tensor samples =
      ds.sample_dtype == DType::kInt64
          ? torch::randint(0, std::max<int64_t>(1, ds.num_classes),
                           WithBatch(micro, ds.sample_shape), torch::kLong)
          : torch::randn(WithBatch(micro, ds.sample_shape));
  at::Tensor labels =
      torch::randint(0, std::max<int64_t>(1, ds.num_classes),
                     WithBatch(micro, graph->label_shape()), torch::kLong);

  std::vector<NodeTimes> times(n);
  for (int k = 0; k < n; ++k) {
    for (const at::Tensor& p : params[k]) times[k].parameter_bytes += Bytes(p);
  }
  // Whether a node's output carries gradient in the whole model: it or a
  // node upstream has parameters. The first layers after the data compute
  // no input gradient in training, so they must not here either.
  std::map<std::string, bool> carries_grad;
  for (int k = 0; k < n; ++k) {
    bool g = !params[k].empty();
    for (int in : nodes[k].inputs) g = g || carries_grad[nodes[in].id()];
    carries_grad[nodes[k].id()] = g;
  }
  // Pass 0 warms up (allocator, BLAS pools, lazy kernel set-up); each node
  // keeps its fastest pass (the one least disturbed by other processes).
  for (int pass = 0; pass <= iterations; ++pass) {
    std::vector<at::Tensor> carried = {samples, labels};
    for (int k = 0; k < n; ++k) {
      if (options.cancelled && options.cancelled()) {
        return absl::CancelledError("profiling stopped");
      }
      const NodeInfo& node = nodes[k];
      // Fresh leaves: backward stops at this node's inputs.
      std::vector<at::Tensor> inputs;
      std::vector<at::Tensor> grad_targets;
      for (size_t e = 0; e < carried.size(); ++e) {
        const at::Tensor& t = carried[e];
        if (k == 0) {
          inputs.push_back(t);
          continue;
        }
        at::Tensor leaf = t.detach();
        const auto& entries = (*layouts)[k].inputs;
        const bool wants_grad =
            e < entries.size() && carries_grad[entries[e].name];
        if (leaf.is_floating_point() && wants_grad) {
          leaf.requires_grad_(true);
          grad_targets.push_back(leaf);
        }
        inputs.push_back(leaf);
      }
      for (const at::Tensor& p : params[k]) {
        if (p.requires_grad()) grad_targets.push_back(p);
      }

      const Clock::time_point f0 = Clock::now();
      absl::StatusOr<StageForward> out =
          models[k]->Forward(inputs, params[k], /*training=*/true);
      const Clock::time_point f1 = Clock::now();
      if (!out.ok()) {
        return absl::Status(out.status().code(),
                            absl::StrCat("profiling node '", node.id(),
                                         "': ", out.status().message()));
      }
      at::Tensor y;
      if ((*layouts)[k].is_last) {
        y = out->loss;
      } else {
        const auto& entries = (*layouts)[k].outputs;
        for (size_t e = 0; e < entries.size(); ++e) {
          if (entries[e].name == node.id()) y = out->outputs[e];
        }
      }
      double backward = 0;
      if (y.defined() && y.requires_grad() && !grad_targets.empty()) {
        at::Tensor ones = torch::ones_like(y);
        const Clock::time_point b0 = Clock::now();
        torch::autograd::grad({y}, grad_targets, {ones},
                              /*retain_graph=*/false, /*create_graph=*/false,
                              /*allow_unused=*/true);
        backward = Seconds(b0, Clock::now());
      }
      if (pass > 0) {
        const double forward = Seconds(f0, f1);
        times[k].forward =
            pass == 1 ? forward : std::min(times[k].forward, forward);
        times[k].backward =
            pass == 1 ? backward : std::min(times[k].backward, backward);
        times[k].activation_bytes = Bytes(y);
      }
      if (!(*layouts)[k].is_last) carried = std::move(out->outputs);
    }
  }

  apapo::v1::ProfileResult result;
  result.set_job_id(command.job_id());
  apapo::v1::ModelProfile* profile = result.mutable_profile();
  profile->set_model(graph->graph().name());
  profile->set_batch_size(batch);
  profile->set_source(absl::StrCat(
      "measured by apapo-worker: micro-batch of ", micro, " x ",
      batch / micro, ", fastest of ", iterations, " pass(es)"));
  for (int k = 0; k < n; ++k) {
    const NodeInfo& node = nodes[k];
    apapo::v1::NodeProfile* np = profile->add_nodes();
    np->set_id(node.id());
    for (const std::string& in : node.node->inputs()) np->add_inputs(in);
    np->set_forward_seconds(times[k].forward * scale);
    np->set_backward_seconds(times[k].backward * scale);
    np->set_activation_bytes(
        static_cast<int64_t>(times[k].activation_bytes * scale));
    np->set_parameter_bytes(times[k].parameter_bytes);
    np->set_description(Describe(node));
    if (node.kind() == apapo::v1::LAYER_KIND_LINEAR) {
      np->set_split_width(node.out_shape.back());  // see plan.proto LayerSplit
    }
  }
  apapo::v1::WorkerResources* res = result.mutable_resources();
  res->set_relative_speed(0);  // the coordinator derives it
  int64_t memory = spec.resources().memory_per_worker_bytes();
  if (memory <= 0) memory = options.memory_bytes;
  if (memory <= 0) memory = AvailableMemoryBytes();
  res->set_memory_bytes(memory);
  return result;
}

}  // namespace

absl::StatusOr<apapo::v1::ProfileResult> ProfileJob(
    const apapo::v1::ProfileCommand& command, const ProfileOptions& options) {
  try {
    return ProfileOrThrow(command, options);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("profiling failed in LibTorch: ", e.what()));
  }
}

}  // namespace apapo::worker
