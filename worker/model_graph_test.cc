#include "worker/model_graph.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "worker/layer_kinds.h"

namespace apapo {
namespace worker {
namespace {

using ::testing::HasSubstr;

apapo::v1::ModelGraph ParseGraph(const std::string& text) {
  apapo::v1::ModelGraph g;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g));
  return g;
}

DataShape Mnist() { return DataShape{{1, 28, 28}, DType::kFloat32, 10}; }

apapo::v1::BuiltinModel Builtin(const std::string& name) {
  apapo::v1::BuiltinModel m;
  m.set_name(name);
  return m;
}

TEST(ModelGraphTest, BuiltinMlpHasReferenceShapeAndSize) {
  auto graph = BuiltinGraph(Builtin("mlp"), Mnist());
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto g = AnalyzedGraph::Create(*graph);
  ASSERT_TRUE(g.ok()) << g.status();
  // 784-2048x4-10.
  EXPECT_EQ(g->num_params(), 784 * 2048 + 2048 + 3 * (2048 * 2048 + 2048) +
                                 2048 * 10 + 10);
  EXPECT_EQ(g->nodes()[g->IndexOf("fc5")].out_shape, (Shape{10}));
  EXPECT_TRUE(g->label_shape().empty());
}

TEST(ModelGraphTest, SplitLinearLayersKeepsShapesAndParameters) {
  auto graph = BuiltinGraph(Builtin("mlp"), Mnist());
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto unsplit = AnalyzedGraph::Create(*graph);
  ASSERT_TRUE(unsplit.ok());
  auto split = SplitLinearLayers(*graph, {{"fc3", 3}, {"fc5", 2}});
  ASSERT_TRUE(split.ok()) << split.status();
  auto g = AnalyzedGraph::Create(*split);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->num_params(), unsplit->num_params());
  const NodeInfo& fc3 = g->nodes()[g->IndexOf("fc3")];
  EXPECT_EQ(fc3.kind(), apapo::v1::LAYER_KIND_CONCAT);
  EXPECT_EQ(fc3.out_shape, (Shape{2048}));
  EXPECT_EQ(g->nodes()[g->IndexOf("fc3/0")].out_shape, (Shape{683}));
  EXPECT_EQ(g->nodes()[g->IndexOf("fc3/2")].out_shape, (Shape{682}));
  EXPECT_EQ(g->nodes()[g->IndexOf("fc5")].out_shape, (Shape{10}));
  // The parts read the split layer's input; its consumers are unchanged.
  EXPECT_EQ(g->nodes()[g->IndexOf("fc3/1")].node->inputs(0), "relu2");
  EXPECT_EQ(g->nodes()[g->IndexOf("relu3")].node->inputs(0), "fc3");
  // No splits: the graph as given.
  auto same = SplitLinearLayers(*graph, {});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->nodes_size(), graph->nodes_size());
}

// Checkpoints key a part's rows by OriginOf: the rows SplitLinearLayers
// gave it, contiguous and covering the whole layer.
TEST(ModelGraphTest, OriginOfNamesTheUnsplitLayerAndItsRows) {
  auto graph = BuiltinGraph(Builtin("mlp"), Mnist());
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto split = SplitLinearLayers(*graph, {{"fc3", 3}});
  ASSERT_TRUE(split.ok()) << split.status();
  auto g = AnalyzedGraph::Create(*split);
  ASSERT_TRUE(g.ok()) << g.status();
  int64_t next = 0;
  for (int j = 0; j < 3; ++j) {
    const int index = g->IndexOf(absl::StrCat("fc3/", j));
    const NodeOrigin o = OriginOf(*g, index);
    EXPECT_EQ(o.id, "fc3");
    EXPECT_TRUE(o.is_part);
    EXPECT_EQ(o.total_rows, 2048);
    EXPECT_EQ(o.rows.begin, next);
    EXPECT_EQ(o.rows.size(), g->nodes()[index].out_shape.back());
    next = o.rows.end;
  }
  EXPECT_EQ(next, 2048);
  const NodeOrigin whole = OriginOf(*g, g->IndexOf("fc2"));
  EXPECT_EQ(whole.id, "fc2");
  EXPECT_FALSE(whole.is_part);
  EXPECT_FALSE(OriginOf(*g, g->IndexOf("fc3")).is_part);  // the concat
  // 20 features in 8: 3,3,3,3,2,2,2,2.
  EXPECT_EQ(SplitPartRows(20, 8, 3).begin, 9);
  EXPECT_EQ(SplitPartRows(20, 8, 4).begin, 12);
  EXPECT_EQ(SplitPartRows(20, 8, 7).end, 20);
}

