#include "worker/model_graph.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/layer_kinds.h"

namespace apapo {
namespace worker {
namespace {

using apapo::v1::AttrValue;
using apapo::v1::LayerKind;
using apapo::v1::LayerNode;
using apapo::v1::ModelGraph;

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

// Reads a built-in model's hyper-parameters and notes every key read that
// the model's entry in BuiltinHyperParameters() does not list (a spec could
// never set it: the coordinator refuses unlisted keys).
class HyperParameters {
 public:
  explicit HyperParameters(const apapo::v1::BuiltinModel& m) : m_(m) {
    const auto& table = BuiltinHyperParameters();
    auto it = table.find(m.name());
    if (it != table.end()) listed_ = &it->second;
  }
  int64_t Int(const std::string& key, int64_t def) {
    const AttrValue* v = Find(key);
    if (v == nullptr) return def;
    if (v->value_case() == AttrValue::kF) return static_cast<int64_t>(v->f());
    return v->i();
  }
  double Float(const std::string& key, double def) {
    const AttrValue* v = Find(key);
    if (v == nullptr) return def;
    if (v->value_case() == AttrValue::kI) return static_cast<double>(v->i());
    return v->f();
  }
  absl::Status Check() const {
    if (unlisted_.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(
        "built-in model '", m_.name(), "' reads hyper-parameter(s) ",
        absl::StrJoin(unlisted_, ", "),
        " that BuiltinHyperParameters() does not list"));
  }

