#include "worker/model_graph.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace apapo {
namespace worker {
namespace {

using apapo::v1::AttrValue;
using apapo::v1::LayerKind;
using apapo::v1::LayerNode;
using apapo::v1::ModelGraph;

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string KindName(LayerKind kind) {
  return apapo::v1::LayerKind_Name(kind);
}

// ---- graph construction helpers (built-ins) ----

class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name) { graph_.set_name(std::move(name)); }

  LayerNode* Add(const std::string& id, LayerKind kind,
                 std::vector<std::string> inputs) {
    LayerNode* n = graph_.add_nodes();
    n->set_id(id);
    n->set_kind(kind);
    for (auto& in : inputs) n->add_inputs(in);
    return n;
  }
  static void SetInt(LayerNode* n, const std::string& key, int64_t v) {
    (*n->mutable_attrs())[key].set_i(v);
  }
  static void SetFloat(LayerNode* n, const std::string& key, double v) {
    (*n->mutable_attrs())[key].set_f(v);
  }
  static void SetInts(LayerNode* n, const std::string& key,
                      const std::vector<int64_t>& v) {
    auto* list = (*n->mutable_attrs())[key].mutable_ints();
    for (int64_t x : v) list->add_values(x);
  }
  ModelGraph Take() { return std::move(graph_); }

 private:
  ModelGraph graph_;
};

int64_t HyperInt(const apapo::v1::BuiltinModel& m, const std::string& key,
                 int64_t def) {
  auto it = m.hyper_parameters().find(key);
  if (it == m.hyper_parameters().end()) return def;
  if (it->second.value_case() == AttrValue::kF) {
    return static_cast<int64_t>(it->second.f());
  }
  return it->second.i();
}

double HyperFloat(const apapo::v1::BuiltinModel& m, const std::string& key,
                  double def) {
  auto it = m.hyper_parameters().find(key);
  if (it == m.hyper_parameters().end()) return def;
  if (it->second.value_case() == AttrValue::kI) {
    return static_cast<double>(it->second.i());
  }
  return it->second.f();
}

