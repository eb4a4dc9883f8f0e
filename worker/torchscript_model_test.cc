// TorchScript models: scripted modules are written at test time by
// /usr/bin/python3 (Debian's python3-torch, the same LibTorch version), their
// graphs are checked, and a scripted Sequential is trained as a pipeline and
// compared with single-process training.

#include "worker/torchscript_model.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model_builder.h"
#include "worker/pipeline_harness.h"

namespace apapo {
namespace worker {
namespace {

using ::testing::HasSubstr;
using schedule::ScheduleKind;

constexpr char kPython[] = "/usr/bin/python3";

// Writes the test modules into `dir`:
//   seq.pt:     Sequential(Linear(784, 32), ReLU(), Linear(32, 10))
//   custom.pt:  a plain nn.Module with a child (not sequential)
//   notchain.pt: a Sequential subclass whose forward is not its chain
//   empty.pt:   Sequential()
constexpr char kMakeModules[] = R"py(
import sys, torch
from torch import nn
d = sys.argv[1]
torch.manual_seed(0)
torch.jit.script(nn.Sequential(nn.Linear(784, 32), nn.ReLU(),
                               nn.Linear(32, 10))).save(d + "/seq.pt")
class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
    def forward(self, x):
        return self.fc(x) + x
torch.jit.script(Custom()).save(d + "/custom.pt")
class DoubledSequential(nn.Sequential):
    def forward(self, x):
        for m in self:
            x = m(x)
        return x * 2.0
torch.jit.script(DoubledSequential(nn.Linear(4, 4), nn.ReLU())).save(
    d + "/notchain.pt")
torch.jit.script(nn.Sequential()).save(d + "/empty.pt")
)py";

class TorchScriptModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/torchscript");
    const std::string script = *dir_ + ".py";
    std::ofstream(script) << kMakeModules;
    const std::string cmd = absl::StrCat("mkdir -p '", *dir_, "' && ", kPython,
                                         " '", script, "' '", *dir_, "'");
    python_ok_ = std::system(cmd.c_str()) == 0;
  }
  void SetUp() override {
    ASSERT_TRUE(python_ok_)
        << "could not write the test modules with " << kPython
        << ": these tests need Debian's python3-torch (import torch) there";
  }
  static std::string Path(const std::string& name) {
    return *dir_ + "/" + name;
  }
  // A job on 784-feature synthetic samples of 10 classes.
  static apapo::v1::JobSpec Job(const std::string& file,
                                int64_t features = 784) {
    apapo::v1::JobSpec spec;
    spec.mutable_model()->mutable_torchscript()->set_path(Path(file));
    spec.mutable_model()->mutable_torchscript()->add_input_shape(features);
    auto* synthetic = spec.mutable_data()->mutable_synthetic();
    synthetic->add_sample_shape(features);
    synthetic->set_num_classes(10);
    return spec;
  }

  static std::string* dir_;
  static bool python_ok_;
};

std::string* TorchScriptModelTest::dir_ = nullptr;
bool TorchScriptModelTest::python_ok_ = false;

