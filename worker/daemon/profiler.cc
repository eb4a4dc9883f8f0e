#include "worker/daemon/profiler.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/random/random.h"
#include "planning/stage_plan.h"
#include "worker/checkpoint_store.h"
#include "worker/daemon/transfer_cpu_probe.h"
#include "worker/file_system.h"
#include "worker/model_builder.h"
#include "worker/optimizer.h"
#include "worker/model_graph.h"
#include "worker/torchscript_model.h"

namespace apapo::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kDefaultIterations = 3;
// Without micro_batches in the spec the planner picks them per schedule (1
// for an async pipeline): profile whole mini-batches then.
constexpr int kDefaultMicroBatches = 1;
// Micro-batch sizes timed for ModelProfile.micro_batch_costs: halves of
// the mini-batch, at most this many (down to 1/16 of it: a 1F1B flush of 4
// stages runs 16 micro-batches), none below 2 rows (a batch norm refuses
// one in training).
constexpr size_t kMaxCostedSizes = 4;
constexpr int64_t kMinCostedRows = 2;
// The share of the compute from which a Linear layer is a split candidate
// (planning/partitioner_planner.cc passes the same to SplitCandidates).
constexpr double kSplitMinShare = 0.05;

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
  // A ReLU's: nonzero outputs over all outputs, summed over the timed
  // passes (each pass's `nonzero` over `outputs`).
  double nonzero = 0;
  double outputs = 0;
};

struct Calibration {
  double step_seconds = 0;    // forward + backward + update, median
  double update_seconds = 0;  // the optimizer update alone, median
  // A predicting stage's update over update_seconds (ModelProfile.
  // update_prediction_seconds), median of the passes' differences; 0 when
  // not timed.
  double update_prediction_seconds = 0;
  // Whether it was timed (a difference within the noise reads 0: under
  // load the 22 MB mlp's extra pass over its weights did).
  bool prediction_timed = false;
  // (rows, forward + backward per row at `rows` over that at the
  // calibration's own rows), each at its fastest pass, ascending rows.
  std::vector<std::pair<int64_t, double>> row_costs;
  // Adding one micro-batch's gradients into another's, seconds per
  // parameter byte, fastest pass; 0 when there are none.
  double accumulate_seconds_per_byte = 0;
  std::optional<apapo::v1::CheckpointMeasurement> checkpoint;
};

// The whole model with its split candidates split in `parts`.
struct SplitTrial {
  int parts = 0;
  double share = 0;  // the candidates' part of the nodes' compute
  std::unique_ptr<AnalyzedGraph> graph;  // outlives `model`, as it must
  std::unique_ptr<StageModel> model;     // null once it failed
  std::vector<at::Tensor> params;
  double seconds = 0;  // forward + backward, fastest pass (TimeSplits)
};

// A state larger than this is not written while profiling (it would hold
// the profile up for as long as the write takes); the plan then charges
// checkpoints their drain and refill alone, and says so.
constexpr int64_t kMaxProbeBytes = int64_t{1} << 30;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int64_t StateBytes(const StageCheckpoint& c) {
  int64_t bytes = 0;
  for (const at::Tensor& p : c.parameters) bytes += Bytes(p);
  for (const auto& slots : c.optimizer.per_param) {
    for (const at::Tensor& t : slots) bytes += Bytes(t);
  }
  for (const auto& [name, b] : c.buffers) bytes += Bytes(b);
  return bytes;
}

