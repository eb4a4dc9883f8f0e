#include "worker/layer_kinds.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace apapo {
namespace worker {
namespace {

using apapo::v1::AttrValue;
using apapo::v1::LayerKind;
using apapo::v1::LayerNode;

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string KindName(LayerKind kind) {
  return apapo::v1::LayerKind_Name(kind);
}

absl::Status NodeError(const LayerNode& n, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(
      "node '", n.id(), "' (", KindName(n.kind()), "): ", msg));
}

absl::Status ShapeMismatch(const LayerNode& n, const std::string& what,
                           const Shape& got, const Shape& want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "shape mismatch at node '", n.id(), "' (", KindName(n.kind()), "): ",
      what, ": got ", ShapeToString(got), ", expected ", ShapeToString(want)));
}

absl::Status UnknownKind(const LayerNode& n) {
  return absl::InvalidArgumentError(absl::StrCat(
      "node '", n.id(), "': unknown layer kind ", static_cast<int>(n.kind()),
      " (", KindName(n.kind()), ")"));
}

// Output extent of a convolution or pooling window along one dimension:
// input `in`, kernel `k`, stride `s`, padding `p` on both sides.
int64_t PoolOut(int64_t in, int64_t k, int64_t s, int64_t p) {
  return (in + 2 * p - k) / s + 1;
}

// ---- attribute access with defaults and checks ----

class Attrs {
 public:
  explicit Attrs(const LayerNode& node) : node_(node) {}

  absl::StatusOr<int64_t> Int(const std::string& key, int64_t def,
                              bool required = false) const {
    auto it = node_.attrs().find(key);
    if (it == node_.attrs().end()) {
      if (required) return Missing(key);
      return def;
    }
    if (it->second.value_case() == AttrValue::kI) return it->second.i();
    if (it->second.value_case() == AttrValue::kInts &&
        it->second.ints().values_size() >= 1) {
      return it->second.ints().values(0);
    }
    return Bad(key, "an integer");
  }
  // An int or an [a, b] pair; returns {a, b}.
  absl::StatusOr<std::pair<int64_t, int64_t>> Pair(const std::string& key,
                                                   int64_t def,
                                                   bool required) const {
    auto it = node_.attrs().find(key);
    if (it == node_.attrs().end()) {
      if (required) return Missing(key);
      return std::make_pair(def, def);
    }
    if (it->second.value_case() == AttrValue::kI) {
      return std::make_pair(it->second.i(), it->second.i());
    }
    if (it->second.value_case() == AttrValue::kInts) {
      const auto& v = it->second.ints().values();
      if (v.size() == 1) return std::make_pair(v[0], v[0]);
      if (v.size() == 2) return std::make_pair(v[0], v[1]);
    }
    return Bad(key, "an integer or a list of two integers");
  }
  absl::StatusOr<double> Float(const std::string& key, double def) const {
    auto it = node_.attrs().find(key);
    if (it == node_.attrs().end()) return def;
    if (it->second.value_case() == AttrValue::kF) return it->second.f();
    if (it->second.value_case() == AttrValue::kI) {
      return static_cast<double>(it->second.i());
    }
    return Bad(key, "a number");
  }
  absl::StatusOr<bool> Bool(const std::string& key, bool def) const {
    auto it = node_.attrs().find(key);
    if (it == node_.attrs().end()) return def;
    if (it->second.value_case() == AttrValue::kB) return it->second.b();
    return Bad(key, "a bool");
  }
  absl::StatusOr<std::vector<int64_t>> Ints(const std::string& key,
                                            bool required) const {
    auto it = node_.attrs().find(key);
    if (it == node_.attrs().end()) {
      if (required) return Missing(key);
      return std::vector<int64_t>{};
    }
    if (it->second.value_case() == AttrValue::kInts) {
      return std::vector<int64_t>(it->second.ints().values().begin(),
                                  it->second.ints().values().end());
    }
    if (it->second.value_case() == AttrValue::kI) {
      return std::vector<int64_t>{it->second.i()};
    }
    return Bad(key, "a list of integers");
  }
  absl::StatusOr<std::string> String(const std::string& key,
                                     const std::string& def) const {
    auto it = node_.attrs().find(key);
    if (it == node_.attrs().end()) return def;
    if (it->second.value_case() == AttrValue::kS) return it->second.s();
    return Bad(key, "a string");
  }