LayerNode* AddInput(GraphBuilder& b, const DataShape& data) {
  LayerNode* in = b.Add("input", apapo::v1::LAYER_KIND_INPUT, {});
  GraphBuilder::SetInts(in, "shape", data.sample_shape);
  (*in->mutable_attrs())["dtype"].set_s(
      data.sample_dtype == DType::kInt64 ? "int64" : "float32");
  return in;
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

// Attributes each kind accepts.
const std::set<std::string>* AllowedAttrs(LayerKind kind) {
  static const auto* table = new std::map<int, std::set<std::string>>{
      {apapo::v1::LAYER_KIND_INPUT, {"shape", "dtype"}},
      {apapo::v1::LAYER_KIND_LINEAR, {"out_features", "bias"}},
      {apapo::v1::LAYER_KIND_CONV2D,
       {"out_channels", "kernel_size", "stride", "padding", "bias"}},
      {apapo::v1::LAYER_KIND_BATCH_NORM2D, {"eps", "momentum"}},
      {apapo::v1::LAYER_KIND_RELU, {}},
      {apapo::v1::LAYER_KIND_GELU, {}},
      {apapo::v1::LAYER_KIND_MAX_POOL2D, {"kernel_size", "stride", "padding"}},
      {apapo::v1::LAYER_KIND_AVG_POOL2D, {"kernel_size", "stride", "padding"}},
      {apapo::v1::LAYER_KIND_ADAPTIVE_AVG_POOL2D, {"output_size"}},
      {apapo::v1::LAYER_KIND_FLATTEN, {"start_dim"}},
      {apapo::v1::LAYER_KIND_DROPOUT, {"p"}},
      {apapo::v1::LAYER_KIND_ADD, {}},
      {apapo::v1::LAYER_KIND_CONCAT, {"dim"}},
      // max_positions: adds a learned positional embedding (for LMs).
      {apapo::v1::LAYER_KIND_EMBEDDING,
       {"num_embeddings", "embedding_dim", "max_positions"}},
      {apapo::v1::LAYER_KIND_LAYER_NORM, {"normalized_shape", "eps"}},
      {apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK,
       {"num_heads", "mlp_ratio", "dropout"}},
      {apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS, {}},
      // Written by TorchScriptGraph (torchscript_model.h), not by hand.
      {apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD,
       {"path", "index", "out_shape", "dtype", "param_names",
        "param_shapes"}},
  };
  auto it = table->find(kind);
  return it == table->end() ? nullptr : &it->second;
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

int64_t PoolOut(int64_t in, int64_t k, int64_t s, int64_t p) {
  return (in + 2 * p - k) / s + 1;
}

// Infers out_shape/out_dtype/params/cost of `info` from its inputs.
absl::Status InferNode(NodeInfo& info, const std::vector<NodeInfo>& nodes) {
  const LayerNode& n = *info.node;
  const Attrs a(n);
  std::vector<const NodeInfo*> in;
  for (int i : info.inputs) in.push_back(&nodes[i]);
  auto need_inputs = [&](size_t count) -> absl::Status {
    if (in.size() != count) {
      return NodeError(n, absl::StrCat("expects ", count, " input(s), got ",
                                       in.size()));
    }
    return absl::OkStatus();
  };
  auto need_float = [&]() -> absl::Status {
    for (const NodeInfo* i : in) {
      if (i->out_dtype != DType::kFloat32) {
        return NodeError(n, absl::StrCat("input '", i->id(),
                                         "' is int64; this kind needs float32"));
      }
    }
    return absl::OkStatus();
  };
  auto need_rank = [&](size_t rank) -> absl::Status {
    if (in[0]->out_shape.size() != rank) {
      return NodeError(
          n, absl::StrCat("expects a rank-", rank, " sample (e.g. [C, H, W])",
                          ", got ", ShapeToString(in[0]->out_shape),
                          " from '", in[0]->id(), "'"));
    }
    return absl::OkStatus();
  };
  switch (n.kind()) {
    case apapo::v1::LAYER_KIND_INPUT: {
      APAPO_RETURN_IF_ERROR(need_inputs(0));
      APAPO_ASSIGN_OR_RETURN(auto shape, a.Ints("shape", /*required=*/true));
      for (int64_t d : shape) {
        if (d < 1) return NodeError(n, "shape dimensions must be >= 1");
      }
      APAPO_ASSIGN_OR_RETURN(auto dtype, a.String("dtype", "float32"));
      if (dtype != "float32" && dtype != "int64") {
        return NodeError(n, "dtype must be float32 or int64, got " + dtype);
      }
      info.out_shape = shape;
      info.out_dtype = dtype == "int64" ? DType::kInt64 : DType::kFloat32;
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_LINEAR: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      APAPO_ASSIGN_OR_RETURN(auto out, a.Int("out_features", 0, true));
      APAPO_ASSIGN_OR_RETURN(auto bias, a.Bool("bias", true));
      const Shape& s = in[0]->out_shape;
      if (s.empty()) return NodeError(n, "input has no feature dimension");
      if (out < 1) return NodeError(n, "out_features must be >= 1");
      const int64_t fan_in = s.back();
      info.out_shape = s;
      info.out_shape.back() = out;
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      info.params.push_back({"weight", {out, fan_in}, bound, 0});
      if (bias) info.params.push_back({"bias", {out}, bound, 0});
      info.forward_ops = Numel(s) / fan_in * fan_in * out;
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_CONV2D: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      APAPO_RETURN_IF_ERROR(need_rank(3));
      APAPO_ASSIGN_OR_RETURN(auto out, a.Int("out_channels", 0, true));
      APAPO_ASSIGN_OR_RETURN(auto k, a.Pair("kernel_size", 0, true));
      APAPO_ASSIGN_OR_RETURN(auto st, a.Pair("stride", 1, false));
      APAPO_ASSIGN_OR_RETURN(auto p, a.Pair("padding", 0, false));
      APAPO_ASSIGN_OR_RETURN(auto bias, a.Bool("bias", true));
      const Shape& s = in[0]->out_shape;
      if (out < 1 || k.first < 1 || k.second < 1 || st.first < 1 ||
          st.second < 1) {
        return NodeError(n, "out_channels, kernel_size and stride must be >= 1");
      }
      const int64_t ho = PoolOut(s[1], k.first, st.first, p.first);
      const int64_t wo = PoolOut(s[2], k.second, st.second, p.second);
      if (ho < 1 || wo < 1) {
        return NodeError(n, absl::StrCat("kernel larger than the input ",
                                         ShapeToString(s)));
      }
      info.out_shape = {out, ho, wo};
      const int64_t fan_in = s[0] * k.first * k.second;
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      info.params.push_back(
          {"weight", {out, s[0], k.first, k.second}, bound, 0});
      if (bias) info.params.push_back({"bias", {out}, bound, 0});
      info.forward_ops = out * ho * wo * fan_in;
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_BATCH_NORM2D: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      APAPO_RETURN_IF_ERROR(need_rank(3));
      APAPO_ASSIGN_OR_RETURN(auto eps, a.Float("eps", 1e-5));
      APAPO_ASSIGN_OR_RETURN(auto mom, a.Float("momentum", 0.1));
      (void)eps;
      (void)mom;
      const int64_t c = in[0]->out_shape[0];
      info.out_shape = in[0]->out_shape;
      info.params.push_back({"weight", {c}, -1, 1.0});
      info.params.push_back({"bias", {c}, -1, 0.0});
      info.forward_ops = 2 * Numel(info.out_shape);
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_RELU:
    case apapo::v1::LAYER_KIND_GELU:
    case apapo::v1::LAYER_KIND_DROPOUT: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      if (n.kind() == apapo::v1::LAYER_KIND_DROPOUT) {
        APAPO_ASSIGN_OR_RETURN(auto p, a.Float("p", 0.5));
        if (p < 0 || p >= 1) return NodeError(n, "p must be in [0, 1)");
      }
      info.out_shape = in[0]->out_shape;
      info.forward_ops = Numel(info.out_shape);
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_MAX_POOL2D:
    case apapo::v1::LAYER_KIND_AVG_POOL2D: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      APAPO_RETURN_IF_ERROR(need_rank(3));
      APAPO_ASSIGN_OR_RETURN(auto k, a.Pair("kernel_size", 0, true));
      APAPO_ASSIGN_OR_RETURN(auto st, a.Pair("stride", k.first, false));
      APAPO_ASSIGN_OR_RETURN(auto p, a.Pair("padding", 0, false));
      if (k.first < 1 || st.first < 1) {
        return NodeError(n, "kernel_size and stride must be >= 1");
      }
      const Shape& s = in[0]->out_shape;
      const int64_t ho = PoolOut(s[1], k.first, st.first, p.first);
      const int64_t wo = PoolOut(s[2], k.second, st.second, p.second);
      if (ho < 1 || wo < 1) {
        return NodeError(n, absl::StrCat("kernel larger than the input ",
                                         ShapeToString(s)));
      }
      info.out_shape = {s[0], ho, wo};
      info.forward_ops = Numel(s);
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_ADAPTIVE_AVG_POOL2D: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      APAPO_RETURN_IF_ERROR(need_rank(3));
      APAPO_ASSIGN_OR_RETURN(auto os, a.Ints("output_size", false));
      if (os.empty()) os = {1, 1};
      if (os.size() == 1) os.push_back(os[0]);
      if (os.size() != 2 || os[0] < 1 || os[1] < 1) {
        return NodeError(n, "output_size must be [h, w] with h, w >= 1");
      }
      info.out_shape = {in[0]->out_shape[0], os[0], os[1]};
      info.forward_ops = Numel(in[0]->out_shape);
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_FLATTEN: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_ASSIGN_OR_RETURN(auto start, a.Int("start_dim", 1));
      const Shape& s = in[0]->out_shape;
      // start_dim counts the batch dimension as 0, as torch.flatten does.
      if (start < 1 || start > static_cast<int64_t>(s.size())) {
        return NodeError(n, absl::StrCat("start_dim ", start,
                                         " out of range for sample ",
                                         ShapeToString(s)));
      }
      info.out_shape.assign(s.begin(), s.begin() + (start - 1));
      int64_t rest = 1;
      for (size_t i = start - 1; i < s.size(); ++i) rest *= s[i];
      info.out_shape.push_back(rest);
      info.out_dtype = in[0]->out_dtype;
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_ADD: {
      if (in.size() < 2) return NodeError(n, "expects at least 2 inputs");
      APAPO_RETURN_IF_ERROR(need_float());
      for (size_t i = 1; i < in.size(); ++i) {
        if (in[i]->out_shape != in[0]->out_shape) {
          return ShapeMismatch(
              n,
              absl::StrCat("input '", in[i]->id(), "' vs input '",
                           in[0]->id(), "'"),
              in[i]->out_shape, in[0]->out_shape);
        }
      }
      info.out_shape = in[0]->out_shape;
      info.forward_ops = Numel(info.out_shape) * in.size();
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_CONCAT: {
      if (in.empty()) return NodeError(n, "expects at least 1 input");
      APAPO_RETURN_IF_ERROR(need_float());
      APAPO_ASSIGN_OR_RETURN(auto dim, a.Int("dim", 1));
      const Shape& s0 = in[0]->out_shape;
      if (dim < 1 || dim > static_cast<int64_t>(s0.size())) {
        return NodeError(n, absl::StrCat("dim ", dim, " out of range for ",
                                         ShapeToString(s0)));
      }
      Shape out = s0;
      for (size_t i = 1; i < in.size(); ++i) {
        Shape si = in[i]->out_shape;
        if (si.size() != s0.size()) {
          return ShapeMismatch(n, absl::StrCat("input '", in[i]->id(), "'"),
                               si, s0);
        }
        for (size_t d = 0; d < s0.size(); ++d) {
          if (static_cast<int64_t>(d) == dim - 1) continue;
          if (si[d] != s0[d]) {
            return ShapeMismatch(
                n, absl::StrCat("input '", in[i]->id(), "' off the concat dim"),
                si, s0);
          }
        }
        out[dim - 1] += si[dim - 1];
      }
      info.out_shape = out;
      info.forward_ops = Numel(out);
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_EMBEDDING: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      if (in[0]->out_dtype != DType::kInt64) {
        return NodeError(n, absl::StrCat("input '", in[0]->id(),
                                         "' must be int64 token ids"));
      }
      APAPO_ASSIGN_OR_RETURN(auto num, a.Int("num_embeddings", 0, true));
      APAPO_ASSIGN_OR_RETURN(auto dim, a.Int("embedding_dim", 0, true));
      APAPO_ASSIGN_OR_RETURN(auto maxpos, a.Int("max_positions", 0));
      if (num < 1 || dim < 1) {
        return NodeError(n, "num_embeddings and embedding_dim must be >= 1");
      }
      info.out_shape = in[0]->out_shape;
      info.out_shape.push_back(dim);
      // PyTorch initialises embeddings N(0, 1); a uniform of the same
      // variance keeps one init routine: U(-sqrt(3), sqrt(3)). LMs prefer
      // small embeddings, so use 0.02-scale like GPT.
      info.params.push_back({"weight", {num, dim}, 0.02 * std::sqrt(3.0), 0});
      if (maxpos > 0) {
        if (in[0]->out_shape.size() != 1 || in[0]->out_shape[0] > maxpos) {
          return NodeError(n, absl::StrCat(
                                  "max_positions needs a [T] input with T <= ",
                                  maxpos, ", got ",
                                  ShapeToString(in[0]->out_shape)));
        }
        info.params.push_back(
            {"position", {maxpos, dim}, 0.02 * std::sqrt(3.0), 0});
      }
      info.forward_ops = Numel(info.out_shape);
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_LAYER_NORM: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      APAPO_ASSIGN_OR_RETURN(auto ns, a.Ints("normalized_shape", false));
      APAPO_ASSIGN_OR_RETURN(auto eps, a.Float("eps", 1e-5));
      (void)eps;
      const Shape& s = in[0]->out_shape;
      if (s.empty()) return NodeError(n, "input has no dimension to normalise");
      if (ns.empty()) ns = {s.back()};
      if (ns.size() > s.size() ||
          !std::equal(ns.begin(), ns.end(), s.end() - ns.size())) {
        return ShapeMismatch(n, "normalized_shape vs input's trailing dims",
                             Shape(s.end() - std::min(ns.size(), s.size()),
                                   s.end()),
                             ns);
      }
      info.out_shape = s;
      info.params.push_back({"weight", ns, -1, 1.0});
      info.params.push_back({"bias", ns, -1, 0.0});
      info.forward_ops = 5 * Numel(s);
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      APAPO_RETURN_IF_ERROR(need_rank(2));
      APAPO_ASSIGN_OR_RETURN(auto heads, a.Int("num_heads", 0, true));
      APAPO_ASSIGN_OR_RETURN(auto ratio, a.Int("mlp_ratio", 4));
      APAPO_ASSIGN_OR_RETURN(auto drop, a.Float("dropout", 0.0));
      const int64_t t = in[0]->out_shape[0];
      const int64_t d = in[0]->out_shape[1];
      if (heads < 1 || d % heads != 0) {
        return NodeError(n, absl::StrCat("num_heads (", heads,
                                         ") must divide the model width (", d,
                                         ")"));
      }
      if (ratio < 1) return NodeError(n, "mlp_ratio must be >= 1");
      if (drop < 0 || drop >= 1) return NodeError(n, "dropout must be in [0, 1)");
      const int64_t h = ratio * d;
      const double bd = 1.0 / std::sqrt(static_cast<double>(d));
      const double bh = 1.0 / std::sqrt(static_cast<double>(h));
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
      info.out_shape = in[0]->out_shape;
      info.forward_ops = t * (4 * d * d + 2 * d * h) + 2 * t * t * d;
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS: {
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_RETURN_IF_ERROR(need_float());
      const Shape& s = in[0]->out_shape;
      if (s.empty() || s.size() > 2) {
        return NodeError(n, absl::StrCat("expects logits [C] or [T, C], got ",
                                         ShapeToString(s)));
      }
      info.out_shape = {};
      info.forward_ops = Numel(s);
      return absl::OkStatus();
    }
    case apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD: {
      // Opaque: the importer ran the child and recorded what it found.
      APAPO_RETURN_IF_ERROR(need_inputs(1));
      APAPO_ASSIGN_OR_RETURN(auto path, a.String("path", ""));
      if (path.empty()) return NodeError(n, "missing required attribute 'path'");
      APAPO_ASSIGN_OR_RETURN(auto index, a.Int("index", 0, /*required=*/true));
      if (index < 0) return NodeError(n, "index must be >= 0");
      APAPO_ASSIGN_OR_RETURN(auto out, a.Ints("out_shape", /*required=*/true));
      APAPO_ASSIGN_OR_RETURN(auto dtype, a.String("dtype", "float32"));
      if (dtype != "float32" && dtype != "int64") {
        return NodeError(n, "dtype must be float32 or int64, got " + dtype);
      }
      APAPO_ASSIGN_OR_RETURN(auto names, a.String("param_names", ""));
      APAPO_ASSIGN_OR_RETURN(auto shapes, a.Ints("param_shapes", false));
      // param_shapes: for each name, its rank followed by its dimensions.
      size_t pos = 0;
      for (absl::string_view name : absl::StrSplit(names, ',', absl::SkipEmpty())) {
        if (pos >= shapes.size() || shapes[pos] < 0 ||
            pos + 1 + shapes[pos] > shapes.size()) {
          return NodeError(n, "param_shapes does not match param_names");
        }
        Shape shape(shapes.begin() + pos + 1,
                    shapes.begin() + pos + 1 + shapes[pos]);
        pos += 1 + shapes[pos];
        info.params.push_back({std::string(name), std::move(shape), 0, 0});
      }
      if (pos != shapes.size()) {
        return NodeError(n, "param_shapes does not match param_names");
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
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "node '", n.id(), "': unknown layer kind ",
          static_cast<int>(n.kind()), " (", KindName(n.kind()), ")"));
  }
}

}  // namespace

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::string_view DTypeName(DType dtype) {
  return dtype == DType::kInt64 ? "int64" : "float32";
}

absl::StatusOr<DataShape> DataShapeForJob(const apapo::v1::DataSpec& data) {
  DataShape out;
  switch (data.source_case()) {
    case apapo::v1::DataSpec::kFashionMnist:
      out.sample_shape = {1, 28, 28};
      out.num_classes = 10;
      return out;
    case apapo::v1::DataSpec::kText:
      if (data.text().context() < 1) {
        return absl::InvalidArgumentError(
            "spec.data.text.context: must be >= 1");
      }
      out.sample_shape = {data.text().context()};
      out.sample_dtype = DType::kInt64;
      out.num_classes = 256;
      return out;
    case apapo::v1::DataSpec::kSynthetic:
      out.sample_shape.assign(data.synthetic().sample_shape().begin(),
                              data.synthetic().sample_shape().end());
      out.num_classes = data.synthetic().num_classes();
      if (out.sample_shape.empty() || out.num_classes < 1) {
        return absl::InvalidArgumentError(
            "spec.data.synthetic: sample_shape and num_classes are required");
      }
      return out;
    default:
      return absl::InvalidArgumentError("spec.data: no data source given");
  }
}

absl::StatusOr<ModelGraph> BuiltinGraph(const apapo::v1::BuiltinModel& m,
                                        const DataShape& data) {
  using B = GraphBuilder;
  const std::string& name = m.name();
  if (name == "mlp") {
    GraphBuilder b("mlp");
    AddInput(b, data);
    const int64_t hidden = HyperInt(m, "hidden", 2048);
    const int64_t layers = HyperInt(m, "layers", 4);
    const double dropout = HyperFloat(m, "dropout", 0.0);
    std::string prev = "input";
    if (data.sample_shape.size() > 1) {
      b.Add("flatten", apapo::v1::LAYER_KIND_FLATTEN, {prev});
      prev = "flatten";
    }
    for (int64_t i = 1; i <= layers; ++i) {
      const std::string fc = absl::StrCat("fc", i);
      B::SetInt(b.Add(fc, apapo::v1::LAYER_KIND_LINEAR, {prev}),
                "out_features", hidden);
      const std::string relu = absl::StrCat("relu", i);
      b.Add(relu, apapo::v1::LAYER_KIND_RELU, {fc});
      prev = relu;
      if (dropout > 0) {
        const std::string d = absl::StrCat("dropout", i);
        B::SetFloat(b.Add(d, apapo::v1::LAYER_KIND_DROPOUT, {prev}), "p",
                    dropout);
        prev = d;
      }
    }
    const std::string out = absl::StrCat("fc", layers + 1);
    B::SetInt(b.Add(out, apapo::v1::LAYER_KIND_LINEAR, {prev}), "out_features",
              data.num_classes);
    b.Add("loss", apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS, {out});
    return b.Take();
  }
  if (name == "cnn") {
    GraphBuilder b("cnn");
    AddInput(b, data);
    auto* c1 = b.Add("conv1", apapo::v1::LAYER_KIND_CONV2D, {"input"});
    B::SetInt(c1, "out_channels", HyperInt(m, "conv1", 32));
    B::SetInt(c1, "kernel_size", 3);
    b.Add("relu1", apapo::v1::LAYER_KIND_RELU, {"conv1"});
    auto* c2 = b.Add("conv2", apapo::v1::LAYER_KIND_CONV2D, {"relu1"});
    B::SetInt(c2, "out_channels", HyperInt(m, "conv2", 64));
    B::SetInt(c2, "kernel_size", 3);
    b.Add("relu2", apapo::v1::LAYER_KIND_RELU, {"conv2"});
    B::SetInt(b.Add("pool", apapo::v1::LAYER_KIND_MAX_POOL2D, {"relu2"}),
              "kernel_size", 2);
    std::string prev = "pool";
    const double d1 = HyperFloat(m, "dropout1", 0.25);
    if (d1 > 0) {
      B::SetFloat(b.Add("dropout1", apapo::v1::LAYER_KIND_DROPOUT, {prev}),
                  "p", d1);
      prev = "dropout1";
    }
    b.Add("flatten", apapo::v1::LAYER_KIND_FLATTEN, {prev});
    B::SetInt(b.Add("fc1", apapo::v1::LAYER_KIND_LINEAR, {"flatten"}),
              "out_features", HyperInt(m, "fc1", 128));
    b.Add("relu3", apapo::v1::LAYER_KIND_RELU, {"fc1"});
    prev = "relu3";
    const double d2 = HyperFloat(m, "dropout2", 0.5);
    if (d2 > 0) {
      B::SetFloat(b.Add("dropout2", apapo::v1::LAYER_KIND_DROPOUT, {prev}),
                  "p", d2);
      prev = "dropout2";
    }
    B::SetInt(b.Add("fc2", apapo::v1::LAYER_KIND_LINEAR, {prev}),
              "out_features", data.num_classes);
    b.Add("loss", apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS, {"fc2"});
    return b.Take();
  }
  if (name == "resnet") {
    GraphBuilder b("resnet");
    AddInput(b, data);
    const int64_t width = HyperInt(m, "width", 16);
    const int64_t blocks = HyperInt(m, "blocks", 2);
    auto conv = [&](const std::string& id, const std::string& in, int64_t out,
                    int64_t k, int64_t stride) {
      auto* c = b.Add(id, apapo::v1::LAYER_KIND_CONV2D, {in});
      B::SetInt(c, "out_channels", out);
      B::SetInt(c, "kernel_size", k);
      B::SetInt(c, "stride", stride);
      B::SetInt(c, "padding", k / 2);
      (*c->mutable_attrs())["bias"].set_b(false);
      const std::string bn = id + "_bn";
      b.Add(bn, apapo::v1::LAYER_KIND_BATCH_NORM2D, {id});
      return bn;
    };
    std::string prev = conv("stem", "input", width, 3, 1);
    b.Add("stem_relu", apapo::v1::LAYER_KIND_RELU, {prev});
    prev = "stem_relu";
    int64_t channels = width;
    for (int stage = 0; stage < 2; ++stage) {
      for (int64_t i = 0; i < blocks; ++i) {
        const std::string p = absl::StrCat("s", stage, "b", i);
        const bool down = stage > 0 && i == 0;
        const int64_t out = down ? channels * 2 : channels;
        std::string x = conv(p + "_conv1", prev, out, 3, down ? 2 : 1);
        b.Add(p + "_relu1", apapo::v1::LAYER_KIND_RELU, {x});
        x = conv(p + "_conv2", p + "_relu1", out, 3, 1);
        std::string shortcut = prev;
        if (down) shortcut = conv(p + "_proj", prev, out, 1, 2);
        b.Add(p + "_add", apapo::v1::LAYER_KIND_ADD, {x, shortcut});
        b.Add(p + "_relu2", apapo::v1::LAYER_KIND_RELU, {p + "_add"});
        prev = p + "_relu2";
        channels = out;
      }
    }
    B::SetInts(b.Add("gap", apapo::v1::LAYER_KIND_ADAPTIVE_AVG_POOL2D, {prev}),
               "output_size", {1, 1});
    b.Add("flatten", apapo::v1::LAYER_KIND_FLATTEN, {"gap"});
    B::SetInt(b.Add("fc", apapo::v1::LAYER_KIND_LINEAR, {"flatten"}),
              "out_features", data.num_classes);
    b.Add("loss", apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS, {"fc"});
    return b.Take();
  }
  if (name == "transformer_lm") {
    if (data.sample_shape.size() != 1 || data.sample_dtype != DType::kInt64) {
      return absl::InvalidArgumentError(
          "model transformer_lm needs token data (spec.data.text)");
    }
    GraphBuilder b("transformer_lm");
    AddInput(b, data);
    const int64_t d = HyperInt(m, "d_model", 128);
    const int64_t layers = HyperInt(m, "layers", 2);
    auto* e = b.Add("embed", apapo::v1::LAYER_KIND_EMBEDDING, {"input"});
    B::SetInt(e, "num_embeddings", data.num_classes);
    B::SetInt(e, "embedding_dim", d);
    B::SetInt(e, "max_positions", data.sample_shape[0]);
    std::string prev = "embed";
    for (int64_t i = 0; i < layers; ++i) {
      const std::string id = absl::StrCat("block", i);
      auto* blk = b.Add(id, apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK, {prev});
      B::SetInt(blk, "num_heads", HyperInt(m, "heads", 4));
      B::SetInt(blk, "mlp_ratio", HyperInt(m, "mlp_ratio", 4));
      prev = id;
    }
    b.Add("ln_f", apapo::v1::LAYER_KIND_LAYER_NORM, {prev});
    B::SetInt(b.Add("head", apapo::v1::LAYER_KIND_LINEAR, {"ln_f"}),
              "out_features", data.num_classes);
    b.Add("loss", apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS, {"head"});
    return b.Take();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.model.builtin.name: unknown built-in model '", name,
      "' (expected mlp, cnn, resnet or transformer_lm)"));
}

absl::StatusOr<ModelGraph> GraphForJob(const apapo::v1::JobSpec& spec,
                                       const TorchScriptImporter& torchscript) {
  switch (spec.model().source_case()) {
    case apapo::v1::ModelSpec::kBuiltin: {
      APAPO_ASSIGN_OR_RETURN(auto data, DataShapeForJob(spec.data()));
      return BuiltinGraph(spec.model().builtin(), data);
    }
    case apapo::v1::ModelSpec::kGraph:
      return spec.model().graph();
    case apapo::v1::ModelSpec::kTorchscript: {
      if (!torchscript) {
        return absl::UnimplementedError(
            "spec.model.torchscript: this process was built without "
            "TorchScript support (no importer passed to GraphForJob)");
      }
      APAPO_ASSIGN_OR_RETURN(auto data, DataShapeForJob(spec.data()));
      return torchscript(spec.model().torchscript(), data);
    }
    default:
      return absl::InvalidArgumentError("spec.model: no model given");
  }
}

absl::StatusOr<ModelGraph> SplitLinearLayers(
    ModelGraph graph, const std::vector<std::pair<std::string, int>>& splits) {
  if (splits.empty()) return graph;
  // Shapes of the unsplit graph: the concat joins along the last dimension.
  APAPO_ASSIGN_OR_RETURN(auto analyzed, AnalyzedGraph::Create(graph));
  std::set<std::string> done;
  for (const auto& [id, parts] : splits) {
    const std::string where = absl::StrCat("plan.splits '", id, "'");
    if (!done.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": split twice"));
    }
    const int index = analyzed.IndexOf(id);
    if (index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no such node in the model graph"));
    }
    const NodeInfo& info = analyzed.nodes()[index];
    if (info.kind() != apapo::v1::LAYER_KIND_LINEAR) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": only Linear nodes can be split, this one is ",
          KindName(info.kind())));
    }
    const int64_t width = info.out_shape.back();
    if (parts < 2 || parts > width) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parts must be in [2, ", width, "], got ", parts));
    }
    int pos = 0;
    while (graph.nodes(pos).id() != id) ++pos;
    const LayerNode original = graph.nodes(pos);
    // The concat takes the Linear's place; the parts go in front of it.
    LayerNode concat;
    concat.set_id(id);
    concat.set_kind(apapo::v1::LAYER_KIND_CONCAT);
    concat.set_description(absl::StrCat(original.description().empty()
                                            ? std::string("Linear")
                                            : original.description(),
                                        ", split into ", parts, " parts"));
    (*concat.mutable_attrs())["dim"].set_i(
        static_cast<int64_t>(info.out_shape.size()));
    std::vector<LayerNode> part_nodes;
    for (int i = 0; i < parts; ++i) {
      LayerNode part = original;
      part.set_id(absl::StrCat(id, "/", i));
      (*part.mutable_attrs())["out_features"].set_i(width / parts +
                                                    (i < width % parts ? 1 : 0));
      concat.add_inputs(part.id());
      part_nodes.push_back(std::move(part));
    }
    *graph.mutable_nodes(pos) = std::move(concat);
    for (LayerNode& part : part_nodes) {
      *graph.add_nodes() = std::move(part);
    }
  }
  // Validate the result (ids such as "<id>/0" must not collide).
  APAPO_RETURN_IF_ERROR(AnalyzedGraph::Create(graph).status());
  return graph;
}

