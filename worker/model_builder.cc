#include "worker/model_builder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "worker/torchscript_model.h"

namespace apapo {
namespace worker {
namespace {

using apapo::v1::AttrValue;
using apapo::v1::LayerNode;

int64_t GetInt(const LayerNode& n, const std::string& key, int64_t def) {
  auto it = n.attrs().find(key);
  if (it == n.attrs().end()) return def;
  if (it->second.value_case() == AttrValue::kI) return it->second.i();
  if (it->second.value_case() == AttrValue::kInts &&
      it->second.ints().values_size() > 0) {
    return it->second.ints().values(0);
  }
  return def;
}

std::vector<int64_t> GetPair(const LayerNode& n, const std::string& key,
                             int64_t def) {
  auto it = n.attrs().find(key);
  if (it == n.attrs().end()) return {def, def};
  if (it->second.value_case() == AttrValue::kI) {
    return {it->second.i(), it->second.i()};
  }
  const auto& v = it->second.ints().values();
  if (v.size() == 1) return {v[0], v[0]};
  return {v[0], v[1]};
}

double GetFloat(const LayerNode& n, const std::string& key, double def) {
  auto it = n.attrs().find(key);
  if (it == n.attrs().end()) return def;
  if (it->second.value_case() == AttrValue::kF) return it->second.f();
  if (it->second.value_case() == AttrValue::kI) return it->second.i();
  return def;
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::vector<int64_t> WithBatch(int64_t batch, const Shape& s) {
  std::vector<int64_t> out{batch};
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

// ---- kernels: one table entry per layer kind ----

// A node's kind-specific settings, read from its node once, at Create, by its
// kind's Configure.
struct KernelSettings {
  std::vector<int64_t> stride, padding, kernel, output_size, normalized_shape;
  int64_t dim = 1, heads = 1;
  double eps = 1e-5, momentum = 0.1, p = 0.0;
  at::Tensor running_mean, running_var;           // BATCH_NORM2D only
  std::unique_ptr<TorchScriptChild> torchscript;  // TORCHSCRIPT_CHILD only
};

// What one node's forward reads, and where the loss leaves its results.
struct KernelCall {
  const at::Tensor& in(size_t i) const { return values[input_slots[i]]; }
  size_t num_inputs() const { return input_slots.size(); }
  const at::Tensor& w(size_t i) const { return params[i]; }
  const at::Tensor& labels() const { return values[labels_slot]; }

  const std::vector<at::Tensor>& values;  // the stage's value table
  const std::vector<int>& input_slots;    // this node's inputs in `values`
  at::ArrayRef<at::Tensor> params;        // this node's, in ParamInfo order
  KernelSettings& settings;
  bool training;
  int labels_slot;
  StageForward& out;
};

// How StageModel runs one kind. `configure` (null: nothing to read) fills the
// settings once per node; `forward` computes the node's output, with a
// leading micro-batch dimension, on every call.
struct LayerKernel {
  apapo::v1::LayerKind kind;
  void (*configure)(const NodeInfo& info, KernelSettings& s);
  at::Tensor (*forward)(const KernelCall& c);
};

at::Tensor InputForward(const KernelCall& c) {
  return c.values[0];  // stage 0's data occupies slot 0
}

at::Tensor LinearForward(const KernelCall& c) {
  return torch::linear(c.in(0), c.w(0),
                       c.params.size() > 1 ? c.w(1) : at::Tensor());
}

void ConfigureConv2d(const NodeInfo& info, KernelSettings& s) {
  s.stride = GetPair(*info.node, "stride", 1);
  s.padding = GetPair(*info.node, "padding", 0);
}
at::Tensor Conv2dForward(const KernelCall& c) {
  return torch::conv2d(c.in(0), c.w(0),
                       c.params.size() > 1 ? c.w(1) : at::Tensor(),
                       c.settings.stride, c.settings.padding);
}

void ConfigureBatchNorm2d(const NodeInfo& info, KernelSettings& s) {
  s.eps = GetFloat(*info.node, "eps", 1e-5);
  s.momentum = GetFloat(*info.node, "momentum", 0.1);
  s.running_mean = torch::zeros({info.out_shape[0]});
  s.running_var = torch::ones({info.out_shape[0]});
}
at::Tensor BatchNorm2dForward(const KernelCall& c) {
  const KernelSettings& s = c.settings;
  return torch::batch_norm(c.in(0), c.w(0), c.w(1), s.running_mean,
                           s.running_var, c.training, s.momentum, s.eps,
                           /*cudnn_enabled=*/false);
}

at::Tensor ReluForward(const KernelCall& c) { return torch::relu(c.in(0)); }

at::Tensor GeluForward(const KernelCall& c) { return torch::gelu(c.in(0)); }

// MAX_POOL2D and AVG_POOL2D: the stride defaults to the kernel size.
void ConfigurePool2d(const NodeInfo& info, KernelSettings& s) {
  s.kernel = GetPair(*info.node, "kernel_size", 1);
  s.stride = GetPair(*info.node, "stride", s.kernel[0]);
  s.padding = GetPair(*info.node, "padding", 0);
}
at::Tensor MaxPool2dForward(const KernelCall& c) {
  return torch::max_pool2d(c.in(0), c.settings.kernel, c.settings.stride,
                           c.settings.padding);
}
at::Tensor AvgPool2dForward(const KernelCall& c) {
  return torch::avg_pool2d(c.in(0), c.settings.kernel, c.settings.stride,
                           c.settings.padding);
}

void ConfigureAdaptiveAvgPool2d(const NodeInfo& info, KernelSettings& s) {
  s.output_size = {info.out_shape[1], info.out_shape[2]};
}
at::Tensor AdaptiveAvgPool2dForward(const KernelCall& c) {
  return torch::adaptive_avg_pool2d(c.in(0), c.settings.output_size);
}

void ConfigureFlatten(const NodeInfo& info, KernelSettings& s) {
  s.dim = GetInt(*info.node, "start_dim", 1);
}
at::Tensor FlattenForward(const KernelCall& c) {
  return c.in(0).flatten(c.settings.dim);
}

void ConfigureDropout(const NodeInfo& info, KernelSettings& s) {
  s.p = GetFloat(*info.node, "p", 0.5);
}
at::Tensor DropoutForward(const KernelCall& c) {
  return torch::dropout(c.in(0), c.settings.p, c.training);
}

at::Tensor AddForward(const KernelCall& c) {
  at::Tensor y = c.in(0);
  for (size_t i = 1; i < c.num_inputs(); ++i) y = y + c.in(i);
  return y;
}

void ConfigureConcat(const NodeInfo& info, KernelSettings& s) {
  s.dim = GetInt(*info.node, "dim", 1);
}
at::Tensor ConcatForward(const KernelCall& c) {
  std::vector<at::Tensor> xs;
  for (size_t i = 0; i < c.num_inputs(); ++i) xs.push_back(c.in(i));
  return torch::cat(xs, c.settings.dim);
}

// The optional second parameter is the learned positional embedding.
at::Tensor EmbeddingForward(const KernelCall& c) {
  at::Tensor y = torch::embedding(c.w(0), c.in(0));
  if (c.params.size() > 1) y = y + c.w(1).narrow(0, 0, c.in(0).size(1));
  return y;
}

void ConfigureLayerNorm(const NodeInfo& info, KernelSettings& s) {
  s.eps = GetFloat(*info.node, "eps", 1e-5);
  s.normalized_shape = info.params[0].shape;
}
at::Tensor LayerNormForward(const KernelCall& c) {
  return torch::layer_norm(c.in(0), c.settings.normalized_shape, c.w(0),
                           c.w(1), c.settings.eps);
}

void ConfigureTransformerBlock(const NodeInfo& info, KernelSettings& s) {
  s.heads = GetInt(*info.node, "num_heads", 1);
  s.p = GetFloat(*info.node, "dropout", 0.0);
}
// Pre-norm GPT block: x + attn(ln1(x)); x + mlp(ln2(x)). Parameters in the
// order model_graph's inference lists them (ln1, qkv, proj, ln2, fc1, fc2).
at::Tensor TransformerBlockForward(const KernelCall& c) {
  const int64_t heads = c.settings.heads;
  const double p = c.settings.p;
  const at::Tensor& x = c.in(0);
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const int64_t dh = d / heads;
  at::Tensor h = torch::layer_norm(x, {d}, c.w(0), c.w(1));
  auto qkv = torch::linear(h, c.w(2), c.w(3)).chunk(3, -1);
  auto split_heads = [&](const at::Tensor& z) {
    return z.view({b, t, heads, dh}).transpose(1, 2);
  };
  at::Tensor q = split_heads(qkv[0]), kk = split_heads(qkv[1]),
             v = split_heads(qkv[2]);
  at::Tensor att =
      torch::matmul(q, kk.transpose(-2, -1)) / std::sqrt(double(dh));
  at::Tensor mask = torch::ones({t, t}, torch::kBool).triu(1);
  att = att.masked_fill(mask, -std::numeric_limits<float>::infinity());
  att = torch::dropout(torch::softmax(att, -1), p, c.training);
  at::Tensor a = torch::matmul(att, v).transpose(1, 2).reshape({b, t, d});
  at::Tensor x1 =
      x + torch::dropout(torch::linear(a, c.w(4), c.w(5)), p, c.training);
  at::Tensor h2 = torch::layer_norm(x1, {d}, c.w(6), c.w(7));
  at::Tensor mlp = torch::linear(
      torch::gelu(torch::linear(h2, c.w(8), c.w(9))), c.w(10), c.w(11));
  return x1 + torch::dropout(mlp, p, c.training);
}

// The module itself is loaded by StageModel::Create, all of a stage's
// children at once (LoadTorchScriptChildren).
at::Tensor TorchScriptChildForward(const KernelCall& c) {
  return c.settings.torchscript->Forward(c.in(0), c.params, c.training);
}

// Mean cross-entropy over every prediction of the micro-batch; the logits and
// labels go to the caller for accuracy.
at::Tensor CrossEntropyLossForward(const KernelCall& c) {
  const at::Tensor& logits = c.in(0);
  const at::Tensor& labels = c.labels();
  const int64_t classes = logits.size(-1);
  c.out.loss = torch::nn::functional::cross_entropy(
      logits.reshape({-1, classes}), labels.reshape({-1}));
  c.out.logits = logits;
  c.out.labels = labels;
  return c.out.loss;
}

// One entry per kind; the only place the builder lists kinds. A kind that
// model_graph's table (layer_kinds.cc) knows must have one here
// (model_builder_test checks).
const std::vector<LayerKernel>& KernelTable() {
  static const auto* table = new std::vector<LayerKernel>{
      {apapo::v1::LAYER_KIND_INPUT, nullptr, &InputForward},
      {apapo::v1::LAYER_KIND_LINEAR, nullptr, &LinearForward},
      {apapo::v1::LAYER_KIND_CONV2D, &ConfigureConv2d, &Conv2dForward},
      {apapo::v1::LAYER_KIND_BATCH_NORM2D, &ConfigureBatchNorm2d,
       &BatchNorm2dForward},
      {apapo::v1::LAYER_KIND_RELU, nullptr, &ReluForward},
      {apapo::v1::LAYER_KIND_GELU, nullptr, &GeluForward},
      {apapo::v1::LAYER_KIND_MAX_POOL2D, &ConfigurePool2d, &MaxPool2dForward},
      {apapo::v1::LAYER_KIND_AVG_POOL2D, &ConfigurePool2d, &AvgPool2dForward},
      {apapo::v1::LAYER_KIND_ADAPTIVE_AVG_POOL2D, &ConfigureAdaptiveAvgPool2d,
       &AdaptiveAvgPool2dForward},
      {apapo::v1::LAYER_KIND_FLATTEN, &ConfigureFlatten, &FlattenForward},
      {apapo::v1::LAYER_KIND_DROPOUT, &ConfigureDropout, &DropoutForward},
      {apapo::v1::LAYER_KIND_ADD, nullptr, &AddForward},
      {apapo::v1::LAYER_KIND_CONCAT, &ConfigureConcat, &ConcatForward},
      {apapo::v1::LAYER_KIND_EMBEDDING, nullptr, &EmbeddingForward},
      {apapo::v1::LAYER_KIND_LAYER_NORM, &ConfigureLayerNorm,
       &LayerNormForward},
      {apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK, &ConfigureTransformerBlock,
       &TransformerBlockForward},
      {apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS, nullptr,
       &CrossEntropyLossForward},
      {apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD, nullptr,
       &TorchScriptChildForward},
  };
  return *table;
}

const LayerKernel* FindKernel(apapo::v1::LayerKind kind) {
  for (const LayerKernel& k : KernelTable()) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

}  // namespace

std::vector<apapo::v1::LayerKind> KernelLayerKinds() {
  std::vector<apapo::v1::LayerKind> kinds;
  for (const LayerKernel& k : KernelTable()) kinds.push_back(k.kind);
  return kinds;
}

struct StageModel::Kernel {
  const NodeInfo* info = nullptr;
  // Null when the builder has no kernel for the kind: Forward then fails.
  const LayerKernel* layer = nullptr;
  std::vector<int> input_slots;  // indices into the stage's value table
  int first_param = 0;           // offset into the stage's params
  int num_params = 0;
  KernelSettings settings;
};

StageModel::StageModel(const AnalyzedGraph& graph, StageLayout layout)
    : graph_(graph), layout_(std::move(layout)) {}

StageModel::~StageModel() = default;

absl::StatusOr<std::unique_ptr<StageModel>> StageModel::Create(
    const AnalyzedGraph& graph, const StageLayout& layout) {
  std::unique_ptr<StageModel> m(new StageModel(graph, layout));
  // Value slots: stage inputs first (stage 0: the INPUT node's data), then
  // every node the stage computes.
  absl::flat_hash_map<std::string, int> slot;
  int next_slot = 0;
  if (layout.is_first) {
    slot[graph.nodes()[graph.input_index()].id()] = next_slot++;
    slot[std::string(kLabelsEntry)] = next_slot++;
  } else {
    for (const BundleEntry& e : layout.inputs) slot[e.name] = next_slot++;
  }
  int param_offset = 0;
  for (int k : layout.nodes) {
    const NodeInfo& info = graph.nodes()[k];
    auto kernel = std::make_unique<Kernel>();
    kernel->info = &info;
    for (int in : info.inputs) {
      auto it = slot.find(graph.nodes()[in].id());
      if (it == slot.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stage ", layout.index, ": node '", info.id(), "' needs '",
            graph.nodes()[in].id(), "', which does not reach this stage"));
      }
      kernel->input_slots.push_back(it->second);
    }
    kernel->first_param = param_offset;
    kernel->num_params = static_cast<int>(info.params.size());
    param_offset += kernel->num_params;
    for (const ParamInfo& p : info.params) {
      m->param_names_.push_back(absl::StrCat(info.id(), ".", p.name));
    }
    kernel->layer = FindKernel(info.kind());
    if (kernel->layer != nullptr && kernel->layer->configure != nullptr) {
      kernel->layer->configure(info, kernel->settings);
    }
    slot[info.id()] = next_slot++;
    m->kernels_.push_back(std::move(kernel));
  }
  std::vector<const NodeInfo*> children;
  for (const auto& k : m->kernels_) {
    if (k->info->kind() == apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD) {
      children.push_back(k->info);
    }
  }
  if (!children.empty()) {
    auto loaded = LoadTorchScriptChildren(children);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("stage ", layout.index, ": ",
                                       loaded.status().message()));
    }
    size_t next = 0;
    for (auto& k : m->kernels_) {
      if (k->info->kind() == apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD) {
        k->settings.torchscript = std::move((*loaded)[next++]);
      }
    }
  }
  for (const BundleEntry& e : layout.outputs) {
    auto it = slot.find(e.name);
    if (it == slot.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", layout.index, ": output '", e.name, "' is not available"));
    }
    m->output_slots_.push_back(it->second);
  }
  auto labels = slot.find(std::string(kLabelsEntry));
  if (labels == slot.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", layout.index, ": labels do not reach it"));
  }
  m->labels_slot_ = labels->second;
  return m;
}

std::vector<at::Tensor> StageModel::InitParameters(int64_t seed) const {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> params;
  for (const auto& k : kernels_) {
    if (k->settings.torchscript) {
      // The values saved in the file, whatever the seed.
      for (at::Tensor& t : k->settings.torchscript->InitialParameters()) {
        params.push_back(std::move(t));
      }
      continue;
    }
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        Fnv1a(k->info->id()) ^ (static_cast<uint64_t>(seed) * 0x9e3779b97f4a7c15ULL));
    for (const ParamInfo& p : k->info->params) {
      at::Tensor t;
      if (p.bound < 0) {
        t = torch::full(p.shape, p.fill);
      } else {
        t = torch::empty(p.shape).uniform_(-p.bound, p.bound, gen);
      }
      params.push_back(t.set_requires_grad(true));
    }
  }
  return params;
}