 private:
  absl::Status Missing(const std::string& key) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "node '", node_.id(), "' (", KindName(node_.kind()),
        "): missing required attribute '", key, "'"));
  }
  absl::Status Bad(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", node_.id(), "' (", KindName(node_.kind()),
                     "): attribute '", key, "' must be ", what));
  }
  const LayerNode& node_;
};

// ---- what every inference function gets ----

// One node under inference: its proto, attributes and (already inferred)
// inputs, with the input checks many kinds share. Errors name the node.
struct Layer {
  Layer(const NodeInfo& info, const std::vector<NodeInfo>& nodes)
      : node(*info.node), attrs(node) {
    for (int i : info.inputs) in.push_back(&nodes[i]);
  }

  absl::Status Error(const std::string& msg) const {
    return NodeError(node, msg);
  }
  absl::Status NeedInputs(size_t count) const {
    if (in.size() != count) {
      return Error(
          absl::StrCat("expects ", count, " input(s), got ", in.size()));
    }
    return absl::OkStatus();
  }
  absl::Status NeedFloat() const {
    for (const NodeInfo* i : in) {
      if (i->out_dtype != DType::kFloat32) {
        return Error(absl::StrCat("input '", i->id(),
                                  "' is int64; this kind needs float32"));
      }
    }
    return absl::OkStatus();
  }
  absl::Status NeedRank(size_t rank) const {
    if (in[0]->out_shape.size() != rank) {
      return Error(absl::StrCat("expects a rank-", rank,
                                " sample (e.g. [C, H, W])", ", got ",
                                ShapeToString(in[0]->out_shape), " from '",
                                in[0]->id(), "'"));
    }
    return absl::OkStatus();
  }

  const LayerNode& node;
  const Attrs attrs;
  std::vector<const NodeInfo*> in;
};

// Sets out_shape, out_dtype, params and forward_ops of `info` (which enters
// with its defaults: float32, no params, no cost).
using InferFn = absl::Status (*)(const Layer& l, NodeInfo& info);

// ---- inference, one function per kind ----

absl::Status InferInput(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(0));
  APAPO_ASSIGN_OR_RETURN(Shape shape, l.attrs.Ints("shape", /*required=*/true));
  for (int64_t d : shape) {
    if (d < 1) return l.Error("shape dimensions must be >= 1");
  }
  APAPO_ASSIGN_OR_RETURN(std::string dtype, l.attrs.String("dtype", "float32"));
  if (dtype != "float32" && dtype != "int64") {
    return l.Error("dtype must be float32 or int64, got " + dtype);
  }
  info.out_shape = shape;
  info.out_dtype = dtype == "int64" ? DType::kInt64 : DType::kFloat32;
  return absl::OkStatus();
}

absl::Status InferLinear(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_ASSIGN_OR_RETURN(int64_t out, l.attrs.Int("out_features", 0, true));
  APAPO_ASSIGN_OR_RETURN(bool bias, l.attrs.Bool("bias", true));
  const Shape& s = l.in[0]->out_shape;
  if (s.empty()) return l.Error("input has no feature dimension");
  if (out < 1) return l.Error("out_features must be >= 1");
  const int64_t fan_in = s.back();
  info.out_shape = s;
  info.out_shape.back() = out;
  // PyTorch's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  info.params.push_back({"weight", {out, fan_in}, bound, 0});
  if (bias) info.params.push_back({"bias", {out}, bound, 0});
  info.forward_ops = Numel(s) / fan_in * fan_in * out;
  return absl::OkStatus();
}