// Takes and writes `state` as a stage does at a checkpoint (the snapshot,
// then FileCheckpointStore::Save on this thread, as the writer thread
// would), into a scratch folder of `directory` with a random name, which is
// removed afterwards; the job's own steps are never touched (the store
// reads only "step-<N>" entries of `directory`). nullopt, with the reason
// on stderr, where the directory cannot be written or the state is too
// large: the profile does not fail for it.
std::optional<apapo::v1::CheckpointMeasurement> MeasureCheckpoint(
    const AnalyzedGraph& graph, const StageCheckpoint& state,
    const std::string& directory) {
  const int64_t bytes = StateBytes(state);
  if (directory.empty() || bytes <= 0) return std::nullopt;
  if (bytes > kMaxProbeBytes) {
    std::fprintf(stderr, "profiling: checkpoint not timed: %lld bytes of state is over %lld\n",
                 static_cast<long long>(bytes), static_cast<long long>(kMaxProbeBytes));
    return std::nullopt;
  }
  absl::BitGen gen;
  const std::string scratch = absl::StrCat(
      directory, "/.profile-probe-", absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
  FileSystem* fs = LocalFileSystem();
  FileCheckpointStore store(scratch, 1, &graph, fs);
  const Clock::time_point t0 = Clock::now();
  StageCheckpoint snapshot = state.Clone();
  const Clock::time_point t1 = Clock::now();
  const double cpu0 = ThreadCpuSeconds();
  absl::Status st = fs->CreateDir(scratch);
  if (st.ok()) st = store.Save(0, snapshot);
  const double cpu1 = ThreadCpuSeconds();
  const Clock::time_point t2 = Clock::now();
  for (const std::string& path :
       {store.DataPath(snapshot.step, 0), store.ManifestPath(snapshot.step, 0)}) {
    fs->Remove(path + ".tmp").IgnoreError();
    fs->Remove(path).IgnoreError();
  }
  fs->Remove(store.StepDir(snapshot.step)).IgnoreError();
  fs->Remove(scratch).IgnoreError();
  if (!st.ok()) {
    std::fprintf(stderr, "profiling: checkpoint not timed: %s\n",
                 std::string(st.message()).c_str());
    return std::nullopt;
  }
  apapo::v1::CheckpointMeasurement m;
  m.set_bytes(bytes);
  m.set_snapshot_seconds(Seconds(t0, t1));
  m.set_write_cpu_seconds(cpu1 - cpu0);
  m.set_write_seconds(Seconds(t1, t2));
  return m;
}

// Forward and backward of `model` on the first `rows` of (samples,
// labels), gradients to `params`; seconds. The gradients are dropped.
absl::StatusOr<double> TimeForwardBackward(StageModel& model,
                                           const std::vector<at::Tensor>& params,
                                           const at::Tensor& samples,
                                           const at::Tensor& labels, int64_t rows) {
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<StageForward> out = model.Forward(
      {samples.narrow(0, 0, rows), labels.narrow(0, 0, rows)}, params, /*training=*/true);
  if (!out.ok()) return out.status();
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& p : params) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  if (out->loss.defined() && out->loss.requires_grad() && !trainable.empty()) {
    torch::autograd::grad({out->loss}, trainable);
  }
  return Seconds(t0, Clock::now());
}

// The whole of `graph` as one stage (which must not outlive `graph`).
absl::StatusOr<std::unique_ptr<StageModel>> WholeModel(const AnalyzedGraph& graph) {
  std::vector<std::string> all;
  for (const NodeInfo& node : graph.nodes()) all.push_back(node.id());
  auto layout = LayoutStages(graph, {all});
  if (!layout.ok()) {
    return absl::InternalError(absl::StrCat(
        "profiling: cannot lay the model out as one stage: ",
        layout.status().message()));
  }
  return StageModel::Create(graph, (*layout)[0]);
}