TEST(ModelGraphTest, BadLayerSplitsNameTheSplit) {
  auto graph = BuiltinGraph(Builtin("mlp"), Mnist());
  ASSERT_TRUE(graph.ok());
  struct Case {
    std::vector<std::pair<std::string, int>> splits;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{{"nope", 2}}, "plan.splits 'nope': no such node"},
           {{{"relu1", 2}}, "plan.splits 'relu1': only Linear nodes"},
           {{{"fc2", 1}}, "plan.splits 'fc2': parts must be in [2, 2048], got 1"},
           {{{"fc5", 11}}, "plan.splits 'fc5': parts must be in [2, 10], got 11"},
           {{{"fc2", 2}, {"fc2", 4}}, "plan.splits 'fc2': split twice"}}) {
    auto split = SplitLinearLayers(*graph, c.splits);
    ASSERT_FALSE(split.ok()) << c.message;
    EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(split.status().message()), HasSubstr(c.message));
  }
}

TEST(ModelGraphTest, BuiltinCnnMatchesPyTorchExample) {
  auto graph = BuiltinGraph(Builtin("cnn"), Mnist());
  ASSERT_TRUE(graph.ok());
  auto g = AnalyzedGraph::Create(*graph);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->nodes()[g->IndexOf("pool")].out_shape, (Shape{64, 12, 12}));
  EXPECT_EQ(g->nodes()[g->IndexOf("flatten")].out_shape, (Shape{9216}));
  // PyTorch's example Net has 1,199,882 parameters.
  EXPECT_EQ(g->num_params(), 1199882);
}

TEST(ModelGraphTest, ResnetAndTransformerAnalyse) {
  auto resnet = BuiltinGraph(Builtin("resnet"), Mnist());
  ASSERT_TRUE(resnet.ok());
  auto g = AnalyzedGraph::Create(*resnet);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->nodes()[g->IndexOf("gap")].out_shape, (Shape{32, 1, 1}));

  auto lm = BuiltinGraph(Builtin("transformer_lm"),
                         DataShape{{32}, DType::kInt64, 256});
  ASSERT_TRUE(lm.ok()) << lm.status();
  auto l = AnalyzedGraph::Create(*lm);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->nodes()[l->IndexOf("head")].out_shape, (Shape{32, 256}));
  EXPECT_EQ(l->label_shape(), (Shape{32}));
  // The LM needs token data.
  EXPECT_FALSE(BuiltinGraph(Builtin("transformer_lm"), Mnist()).ok());
}

// Each key BuiltinHyperParameters() lists (what a spec may set) changes the
// model it builds, and building every model reads no unlisted key (that
// fails with INTERNAL naming it): the coordinator's validator and the
// builders agree on the keys.
TEST(ModelGraphTest, EveryListedHyperParameterIsRead) {
  const DataShape tokens{{32}, DType::kInt64, 256};
  ASSERT_EQ(BuiltinHyperParameters().size(), 4u);
  for (const auto& [name, keys] : BuiltinHyperParameters()) {
    const DataShape data = name == "transformer_lm" ? tokens : Mnist();
    auto plain = BuiltinGraph(Builtin(name), data);
    ASSERT_TRUE(plain.ok()) << name << ": " << plain.status();
    for (const std::string& key : keys) {
      apapo::v1::BuiltinModel m = Builtin(name);
      apapo::v1::AttrValue& v = (*m.mutable_hyper_parameters())[key];
      if (absl::StartsWith(key, "dropout")) {
        v.set_f(0.125);
      } else {
        v.set_i(8);
      }
      auto changed = BuiltinGraph(m, data);
      ASSERT_TRUE(changed.ok()) << name << "." << key << ": " << changed.status();
      EXPECT_NE(changed->SerializeAsString(), plain->SerializeAsString())
          << name << "." << key << " is listed but not read";
    }
  }
}

TEST(ModelGraphTest, UnknownBuiltinIsInvalidArgument) {
  auto g = BuiltinGraph(Builtin("vgg"), Mnist());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("vgg"));
}

TEST(ModelGraphTest, ShapeMismatchNamesNodeAndBothShapes) {
  auto g = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "input" kind: LAYER_KIND_INPUT
            attrs { key: "shape" value { ints { values: 8 } } } }
    nodes { id: "a" kind: LAYER_KIND_LINEAR inputs: "input"
            attrs { key: "out_features" value { i: 4 } } }
    nodes { id: "b" kind: LAYER_KIND_LINEAR inputs: "input"
            attrs { key: "out_features" value { i: 5 } } }
    nodes { id: "sum" kind: LAYER_KIND_ADD inputs: "a" inputs: "b" }
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "sum" }
  )pb"));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(g.status().message());
  EXPECT_THAT(msg, HasSubstr("'sum'"));
  EXPECT_THAT(msg, HasSubstr("[5]"));
  EXPECT_THAT(msg, HasSubstr("[4]"));
}