absl::Status InferConv2d(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_RETURN_IF_ERROR(l.NeedRank(3));
  APAPO_ASSIGN_OR_RETURN(int64_t out, l.attrs.Int("out_channels", 0, true));
  APAPO_ASSIGN_OR_RETURN(auto k, l.attrs.Pair("kernel_size", 0, true));
  APAPO_ASSIGN_OR_RETURN(auto st, l.attrs.Pair("stride", 1, false));
  APAPO_ASSIGN_OR_RETURN(auto p, l.attrs.Pair("padding", 0, false));
  APAPO_ASSIGN_OR_RETURN(bool bias, l.attrs.Bool("bias", true));
  const Shape& s = l.in[0]->out_shape;
  if (out < 1 || k.first < 1 || k.second < 1 || st.first < 1 ||
      st.second < 1) {
    return l.Error("out_channels, kernel_size and stride must be >= 1");
  }
  const int64_t ho = PoolOut(s[1], k.first, st.first, p.first);
  const int64_t wo = PoolOut(s[2], k.second, st.second, p.second);
  if (ho < 1 || wo < 1) {
    return l.Error(
        absl::StrCat("kernel larger than the input ", ShapeToString(s)));
  }
  info.out_shape = {out, ho, wo};
  const int64_t fan_in = s[0] * k.first * k.second;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  info.params.push_back({"weight", {out, s[0], k.first, k.second}, bound, 0});
  if (bias) info.params.push_back({"bias", {out}, bound, 0});
  info.forward_ops = out * ho * wo * fan_in;
  return absl::OkStatus();
}

absl::Status InferBatchNorm2d(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_RETURN_IF_ERROR(l.NeedRank(3));
  // Read only to reject values of the wrong type; the kernel uses them.
  APAPO_RETURN_IF_ERROR(l.attrs.Float("eps", 1e-5).status());
  APAPO_RETURN_IF_ERROR(l.attrs.Float("momentum", 0.1).status());
  const int64_t c = l.in[0]->out_shape[0];
  info.out_shape = l.in[0]->out_shape;
  info.params.push_back({"weight", {c}, -1, 1.0});
  info.params.push_back({"bias", {c}, -1, 0.0});
  info.forward_ops = 2 * Numel(info.out_shape);
  return absl::OkStatus();
}

// RELU and GELU: elementwise, one operation per element.
absl::Status InferActivation(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  info.out_shape = l.in[0]->out_shape;
  info.forward_ops = Numel(info.out_shape);
  return absl::OkStatus();
}

absl::Status InferDropout(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_ASSIGN_OR_RETURN(double p, l.attrs.Float("p", 0.5));
  if (p < 0 || p >= 1) return l.Error("p must be in [0, 1)");
  info.out_shape = l.in[0]->out_shape;
  info.forward_ops = Numel(info.out_shape);
  return absl::OkStatus();
}

// MAX_POOL2D and AVG_POOL2D: the stride defaults to the kernel size.
absl::Status InferPool2d(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_RETURN_IF_ERROR(l.NeedRank(3));
  APAPO_ASSIGN_OR_RETURN(auto k, l.attrs.Pair("kernel_size", 0, true));
  APAPO_ASSIGN_OR_RETURN(auto st, l.attrs.Pair("stride", k.first, false));
  APAPO_ASSIGN_OR_RETURN(auto p, l.attrs.Pair("padding", 0, false));
  if (k.first < 1 || st.first < 1) {
    return l.Error("kernel_size and stride must be >= 1");
  }
  const Shape& s = l.in[0]->out_shape;
  const int64_t ho = PoolOut(s[1], k.first, st.first, p.first);
  const int64_t wo = PoolOut(s[2], k.second, st.second, p.second);
  if (ho < 1 || wo < 1) {
    return l.Error(
        absl::StrCat("kernel larger than the input ", ShapeToString(s)));
  }
  info.out_shape = {s[0], ho, wo};
  info.forward_ops = Numel(s);
  return absl::OkStatus();
}

