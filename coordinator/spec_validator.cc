#include "coordinator/spec_validator.h"

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "worker/model_graph.h"

namespace apapo::coordinator {
namespace {

using apapo::v1::JobSpec;
using apapo::v1::LayerKind;

constexpr size_t kMaxNameLength = 128;
// Upper bounds of numeric fields (see CheckRange).
constexpr int64_t kMaxBatchSize = 1 << 20;
constexpr int64_t kMaxWorkers = 10000;
constexpr int64_t kMaxHyperParameter = 1 << 20;  // widths, layers, classes
constexpr int64_t kMaxDimension = 1 << 20;       // one dimension of a sample
constexpr int64_t kMaxCount = int64_t{1} << 40;  // steps, samples
constexpr double kMaxBatchInputBytes = 64.0 * (1 << 30);

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", bytes, units[u]);
}

// Collects "<path>: <reason>" problems.
class Problems {
 public:
  template <typename... Args>
  void Add(const std::string& path, const Args&... reason) {
    list_.push_back(absl::StrCat(path, ": ", reason...));
  }
  absl::Status ToStatus() const {
    if (list_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(list_, "; "));
  }

 private:
  std::vector<std::string> list_;
};

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
          c == '-')) {
      return false;
    }
  }
  return true;
}

// `value` in [min, max]: upper bounds keep a spec from asking a worker for
// what no worker holds (and LibTorch from failing deep inside).
void CheckRange(Problems& p, const std::string& path, int64_t value,
                int64_t min, int64_t max) {
  if (value < min) p.Add(path, "must be >= ", min, ", got ", value);
  if (value > max) p.Add(path, "must be <= ", max, ", got ", value);
}

void CheckPositiveFinite(Problems& p, const std::string& path, double value) {
  if (!std::isfinite(value) || value <= 0) {
    p.Add(path, "must be a finite number > 0, got ", value);
  }
}

void CheckNonNegativeFinite(Problems& p, const std::string& path,
                            double value) {
  if (!std::isfinite(value) || value < 0) {
    p.Add(path, "must be a finite number >= 0, got ", value);
  }
}

void CheckUnitInterval(Problems& p, const std::string& path, double value,
                       bool include_one) {
  bool ok = std::isfinite(value) && value >= 0 &&
            (include_one ? value <= 1 : value < 1);
  if (!ok) {
    p.Add(path, "must be in [0, 1", include_one ? "]" : ")", ", got ", value);
  }
}

void ValidateBuiltin(Problems& p, const std::string& path,
                     const apapo::v1::BuiltinModel& model) {
  // The table the worker's builders read from (worker/model_graph.h).
  const auto& known = apapo::worker::BuiltinHyperParameters();
  auto it = known.find(model.name());
  if (it == known.end()) {
    p.Add(path + ".name", "unknown built-in model \"", model.name(),
          "\"; expected one of ", absl::StrJoin(BuiltinModelNames(), ", "));
    return;
  }
  // Sorted for a deterministic message order.
  std::map<std::string, apapo::v1::AttrValue> params(
      model.hyper_parameters().begin(), model.hyper_parameters().end());
  for (const auto& [key, value] : params) {
    std::string key_path = absl::StrCat(path, ".hyper_parameters[\"", key, "\"]");
    if (!it->second.count(key)) {
      p.Add(key_path, "not a hyper-parameter of \"", model.name(),
            "\"; expected one of ", absl::StrJoin(it->second, ", "));
      continue;
    }
    if (absl::StartsWith(key, "dropout")) {
      double v = value.has_f() ? value.f() : value.has_i() ? value.i() : -1;
      if (!(value.has_f() || value.has_i())) {
        p.Add(key_path, "must be a number");
      } else {
        CheckUnitInterval(p, key_path, v, /*include_one=*/false);
      }
    } else if (!value.has_i()) {
      p.Add(key_path, "must be an integer (i: ...)");
    } else {
      CheckRange(p, key_path, value.i(), 1, kMaxHyperParameter);
    }
  }
}