std::vector<StageModel::WeightGradientNode> StageModel::WeightGradientNodes() const {
  std::vector<WeightGradientNode> out;
  for (const auto& k : kernels_) {
    if (k->num_params > 0 && WeightGradientsAfterSend(k->info->kind())) {
      out.push_back({k->first_param, k->num_params, WeightGradientsInProduct(*k->info)});
    }
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> StageModel::Buffers() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& k : kernels_) {
    const KernelSettings& s = k->settings;
    const std::string& id = k->info->id();
    if (s.running_mean.defined()) {
      out.emplace_back(absl::StrCat(id, ".running_mean"), s.running_mean);
      out.emplace_back(absl::StrCat(id, ".running_var"), s.running_var);
    }
    if (s.torchscript) {
      for (auto& [name, b] : s.torchscript->Buffers()) {
        out.emplace_back(absl::StrCat(id, ".", name), b);
      }
    }
  }
  return out;
}

absl::StatusOr<StageForward> StageModel::Forward(
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& params, bool training,
    bool keep_param_outputs) {
  const size_t want_inputs =
      layout_.is_first ? 2 : layout_.inputs.size();
  if (inputs.size() != want_inputs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", layout_.index, ": got ", inputs.size(), " inputs, expected ",
        want_inputs));
  }
  if (params.size() != param_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", layout_.index, ": got ", params.size(),
        " parameters, expected ", param_names_.size()));
  }
  std::vector<at::Tensor> values(inputs.begin(), inputs.end());
  values.reserve(inputs.size() + kernels_.size());
  const int64_t batch = inputs[0].size(0);
  StageForward out;
  const Kernel* current = nullptr;
  try {
    for (const auto& kp : kernels_) {
      current = kp.get();
      Kernel& k = *kp;
      if (k.layer == nullptr) {
        return absl::UnimplementedError(absl::StrCat(
            "stage ", layout_.index, ": node '", k.info->id(),
            "' has no kernel for ", apapo::v1::LayerKind_Name(k.info->kind())));
      }
      const KernelCall call{
          values,
          k.input_slots,
          at::ArrayRef<at::Tensor>(params.data() + k.first_param,
                                   k.num_params),
          k.settings,
          training,
          labels_slot_,
          out};
      at::Tensor y = k.layer->forward(call);
      // The loss is one scalar for the whole micro-batch.
      const auto want = WithBatch(batch, k.info->out_shape);
      if (k.info->kind() != apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS &&
          y.sizes() != at::IntArrayRef(want)) {
        return absl::InternalError(absl::StrCat(
            "stage ", layout_.index, ": node '", k.info->id(), "' produced ",
            c10::str(y.sizes()), ", inferred ", c10::str(at::IntArrayRef(want))));
      }
      if (keep_param_outputs && k.num_params > 0 && y.requires_grad() &&
          WeightGradientsAfterSend(k.info->kind())) {
        StageForward::ParamNodeOutput po{y, k.first_param, k.num_params, at::Tensor()};
        // Rows in and out: the shape check above holds y to out_shape.
        if (WeightGradientsInProduct(*k.info)) po.product_input = call.in(0);
        out.param_outputs.push_back(std::move(po));
      }
      values.push_back(std::move(y));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(
        "stage ", layout_.index, ": node '",
        current ? current->info->id() : std::string("?"),
        "' failed in LibTorch: ", e.what()));
  }
  for (int s : output_slots_) out.outputs.push_back(values[s]);
  return out;
}

std::pair<int64_t, int64_t> CountCorrect(const at::Tensor& logits,
                                         const at::Tensor& labels,
                                         int64_t valid) {
  torch::NoGradGuard no_grad;
  at::Tensor l = logits;
  at::Tensor y = labels;
  if (valid >= 0 && valid < l.size(0)) {
    l = l.narrow(0, 0, valid);
    y = y.narrow(0, 0, valid);
  }
  at::Tensor pred = l.argmax(-1);
  const int64_t correct = pred.eq(y).sum().item<int64_t>();
  return {correct, y.numel()};
}

}  // namespace worker
}  // namespace apapo