absl::Status InferAdaptiveAvgPool2d(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_RETURN_IF_ERROR(l.NeedRank(3));
  APAPO_ASSIGN_OR_RETURN(std::vector<int64_t> os,
                         l.attrs.Ints("output_size", false));
  if (os.empty()) os = {1, 1};
  if (os.size() == 1) os.push_back(os[0]);
  if (os.size() != 2 || os[0] < 1 || os[1] < 1) {
    return l.Error("output_size must be [h, w] with h, w >= 1");
  }
  info.out_shape = {l.in[0]->out_shape[0], os[0], os[1]};
  info.forward_ops = Numel(l.in[0]->out_shape);
  return absl::OkStatus();
}

absl::Status InferFlatten(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_ASSIGN_OR_RETURN(int64_t start, l.attrs.Int("start_dim", 1));
  const Shape& s = l.in[0]->out_shape;
  // start_dim counts the batch dimension as 0, as torch.flatten does.
  if (start < 1 || start > static_cast<int64_t>(s.size())) {
    return l.Error(absl::StrCat("start_dim ", start,
                                " out of range for sample ",
                                ShapeToString(s)));
  }
  info.out_shape.assign(s.begin(), s.begin() + (start - 1));
  int64_t rest = 1;
  for (size_t i = start - 1; i < s.size(); ++i) rest *= s[i];
  info.out_shape.push_back(rest);
  info.out_dtype = l.in[0]->out_dtype;
  return absl::OkStatus();
}

absl::Status InferAdd(const Layer& l, NodeInfo& info) {
  const auto& in = l.in;
  if (in.size() < 2) return l.Error("expects at least 2 inputs");
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i]->out_shape != in[0]->out_shape) {
      return ShapeMismatch(l.node,
                           absl::StrCat("input '", in[i]->id(),
                                        "' vs input '", in[0]->id(), "'"),
                           in[i]->out_shape, in[0]->out_shape);
    }
  }
  info.out_shape = in[0]->out_shape;
  info.forward_ops = Numel(info.out_shape) * in.size();
  return absl::OkStatus();
}

absl::Status InferConcat(const Layer& l, NodeInfo& info) {
  const auto& in = l.in;
  if (in.empty()) return l.Error("expects at least 1 input");
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_ASSIGN_OR_RETURN(int64_t dim, l.attrs.Int("dim", 1));
  const Shape& s0 = in[0]->out_shape;
  if (dim < 1 || dim > static_cast<int64_t>(s0.size())) {
    return l.Error(absl::StrCat("dim ", dim, " out of range for ",
                                ShapeToString(s0)));
  }
  Shape out = s0;
  for (size_t i = 1; i < in.size(); ++i) {
    const Shape& si = in[i]->out_shape;
    if (si.size() != s0.size()) {
      return ShapeMismatch(l.node, absl::StrCat("input '", in[i]->id(), "'"),
                           si, s0);
    }
    for (size_t d = 0; d < s0.size(); ++d) {
      if (static_cast<int64_t>(d) == dim - 1) continue;
      if (si[d] != s0[d]) {
        return ShapeMismatch(
            l.node,
            absl::StrCat("input '", in[i]->id(), "' off the concat dim"), si,
            s0);
      }
    }
    out[dim - 1] += si[dim - 1];
  }
  info.out_shape = out;
  info.forward_ops = Numel(out);
  return absl::OkStatus();
}