void ValidateGraph(Problems& p, const std::string& path,
                   const apapo::v1::ModelGraph& graph) {
  if (graph.nodes().empty()) {
    p.Add(path + ".nodes", "must not be empty");
    return;
  }
  absl::flat_hash_map<std::string, int> index;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const auto& node = graph.nodes(i);
    std::string node_path = absl::StrCat(path, ".nodes[", i, "]");
    if (node.id().empty()) {
      p.Add(node_path + ".id", "must not be empty");
    } else if (!index.emplace(node.id(), i).second) {
      p.Add(node_path + ".id", "duplicate node id \"", node.id(),
            "\" (first at nodes[", index[node.id()], "])");
    }
    if (node.kind() == apapo::v1::LAYER_KIND_UNSPECIFIED ||
        !apapo::v1::LayerKind_IsValid(node.kind())) {
      p.Add(node_path + ".kind", "must be set to a known layer kind");
    }
  }
  // Edges, sinks and cycles (Kahn's algorithm over valid edges).
  std::vector<int> indegree(graph.nodes_size(), 0);
  std::vector<std::vector<int>> consumers(graph.nodes_size());
  for (int i = 0; i < graph.nodes_size(); ++i) {
    const auto& node = graph.nodes(i);
    std::string node_path = absl::StrCat(path, ".nodes[", i, "]");
    bool is_input = node.kind() == apapo::v1::LAYER_KIND_INPUT;
    if (is_input && !node.inputs().empty()) {
      p.Add(node_path + ".inputs", "an INPUT node takes no inputs");
    }
    if (!is_input && node.inputs().empty()) {
      p.Add(node_path + ".inputs", "node \"", node.id(),
            "\" needs at least one input");
    }
    for (int k = 0; k < node.inputs_size(); ++k) {
      auto it = index.find(node.inputs(k));
      if (it == index.end()) {
        p.Add(absl::StrCat(node_path, ".inputs[", k, "]"), "unknown node \"",
              node.inputs(k), "\"");
        continue;
      }
      consumers[it->second].push_back(i);
      ++indegree[i];
    }
  }
  std::vector<int> ready;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    if (indegree[i] == 0) ready.push_back(i);
  }
  int visited = 0;
  while (!ready.empty()) {
    int n = ready.back();
    ready.pop_back();
    ++visited;
    for (int c : consumers[n]) {
      if (--indegree[c] == 0) ready.push_back(c);
    }
  }
  if (visited != graph.nodes_size()) {
    std::vector<std::string> in_cycle;
    for (int i = 0; i < graph.nodes_size(); ++i) {
      if (indegree[i] > 0) in_cycle.push_back(graph.nodes(i).id());
    }
    p.Add(path + ".nodes", "the graph has a cycle through ",
          absl::StrJoin(in_cycle, ", "));
  }
  int sinks = 0;
  for (int i = 0; i < graph.nodes_size(); ++i) {
    if (consumers[i].empty()) ++sinks;
  }
  if (sinks != 1) {
    p.Add(path + ".nodes", "must have exactly one output node (the loss), found ",
          sinks);
  }
}

void ValidateModel(Problems& p, const apapo::v1::ModelSpec& model) {
  const std::string path = "spec.model";
  switch (model.source_case()) {
    case apapo::v1::ModelSpec::kBuiltin:
      ValidateBuiltin(p, path + ".builtin", model.builtin());
      break;
    case apapo::v1::ModelSpec::kGraph:
      ValidateGraph(p, path + ".graph", model.graph());
      break;
    case apapo::v1::ModelSpec::kTorchscript:
      if (model.torchscript().path().empty()) {
        p.Add(path + ".torchscript.path", "must not be empty");
      }
      if (model.torchscript().input_shape().empty()) {
        p.Add(path + ".torchscript.input_shape", "must not be empty");
      }
      for (int i = 0; i < model.torchscript().input_shape_size(); ++i) {
        CheckRange(p, absl::StrCat(path, ".torchscript.input_shape[", i, "]"),
                   model.torchscript().input_shape(i), 1, kMaxDimension);
      }
      break;
    case apapo::v1::ModelSpec::SOURCE_NOT_SET:
      p.Add(path, "one of builtin, graph or torchscript must be set");
      break;
  }
}