// Trains the whole model as one stage on (samples, labels): one warm-up
// step, then `iterations` timed ones. After each step it also runs the
// forward and backward alone on the first `smaller` rows (descending), for
// Calibration::row_costs, interleaved with the whole steps. A size the
// model refuses (a batch norm's single row) ends the sizes there.
absl::StatusOr<Calibration> CalibrateWholeStep(
    const AnalyzedGraph& graph, const apapo::v1::JobSpec& spec,
    const at::Tensor& samples, const at::Tensor& labels, int iterations,
    const std::vector<int64_t>& smaller, const ProfileOptions& options) {
  auto model = WholeModel(graph);
  if (!model.ok()) return model.status();
  std::vector<at::Tensor> params = (*model)->InitParameters(spec.seed());
  auto optimizer = Optimizer::Create(spec.optimizer(), iterations + 1);
  if (!optimizer.ok()) return optimizer.status();
  // A stage that predicts its weights (async, all but the last stage)
  // updates as WeightStore::Update does with prediction_steps set: the
  // step fused with the prediction, or the step and then Predict. Timed
  // on an optimizer of its own, fed the same weights and gradients as the
  // plain one (so their states stay alike), its outputs dropped; before
  // the plain step on odd passes and after it on even ones, as the second
  // of two passes over the same memory runs on warmer caches.
  const apapo::v1::ScheduleKind kind = spec.schedule().kind();
  std::unique_ptr<Optimizer> predicting;
  if (planning::WeightPredictionRequested(spec) &&
      (kind == apapo::v1::SCHEDULE_KIND_UNSPECIFIED ||
       kind == apapo::v1::SCHEDULE_KIND_ASYNC)) {
    auto o = Optimizer::Create(spec.optimizer(), iterations + 1);
    if (!o.ok()) return o.status();
    predicting = *std::move(o);
  }
  std::vector<at::Tensor> predicting_spare, predicted_spare;
  auto time_predicting = [&](const std::vector<at::Tensor>& before,
                             std::vector<at::Tensor>& grads, int64_t step) {
    Optimizer::FusedPrediction fused;
    fused.steps = 1;
    fused.reuse = std::move(predicted_spare);
    const Clock::time_point p0 = Clock::now();
    std::vector<at::Tensor> next =
        predicting->Step(before, grads, step, std::move(predicting_spare), &fused);
    if (fused.out.empty()) {
      fused.out = predicting->Predict(next, fused.steps, step, std::move(fused.reuse));
    }
    const double seconds = Seconds(p0, Clock::now());
    predicting_spare = std::move(next);
    predicted_spare = std::move(fused.out);
    return seconds;
  };
  std::vector<double> steps, updates, prediction_extras;
  std::vector<std::vector<double>> row_times(smaller.size());
  std::vector<double> own_row_times;
  std::vector<at::Tensor> accumulated;
  std::vector<double> accumulate_times;
  size_t sizes = smaller.size();  // those the model runs
  const int64_t own_rows = samples.size(0);
  std::vector<at::Tensor> spare;
  for (int pass = 0; pass <= iterations; ++pass) {
    if (options.cancelled && options.cancelled()) {
      return absl::CancelledError("profiling stopped");
    }
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<StageForward> out =
        (*model)->Forward({samples, labels}, params, /*training=*/true);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("profiling the whole model: ",
                                       out.status().message()));
    }
    std::vector<at::Tensor> trainable, grads;
    for (const at::Tensor& p : params) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    if (out->loss.defined() && out->loss.requires_grad() &&
        !trainable.empty()) {
      grads = torch::autograd::grad({out->loss}, trainable);
    }
    const Clock::time_point t1 = Clock::now();
    const bool updates_all = !grads.empty() && grads.size() == params.size();
    double predicting_seconds = -1;
    if (predicting != nullptr && updates_all && pass % 2 == 1) {
      predicting_seconds = time_predicting(params, grads, pass);
    }
    const Clock::time_point t1b = Clock::now();
    if (updates_all) {
      std::vector<at::Tensor> next =
          (*optimizer)->Step(params, grads, pass, std::move(spare));
      // The runtime recycles a version nobody reads; so does this.
      spare = std::move(params);
      params = std::move(next);
    }
    const Clock::time_point t2 = Clock::now();
    if (predicting != nullptr && updates_all && pass % 2 == 0) {
      predicting_seconds = time_predicting(spare, grads, pass);  // the weights before
    }
    if (pass > 0) {
      steps.push_back(Seconds(t0, t1) + Seconds(t1b, t2));
      updates.push_back(Seconds(t1b, t2));
      if (predicting_seconds >= 0) {
        prediction_extras.push_back(predicting_seconds - Seconds(t1b, t2));
      }
    }
    // The runtime adds each later micro-batch's gradients into the first's
    // (stage_executor.cc): timed on this pass's fresh gradients, into the
    // previous pass's.
    if (!grads.empty() && accumulated.size() == grads.size()) {
      const Clock::time_point a0 = Clock::now();
      double bytes = 0;
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!grads[i].defined() || !accumulated[i].defined()) continue;
        accumulated[i].add_(grads[i]);
        bytes += static_cast<double>(Bytes(grads[i]));
      }
      const double seconds = Seconds(a0, Clock::now());
      if (pass > 0 && bytes > 0) accumulate_times.push_back(seconds / bytes);
    } else if (!grads.empty()) {
      for (const at::Tensor& g : grads) {
        accumulated.push_back(g.defined() ? g.detach().clone() : at::Tensor());
      }
    }
    if (pass > 0) own_row_times.push_back(Seconds(t0, t1) / static_cast<double>(own_rows));
    for (size_t i = 0; i < sizes; ++i) {
      absl::StatusOr<double> t = absl::InternalError("not run");
      try {
        t = TimeForwardBackward(**model, params, samples, labels, smaller[i]);
      } catch (const std::exception& e) {
        t = absl::InternalError(e.what());
      }
      if (!t.ok()) {
        sizes = i;
        break;
      }
      if (pass > 0) {
        row_times[i].push_back(*t / static_cast<double>(smaller[i]));
      }
    }
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  Calibration cal{median(steps), median(updates)};
  cal.update_prediction_seconds = std::max(0.0, median(prediction_extras));
  cal.prediction_timed = !prediction_extras.empty();
  // Each size's fastest pass, as the nodes keep theirs (a disturbance only
  // slows a pass: medians of the per-pass ratios put the mlp's 64 rows at
  // 0.86x and 1.14x in two profiles a minute apart). Bounded as the node
  // factor is.
  const double own = own_row_times.empty()
                         ? 0
                         : *std::min_element(own_row_times.begin(), own_row_times.end());
  for (size_t i = sizes; i-- > 0;) {
    if (!row_times[i].empty() && own > 0) {
      const double fastest = *std::min_element(row_times[i].begin(), row_times[i].end());
      cal.row_costs.emplace_back(smaller[i], std::clamp(fastest / own, 0.5, 4.0));
    }
  }
  cal.row_costs.emplace_back(own_rows, 1.0);
  // At most 1e-7 s a byte (10 MB/s): slower is a tiny model's per-call
  // overhead, not its bytes (the planner refuses more than 1e-6).
  if (!accumulate_times.empty()) {
    cal.accumulate_seconds_per_byte = std::min(
        1e-7, *std::min_element(accumulate_times.begin(), accumulate_times.end()));
  }
  // The trained state, as a stage holds it at a checkpoint.
  StageCheckpoint state;
  state.step = iterations + 1;
  state.version = iterations + 1;
  state.parameter_names = (*model)->param_names();
  state.parameters = params;
  state.optimizer = (*optimizer)->State();
  state.buffers = (*model)->Buffers();
  cal.checkpoint = MeasureCheckpoint(graph, state, spec.checkpoint().directory());
  return cal;
}

