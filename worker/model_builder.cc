#include "worker/model_builder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
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

}  // namespace

struct StageModel::Kernel {
  const NodeInfo* info = nullptr;
  std::vector<int> input_slots;  // indices into the stage's value table
  int first_param = 0;           // offset into the stage's params
  int num_params = 0;
  // Kind-specific settings.
  std::vector<int64_t> stride, padding, kernel, output_size, normalized_shape;
  int64_t dim = 1, heads = 1;
  double eps = 1e-5, momentum = 0.1, p = 0.0;
  at::Tensor running_mean, running_var;
  std::unique_ptr<TorchScriptChild> torchscript;  // TORCHSCRIPT_CHILD only
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
    const LayerNode& n = *info.node;
    switch (info.kind()) {
      case apapo::v1::LAYER_KIND_CONV2D:
        kernel->stride = GetPair(n, "stride", 1);
        kernel->padding = GetPair(n, "padding", 0);
        break;
      case apapo::v1::LAYER_KIND_MAX_POOL2D:
      case apapo::v1::LAYER_KIND_AVG_POOL2D: {
        kernel->kernel = GetPair(n, "kernel_size", 1);
        kernel->stride = GetPair(n, "stride", kernel->kernel[0]);
        kernel->padding = GetPair(n, "padding", 0);
        break;
      }
      case apapo::v1::LAYER_KIND_ADAPTIVE_AVG_POOL2D:
        kernel->output_size = {info.out_shape[1], info.out_shape[2]};
        break;
      case apapo::v1::LAYER_KIND_BATCH_NORM2D:
        kernel->eps = GetFloat(n, "eps", 1e-5);
        kernel->momentum = GetFloat(n, "momentum", 0.1);
        kernel->running_mean = torch::zeros({info.out_shape[0]});
        kernel->running_var = torch::ones({info.out_shape[0]});
        break;
      case apapo::v1::LAYER_KIND_FLATTEN:
        kernel->dim = GetInt(n, "start_dim", 1);
        break;
      case apapo::v1::LAYER_KIND_DROPOUT:
        kernel->p = GetFloat(n, "p", 0.5);
        break;
      case apapo::v1::LAYER_KIND_CONCAT:
        kernel->dim = GetInt(n, "dim", 1);
        break;
      case apapo::v1::LAYER_KIND_LAYER_NORM:
        kernel->eps = GetFloat(n, "eps", 1e-5);
        kernel->normalized_shape = info.params[0].shape;
        break;
      case apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK:
        kernel->heads = GetInt(n, "num_heads", 1);
        kernel->p = GetFloat(n, "dropout", 0.0);
        break;
      default:
        break;
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
        k->torchscript = std::move((*loaded)[next++]);
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
    if (k->torchscript) {
      // The values saved in the file, whatever the seed.
      for (at::Tensor& t : k->torchscript->InitialParameters()) {
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

std::vector<at::Tensor> StageModel::Buffers() const {
  std::vector<at::Tensor> out;
  for (const auto& k : kernels_) {
    if (k->running_mean.defined()) {
      out.push_back(k->running_mean);
      out.push_back(k->running_var);
    }
    if (k->torchscript) {
      for (const at::Tensor& b : k->torchscript->Buffers()) out.push_back(b);
    }
  }
  return out;
}

absl::StatusOr<StageForward> StageModel::Forward(
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& params, bool training) {
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
      auto in = [&](int i) -> const at::Tensor& {
        return values[k.input_slots[i]];
      };
      auto w = [&](int i) -> const at::Tensor& {
        return params[k.first_param + i];
      };
      at::Tensor y;
      switch (k.info->kind()) {
        case apapo::v1::LAYER_KIND_INPUT:
          y = values[0];  // stage 0's data occupies slot 0
          break;
        case apapo::v1::LAYER_KIND_LINEAR:
          y = torch::linear(in(0), w(0),
                            k.num_params > 1 ? w(1) : at::Tensor());
          break;
        case apapo::v1::LAYER_KIND_CONV2D:
          y = torch::conv2d(in(0), w(0),
                            k.num_params > 1 ? w(1) : at::Tensor(), k.stride,
                            k.padding);
          break;
        case apapo::v1::LAYER_KIND_BATCH_NORM2D:
          y = torch::batch_norm(in(0), w(0), w(1), k.running_mean,
                                k.running_var, training, k.momentum, k.eps,
                                /*cudnn_enabled=*/false);
          break;
        case apapo::v1::LAYER_KIND_RELU:
          y = torch::relu(in(0));
          break;
        case apapo::v1::LAYER_KIND_GELU:
          y = torch::gelu(in(0));
          break;
        case apapo::v1::LAYER_KIND_MAX_POOL2D:
          y = torch::max_pool2d(in(0), k.kernel, k.stride, k.padding);
          break;
        case apapo::v1::LAYER_KIND_AVG_POOL2D:
          y = torch::avg_pool2d(in(0), k.kernel, k.stride, k.padding);
          break;
        case apapo::v1::LAYER_KIND_ADAPTIVE_AVG_POOL2D:
          y = torch::adaptive_avg_pool2d(in(0), k.output_size);
          break;
        case apapo::v1::LAYER_KIND_FLATTEN:
          y = in(0).flatten(k.dim);
          break;
        case apapo::v1::LAYER_KIND_DROPOUT:
          y = torch::dropout(in(0), k.p, training);
          break;
        case apapo::v1::LAYER_KIND_ADD:
          y = in(0);
          for (size_t i = 1; i < k.input_slots.size(); ++i) y = y + in(i);
          break;
        case apapo::v1::LAYER_KIND_CONCAT: {
          std::vector<at::Tensor> xs;
          for (size_t i = 0; i < k.input_slots.size(); ++i) xs.push_back(in(i));
          y = torch::cat(xs, k.dim);
          break;
        }
        case apapo::v1::LAYER_KIND_EMBEDDING:
          y = torch::embedding(w(0), in(0));
          if (k.num_params > 1) {
            y = y + w(1).narrow(0, 0, in(0).size(1));
          }
          break;
        case apapo::v1::LAYER_KIND_LAYER_NORM:
          y = torch::layer_norm(in(0), k.normalized_shape, w(0), w(1), k.eps);
          break;
        case apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK: {
          // Pre-norm GPT block: x + attn(ln1(x)); x + mlp(ln2(x)).
          const at::Tensor& x = in(0);
          const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
          const int64_t dh = d / k.heads;
          at::Tensor h = torch::layer_norm(x, {d}, w(0), w(1));
          auto qkv = torch::linear(h, w(2), w(3)).chunk(3, -1);
          auto heads = [&](const at::Tensor& z) {
            return z.view({b, t, k.heads, dh}).transpose(1, 2);
          };
          at::Tensor q = heads(qkv[0]), kk = heads(qkv[1]), v = heads(qkv[2]);
          at::Tensor att =
              torch::matmul(q, kk.transpose(-2, -1)) / std::sqrt(double(dh));
          at::Tensor mask = torch::ones({t, t}, torch::kBool).triu(1);
          att = att.masked_fill(mask, -std::numeric_limits<float>::infinity());
          att = torch::dropout(torch::softmax(att, -1), k.p, training);
          at::Tensor a = torch::matmul(att, v).transpose(1, 2).reshape({b, t, d});
          at::Tensor x1 =
              x + torch::dropout(torch::linear(a, w(4), w(5)), k.p, training);
          at::Tensor h2 = torch::layer_norm(x1, {d}, w(6), w(7));
          at::Tensor mlp = torch::linear(
              torch::gelu(torch::linear(h2, w(8), w(9))), w(10), w(11));
          y = x1 + torch::dropout(mlp, k.p, training);
          break;
        }
        case apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD:
          y = k.torchscript->Forward(
              in(0),
              at::ArrayRef<at::Tensor>(params.data() + k.first_param,
                                       k.num_params),
              training);
          break;
        case apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS: {
          const at::Tensor& logits = in(0);
          const at::Tensor& labels = values[labels_slot_];
          const int64_t c = logits.size(-1);
          out.loss = torch::nn::functional::cross_entropy(
              logits.reshape({-1, c}), labels.reshape({-1}));
          out.logits = logits;
          out.labels = labels;
          y = out.loss;
          break;
        }
        default:
          return absl::UnimplementedError(absl::StrCat(
              "stage ", layout_.index, ": node '", k.info->id(),
              "' has no kernel for ", apapo::v1::LayerKind_Name(k.info->kind())));
      }
      const auto want = WithBatch(batch, k.info->out_shape);
      if (k.info->kind() != apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS &&
          y.sizes() != at::IntArrayRef(want)) {
        return absl::InternalError(absl::StrCat(
            "stage ", layout_.index, ": node '", k.info->id(), "' produced ",
            c10::str(y.sizes()), ", inferred ", c10::str(at::IntArrayRef(want))));
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