void ValidateData(Problems& p, const apapo::v1::DataSpec& data) {
  const std::string path = "spec.data";
  switch (data.source_case()) {
    case apapo::v1::DataSpec::kFashionMnist:
      break;
    case apapo::v1::DataSpec::kText:
      if (data.text().path().empty()) {
        p.Add(path + ".text.path", "must not be empty");
      }
      CheckRange(p, path + ".text.context", data.text().context(), 1, 1 << 16);
      if (data.text().has_test_fraction()) {
        double f = data.text().test_fraction();
        if (!(f > 0 && f < 1)) {
          p.Add(path + ".text.test_fraction", "must be in (0, 1), got ", f);
        }
      }
      break;
    case apapo::v1::DataSpec::kSynthetic: {
      const auto& s = data.synthetic();
      if (s.sample_shape().empty()) {
        p.Add(path + ".synthetic.sample_shape", "must not be empty");
      }
      for (int i = 0; i < s.sample_shape_size(); ++i) {
        CheckRange(p, absl::StrCat(path, ".synthetic.sample_shape[", i, "]"),
                   s.sample_shape(i), 1, kMaxDimension);
      }
      CheckRange(p, path + ".synthetic.num_classes", s.num_classes(), 2,
                 kMaxHyperParameter);
      CheckRange(p, path + ".synthetic.samples_per_epoch",
                 s.samples_per_epoch(), 1, kMaxCount);
      break;
    }
    case apapo::v1::DataSpec::SOURCE_NOT_SET:
      p.Add(path, "one of fashion_mnist, text or synthetic must be set");
      break;
  }
  CheckRange(p, path + ".batch_size", data.batch_size(), 1, kMaxBatchSize);
  CheckRange(p, path + ".eval_batch_size", data.eval_batch_size(), 0,
             kMaxBatchSize);
}

// Values one sample of the data source holds (0 when the source is invalid).
double ValuesPerSample(const apapo::v1::DataSpec& data) {
  switch (data.source_case()) {
    case apapo::v1::DataSpec::kFashionMnist:
      return 28 * 28;
    case apapo::v1::DataSpec::kText:
      return data.text().context();
    case apapo::v1::DataSpec::kSynthetic: {
      double n = 1;
      for (int64_t d : data.synthetic().sample_shape()) n *= std::max<int64_t>(d, 0);
      return n;
    }
    default:
      return 0;
  }
}

// A mini-batch's input alone (4-byte values) must fit a worker: the limit a
// spec sets, else kMaxBatchInputBytes. Activations come on top, so this
// refuses only what cannot possibly run, with the size it would need.
void CheckBatchFits(Problems& p, const JobSpec& spec) {
  const double bytes =
      4.0 * std::max(0, spec.data().batch_size()) * ValuesPerSample(spec.data());
  const int64_t memory = spec.resources().memory_per_worker_bytes();
  const double limit =
      memory > 0 ? std::min<double>(memory, kMaxBatchInputBytes) : kMaxBatchInputBytes;
  if (bytes > limit) {
    p.Add("spec.data.batch_size",
          absl::StrFormat("a batch of %d samples of %.0f values is %s of input "
                          "alone; at most %s fits %s",
                          spec.data().batch_size(), ValuesPerSample(spec.data()),
                          HumanBytes(bytes), HumanBytes(limit),
                          memory > 0 ? "spec.resources.memory_per_worker_bytes"
                                     : "a worker"));
  }
}