// The whole model's forward and backward, and each split trial's, on
// (samples, labels): a warm-up pass, then `iterations` timed ones, each
// pass running them in a rotated order. In a loop of their own, not beside
// the calibration's steps: a model timed right after a step (its update and
// gradient accumulation through all the weights) ran up to 3x slower than
// the same model timed first (the default mlp at 32 rows), and timed before
// the step, it slowed the step. Returns the whole model's fastest pass (0
// if it failed or was cancelled) and sets each trial's; a trial that fails
// loses its model.
double TimeSplits(StageModel& whole, const std::vector<at::Tensor>& whole_params,
                  std::vector<SplitTrial>& splits, const at::Tensor& samples,
                  const at::Tensor& labels, int iterations, const ProfileOptions& options) {
  const int64_t rows = samples.size(0);
  const size_t runs = splits.size() + 1;  // run 0: the whole model
  std::vector<std::vector<double>> times(runs);
  for (int pass = 0; pass <= iterations; ++pass) {
    for (size_t r = 0; r < runs; ++r) {
      if (options.cancelled && options.cancelled()) return 0;
      const size_t i = (r + static_cast<size_t>(pass)) % runs;
      StageModel* model = i == 0 ? &whole : splits[i - 1].model.get();
      if (model == nullptr) continue;
      absl::StatusOr<double> t = absl::InternalError("not run");
      try {
        t = TimeForwardBackward(*model, i == 0 ? whole_params : splits[i - 1].params,
                                samples, labels, rows);
      } catch (const std::exception& e) {
        t = absl::InternalError(e.what());
      }
      if (!t.ok()) {
        if (i == 0) return 0;
        splits[i - 1].model.reset();
        times[i].clear();
        continue;
      }
      if (pass > 0) times[i].push_back(*t);
    }
  }
  for (size_t i = 1; i < runs; ++i) {
    if (splits[i - 1].model != nullptr && !times[i].empty()) {
      splits[i - 1].seconds = *std::min_element(times[i].begin(), times[i].end());
    }
  }
  return times[0].empty() ? 0 : *std::min_element(times[0].begin(), times[0].end());
}

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
        if (node.kind() == apapo::v1::LAYER_KIND_RELU && y.defined() &&
            y.scalar_type() == torch::kFloat) {
          times[k].nonzero += static_cast<double>((y != 0).sum().item<int64_t>());
          times[k].outputs += static_cast<double>(y.numel());
        }
      }
      if (!(*layouts)[k].is_last) carried = std::move(out->outputs);
    }
  }

  // Calibration: node by node, each layer runs with its weights warm in
  // cache and keeps its fastest pass, and no optimizer step is timed; the
  // runtime runs the whole model in one pass and updates the weights after
  // it. So the whole model is also trained as one stage for `iterations`
  // steps after a warm-up, with the spec's optimizer; the per-node times
  // are scaled by (median step - median update) / their sum, and the
  // median update is charged to the nodes' backward in proportion to
  // their parameters (the update follows the backward pass).
  double node_sum = 0, total_params = 0;
  for (int k = 0; k < n; ++k) {
    node_sum += times[k].forward + times[k].backward;
    total_params += static_cast<double>(times[k].parameter_bytes);
  }
  // Without micro_batches in the spec the planner weighs schedules whose
  // micro-batches or replicas split the mini-batch: time the whole model
  // at halves of it too, down to kMinCostedRows (ModelProfile.
  // micro_batch_costs). With them, every plan runs this profile's size.
  std::vector<int64_t> smaller;
  if (!spec.schedule().has_micro_batches()) {
    for (int64_t rows = micro / 2; rows >= kMinCostedRows &&
                                   smaller.size() < kMaxCostedSizes;
         rows /= 2) {
      smaller.push_back(rows);
    }
  }
  // The planner may split wide Linear layers column-wise (plan.proto
  // LayerSplit) in 2, 4 or 8 parts, all its candidates at once: each count
  // is timed on the whole model here, candidates as the planner picks them
  // (planning's SplitCandidates: Linear, at least kSplitMinShare of the
  // compute), unless the spec turns splits off.
  std::vector<SplitTrial> split_trials;
  if (!spec.schedule().has_split_layers() || spec.schedule().split_layers()) {
    for (int parts : {2, 4, 8}) {
      SplitTrial trial;
      trial.parts = parts;
      std::vector<std::pair<std::string, int>> splits;
      for (int k = 0; k < n; ++k) {
        const double t = times[k].forward + times[k].backward;
        if (nodes[k].kind() == apapo::v1::LAYER_KIND_LINEAR && node_sum > 0 &&
            t >= kSplitMinShare * node_sum && nodes[k].out_shape.back() >= parts) {
          splits.emplace_back(nodes[k].id(), parts);
          trial.share += t / node_sum;
        }
      }
      if (splits.empty()) continue;
      absl::StatusOr<apapo::v1::ModelGraph> split = SplitLinearLayers(graph->graph(), splits);
      if (!split.ok()) continue;
      absl::StatusOr<AnalyzedGraph> analyzed = AnalyzedGraph::Create(*std::move(split));
      if (!analyzed.ok()) continue;
      trial.graph = std::make_unique<AnalyzedGraph>(*std::move(analyzed));
      auto model = WholeModel(*trial.graph);
      if (!model.ok()) continue;
      trial.params = (*model)->InitParameters(spec.seed());
      trial.model = *std::move(model);
      split_trials.push_back(std::move(trial));
    }
  }
  absl::StatusOr<Calibration> cal = CalibrateWholeStep(
      *graph, spec, samples, labels, iterations, smaller, options);
  if (!cal.ok()) return cal.status();
  double whole_seconds = 0;
  if (!split_trials.empty()) {
    auto whole = WholeModel(*graph);
    if (whole.ok()) {
      whole_seconds = TimeSplits(**whole, (*whole)->InitParameters(spec.seed()),
                                 split_trials, samples, labels, iterations, options);
    }
  }
  if (options.cancelled && options.cancelled()) {
    return absl::CancelledError("profiling stopped");
  }
  // Bounded: a calibration pass disturbed by another process must not
  // distort the profile beyond what the two methods can differ by.
  const double factor =
      node_sum > 0 ? std::clamp(
                         (cal->step_seconds - cal->update_seconds) / node_sum,
                         0.5, 4.0)
                   : 1.0;

  apapo::v1::ProfileResult result;
  result.set_job_id(command.job_id());
  apapo::v1::ModelProfile* profile = result.mutable_profile();
  profile->set_model(graph->graph().name());
  profile->set_batch_size(batch);
  profile->set_update_seconds(total_params > 0 ? cal->update_seconds : 0);
  profile->set_update_prediction_seconds(
      total_params > 0 ? cal->update_prediction_seconds : 0);
  profile->set_accumulate_seconds_per_byte(cal->accumulate_seconds_per_byte);
  if (cal->row_costs.size() > 1) {
    for (const auto& [rows, cost] : cal->row_costs) {
      apapo::v1::MicroBatchCost* c = profile->add_micro_batch_costs();
      c->set_rows(rows);
      c->set_scale(cost);
    }
  }
  // A split trial's extra time, over the split nodes' share of the whole
  // model's: what their parts and concats compute, as a multiple of the
  // nodes. At least 1 (a split is never charged below the whole layer) and
  // bounded as the node factor is.
  std::vector<std::string> split_costs;
  for (const SplitTrial& trial : split_trials) {
    if (whole_seconds <= 0 || trial.seconds <= 0 || trial.share <= 0) continue;
    const double cost = std::clamp(
        1.0 + (trial.seconds - whole_seconds) / (whole_seconds * trial.share), 1.0, 4.0);
    apapo::v1::SplitCost* c = profile->add_split_costs();
    c->set_parts(trial.parts);
    c->set_scale(cost);
    split_costs.push_back(absl::StrFormat("%.2fx in %d", cost, trial.parts));
  }
  std::vector<std::string> row_costs;
  for (const auto& [rows, cost] : cal->row_costs) {
    if (rows != micro) row_costs.push_back(absl::StrFormat("%.2fx at %d", cost, rows));
  }
  profile->set_source(absl::StrFormat(
      "measured by apapo-worker: micro-batch of %d x %d, fastest of %d "
      "pass(es), scaled x%.3f to the median whole-model step (%.4g s, of "
      "which the optimizer update %.4g s%s); gradients add at %.3g GB/s%s%s",
      micro, batch / micro, iterations, factor, cal->step_seconds,
      cal->update_seconds,
      cal->prediction_timed && total_params > 0
          ? absl::StrFormat(", %.4g s more predicting the weights",
                            profile->update_prediction_seconds())
          : "",
      cal->accumulate_seconds_per_byte > 0 ? 1e-9 / cal->accumulate_seconds_per_byte : 0,
      row_costs.empty()
          ? ""
          : absl::StrCat("; per row, smaller micro-batches cost ",
                         absl::StrJoin(row_costs, ", "), " rows"),
      split_costs.empty()
          ? ""
          : absl::StrCat("; Linear layers split column-wise cost ",
                         absl::StrJoin(split_costs, ", "), " parts")));
  for (int k = 0; k < n; ++k) {
    const NodeInfo& node = nodes[k];
    apapo::v1::NodeProfile* np = profile->add_nodes();
    np->set_id(node.id());
    for (const std::string& in : node.node->inputs()) np->add_inputs(in);
    np->set_forward_seconds(times[k].forward * factor * scale);
    // The update runs once per mini-batch, not per micro-batch.
    np->set_backward_seconds(
        times[k].backward * factor * scale +
        (total_params > 0 ? cal->update_seconds *
                                static_cast<double>(times[k].parameter_bytes) /
                                total_params
                          : 0));
    np->set_activation_bytes(
        static_cast<int64_t>(times[k].activation_bytes * scale));
    np->set_parameter_bytes(times[k].parameter_bytes);
    np->set_description(Describe(node));
    if (node.kind() == apapo::v1::LAYER_KIND_LINEAR) {
      np->set_split_width(node.out_shape.back());  // see plan.proto LayerSplit
    }
    if (node.num_params > 0 && WeightGradientsAfterSend(node.kind())) {
      np->set_weight_gradients_after_send(true);
    }
    if (WeightGradientsInProduct(node)) np->set_weight_gradients_in_product(true);
    if (times[k].outputs > 0) {
      // Never 0, which would mean "every value crosses".
      np->set_nonzero_share(
          std::clamp(times[k].nonzero / times[k].outputs, 1e-6, 1.0));
    }
  }
  if (cal->checkpoint.has_value()) *result.mutable_checkpoint() = *cal->checkpoint;
  // What a message costs this CPU by size, up to the largest a cut of this
  // model could carry (a whole mini-batch's activation, one micro-batch).
  int64_t largest = 0;
  for (const auto& np : profile->nodes()) {
    largest = std::max(largest, np.activation_bytes());
  }
  for (auto& m : MeasureTransferCpuBySize(largest, kLinkTestMessageBytes)) {
    *result.add_transfer_cpu() = std::move(m);
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