TEST(ModelGraphTest, ConvOnFlatInputIsAShapeError) {
  auto g = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "input" kind: LAYER_KIND_INPUT
            attrs { key: "shape" value { ints { values: 784 } } } }
    nodes { id: "conv" kind: LAYER_KIND_CONV2D inputs: "input"
            attrs { key: "out_channels" value { i: 4 } }
            attrs { key: "kernel_size" value { i: 3 } } }
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "conv" }
  )pb"));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("'conv'"));
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("[784]"));
}

TEST(ModelGraphTest, UnknownKindAndAttributeAreClearErrors) {
  auto g = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "input" kind: LAYER_KIND_INPUT
            attrs { key: "shape" value { ints { values: 8 } } } }
    nodes { id: "weird" kind: 99 inputs: "input" }
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "weird" }
  )pb"));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("'weird'"));
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("unknown layer kind"));

  auto h = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "input" kind: LAYER_KIND_INPUT
            attrs { key: "shape" value { ints { values: 8 } } } }
    nodes { id: "fc" kind: LAYER_KIND_LINEAR inputs: "input"
            attrs { key: "out_features" value { i: 4 } }
            attrs { key: "colour" value { s: "red" } } }
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "fc" }
  )pb"));
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("colour"));

  auto ts = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "input" kind: LAYER_KIND_INPUT
            attrs { key: "shape" value { ints { values: 8 } } } }
    nodes { id: "c0" kind: LAYER_KIND_TORCHSCRIPT_CHILD inputs: "input" }
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "c0" }
  )pb"));
  EXPECT_EQ(ts.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ts.status().message()), HasSubstr("'path'"));
}

// TorchScript children carry what the importer found (torchscript_model.h).
TEST(ModelGraphTest, TorchScriptChildTakesItsRecordedShapes) {
  auto g = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "input" kind: LAYER_KIND_INPUT
            attrs { key: "shape" value { ints { values: 8 } } } }
    nodes { id: "child0" kind: LAYER_KIND_TORCHSCRIPT_CHILD inputs: "input"
            attrs { key: "path" value { s: "m.pt" } }
            attrs { key: "index" value { i: 0 } }
            attrs { key: "out_shape" value { ints { values: 4 } } }
            attrs { key: "param_names" value { s: "weight,bias" } }
            attrs { key: "param_shapes"
                    value { ints { values: [ 2, 4, 8, 1, 4 ] } } } }
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "child0" }
  )pb"));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeInfo& c = g->nodes()[1];
  EXPECT_EQ(c.out_shape, Shape({4}));
  ASSERT_EQ(c.params.size(), 2u);
  EXPECT_EQ(c.params[0].name, "weight");
  EXPECT_EQ(c.params[0].shape, Shape({4, 8}));
  EXPECT_EQ(c.params[1].shape, Shape({4}));
  EXPECT_EQ(g->num_params(), 36);

  auto bad = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "input" kind: LAYER_KIND_INPUT
            attrs { key: "shape" value { ints { values: 8 } } } }
    nodes { id: "child0" kind: LAYER_KIND_TORCHSCRIPT_CHILD inputs: "input"
            attrs { key: "path" value { s: "m.pt" } }
            attrs { key: "index" value { i: 0 } }
            attrs { key: "out_shape" value { ints { values: 4 } } }
            attrs { key: "param_names" value { s: "weight,bias" } }
            attrs { key: "param_shapes" value { ints { values: [ 2, 4, 8 ] } } } }
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "child0" }
  )pb"));
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("param_shapes does not match param_names"));
}

TEST(ModelGraphTest, TorchScriptSpecNeedsAnImporter) {
  apapo::v1::JobSpec spec;
  spec.mutable_model()->mutable_torchscript()->set_path("m.pt");
  spec.mutable_model()->mutable_torchscript()->add_input_shape(8);
  spec.mutable_data()->mutable_synthetic()->add_sample_shape(8);
  spec.mutable_data()->mutable_synthetic()->set_num_classes(4);
  EXPECT_EQ(GraphForJob(spec).status().code(),
            absl::StatusCode::kUnimplemented);
  int calls = 0;
  auto g = GraphForJob(spec, [&](const apapo::v1::TorchScriptModel& m,
                                 const DataShape& data)
                                 -> absl::StatusOr<apapo::v1::ModelGraph> {
    ++calls;
    EXPECT_EQ(m.path(), "m.pt");
    EXPECT_EQ(data.sample_shape, Shape({8}));
    return absl::NotFoundError("m.pt");
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelGraphTest, CycleAndUnknownInputAreRefused) {
  auto g = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "input" kind: LAYER_KIND_INPUT
            attrs { key: "shape" value { ints { values: 8 } } } }
    nodes { id: "a" kind: LAYER_KIND_RELU inputs: "b" }
    nodes { id: "b" kind: LAYER_KIND_RELU inputs: "a" }
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "input" }
  )pb"));
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("cycle"));
  auto h = AnalyzedGraph::Create(ParseGraph(R"pb(
    nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "nope" }
  )pb"));
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("'nope'"));
}