absl::Status InferEmbedding(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  const NodeInfo& in = *l.in[0];
  if (in.out_dtype != DType::kInt64) {
    return l.Error(
        absl::StrCat("input '", in.id(), "' must be int64 token ids"));
  }
  APAPO_ASSIGN_OR_RETURN(int64_t num, l.attrs.Int("num_embeddings", 0, true));
  APAPO_ASSIGN_OR_RETURN(int64_t dim, l.attrs.Int("embedding_dim", 0, true));
  APAPO_ASSIGN_OR_RETURN(int64_t maxpos, l.attrs.Int("max_positions", 0));
  if (num < 1 || dim < 1) {
    return l.Error("num_embeddings and embedding_dim must be >= 1");
  }
  info.out_shape = in.out_shape;
  info.out_shape.push_back(dim);
  // PyTorch initialises embeddings N(0, 1); a uniform of the same
  // variance keeps one init routine: U(-sqrt(3), sqrt(3)). LMs prefer
  // small embeddings, so use 0.02-scale like GPT.
  info.params.push_back({"weight", {num, dim}, 0.02 * std::sqrt(3.0), 0});
  if (maxpos > 0) {
    if (in.out_shape.size() != 1 || in.out_shape[0] > maxpos) {
      return l.Error(absl::StrCat("max_positions needs a [T] input with T <= ",
                                  maxpos, ", got ",
                                  ShapeToString(in.out_shape)));
    }
    info.params.push_back(
        {"position", {maxpos, dim}, 0.02 * std::sqrt(3.0), 0});
  }
  info.forward_ops = Numel(info.out_shape);
  return absl::OkStatus();
}

absl::Status InferLayerNorm(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_ASSIGN_OR_RETURN(std::vector<int64_t> ns,
                         l.attrs.Ints("normalized_shape", false));
  // Read only to reject a value of the wrong type; the kernel uses it.
  APAPO_RETURN_IF_ERROR(l.attrs.Float("eps", 1e-5).status());
  const Shape& s = l.in[0]->out_shape;
  if (s.empty()) return l.Error("input has no dimension to normalise");
  if (ns.empty()) ns = {s.back()};
  if (ns.size() > s.size() ||
      !std::equal(ns.begin(), ns.end(), s.end() - ns.size())) {
    return ShapeMismatch(
        l.node, "normalized_shape vs input's trailing dims",
        Shape(s.end() - std::min(ns.size(), s.size()), s.end()), ns);
  }
  info.out_shape = s;
  info.params.push_back({"weight", ns, -1, 1.0});
  info.params.push_back({"bias", ns, -1, 0.0});
  info.forward_ops = 5 * Numel(s);
  return absl::OkStatus();
}

absl::Status InferTransformerBlock(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  APAPO_RETURN_IF_ERROR(l.NeedRank(2));
  APAPO_ASSIGN_OR_RETURN(int64_t heads, l.attrs.Int("num_heads", 0, true));
  APAPO_ASSIGN_OR_RETURN(int64_t ratio, l.attrs.Int("mlp_ratio", 4));
  APAPO_ASSIGN_OR_RETURN(double drop, l.attrs.Float("dropout", 0.0));
  const int64_t t = l.in[0]->out_shape[0];
  const int64_t d = l.in[0]->out_shape[1];
  if (heads < 1 || d % heads != 0) {
    return l.Error(absl::StrCat("num_heads (", heads,
                                ") must divide the model width (", d, ")"));
  }
  if (ratio < 1) return l.Error("mlp_ratio must be >= 1");
  if (drop < 0 || drop >= 1) return l.Error("dropout must be in [0, 1)");
  const int64_t h = ratio * d;
  const double bd = 1.0 / std::sqrt(static_cast<double>(d));
  const double bh = 1.0 / std::sqrt(static_cast<double>(h));
  // In the order the kernel (model_builder.cc) indexes them.
  info.params = {{"ln1.weight", {d}, -1, 1.0},
                 {"ln1.bias", {d}, -1, 0.0},
                 {"qkv.weight", {3 * d, d}, bd, 0},
                 {"qkv.bias", {3 * d}, bd, 0},
                 {"proj.weight", {d, d}, bd, 0},
                 {"proj.bias", {d}, bd, 0},
                 {"ln2.weight", {d}, -1, 1.0},
                 {"ln2.bias", {d}, -1, 0.0},
                 {"fc1.weight", {h, d}, bd, 0},
                 {"fc1.bias", {h}, bd, 0},
                 {"fc2.weight", {d, h}, bh, 0},
                 {"fc2.bias", {d}, bh, 0}};
  info.out_shape = l.in[0]->out_shape;
  // Per sample of T tokens, width d, MLP width h: QKV and output projections
  // (4d^2 per token), the MLP (2dh per token), scores and mixing (2T^2 d).
  info.forward_ops = t * (4 * d * d + 2 * d * h) + 2 * t * t * d;
  return absl::OkStatus();
}