TEST_F(TorchScriptModelTest, SequentialBecomesOneNodePerChild) {
  auto proto = GraphForJob(Job("seq.pt"), TorchScriptGraph);
  ASSERT_TRUE(proto.ok()) << proto.status();
  auto g = AnalyzedGraph::Create(*proto);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->nodes().size(), 5u);
  EXPECT_EQ(g->nodes()[0].kind(), apapo::v1::LAYER_KIND_INPUT);
  EXPECT_EQ(g->nodes()[0].out_shape, Shape({784}));
  const std::vector<std::string> types = {"Linear", "ReLU", "Linear"};
  const std::vector<Shape> shapes = {{32}, {32}, {10}};
  for (int i = 0; i < 3; ++i) {
    const NodeInfo& n = g->nodes()[i + 1];
    EXPECT_EQ(n.id(), absl::StrCat("child", i));
    EXPECT_EQ(n.kind(), apapo::v1::LAYER_KIND_TORCHSCRIPT_CHILD);
    EXPECT_EQ(n.node->attrs().at("index").i(), i);
    EXPECT_EQ(n.node->description(), types[i]);
    EXPECT_EQ(n.out_shape, shapes[i]) << n.id();
  }
  ASSERT_EQ(g->nodes()[1].params.size(), 2u);
  EXPECT_EQ(g->nodes()[1].params[0].name, "weight");
  EXPECT_EQ(g->nodes()[1].params[0].shape, Shape({32, 784}));
  EXPECT_EQ(g->nodes()[1].params[1].shape, Shape({32}));
  EXPECT_TRUE(g->nodes()[2].params.empty());
  EXPECT_EQ(g->num_params(), 784 * 32 + 32 + 32 * 10 + 10);
  EXPECT_EQ(g->nodes()[4].kind(), apapo::v1::LAYER_KIND_CROSS_ENTROPY_LOSS);
  EXPECT_EQ(g->label_shape(), Shape({}));
}

// The stage model runs the file's module: same initial weights, same output.
TEST_F(TorchScriptModelTest, StageModelComputesWhatTheModuleComputes) {
  auto g = AnalyzedGraph::Create(*GraphForJob(Job("seq.pt"), TorchScriptGraph));
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<std::string> all;
  for (const NodeInfo& n : g->nodes()) all.push_back(n.id());
  auto layouts = LayoutStages(*g, {all});
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  auto model = StageModel::Create(*g, (*layouts)[0]);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->param_names()[0], "child0.weight");
  const std::vector<at::Tensor> params = (*model)->InitParameters(/*seed=*/3);
  torch::jit::Module module = torch::jit::load(Path("seq.pt"));
  module.eval();
  torch::manual_seed(1);
  at::Tensor x = torch::randn({5, 784});
  at::Tensor y = torch::randint(0, 10, {5}, torch::kLong);
  auto fwd = (*model)->Forward({x, y}, params, /*training=*/false);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  at::Tensor want = module.forward({x}).toTensor();
  EXPECT_TRUE(torch::allclose(fwd->logits, want, 1e-6, 1e-6));
  // Its gradients reach the version's tensors.
  auto grads = torch::autograd::grad({fwd->loss}, params);
  ASSERT_EQ(grads.size(), 4u);
  for (const auto& gr : grads) EXPECT_GT(gr.abs().sum().item<double>(), 0);
}