void ValidateOptimizer(Problems& p, const apapo::v1::OptimizerSpec& opt) {
  const std::string path = "spec.optimizer";
  switch (opt.kind_case()) {
    case apapo::v1::OptimizerSpec::kSgd:
      CheckUnitInterval(p, path + ".sgd.momentum", opt.sgd().momentum(),
                        /*include_one=*/false);
      if (opt.sgd().nesterov() && opt.sgd().momentum() <= 0) {
        p.Add(path + ".sgd.nesterov", "needs momentum > 0");
      }
      break;
    case apapo::v1::OptimizerSpec::kAdam:
      if (opt.adam().has_beta1()) {
        CheckUnitInterval(p, path + ".adam.beta1", opt.adam().beta1(), false);
      }
      if (opt.adam().has_beta2()) {
        CheckUnitInterval(p, path + ".adam.beta2", opt.adam().beta2(), false);
      }
      if (opt.adam().has_epsilon()) {
        CheckPositiveFinite(p, path + ".adam.epsilon", opt.adam().epsilon());
      }
      break;
    case apapo::v1::OptimizerSpec::KIND_NOT_SET:
      p.Add(path, "one of sgd or adam must be set");
      break;
  }
  CheckPositiveFinite(p, path + ".learning_rate", opt.learning_rate());
  CheckNonNegativeFinite(p, path + ".weight_decay", opt.weight_decay());
  CheckNonNegativeFinite(p, path + ".grad_clip_norm", opt.grad_clip_norm());
  const auto& lr = opt.lr_schedule();
  CheckRange(p, path + ".lr_schedule.warmup_steps", lr.warmup_steps(), 0,
             kMaxCount);
  if (!apapo::v1::LearningRateSchedule::Decay_IsValid(lr.decay())) {
    p.Add(path + ".lr_schedule.decay", "unknown value ", lr.decay());
  }
  if (lr.decay() == apapo::v1::LearningRateSchedule::DECAY_STEP) {
    CheckRange(p, path + ".lr_schedule.step_size", lr.step_size(), 1, kMaxCount);
    if (!(lr.gamma() > 0 && lr.gamma() <= 1)) {
      p.Add(path + ".lr_schedule.gamma", "must be in (0, 1], got ",
            lr.gamma());
    }
  }
}

void ValidateScheduleAndResources(Problems& p, const JobSpec& spec) {
  const auto& s = spec.schedule();
  const auto& r = spec.resources();
  if (!apapo::v1::ScheduleKind_IsValid(s.kind())) {
    p.Add("spec.schedule.kind", "unknown value ", s.kind());
  }
  if (s.has_micro_batches()) {
    CheckRange(p, "spec.schedule.micro_batches", s.micro_batches(), 1, 4096);
  }
  int m = EffectiveMicroBatches(spec);
  if (m >= 1 && spec.data().batch_size() >= 1 &&
      spec.data().batch_size() % m != 0) {
    p.Add("spec.schedule.micro_batches", "must divide spec.data.batch_size (",
          spec.data().batch_size(), "), got ", m);
  }
  if (s.has_max_staleness()) {
    CheckRange(p, "spec.schedule.max_staleness", s.max_staleness(), 0, 1024);
  }
  CheckRange(p, "spec.schedule.stages", s.stages(), 0, kMaxWorkers);
  CheckRange(p, "spec.schedule.replicas", s.replicas(), 0, kMaxWorkers);
  if (!apapo::v1::TransferPrecision_IsValid(s.transfer_precision())) {
    p.Add("spec.schedule.transfer_precision", "unknown value ",
          s.transfer_precision());
  }
  if (s.kind() == apapo::v1::SCHEDULE_KIND_DATA_PARALLEL && s.stages() > 1) {
    p.Add("spec.schedule.stages",
          "data parallelism runs one stage, got ", s.stages());
  }
  // The all-reduce's parts start at the split backward's cut points.
  if (s.has_allreduce_in_backward() && s.allreduce_in_backward() &&
      s.has_split_backward() && !s.split_backward()) {
    p.Add("spec.schedule.allreduce_in_backward",
          "true needs spec.schedule.split_backward (the parts start where the "
          "backward splits), which is false");
  }

  CheckRange(p, "spec.resources.workers", r.workers(), 1, kMaxWorkers);
  CheckRange(p, "spec.resources.threads_per_worker", r.threads_per_worker(), 0,
             1024);
  CheckRange(p, "spec.resources.memory_per_worker_bytes",
             r.memory_per_worker_bytes(), 0, int64_t{1} << 50);
  if (!r.device().empty() && r.device() != "cpu" && r.device() != "cuda") {
    p.Add("spec.resources.device", "must be \"cpu\" or \"cuda\", got \"",
          r.device(), "\"");
  }
  int64_t used = static_cast<int64_t>(std::max(1, s.stages())) *
                 std::max(1, s.replicas());
  if ((s.stages() > 0 || s.replicas() > 0) && r.workers() >= 1 &&
      used > r.workers()) {
    p.Add("spec.schedule", "stages x replicas = ", used,
          " exceeds spec.resources.workers (", r.workers(), ")");
  }
}