absl::Status InferCrossEntropyLoss(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_RETURN_IF_ERROR(l.NeedFloat());
  const Shape& s = l.in[0]->out_shape;
  if (s.empty() || s.size() > 2) {
    return l.Error(absl::StrCat("expects logits [C] or [T, C], got ",
                                ShapeToString(s)));
  }
  info.out_shape = {};
  info.forward_ops = Numel(s);
  return absl::OkStatus();
}

// Opaque: the importer (torchscript_model.h) ran the child and recorded
// what it found.
absl::Status InferTorchScriptChild(const Layer& l, NodeInfo& info) {
  APAPO_RETURN_IF_ERROR(l.NeedInputs(1));
  APAPO_ASSIGN_OR_RETURN(std::string path, l.attrs.String("path", ""));
  if (path.empty()) return l.Error("missing required attribute 'path'");
  APAPO_ASSIGN_OR_RETURN(int64_t index,
                         l.attrs.Int("index", 0, /*required=*/true));
  if (index < 0) return l.Error("index must be >= 0");
  APAPO_ASSIGN_OR_RETURN(Shape out,
                         l.attrs.Ints("out_shape", /*required=*/true));
  APAPO_ASSIGN_OR_RETURN(std::string dtype,
                         l.attrs.String("dtype", "float32"));
  if (dtype != "float32" && dtype != "int64") {
    return l.Error("dtype must be float32 or int64, got " + dtype);
  }
  APAPO_ASSIGN_OR_RETURN(std::string names, l.attrs.String("param_names", ""));
  APAPO_ASSIGN_OR_RETURN(std::vector<int64_t> shapes,
                         l.attrs.Ints("param_shapes", false));
  // param_shapes: for each name, its rank followed by its dimensions.
  size_t pos = 0;
  for (absl::string_view name :
       absl::StrSplit(names, ',', absl::SkipEmpty())) {
    if (pos >= shapes.size() || shapes[pos] < 0 ||
        pos + 1 + shapes[pos] > shapes.size()) {
      return l.Error("param_shapes does not match param_names");
    }
    Shape shape(shapes.begin() + pos + 1,
                shapes.begin() + pos + 1 + shapes[pos]);
    pos += 1 + shapes[pos];
    info.params.push_back({std::string(name), std::move(shape), 0, 0});
  }
  if (pos != shapes.size()) {
    return l.Error("param_shapes does not match param_names");
  }
  info.out_shape = out;
  info.out_dtype = dtype == "int64" ? DType::kInt64 : DType::kFloat32;
  // An estimate (the profiler measures): each weight element is used once
  // per output position (H*W for [C, H, W], T for [T, C], else once),
  // plus one operation per output element.
  int64_t positions = 1;
  if (out.size() == 3) {
    positions = out[1] * out[2];
  } else if (out.size() >= 2) {
    positions = Numel(out) / out.back();
  }
  info.forward_ops = Numel(out);
  for (const ParamInfo& p : info.params) {
    info.forward_ops += Numel(p.shape) * positions;
  }
  return absl::OkStatus();
}