absl::StatusOr<AnalyzedGraph> AnalyzedGraph::Create(ModelGraph graph) {
  AnalyzedGraph g;
  g.graph_ = std::make_shared<const ModelGraph>(std::move(graph));
  const ModelGraph& proto = *g.graph_;
  const int n = proto.nodes_size();
  absl::flat_hash_map<std::string, int> proto_index;
  for (int i = 0; i < n; ++i) {
    const LayerNode& node = proto.nodes(i);
    if (node.id().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph node #", i, " has an empty id"));
    }
    if (!proto_index.emplace(node.id(), i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate node id '", node.id(), "'"));
    }
    const std::set<std::string>* allowed = AllowedAttrs(node.kind());
    if (allowed == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node '", node.id(), "': unknown layer kind ",
          static_cast<int>(node.kind()), " (", KindName(node.kind()), ")"));
    }
    for (const auto& [key, value] : node.attrs()) {
      if (!allowed->count(key)) {
        return NodeError(node, absl::StrCat("unknown attribute '", key, "'"));
      }
    }
  }
  // Kahn's algorithm, ties broken by proto order.
  std::vector<std::vector<int>> consumers(n);
  std::vector<int> indegree(n, 0);
  for (int i = 0; i < n; ++i) {
    for (const std::string& in : proto.nodes(i).inputs()) {
      auto it = proto_index.find(in);
      if (it == proto_index.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("node '", proto.nodes(i).id(),
                         "' has unknown input '", in, "'"));
      }
      consumers[it->second].push_back(i);
      ++indegree[i];
    }
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i) {
    if (indegree[i] == 0) ready.push(i);
  }
  std::vector<int> order;
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int c : consumers[i]) {
      if (--indegree[c] == 0) ready.push(c);
    }
  }
  if (static_cast<int>(order.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph '", proto.name(), "' has a cycle"));
  }
  std::vector<int> position(n);
  for (int k = 0; k < n; ++k) position[order[k]] = k;
  g.nodes_.resize(n);
  for (int k = 0; k < n; ++k) {
    NodeInfo& info = g.nodes_[k];
    info.node = &proto.nodes(order[k]);
    for (const std::string& in : info.node->inputs()) {
      info.inputs.push_back(position[proto_index[in]]);
    }
    for (int c : consumers[order[k]]) info.consumers.push_back(position[c]);
    std::sort(info.consumers.begin(), info.consumers.end());
    g.index_[info.id()] = k;
  }
  for (int k = 0; k < n; ++k) {
    NodeInfo& info = g.nodes_[k];
    if (info.kind() == apapo::v1::LAYER_KIND_INPUT) {
      if (g.input_index_ >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "graph has two INPUT nodes ('", g.nodes_[g.input_index_].id(),
            "', '", info.id(), "'); exactly one is supported"));
      }
      g.input_index_ = k;
    }
    if (info.kind() == apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS) {
      if (g.loss_index_ >= 0) {
        return absl::InvalidArgumentError("graph has two loss nodes");
      }
      g.loss_index_ = k;
    }
    if (absl::Status s = InferNode(info, g.nodes_); !s.ok()) return s;
    for (const ParamInfo& p : info.params) info.num_params += Numel(p.shape);
  }
  if (g.input_index_ < 0) {
    return absl::InvalidArgumentError("graph has no INPUT node");
  }
  if (g.loss_index_ < 0) {
    return absl::InvalidArgumentError(
        "graph has no CROSS_ENTROPY_LOSS node (its sink)");
  }
  for (int k = 0; k < n; ++k) {
    if (k != g.loss_index_ && g.nodes_[k].consumers.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", g.nodes_[k].id(),
                       "' has no consumers; only the loss may be a sink"));
    }
  }
  if (!g.nodes_[g.loss_index_].consumers.empty()) {
    return absl::InvalidArgumentError("the loss node must be the graph's sink");
  }
  const Shape& logits = g.nodes_[g.nodes_[g.loss_index_].inputs[0]].out_shape;
  g.label_shape_.assign(logits.begin(), logits.end() - 1);
  return g;
}