TEST_F(TorchScriptModelTest, GpipeOnTwoStagesEqualsSingleProcessTraining) {
  auto proto = GraphForJob(Job("seq.pt"), TorchScriptGraph);
  ASSERT_TRUE(proto.ok()) << proto.status();
  pipeline_test::Fixture f = pipeline_test::MakeFixture(*proto, {784}, 10);
  apapo::v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_momentum(0.9);
  spec.set_learning_rate(0.1);
  spec.set_weight_decay(1e-3);
  constexpr int64_t kSteps = 4;
  auto reference = pipeline_test::TrainSingleProcess(f, spec, kSteps);
  schedule::ScheduleOptions sched;
  sched.kind = ScheduleKind::kGPipe;
  sched.num_stages = 2;
  sched.micro_batches_per_iteration = 4;
  auto got = pipeline_test::RunPipeline(f, sched, spec, kSteps);
  for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  // Both stages hold children (the split is by cost).
  EXPECT_GT(got.reports[0].forward_micro_batches, 0);
  ASSERT_EQ(got.params.size(), 4u);
  ASSERT_EQ(reference.size(), 4u);
  torch::jit::Module module = torch::jit::load(Path("seq.pt"));
  at::Tensor initial = module.attr("0").toModule().attr("weight").toTensor();
  EXPECT_FALSE(torch::allclose(reference["child0.weight"], initial));
  for (const auto& [name, want] : reference) {
    ASSERT_TRUE(got.params.count(name)) << name;
    const double diff = (got.params[name] - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << name;
  }
}

// Under async, stage 0's backwards use the weight version their forward used
// (recomputed here from the recorded inputs, gradients and weights).
TEST_F(TorchScriptModelTest, AsyncBackwardUsesStashedVersion) {
  auto proto = GraphForJob(Job("seq.pt"), TorchScriptGraph);
  ASSERT_TRUE(proto.ok()) << proto.status();
  pipeline_test::Fixture f = pipeline_test::MakeFixture(*proto, {784}, 10);
  apapo::v1::OptimizerSpec spec;
  spec.mutable_sgd();
  spec.set_learning_rate(0.5);
  schedule::ScheduleOptions sched;
  sched.kind = ScheduleKind::kAsync;
  sched.num_stages = 2;
  sched.micro_batches_per_iteration = 1;
  auto got = pipeline_test::RunPipeline(f, sched, spec, 4, /*record=*/true);
  for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got.reports[0].max_staleness, 1);
  auto layouts = LayoutStages(*f.graph, *BalancedSplit(*f.graph, 2));
  auto stage0 = StageModel::Create(*f.graph, (*layouts)[0]);
  ASSERT_TRUE(stage0.ok()) << stage0.status();
  ASSERT_EQ(got.records[0].size(), 4u);
  for (const auto& r : got.records[0]) {
    EXPECT_EQ(r.forward_version, r.backward_version);
    std::vector<at::Tensor> w;
    for (const auto& p : r.params) w.push_back(p.detach().requires_grad_(true));
    auto fwd = (*stage0)->Forward(r.inputs, w, true);
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    std::vector<at::Tensor> outs, gouts;
    size_t k = 0;
    for (const auto& o : fwd->outputs) {
      if (o.scalar_type() != torch::kFloat) continue;
      outs.push_back(o);
      gouts.push_back(r.grad_outputs[k++]);
    }
    auto grads = torch::autograd::grad(outs, w, gouts);
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(torch::allclose(grads[i], r.param_grads[i], 1e-5, 1e-6))
          << "micro-batch " << r.micro_batch << " param " << i;
    }
  }
}

TEST_F(TorchScriptModelTest, WithoutAnImporterTorchScriptIsUnimplemented) {
  auto proto = GraphForJob(Job("seq.pt"));
  EXPECT_EQ(proto.status().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(TorchScriptModelTest, MissingFileIsNotFoundNamingThePath) {
  auto proto = GraphForJob(Job("nope.pt"), TorchScriptGraph);
  EXPECT_EQ(proto.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(proto.status().message()),
              HasSubstr(Path("nope.pt")));
}

TEST_F(TorchScriptModelTest, NonSequentialModulesAreRefused) {
  struct Case {
    std::string file;
    std::string why;
  };
  for (const Case& c : {Case{"custom.pt", "not a torch.nn.Sequential"},
                        Case{"notchain.pt", "not the chain of its children"},
                        Case{"empty.pt", "no children"}}) {
    auto proto = GraphForJob(Job(c.file, 4), TorchScriptGraph);
    EXPECT_EQ(proto.status().code(), absl::StatusCode::kInvalidArgument)
        << c.file << ": " << proto.status();
    EXPECT_THAT(std::string(proto.status().message()), HasSubstr(Path(c.file)));
    EXPECT_THAT(std::string(proto.status().message()), HasSubstr(c.why));
  }
}

TEST_F(TorchScriptModelTest, InputThatChildrenRejectIsNamed) {
  auto proto = GraphForJob(Job("seq.pt", 20), TorchScriptGraph);
  EXPECT_EQ(proto.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(proto.status().message()),
              HasSubstr("child 0 ('0', Linear) fails on a [2, 20] batch"));
  apapo::v1::JobSpec spec = Job("seq.pt");
  spec.mutable_model()->mutable_torchscript()->set_input_shape(0, 783);
  auto mismatch = GraphForJob(spec, TorchScriptGraph);
  EXPECT_THAT(std::string(mismatch.status().message()),
              HasSubstr("does not match the data's sample shape [784]"));
}

}  // namespace
}  // namespace worker
}  // namespace apapo