TEST(ModelGraphTest, ResnetCutPassesSkipTensorsThroughTheBundle) {
  auto graph = BuiltinGraph(Builtin("resnet"), Mnist());
  auto g = AnalyzedGraph::Create(*graph);
  ASSERT_TRUE(g.ok());
  // Cut inside a residual block: after s0b0_conv1, so the block input
  // (stem_relu) must cross with it.
  std::vector<std::vector<std::string>> stages(2);
  bool first = true;
  for (const NodeInfo& n : g->nodes()) {
    stages[first ? 0 : 1].push_back(n.id());
    if (n.id() == "s0b0_conv1_bn") first = false;
  }
  auto layouts = LayoutStages(*g, stages);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  ASSERT_EQ((*layouts)[0].outputs.size(), 3u);
  EXPECT_EQ((*layouts)[0].outputs[0].name, "stem_relu");
  EXPECT_EQ((*layouts)[0].outputs[1].name, "s0b0_conv1_bn");
  EXPECT_EQ((*layouts)[0].outputs[2].name, std::string(kLabelsEntry));
  EXPECT_EQ((*layouts)[0].outputs[2].dtype, DType::kInt64);
  EXPECT_EQ((*layouts)[1].inputs.size(), 3u);
  EXPECT_TRUE((*layouts)[1].outputs.empty());
}

TEST(ModelGraphTest, LayoutRejectsBadPlans) {
  auto graph = BuiltinGraph(Builtin("mlp"), Mnist());
  auto g = AnalyzedGraph::Create(*graph);
  ASSERT_TRUE(g.ok());
  std::vector<std::vector<std::string>> stages(2);
  for (const NodeInfo& n : g->nodes()) stages[0].push_back(n.id());
  // Stage 1 empty is fine for layout except the loss must be last.
  EXPECT_FALSE(LayoutStages(*g, stages).ok());
  stages[1].push_back("ghost");
  EXPECT_THAT(std::string(LayoutStages(*g, stages).status().message()),
              HasSubstr("ghost"));
}

TEST(ModelGraphTest, BalancedSplitOfMlpBalancesCompute) {
  auto graph = BuiltinGraph(Builtin("mlp"), Mnist());
  auto g = AnalyzedGraph::Create(*graph);
  auto split = BalancedSplit(*g, 2);
  ASSERT_TRUE(split.ok()) << split.status();
  auto layouts = LayoutStages(*g, *split);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  const double a = (*layouts)[0].forward_ops;
  const double b = (*layouts)[1].forward_ops;
  EXPECT_LT(std::max(a, b) / (a + b), 0.6);
  auto three = BalancedSplit(*g, 3);
  ASSERT_TRUE(three.ok());
  EXPECT_TRUE(LayoutStages(*g, *three).ok());
}

// A kind added to the proto needs its entry in layer_kinds.cc, and the
// table names each kind once (FindEntry would silently take the first).
TEST(ModelGraphTest, LayerKindTableCoversTheProtoEnumOnce) {
  std::vector<apapo::v1::LayerKind> want;
  for (int k = apapo::v1::LayerKind_MIN; k <= apapo::v1::LayerKind_MAX; ++k) {
    if (apapo::v1::LayerKind_IsValid(k) &&
        k != apapo::v1::LAYER_KIND_UNSPECIFIED) {
      want.push_back(static_cast<apapo::v1::LayerKind>(k));
    }
  }
  EXPECT_THAT(GraphLayerKinds(), ::testing::UnorderedElementsAreArray(want));
}

// Kinds whose weight gradients a split backward takes after the send: one
// operation between parameters and output. A transformer block or a
// TorchScript child would repeat its inner input gradients on that path.
TEST(WeightGradientsAfterSendTest, OneOperationKindsOnly) {
  EXPECT_TRUE(WeightGradientsAfterSend(apapo::v1::LAYER_KIND_LINEAR));
  EXPECT_TRUE(WeightGradientsAfterSend(apapo::v1::LAYER_KIND_CONV2D));
  EXPECT_TRUE(WeightGradientsAfterSend(apapo::v1::LAYER_KIND_LAYER_NORM));
  EXPECT_FALSE(WeightGradientsAfterSend(apapo::v1::LAYER_KIND_TRANSFORMER_BLOCK));
  EXPECT_FALSE(WeightGradientsAfterSend(apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD));
  EXPECT_FALSE(WeightGradientsAfterSend(apapo::v1::LAYER_KIND_RELU));
}

}  // namespace
}  // namespace worker
}  // namespace apapo