 private:
  const AttrValue* Find(const std::string& key) {
    if (listed_ == nullptr || !listed_->count(key)) unlisted_.insert(key);
    auto it = m_.hyper_parameters().find(key);
    return it == m_.hyper_parameters().end() ? nullptr : &it->second;
  }
  const apapo::v1::BuiltinModel& m_;
  const std::set<std::string>* listed_ = nullptr;
  std::set<std::string> unlisted_;
};

LayerNode* AddInput(GraphBuilder& b, const DataShape& data) {
  LayerNode* in = b.Add("input", apapo::v1::LAYER_KIND_INPUT, {});
  GraphBuilder::SetInts(in, "shape", data.sample_shape);
  (*in->mutable_attrs())["dtype"].set_s(
      data.sample_dtype == DType::kInt64 ? "int64" : "float32");
  return in;
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

namespace {

absl::StatusOr<ModelGraph> BuildBuiltin(const apapo::v1::BuiltinModel& m,
                                        const DataShape& data,
                                        HyperParameters& hp) {
  using B = GraphBuilder;
  const std::string& name = m.name();
  if (name == "mlp") {
    GraphBuilder b("mlp");
    AddInput(b, data);
    const int64_t hidden = hp.Int("hidden", 2048);
    const int64_t layers = hp.Int("layers", 4);
    const double dropout = hp.Float("dropout", 0.0);
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
    B::SetInt(c1, "out_channels", hp.Int("conv1", 32));
    B::SetInt(c1, "kernel_size", 3);
    b.Add("relu1", apapo::v1::LAYER_KIND_RELU, {"conv1"});
    auto* c2 = b.Add("conv2", apapo::v1::LAYER_KIND_CONV2D, {"relu1"});
    B::SetInt(c2, "out_channels", hp.Int("conv2", 64));
    B::SetInt(c2, "kernel_size", 3);
    b.Add("relu2", apapo::v1::LAYER_KIND_RELU, {"conv2"});
    B::SetInt(b.Add("pool", apapo::v1::LAYER_KIND_MAX_POOL2D, {"relu2"}),
              "kernel_size", 2);
    std::string prev = "pool";
    const double d1 = hp.Float("dropout1", 0.25);
    if (d1 > 0) {
      B::SetFloat(b.Add("dropout1", apapo::v1::LAYER_KIND_DROPOUT, {prev}),
                  "p", d1);
      prev = "dropout1";
    }
    b.Add("flatten", apapo::v1::LAYER_KIND_FLATTEN, {prev});
    B::SetInt(b.Add("fc1", apapo::v1::LAYER_KIND_LINEAR, {"flatten"}),
              "out_features", hp.Int("fc1", 128));
    b.Add("relu3", apapo::v1::LAYER_KIND_RELU, {"fc1"});
    prev = "relu3";
    const double d2 = hp.Float("dropout2", 0.5);
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
    const int64_t width = hp.Int("width", 16);
    const int64_t blocks = hp.Int("blocks", 2);
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
    const int64_t d = hp.Int("d_model", 128);
    const int64_t layers = hp.Int("layers", 2);
    auto* e = b.Add("embed", apapo::v1::LAYER_KIND_EMBEDDING, {"input"});
    B::SetInt(e, "num_embeddings", data.num_classes);
    B::SetInt(e, "embedding_dim", d);
    B::SetInt(e, "max_positions", data.sample_shape[0]);
    std::string prev = "embed";
    for (int64_t i = 0; i < layers; ++i) {
      const std::string id = absl::StrCat("block", i);
      auto* blk = b.Add(id, apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK, {prev});
      B::SetInt(blk, "num_heads", hp.Int("heads", 4));
      B::SetInt(blk, "mlp_ratio", hp.Int("mlp_ratio", 4));
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

}  // namespace

const std::map<std::string, std::set<std::string>>& BuiltinHyperParameters() {
  // Integers >= 1, except the "dropout" ones: probabilities in [0, 1).
  static const auto* kParams =
      new std::map<std::string, std::set<std::string>>{
          {"mlp", {"hidden", "layers", "dropout"}},
          {"cnn", {"conv1", "conv2", "fc1", "dropout1", "dropout2"}},
          {"resnet", {"width", "blocks"}},
          {"transformer_lm", {"d_model", "layers", "heads", "mlp_ratio"}},
      };
  return *kParams;
}

absl::StatusOr<ModelGraph> BuiltinGraph(const apapo::v1::BuiltinModel& m,
                                        const DataShape& data) {
  HyperParameters hp(m);
  absl::StatusOr<ModelGraph> graph = BuildBuiltin(m, data, hp);
  if (absl::Status s = hp.Check(); !s.ok()) return s;
  return graph;
}

absl::StatusOr<ModelGraph> GraphForJob(const apapo::v1::JobSpec& spec,
                                       const TorchScriptImporter& torchscript) {
  switch (spec.model().source_case()) {
    case apapo::v1::ModelSpec::kBuiltin: {
      APAPO_ASSIGN_OR_RETURN(DataShape data, DataShapeForJob(spec.data()));
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
      APAPO_ASSIGN_OR_RETURN(DataShape data, DataShapeForJob(spec.data()));
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
  APAPO_ASSIGN_OR_RETURN(AnalyzedGraph analyzed,
                         AnalyzedGraph::Create(graph));
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
      (*part.mutable_attrs())["out_features"].set_i(
          SplitPartRows(width, parts, i).size());
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

bool WeightGradientsAfterSend(apapo::v1::LayerKind kind) {
  switch (kind) {
    case apapo::v1::LAYER_KIND_LINEAR:
    case apapo::v1::LAYER_KIND_CONV2D:
    case apapo::v1::LAYER_KIND_BATCH_NORM2D:
    case apapo::v1::LAYER_KIND_EMBEDDING:
    case apapo::v1::LAYER_KIND_LAYER_NORM:
      return true;
    default:
      return false;
  }
}

bool WeightGradientsInProduct(const NodeInfo& node) {
  return node.kind() == apapo::v1::LAYER_KIND_LINEAR && node.num_params > 0 &&
         node.out_shape.size() == 1;
}

RowRange SplitPartRows(int64_t width, int parts, int part) {
  // q = width / parts features each, and the first r = width % parts parts
  // one more: part i starts at i q + min(i, r).
  const int64_t q = width / parts, r = width % parts;
  RowRange rows;
  rows.begin = part * q + std::min<int64_t>(part, r);
  rows.end = rows.begin + q + (part < r ? 1 : 0);
  return rows;
}

NodeOrigin OriginOf(const AnalyzedGraph& graph, int node_index) {
  const NodeInfo& node = graph.nodes()[node_index];
  NodeOrigin origin;
  origin.id = node.id();
  const size_t slash = node.id().rfind('/');
  int part = -1;
  if (node.kind() != apapo::v1::LAYER_KIND_LINEAR ||
      slash == std::string::npos ||
      !absl::SimpleAtoi(node.id().substr(slash + 1), &part) || part < 0) {
    return origin;
  }
  const std::string whole = node.id().substr(0, slash);
  const int concat = graph.IndexOf(whole);
  if (concat < 0 ||
      graph.nodes()[concat].kind() != apapo::v1::LAYER_KIND_CONCAT) {
    return origin;
  }
  const NodeInfo& c = graph.nodes()[concat];
  const int parts = static_cast<int>(c.inputs.size());
  if (part >= parts) return origin;
  int64_t width = 0;
  for (int k = 0; k < parts; ++k) {
    const NodeInfo& p = graph.nodes()[c.inputs[k]];
    if (p.id() != absl::StrCat(whole, "/", k) ||
        p.kind() != apapo::v1::LAYER_KIND_LINEAR || p.out_shape.empty()) {
      return origin;
    }
    width += p.out_shape.back();
  }
  for (int k = 0; k < parts; ++k) {
    if (graph.nodes()[c.inputs[k]].out_shape.back() !=
        SplitPartRows(width, parts, k).size()) {
      return origin;
    }
  }
  origin.id = whole;
  origin.is_part = true;
  origin.rows = SplitPartRows(width, parts, part);
  origin.total_rows = width;
  return origin;
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
    APAPO_RETURN_IF_ERROR(CheckLayerAttributes(node));
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
    APAPO_RETURN_IF_ERROR(InferLayer(g.nodes_, info));
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
          const NodeInfo& node = graph.nodes()[k];
          l.outputs.push_back({node.id(), node.out_shape, node.out_dtype,
                               node.kind() == apapo::v1::LAYER_KIND_RELU &&
                                   node.out_dtype == DType::kFloat32});
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