int AnalyzedGraph::IndexOf(absl::string_view id) const {
  auto it = index_.find(id);
  return it == index_.end() ? -1 : it->second;
}

int64_t AnalyzedGraph::num_params() const {
  int64_t total = 0;
  for (const NodeInfo& n : nodes_) total += n.num_params;
  return total;
}

absl::StatusOr<std::vector<StageLayout>> LayoutStages(
    const AnalyzedGraph& graph,
    const std::vector<std::vector<std::string>>& stage_nodes) {
  const int p = static_cast<int>(stage_nodes.size());
  if (p < 1) return absl::InvalidArgumentError("plan has no stages");
  const int n = static_cast<int>(graph.nodes().size());
  std::vector<int> stage_of(n, -1);
  for (int s = 0; s < p; ++s) {
    for (const std::string& id : stage_nodes[s]) {
      const int k = graph.IndexOf(id);
      if (k < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan stage ", s, " names unknown node '", id, "'"));
      }
      if (stage_of[k] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("plan puts node '", id, "' in stages ", stage_of[k],
                         " and ", s));
      }
      stage_of[k] = s;
    }
  }
  for (int k = 0; k < n; ++k) {
    if (stage_of[k] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan leaves node '", graph.nodes()[k].id(), "' in no stage"));
    }
    for (int in : graph.nodes()[k].inputs) {
      if (stage_of[in] > stage_of[k]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan runs node '", graph.nodes()[k].id(), "' in stage ",
            stage_of[k], " before its input '", graph.nodes()[in].id(),
            "' (stage ", stage_of[in], ")"));
      }
    }
  }
  if (stage_of[graph.input_index()] != 0) {
    return absl::InvalidArgumentError("plan must put the INPUT node in stage 0");
  }
  if (stage_of[graph.loss_index()] != p - 1) {
    return absl::InvalidArgumentError(
        "plan must put the loss node in the last stage");
  }
  std::vector<StageLayout> layouts(p);
  for (int s = 0; s < p; ++s) {
    StageLayout& l = layouts[s];
    l.index = s;
    l.is_first = s == 0;
    l.is_last = s == p - 1;
    for (int k = 0; k < n; ++k) {
      if (stage_of[k] == s) {
        l.nodes.push_back(k);
        l.num_params += graph.nodes()[k].num_params;
        l.forward_ops += graph.nodes()[k].forward_ops;
      }
    }
    if (s + 1 < p) {
      // Tensors made at or before s and consumed after s cross cut s|s+1.
      for (int k = 0; k < n; ++k) {
        if (stage_of[k] > s) continue;
        bool needed = false;
        for (int c : graph.nodes()[k].consumers) needed |= stage_of[c] > s;
        if (needed) {
          l.outputs.push_back({graph.nodes()[k].id(),
                               graph.nodes()[k].out_shape,
                               graph.nodes()[k].out_dtype});
        }
      }
      l.outputs.push_back(
          {std::string(kLabelsEntry), graph.label_shape(), DType::kInt64});
    }
    if (s > 0) l.inputs = layouts[s - 1].outputs;
  }
  return layouts;
}