void ValidateLimits(Problems& p, const apapo::v1::Limits& limits) {
  CheckRange(p, "spec.limits.epochs", limits.epochs(), 0, 1000000);
  CheckRange(p, "spec.limits.max_steps", limits.max_steps(), 0, kMaxCount);
  if (limits.epochs() <= 0 && limits.max_steps() <= 0) {
    p.Add("spec.limits", "set epochs or max_steps (training must end)");
  }
  CheckUnitInterval(p, "spec.limits.target_accuracy", limits.target_accuracy(),
                    /*include_one=*/true);
  if (limits.has_max_duration() &&
      (limits.max_duration().seconds() < 0 || limits.max_duration().nanos() < 0)) {
    p.Add("spec.limits.max_duration", "must not be negative");
  }
}

void ValidateFaultTolerance(Problems& p, const JobSpec& spec) {
  const auto& f = spec.fault_tolerance();
  CheckRange(p, "spec.fault_tolerance.max_restarts", f.max_restarts(), 0, 1000);
  if (f.has_max_workers()) {
    CheckRange(p, "spec.fault_tolerance.max_workers", f.max_workers(),
               std::max(1, spec.resources().workers()), 100000);
  }
  if (f.has_min_workers()) {
    CheckRange(p, "spec.fault_tolerance.min_workers", f.min_workers(), 1,
               std::max(1, spec.resources().workers()));
  }
  if (f.has_replacement_wait() &&
      (f.replacement_wait().seconds() < 0 || f.replacement_wait().nanos() < 0 ||
       f.replacement_wait().seconds() > 7 * 24 * 3600)) {
    p.Add("spec.fault_tolerance.replacement_wait", "must be within 0..7 days");
  }
}

}  // namespace

const std::vector<std::string>& BuiltinModelNames() {
  static const auto* kNames = [] {
    auto* names = new std::vector<std::string>;
    for (const auto& [name, keys] : apapo::worker::BuiltinHyperParameters()) {
      names->push_back(name);  // sorted: the table is a std::map
    }
    return names;
  }();
  return *kNames;
}

int EffectiveMicroBatches(const JobSpec& spec) {
  return spec.schedule().has_micro_batches() ? spec.schedule().micro_batches()
                                             : 0;
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  Problems p;
  // Checked first: a job carries its spec in every reply about it.
  if (const size_t bytes = spec.ByteSizeLong(); bytes > kMaxSpecBytes) {
    p.Add("spec", absl::StrFormat("%.1f MiB serialized, at most %d MiB",
                                  bytes / 1048576.0, kMaxSpecBytes >> 20));
    return p.ToStatus();
  }
  if (!ValidName(spec.name())) {
    p.Add("spec.name", "must be 1..", kMaxNameLength,
          " characters of [A-Za-z0-9._-], got \"", spec.name(), "\"");
  }
  ValidateModel(p, spec.model());
  ValidateData(p, spec.data());
  ValidateOptimizer(p, spec.optimizer());
  ValidateScheduleAndResources(p, spec);
  ValidateLimits(p, spec.limits());
  ValidateFaultTolerance(p, spec);
  CheckRange(p, "spec.checkpoint.every_steps", spec.checkpoint().every_steps(),
             0, kMaxCount);
  if (spec.checkpoint().resume() && spec.checkpoint().directory().empty()) {
    p.Add("spec.checkpoint.resume", "needs spec.checkpoint.directory");
  }
  CheckRange(p, "spec.eval_every_epochs", spec.eval_every_epochs(), 0, 1000000);
  CheckBatchFits(p, spec);
  return p.ToStatus();
}

}  // namespace apapo::coordinator