// ---- the table ----

struct LayerKindEntry {
  LayerKind kind;
  std::set<std::string> attrs;  // the attributes the kind accepts
  InferFn infer;
};

// One entry per kind; the only place the graph library lists kinds.
const std::vector<LayerKindEntry>& LayerKindTable() {
  static const auto* table = new std::vector<LayerKindEntry>{
      {apapo::v1::LAYER_KIND_INPUT, {"shape", "dtype"}, &InferInput},
      {apapo::v1::LAYER_KIND_LINEAR, {"out_features", "bias"}, &InferLinear},
      {apapo::v1::LAYER_KIND_CONV2D,
       {"out_channels", "kernel_size", "stride", "padding", "bias"},
       &InferConv2d},
      {apapo::v1::LAYER_KIND_BATCH_NORM2D,
       {"eps", "momentum"},
       &InferBatchNorm2d},
      {apapo::v1::LAYER_KIND_RELU, {}, &InferActivation},
      {apapo::v1::LAYER_KIND_GELU, {}, &InferActivation},
      {apapo::v1::LAYER_KIND_MAX_POOL2D,
       {"kernel_size", "stride", "padding"},
       &InferPool2d},
      {apapo::v1::LAYER_KIND_AVG_POOL2D,
       {"kernel_size", "stride", "padding"},
       &InferPool2d},
      {apapo::v1::LAYER_KIND_ADAPTIVE_AVG_POOL2D,
       {"output_size"},
       &InferAdaptiveAvgPool2d},
      {apapo::v1::LAYER_KIND_FLATTEN, {"start_dim"}, &InferFlatten},
      {apapo::v1::LAYER_KIND_DROPOUT, {"p"}, &InferDropout},
      {apapo::v1::LAYER_KIND_ADD, {}, &InferAdd},
      {apapo::v1::LAYER_KIND_CONCAT, {"dim"}, &InferConcat},
      // max_positions: adds a learned positional embedding (for LMs).
      {apapo::v1::LAYER_KIND_EMBEDDING,
       {"num_embeddings", "embedding_dim", "max_positions"},
       &InferEmbedding},
      {apapo::v1::LAYER_KIND_LAYER_NORM,
       {"normalized_shape", "eps"},
       &InferLayerNorm},
      {apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK,
       {"num_heads", "mlp_ratio", "dropout"},
       &InferTransformerBlock},
      {apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS, {}, &InferCrossEntropyLoss},
      // Written by TorchScriptGraph (torchscript_model.h), not by hand.
      {apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD,
       {"path", "index", "out_shape", "dtype", "param_names", "param_shapes"},
       &InferTorchScriptChild},
  };
  return *table;
}

const LayerKindEntry* FindEntry(LayerKind kind) {
  for (const LayerKindEntry& e : LayerKindTable()) {
    if (e.kind == kind) return &e;
  }
  return nullptr;
}

}  // namespace

std::vector<LayerKind> GraphLayerKinds() {
  std::vector<LayerKind> kinds;
  for (const LayerKindEntry& e : LayerKindTable()) kinds.push_back(e.kind);
  return kinds;
}

absl::Status CheckLayerAttributes(const LayerNode& node) {
  const LayerKindEntry* entry = FindEntry(node.kind());
  if (entry == nullptr) return UnknownKind(node);
  for (const auto& [key, value] : node.attrs()) {
    if (!entry->attrs.count(key)) {
      return NodeError(node, absl::StrCat("unknown attribute '", key, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status InferLayer(const std::vector<NodeInfo>& nodes, NodeInfo& info) {
  const LayerKindEntry* entry = FindEntry(info.kind());
  if (entry == nullptr) return UnknownKind(*info.node);
  APAPO_RETURN_IF_ERROR(entry->infer(Layer(info, nodes), info));
  for (const ParamInfo& p : info.params) info.num_params += Numel(p.shape);
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace apapo