absl::StatusOr<std::vector<std::vector<std::string>>> BalancedSplit(
    const AnalyzedGraph& graph, int num_stages) {
  const int n = static_cast<int>(graph.nodes().size());
  if (num_stages < 1 || num_stages > n - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot split ", n, " nodes into ", num_stages, " stages"));
  }
  // Cost per node: forward ops; parameter-free nodes still cost a little.
  std::vector<double> prefix(n + 1, 0.0);
  for (int k = 0; k < n; ++k) {
    prefix[k + 1] =
        prefix[k] + static_cast<double>(graph.nodes()[k].forward_ops) + 1.0;
  }
  // best[s][k]: min over splits of nodes [0, k) into s stages of the max cost.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(num_stages + 1,
                                        std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(num_stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= num_stages; ++s) {
    for (int k = s; k <= n; ++k) {
      for (int j = s - 1; j < k; ++j) {
        const double v = std::max(best[s - 1][j], prefix[k] - prefix[j]);
        if (v < best[s][k]) {
          best[s][k] = v;
          cut[s][k] = j;
        }
      }
    }
  }
  std::vector<std::vector<std::string>> out(num_stages);
  int k = n;
  for (int s = num_stages; s >= 1; --s) {
    const int j = cut[s][k];
    for (int i = j; i < k; ++i) out[s - 1].push_back(graph.nodes()[i].id());
    k = j;
  }
  return out;
}

}  // namespace worker
}  // namespace apapo
