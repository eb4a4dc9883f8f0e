// Stage executor tests: pipelines of 2-3 stages run as threads of this
// process, each stage with its own Gloo process group over a TCPStore on a
// free port (pipeline_harness.h), and are compared with plain single-process
// training.

#include "worker/stage_executor.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/synchronization/notification.h"
#include "worker/checkpoint_store.h"
#include "worker/evaluator.h"
#include "worker/model_builder.h"
#include "worker/pipeline_harness.h"
#include "worker/testing/memory_file_system.h"

namespace apapo {
namespace worker {
namespace {

using ::testing::HasSubstr;
using schedule::ScheduleKind;

using pipeline_test::Fixture;
using pipeline_test::kBatch;
using pipeline_test::PipelineResult;
using pipeline_test::RunPipeline;
using pipeline_test::TrainSingleProcess;

// The whole of `g` as one stage (expects success; `g` must outlive it).
std::unique_ptr<StageModel> OneStage(const AnalyzedGraph& g) {
  std::vector<std::string> ids;
  for (const auto& n : g.nodes()) ids.push_back(n.id());
  auto layouts = LayoutStages(g, {ids});
  EXPECT_TRUE(layouts.ok()) << layouts.status();
  auto model = StageModel::Create(g, (*layouts)[0]);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

// A plan's layer split (SplitLinearLayers) changes where stages may cut,
// not what the network computes: with the unsplit weights sliced into the
// parts, loss and gradients agree.
TEST(SplitLinearLayersTest, SplitModelComputesTheSameFunction) {
  apapo::v1::BuiltinModel mlp;
  mlp.set_name("mlp");
  (*mlp.mutable_hyper_parameters())["hidden"].set_i(96);
  (*mlp.mutable_hyper_parameters())["layers"].set_i(2);
  const DataShape data{{1, 28, 28}, DType::kFloat32, 10};
  auto proto = BuiltinGraph(mlp, data);
  ASSERT_TRUE(proto.ok()) << proto.status();
  auto split_proto = SplitLinearLayers(*proto, {{"fc2", 5}, {"fc3", 3}});
  ASSERT_TRUE(split_proto.ok()) << split_proto.status();
  auto whole = AnalyzedGraph::Create(*proto);
  auto split = AnalyzedGraph::Create(*split_proto);
  ASSERT_TRUE(whole.ok() && split.ok());
  auto a = OneStage(*whole);
  auto b = OneStage(*split);
  std::vector<at::Tensor> pa = a->InitParameters(7);
  std::map<std::string, at::Tensor> by_name;
  for (size_t i = 0; i < pa.size(); ++i) by_name[a->param_names()[i]] = pa[i];
  // "fc2/3.weight" is rows [offset, offset + rows) of "fc2.weight".
  std::map<std::string, int64_t> offset;
  std::vector<at::Tensor> pb;
  for (const std::string& name : b->param_names()) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos) {
      pb.push_back(by_name.at(name).detach().clone().requires_grad_(true));
      continue;
    }
    const std::string node = name.substr(0, slash);
    const std::string param = name.substr(name.find('.'));
    const int64_t rows = split->nodes()[split->IndexOf(name.substr(0, name.find('.')))]
                             .out_shape.back();
    int64_t& at = offset[node + param];
    pb.push_back(by_name.at(node + param)
                     .detach()
                     .narrow(0, at, rows)
                     .clone()
                     .requires_grad_(true));
    at += rows;
  }
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({6, 1, 28, 28});
  const at::Tensor y = torch::randint(0, 10, {6}, torch::kLong);
  auto fa = a->Forward({x, y}, pa, /*training=*/true);
  auto fb = b->Forward({x, y}, pb, /*training=*/true);
  ASSERT_TRUE(fa.ok() && fb.ok());
  EXPECT_NEAR(fa->loss.item<double>(), fb->loss.item<double>(), 1e-5);
  auto ga = torch::autograd::grad({fa->loss}, pa);
  auto gb = torch::autograd::grad({fb->loss}, pb);
  // fc1 is not split: its gradient flows back through every part.
  const auto index = [](const StageModel& m, const std::string& n) {
    const auto& names = m.param_names();
    return std::find(names.begin(), names.end(), n) - names.begin();
  };
  EXPECT_TRUE(torch::allclose(ga[index(*a, "fc1.weight")],
                              gb[index(*b, "fc1.weight")], 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(
      ga[index(*a, "fc2.weight")].narrow(0, 0, 20),
      gb[index(*b, "fc2/0.weight")], 1e-5, 1e-6));
}

// A split backward adds a Linear's weight gradient into the mini-batch's
// inside one product (stage_executor.cc's pass 2): Forward hands it the
// input of every Linear on rows (the cnn's fc1 and fc2, after the
// flatten) and of no convolution, and g^T x and g's column sums are
// autograd's own weight and bias gradients, bit for bit; added by addmm_
// into an earlier micro-batch's, they equal autograd's sum with add_.
TEST(ProductGradientTest, ALinearsWeightGradientIsTheProductAutogradComputes) {
  apapo::v1::BuiltinModel cnn;
  cnn.set_name("cnn");
  (*cnn.mutable_hyper_parameters())["conv1"].set_i(4);
  (*cnn.mutable_hyper_parameters())["conv2"].set_i(8);
  (*cnn.mutable_hyper_parameters())["fc1"].set_i(32);
  (*cnn.mutable_hyper_parameters())["dropout1"].set_f(0);
  (*cnn.mutable_hyper_parameters())["dropout2"].set_f(0);
  const DataShape data{{1, 28, 28}, DType::kFloat32, 10};
  auto proto = BuiltinGraph(cnn, data);
  ASSERT_TRUE(proto.ok()) << proto.status();
  auto g = AnalyzedGraph::Create(*proto);
  ASSERT_TRUE(g.ok()) << g.status();
  std::unique_ptr<StageModel> model = OneStage(*g);
  std::vector<at::Tensor> params = model->InitParameters(5);
  torch::manual_seed(9);
  std::vector<at::Tensor> sums(params.size()), one_pass(params.size());
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    const at::Tensor x = torch::randn({7, 1, 28, 28});
    const at::Tensor y = torch::randint(0, 10, {7}, torch::kLong);
    auto fwd = model->Forward({x, y}, params, /*training=*/true,
                                 /*keep_param_outputs=*/true);
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    std::vector<at::Tensor> outputs;
    int products = 0;
    for (const auto& po : fwd->param_outputs) {
      outputs.push_back(po.output);
      const std::string& name = model->param_names()[po.first_param];
      const bool linear = absl::StartsWith(name, "fc");
      EXPECT_EQ(po.product_input.defined(), linear) << name;
      products += po.product_input.defined();
    }
    EXPECT_EQ(products, 2);
    std::vector<at::Tensor> want =
        torch::autograd::grad({fwd->loss}, params, {}, /*retain_graph=*/true);
    std::vector<at::Tensor> out_grads = torch::autograd::grad({fwd->loss}, outputs);
    torch::NoGradGuard no_grad;
    for (size_t n = 0; n < outputs.size(); ++n) {
      const auto& po = fwd->param_outputs[n];
      if (!po.product_input.defined()) continue;
      const at::Tensor gt = out_grads[n].t();
      const int w = po.first_param;
      EXPECT_TRUE(torch::equal(at::mm(gt, po.product_input), want[w])) << w;
      ASSERT_EQ(po.num_params, 2);
      EXPECT_TRUE(torch::equal(out_grads[n].sum(0), want[w + 1])) << w;
      if (micro_batch == 0) {
        sums[w] = at::mm(gt, po.product_input);
        one_pass[w] = want[w].clone();
      } else {
        // The executor's accumulation against one pass's add_.
        sums[w].addmm_(gt, po.product_input);
        one_pass[w].add_(want[w]);
        EXPECT_TRUE(torch::equal(sums[w], one_pass[w])) << w;
      }
    }
  }
}

// Evaluation runs each stage's forward over a test batch a training
// micro-batch's rows at a time (Evaluator): a 2-stage cut of the cnn, on a
// batch of 23 rows in pieces of 5 (the last one 3), gives the first stage's
// outputs, labels included, and the last stage's logits of the whole batch.
TEST(ForwardInChunksTest, PiecesJoinToTheWholeBatchsForward) {
  apapo::v1::BuiltinModel cnn;
  cnn.set_name("cnn");
  const DataShape data{{1, 28, 28}, DType::kFloat32, 10};
  auto proto = BuiltinGraph(cnn, data);
  ASSERT_TRUE(proto.ok()) << proto.status();
  auto g = AnalyzedGraph::Create(*proto);
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<std::string> head, tail;
  for (const auto& n : g->nodes()) {
    (head.size() < 3 ? head : tail).push_back(n.id());
  }
  auto layouts = LayoutStages(*g, {head, tail});
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({23, 1, 28, 28});
  const at::Tensor y = torch::randint(0, 10, {23}, torch::kLong);
  std::vector<at::Tensor> inputs = {x, y};
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(absl::StrCat("stage ", s));
    auto model = StageModel::Create(*g, (*layouts)[s]);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<at::Tensor> w = (*model)->InitParameters(3);
    torch::NoGradGuard no_grad;
    auto whole = ForwardInChunks(**model, inputs, w, 0);
    auto pieces = ForwardInChunks(**model, inputs, w, 5);
    ASSERT_TRUE(whole.ok() && pieces.ok());
    ASSERT_EQ(pieces->outputs.size(), whole->outputs.size());
    for (size_t i = 0; i < whole->outputs.size(); ++i) {
      EXPECT_EQ(pieces->outputs[i].sizes(), whole->outputs[i].sizes()) << i;
      EXPECT_TRUE(torch::allclose(pieces->outputs[i], whole->outputs[i],
                                  1e-5, 1e-6)) << i;
    }
    if (s == 0) {
      EXPECT_FALSE(whole->outputs.empty());
      inputs = whole->outputs;  // the next stage's input bundle
    } else {
      ASSERT_TRUE(pieces->logits.defined());
      EXPECT_EQ(pieces->logits.size(0), 23);
      EXPECT_TRUE(torch::allclose(pieces->logits, whole->logits, 1e-5, 1e-6));
      EXPECT_TRUE(torch::equal(pieces->labels, y));
      EXPECT_EQ(CountCorrect(pieces->logits, pieces->labels, 20),
                CountCorrect(whole->logits, whole->labels, 20));
    }
  }
}

// A 3-hidden-layer mlp of `hidden` features on 12-feature synthetic
// samples of 4 classes.
Fixture MakeFixture(int hidden = 10) {
  apapo::v1::DataSpec data;
  data.mutable_synthetic()->add_sample_shape(12);
  data.mutable_synthetic()->set_num_classes(4);
  apapo::v1::BuiltinModel mlp;
  mlp.set_name("mlp");
  (*mlp.mutable_hyper_parameters())["hidden"].set_i(hidden);
  (*mlp.mutable_hyper_parameters())["layers"].set_i(3);
  auto shape = DataShapeForJob(data);
  auto g = BuiltinGraph(mlp, *shape);
  EXPECT_TRUE(g.ok()) << g.status();
  return pipeline_test::MakeFixture(*g, {12}, 4);
}

apapo::v1::OptimizerSpec Sgd() {
  apapo::v1::OptimizerSpec o;
  o.mutable_sgd()->set_momentum(0.9);
  o.set_learning_rate(0.1);
  o.set_weight_decay(1e-3);
  o.mutable_lr_schedule()->set_warmup_steps(2);
  return o;
}

// The async schedule on 2 stages with `m` micro-batches per iteration.
schedule::ScheduleOptions AsyncTwoStages(int m) {
  schedule::ScheduleOptions sched;
  sched.kind = ScheduleKind::kAsync;
  sched.num_stages = 2;
  sched.micro_batches_per_iteration = m;
  return sched;
}

// Three stages, GPipe with 4 micro-batches and async with 2.
std::vector<schedule::ScheduleOptions> ThreeStageSchedules() {
  schedule::ScheduleOptions gpipe;
  gpipe.kind = ScheduleKind::kGPipe;
  gpipe.num_stages = 3;
  gpipe.micro_batches_per_iteration = 4;
  schedule::ScheduleOptions async = AsyncTwoStages(2);
  async.num_stages = 3;
  return {gpipe, async};
}

struct EquivalenceCase {
  ScheduleKind kind;
  int stages;
  std::vector<int> replicas;
  int micro_batches;
  bool adam;
};

class EquivalenceTest : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(EquivalenceTest, KStepsEqualSingleProcessTraining) {
  const EquivalenceCase& c = GetParam();
  Fixture f = MakeFixture();
  apapo::v1::OptimizerSpec spec = Sgd();
  if (c.adam) {
    spec.mutable_adam();
    spec.set_learning_rate(0.01);
    spec.set_grad_clip_norm(0);
  }
  constexpr int64_t kSteps = 6;
  auto reference = TrainSingleProcess(f, spec, kSteps);
  schedule::ScheduleOptions sched;
  sched.kind = c.kind;
  sched.num_stages = c.stages;
  sched.replicas = c.replicas;
  sched.micro_batches_per_iteration = c.micro_batches;
  PipelineResult got = RunPipeline(f, sched, spec, kSteps);
  for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.params.size(), reference.size());
  for (const auto& [name, want] : reference) {
    ASSERT_TRUE(got.params.count(name)) << name;
    const double diff = (got.params[name] - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << name;
  }
  for (const StageReport& r : got.reports) {
    EXPECT_EQ(r.steps, kSteps);
    EXPECT_EQ(r.max_staleness, 0);  // synchronous schedules
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, EquivalenceTest,
    ::testing::Values(
        EquivalenceCase{ScheduleKind::kGPipe, 2, {}, 4, false},
        EquivalenceCase{ScheduleKind::kGPipe, 3, {}, 4, true},
        EquivalenceCase{ScheduleKind::k1F1BFlush, 2, {}, 4, true},
        EquivalenceCase{ScheduleKind::k1F1BFlush, 3, {}, 4, false},
        EquivalenceCase{ScheduleKind::k1F1BFlush, 2, {2, 1}, 4, false},
        EquivalenceCase{ScheduleKind::kDataParallel, 1, {2}, 2, false}),
    [](const ::testing::TestParamInfo<EquivalenceCase>& info) {
      std::string name(schedule::ScheduleKindName(info.param.kind));
      name += absl::StrCat("_", info.param.stages, "stages");
      if (!info.param.replicas.empty()) name += "_replicated";
      if (info.param.adam) name += "_adam";
      return name;
    });

// Activations and gradients sent in bfloat16: the same training to within
// the rounding, and half the float bytes on the wire (the labels, int64,
// travel exactly beside the activations).
TEST(TransferPrecisionTest, BFloat16SendsHalfTheFloatBytesAndTrainsAlike) {
  Fixture f = MakeFixture();
  const apapo::v1::OptimizerSpec spec = Sgd();
  constexpr int64_t kSteps = 6;
  auto reference = TrainSingleProcess(f, spec, kSteps);
  schedule::ScheduleOptions sched;
  sched.kind = ScheduleKind::kGPipe;  // synchronous: comparable step for step
  sched.num_stages = 2;
  sched.micro_batches_per_iteration = 4;
  // Whole tensors, zeros included (skip_zeros below).
  PipelineResult exact = RunPipeline(f, sched, spec, kSteps, false, {}, false, {},
                                     apapo::v1::TRANSFER_PRECISION_FLOAT32, false);
  PipelineResult half = RunPipeline(f, sched, spec, kSteps, false, {}, false, {},
                                    apapo::v1::TRANSFER_PRECISION_BFLOAT16, false);
  for (const auto& s : exact.statuses) ASSERT_TRUE(s.ok()) << s;
  for (const auto& s : half.statuses) ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(half.reports.size(), 2u);
  // Stage 0 sends its output's floats and each sample's int64 label (8
  // bytes); stage 1 sends back the floats' gradients.
  const int64_t labels = 8 * kSteps * pipeline_test::kBatch;
  EXPECT_EQ(exact.reports[0].bytes_sent - labels, exact.reports[1].bytes_sent);
  EXPECT_EQ(half.reports[0].bytes_sent - labels, half.reports[1].bytes_sent);
  EXPECT_EQ(half.reports[1].bytes_sent * 2, exact.reports[1].bytes_sent);
  EXPECT_GT(half.reports[1].bytes_sent, 0);
  double largest = 0;
  for (const auto& [name, want] : reference) {
    ASSERT_TRUE(half.params.count(name)) << name;
    const double diff = (half.params[name] - want).abs().max().item<double>();
    EXPECT_LE(diff, 5e-3) << name;
    largest = std::max(largest, diff);
    EXPECT_LE((exact.params[name] - want).abs().max().item<double>(), 1e-5) << name;
  }
  EXPECT_GT(largest, 1e-6) << "the rounding reached the weights";
}

// ReLU outputs crossing without their zeros: the same weights bit for bit
// as whole tensors, in float32 and in bfloat16, synchronous and async, in
// fewer bytes each way.
TEST(SkipZerosTest, SameWeightsBitForBitInFewerBytes) {
  Fixture f = MakeFixture();
  const apapo::v1::OptimizerSpec spec = Sgd();
  constexpr int64_t kSteps = 6;
  // The cuts BalancedSplit makes carry ReLU outputs (else nothing is tested).
  auto stages = BalancedSplit(*f.graph, 3);
  ASSERT_TRUE(stages.ok()) << stages.status();
  auto layouts = LayoutStages(*f.graph, *stages);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  int relu_cuts = 0;
  for (const StageLayout& l : *layouts) {
    for (const BundleEntry& e : l.outputs) relu_cuts += e.skip_zeros;
  }
  ASSERT_GT(relu_cuts, 0);
  for (auto precision : {apapo::v1::TRANSFER_PRECISION_FLOAT32,
                         apapo::v1::TRANSFER_PRECISION_BFLOAT16}) {
    for (const schedule::ScheduleOptions& sched : ThreeStageSchedules()) {
      SCOPED_TRACE(absl::StrCat(apapo::v1::TransferPrecision_Name(precision), " ",
                                schedule::ScheduleKindName(sched.kind)));
      const bool async = sched.kind == ScheduleKind::kAsync;
      PipelineResult whole = RunPipeline(f, sched, spec, kSteps, false, {}, async, {},
                                         precision, /*skip_zeros=*/false);
      PipelineResult skipped = RunPipeline(f, sched, spec, kSteps, false, {}, async, {},
                                           precision, /*skip_zeros=*/true);
      for (const auto& st : whole.statuses) ASSERT_TRUE(st.ok()) << st;
      for (const auto& st : skipped.statuses) ASSERT_TRUE(st.ok()) << st;
      for (const auto& [name, want] : whole.params) {
        ASSERT_TRUE(skipped.params.count(name)) << name;
        EXPECT_TRUE(torch::equal(skipped.params[name], want)) << name;
      }
      int64_t sent_whole = 0, sent_skipped = 0;
      for (const auto& r : whole.reports) sent_whole += r.bytes_sent;
      for (const auto& r : skipped.reports) sent_skipped += r.bytes_sent;
      EXPECT_LT(sent_skipped, sent_whole);  // exact sizes: transport_test
      EXPECT_GT(sent_skipped, 0);
    }
  }
}

// A stage after the first sends its input gradients between its two
// backward passes (ExecutorConfig::split_backward): the same gradient of
// every parameter for every micro-batch, bit for bit, as one pass, and in
// the measured timeline each such backward is two spans with the send of
// its gradients between them.
TEST(SplitBackwardTest, SameGradientsBitForBitWithTheSendBetweenThePasses) {
  Fixture f = MakeFixture();
  const apapo::v1::OptimizerSpec spec = Sgd();
  constexpr int64_t kSteps = 6;
  for (const schedule::ScheduleOptions& sched : ThreeStageSchedules()) {
    SCOPED_TRACE(schedule::ScheduleKindName(sched.kind));
    const bool async = sched.kind == ScheduleKind::kAsync;
    PipelineResult one = RunPipeline(f, sched, spec, kSteps, /*record=*/true, {}, async, {},
                                     apapo::v1::TRANSFER_PRECISION_FLOAT32,
                                     /*skip_zeros=*/true, /*split_backward=*/false);
    PipelineResult two = RunPipeline(f, sched, spec, kSteps, /*record=*/true, {}, async, {},
                                     apapo::v1::TRANSFER_PRECISION_FLOAT32,
                                     /*skip_zeros=*/true, /*split_backward=*/true);
    for (const auto& st : one.statuses) ASSERT_TRUE(st.ok()) << st;
    for (const auto& st : two.statuses) ASSERT_TRUE(st.ok()) << st;
    for (const auto& [name, want] : one.params) {
      ASSERT_TRUE(two.params.count(name)) << name;
      EXPECT_TRUE(torch::equal(two.params[name], want)) << name;
    }
    ASSERT_EQ(one.records.size(), two.records.size());
    for (size_t rank = 0; rank < one.records.size(); ++rank) {
      ASSERT_EQ(one.records[rank].size(), two.records[rank].size()) << rank;
      ASSERT_FALSE(two.records[rank].empty()) << rank;
      for (size_t b = 0; b < one.records[rank].size(); ++b) {
        const BackwardRecord& a = one.records[rank][b];
        const BackwardRecord& c = two.records[rank][b];
        ASSERT_EQ(a.micro_batch, c.micro_batch);
        ASSERT_EQ(a.param_grads.size(), c.param_grads.size());
        for (size_t i = 0; i < a.param_grads.size(); ++i) {
          EXPECT_TRUE(torch::equal(a.param_grads[i], c.param_grads[i]))
              << "rank " << rank << " micro-batch " << a.micro_batch << " param " << i;
        }
      }
    }
    // Ranks are stage-major: rank s is stage s (nothing replicated).
    for (int rank = 0; rank < 3; ++rank) {
      for (const bool split : {false, true}) {
        const PipelineResult& run = split ? two : one;
        ASSERT_FALSE(run.traces[rank].empty()) << rank;
        std::map<int64_t, std::string> pattern;  // micro-batch -> "B", "S" in order
        for (const apapo::v1::StageTrace& t : run.traces[rank]) {
          for (const apapo::v1::TraceSpan& span : t.spans()) {
            if (span.kind() == apapo::v1::SPAN_KIND_BACKWARD) pattern[span.micro_batch()] += "B";
            // A send after the micro-batch's first backward span: its gradients.
            if (span.kind() == apapo::v1::SPAN_KIND_SEND && pattern.count(span.micro_batch())) {
              pattern[span.micro_batch()] += "S";
            }
          }
        }
        ASSERT_FALSE(pattern.empty()) << rank;
        const std::string want = rank == 0 ? "B" : split ? "BSB" : "BS";
        for (const auto& [j, got] : pattern) {
          EXPECT_EQ(got, want) << "rank " << rank << " micro-batch " << j
                               << (split ? " split" : " one pass");
        }
      }
    }
  }
}

// A replicated stage with a split backward all-reduces its gradients in
// parts that start inside its iteration's last backward (pass 1's
// parameters, then each node's after its weight gradient): the same
// weights, bit for bit, as one all-reduce after the backward, on data
// parallelism, a replicated stage of a flushed pipeline, and the async
// pipeline, with m = 1 too, where each replica of stage 0 has no
// micro-batch in every other iteration and starts all its parts at the
// all-reduce itself. Layers of 300 features make parts of their own. A
// plan that runs one all-reduce after the split backward
// (Plan.allreduce_after_backward) starts no part, with the same weights.
TEST(AllReduceInPartsTest, SameWeightsBitForBitAsOneAllReduceStartedInTheBackward) {
  Fixture f = MakeFixture(/*hidden=*/300);
  const apapo::v1::OptimizerSpec spec = Sgd();
  constexpr int64_t kSteps = 4;
  schedule::ScheduleOptions dp;
  dp.kind = ScheduleKind::kDataParallel;
  dp.replicas = {2};
  dp.micro_batches_per_iteration = 2;
  schedule::ScheduleOptions flush;
  flush.kind = ScheduleKind::k1F1BFlush;
  flush.num_stages = 2;
  flush.replicas = {2, 1};
  flush.micro_batches_per_iteration = 4;
  schedule::ScheduleOptions async2 = AsyncTwoStages(2);
  async2.replicas = {2, 1};
  schedule::ScheduleOptions async1 = AsyncTwoStages(1);
  async1.replicas = {2, 1};
  // The second stage replicated: its passes are split by the send.
  schedule::ScheduleOptions async_last = AsyncTwoStages(2);
  async_last.replicas = {1, 2};
  for (const schedule::ScheduleOptions& sched : {dp, flush, async2, async1, async_last}) {
    SCOPED_TRACE(absl::StrCat(schedule::ScheduleKindName(sched.kind), " m=",
                              sched.micro_batches_per_iteration));
    PipelineResult whole = RunPipeline(f, sched, spec, kSteps, /*record=*/false, {}, false, {},
                                       apapo::v1::TRANSFER_PRECISION_FLOAT32,
                                       /*skip_zeros=*/true, /*split_backward=*/false);
    PipelineResult parts = RunPipeline(f, sched, spec, kSteps, /*record=*/false, {}, false, {},
                                       apapo::v1::TRANSFER_PRECISION_FLOAT32,
                                       /*skip_zeros=*/true, /*split_backward=*/true);
    PipelineResult after = RunPipeline(f, sched, spec, kSteps, /*record=*/false, {}, false, {},
                                       apapo::v1::TRANSFER_PRECISION_FLOAT32,
                                       /*skip_zeros=*/true, /*split_backward=*/true,
                                       /*allreduce_after_backward=*/true);
    for (const auto& st : whole.statuses) ASSERT_TRUE(st.ok()) << st;
    for (const auto& st : parts.statuses) ASSERT_TRUE(st.ok()) << st;
    for (const auto& st : after.statuses) ASSERT_TRUE(st.ok()) << st;
    ASSERT_FALSE(parts.params.empty());
    for (const auto& [name, want] : whole.params) {
      ASSERT_TRUE(parts.params.count(name)) << name;
      EXPECT_TRUE(torch::equal(parts.params[name], want)) << name;
      ASSERT_TRUE(after.params.count(name)) << name;
      EXPECT_TRUE(torch::equal(after.params[name], want)) << name;
    }
    for (const StageReport& r : after.reports) EXPECT_EQ(r.allreduce_parts, 0) << r.rank;
    if (sched.replicas[0] == 1) {
      // Ranks are stage-major: ranks 1 and 2 are stage 1's replicas. Its
      // parts start in pass 2 only: pass 1 ends with the send.
      EXPECT_EQ(parts.reports[0].allreduce_parts, 0);
      for (int rank = 1; rank < 3; ++rank) {
        const StageReport& r = parts.reports[rank];
        EXPECT_GE(r.allreduce_parts_in_backward, kSteps) << rank;
        EXPECT_EQ(r.allreduce_parts_in_pass1, 0) << rank;
      }
      continue;
    }
    // Ranks are stage-major: ranks 0 and 1 are stage 0's replicas.
    for (int rank = 0; rank < 2; ++rank) {
      const StageReport& r = parts.reports[rank];
      EXPECT_EQ(whole.reports[rank].allreduce_parts, 0) << rank;
      // Every iteration starts every part; those of an iteration with a
      // backward on this replica start inside it. The whole model is three
      // (pass 2 runs last node first: the head with fc3, after fc3's
      // weight gradient; fc2; fc1).
      const int64_t iterations_with_backward =
          sched.micro_batches_per_iteration == 1 ? kSteps / 2 : kSteps;
      const int64_t per_iteration = r.allreduce_parts / kSteps;
      EXPECT_EQ(r.allreduce_parts, per_iteration * kSteps) << rank;
      EXPECT_GE(per_iteration, 1) << rank;
      EXPECT_EQ(r.allreduce_parts_in_backward, per_iteration * iterations_with_backward)
          << rank;
      // The first stage has no send between its passes: the parts of its
      // product nodes (Linears) start in pass 1, as soon as their output's
      // gradient is in, all but fc1's (its input is the data: pass 1 does
      // not run through it).
      if (sched.num_stages == 1) {
        // Laid out head + fc3, fc2 (pass 1), fc1 (pass 2).
        EXPECT_EQ(per_iteration, 3) << rank;
        EXPECT_EQ(r.allreduce_parts_in_pass1, 2 * iterations_with_backward) << rank;
      } else {
        EXPECT_LT(r.allreduce_parts_in_pass1, r.allreduce_parts_in_backward) << rank;
      }
    }
    if (sched.num_stages > 1) {
      EXPECT_EQ(parts.reports[2].allreduce_parts, 0);
    }
  }
}

// The throughput a replica reports leaves out its run's first
// kRateWarmupSteps steps: every replica marks when they ended, inside its
// training time, and only a run that reaches them does.
TEST(ThroughputTest, EveryReplicaMarksTheEndOfItsWarmUp) {
  Fixture f = MakeFixture();
  const schedule::ScheduleOptions sched = AsyncTwoStages(1);
  PipelineResult got = RunPipeline(f, sched, Sgd(), 2 * kRateWarmupSteps + 4);
  for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.reports.size(), 2u);
  for (const StageReport& r : got.reports) {
    EXPECT_GT(r.warm_train_seconds, 0);
    EXPECT_LT(r.warm_train_seconds, r.train_seconds);
    EXPECT_GT(SteadySamplesPerSecond(r, static_cast<double>(r.samples)), 0);
  }
  PipelineResult short_run = RunPipeline(f, sched, Sgd(), kRateWarmupSteps - 1);
  for (const StageReport& r : short_run.reports) {
    EXPECT_LT(r.warm_train_seconds, 0);
    EXPECT_DOUBLE_EQ(SteadySamplesPerSecond(r, static_cast<double>(r.samples)),
                     r.samples / r.train_seconds);
  }
}

// Micro-batches keep more in flight at the same staleness: stage 0 running
// two micro-batches of each mini-batch with three in flight computes on
// weights one update old, as whole mini-batches with two in flight do; a
// fourth in flight makes it two (schedule::MaxInFlightForStaleness).
TEST(WeightStashingTest, MicroBatchesKeepMoreInFlightAtTheSameStaleness) {
  Fixture f = MakeFixture();
  for (const auto& [depth, staleness] : {std::pair{3, 1}, std::pair{4, 2}}) {
    schedule::ScheduleOptions sched = AsyncTwoStages(2);
    sched.in_flight_depth = {depth, 0};
    PipelineResult got = RunPipeline(f, sched, Sgd(), 8);
    for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(got.reports.size(), 2u);
    EXPECT_EQ(got.reports[0].max_staleness, staleness) << "depth " << depth;
    EXPECT_EQ(got.reports[1].max_staleness, 0) << "depth " << depth;
    EXPECT_EQ(got.reports[0].samples, got.reports[1].samples);
  }
  // The same bound asked as a spec asks it: max_staleness 1 with two
  // micro-batches a mini-batch lets stage 0 keep 3 in flight (the harness
  // checks the stage plan's max_in_flight), one update stale.
  schedule::ScheduleOptions sched = AsyncTwoStages(2);
  sched.in_flight_depth = {3, 0};
  sched.max_in_flight = 3;
  PipelineResult got = RunPipeline(f, sched, Sgd(), 8);
  for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.reports.size(), 2u);
  EXPECT_EQ(got.reports[0].max_staleness, 1);
}

// Weight stashing: under async, a stage-0 backward runs after newer weights
// exist; it must differentiate the version its forward used. The gradients
// it produced are recomputed here from the recorded inputs, received
// gradients and weights: they match the stashed version and not the newest.
TEST(WeightStashingTest, BackwardUsesItsForwardsWeightVersion) {
  Fixture f = MakeFixture();
  const schedule::ScheduleOptions sched = AsyncTwoStages(1);
  apapo::v1::OptimizerSpec spec = Sgd();
  spec.set_learning_rate(0.5);
  PipelineResult got = RunPipeline(f, sched, spec, 6, /*record=*/true);
  for (const auto& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got.reports[0].max_staleness, 1);  // p - s - 1 for s = 0
  EXPECT_EQ(got.reports[1].max_staleness, 0);
  EXPECT_EQ(got.reports[0].max_weight_versions, 2);

  auto split = BalancedSplit(*f.graph, 2);
  auto layouts = LayoutStages(*f.graph, *split);
  auto stage0 = StageModel::Create(*f.graph, (*layouts)[0]);
  ASSERT_TRUE(stage0.ok());
  const auto& records = got.records[0];
  ASSERT_EQ(records.size(), 6u);
  std::map<int64_t, std::vector<at::Tensor>> version_params;
  for (const auto& r : records) version_params[r.forward_version] = r.params;
  auto grads_at = [&](const BackwardRecord& r,
                      const std::vector<at::Tensor>& weights) {
    std::vector<at::Tensor> w;
    for (const auto& p : weights) w.push_back(p.detach().requires_grad_(true));
    auto fwd = (*stage0)->Forward(r.inputs, w, true);
    EXPECT_TRUE(fwd.ok());
    std::vector<at::Tensor> outs, gouts;
    size_t g = 0;
    for (size_t i = 0; i < fwd->outputs.size(); ++i) {
      if (fwd->outputs[i].scalar_type() != torch::kFloat) continue;
      outs.push_back(fwd->outputs[i]);
      gouts.push_back(r.grad_outputs[g++]);
    }
    return torch::autograd::grad(outs, w, gouts);
  };
  int stale = 0;
  for (const auto& r : records) {
    EXPECT_EQ(r.forward_version, r.backward_version);
    auto with_stash = grads_at(r, r.params);
    for (size_t i = 0; i < with_stash.size(); ++i) {
      EXPECT_TRUE(torch::allclose(with_stash[i], r.param_grads[i], 1e-5, 1e-6));
    }
    if (r.newest_version == r.forward_version) continue;
    // The newest version's weights are known if a later forward used them.
    if (!version_params.count(r.newest_version)) continue;
    ++stale;
    auto with_newest = grads_at(r, version_params[r.newest_version]);
    bool differs = false;
    for (size_t i = 0; i < with_newest.size(); ++i) {
      differs |= !torch::allclose(with_newest[i], r.param_grads[i], 1e-5, 1e-6);
    }
    EXPECT_TRUE(differs) << "micro-batch " << r.micro_batch;
  }
  EXPECT_GE(stale, 3);  // backwards after the first update are stale
}

// Weight prediction: under async, stage 0's gradients land one update late,
// so it runs forward and backward on W - lr x momentum, one update ahead;
// the last stage (no delay) runs on W itself. The first update is the same
// with and without prediction (no direction before it), so with plain SGD
// momentum (buffer = first gradient) stage 0's version 1 must run on
// W1 - lr x g0 = 2 W1 - W0, where W0 and W1 are what the run without
// prediction recorded.
TEST(WeightPredictionTest, StaleStageRunsOneUpdateAheadLastStageDoesNot) {
  Fixture f = MakeFixture();
  const schedule::ScheduleOptions sched = AsyncTwoStages(1);
  apapo::v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_momentum(0.9);
  spec.set_learning_rate(0.1);
  PipelineResult plain = RunPipeline(f, sched, spec, 4, /*record=*/true);
  PipelineResult predicted =
      RunPipeline(f, sched, spec, 4, /*record=*/true, {}, /*weight_prediction=*/true);
  for (const auto& s : plain.statuses) ASSERT_TRUE(s.ok()) << s;
  for (const auto& s : predicted.statuses) ASSERT_TRUE(s.ok()) << s;
  auto by_version = [](const std::vector<BackwardRecord>& records) {
    std::map<int64_t, std::vector<at::Tensor>> out;
    for (const auto& r : records) out.emplace(r.forward_version, r.params);
    return out;
  };
  auto plain0 = by_version(plain.records[0]);
  auto pred0 = by_version(predicted.records[0]);
  auto plain1 = by_version(plain.records[1]);
  auto pred1 = by_version(predicted.records[1]);
  ASSERT_TRUE(plain0.count(0) && plain0.count(1) && pred0.count(0) && pred0.count(1));
  ASSERT_TRUE(plain1.count(0) && plain1.count(1) && pred1.count(0) && pred1.count(1));
  for (size_t i = 0; i < plain0[0].size(); ++i) {
    const at::Tensor w0 = plain0[0][i], w1 = plain0[1][i];
    EXPECT_TRUE(torch::equal(pred0[0][i], w0)) << "stage 0, version 0, param " << i;
    EXPECT_FALSE(torch::allclose(w1, w0)) << "the first update moved nothing";
    EXPECT_TRUE(torch::allclose(pred0[1][i], 2 * w1 - w0, 1e-5, 1e-6))
        << "stage 0, version 1, param " << i;
  }
  for (size_t i = 0; i < plain1[1].size(); ++i) {
    EXPECT_TRUE(torch::equal(pred1[0][i], plain1[0][i])) << "stage 1, param " << i;
    EXPECT_TRUE(torch::allclose(pred1[1][i], plain1[1][i], 1e-6, 1e-7))
        << "stage 1, version 1, param " << i;
  }
}

// A stage the plan keeps deeper than the default (a slow link's depth,
// Stage.in_flight_depth) is that many updates stale, and its prediction
// reaches as far: at depth 3 (two updates of delay), version 1 runs on
// W1 - 2 lr x g0 = 3 W1 - 2 W0. (Until this test the executor read the
// depth from a moved-from schedule and predicted the default's one update.)
TEST(WeightPredictionTest, ADeeperStagePredictsAsManyUpdatesAheadAsItsDepth) {
  Fixture f = MakeFixture();
  schedule::ScheduleOptions sched = AsyncTwoStages(1);
  sched.in_flight_depth = {3, 0};
  apapo::v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_momentum(0.9);
  spec.set_learning_rate(0.1);
  PipelineResult plain = RunPipeline(f, sched, spec, 5, /*record=*/true);
  PipelineResult predicted =
      RunPipeline(f, sched, spec, 5, /*record=*/true, {}, /*weight_prediction=*/true);
  for (const auto& s : plain.statuses) ASSERT_TRUE(s.ok()) << s;
  for (const auto& s : predicted.statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(predicted.reports[0].max_staleness, 2);
  auto by_version = [](const std::vector<BackwardRecord>& records) {
    std::map<int64_t, std::vector<at::Tensor>> out;
    for (const auto& r : records) out.emplace(r.forward_version, r.params);
    return out;
  };
  auto plain0 = by_version(plain.records[0]);
  auto pred0 = by_version(predicted.records[0]);
  ASSERT_TRUE(plain0.count(0) && plain0.count(1) && pred0.count(1));
  for (size_t i = 0; i < plain0[0].size(); ++i) {
    const at::Tensor w0 = plain0[0][i], w1 = plain0[1][i];
    EXPECT_TRUE(torch::allclose(pred0[1][i], 3 * w1 - 2 * w0, 1e-5, 1e-6))
        << "stage 0, version 1, param " << i;
  }
}

// A run stopped after a checkpoint and resumed under the same plan ends
// bit-for-bit where an uninterrupted run with the same checkpoints ends: it
// reads the same next micro-batches, with the same learning rates, from the
// same weights and optimizer state; with weight prediction (async), from
// the same predicted weights too, though the resumed run computes its
// first prediction from the loaded state where the other took it from the
// fused update.
class ResumeTest : public ::testing::TestWithParam<ScheduleKind> {};

TEST_P(ResumeTest, ResumedRunMatchesUninterruptedRun) {
  Fixture f = MakeFixture();
  schedule::ScheduleOptions sched;
  sched.kind = GetParam();
  sched.num_stages = 2;
  sched.micro_batches_per_iteration = 4;
  for (const bool predict : {false, true}) {
    if (predict && GetParam() != ScheduleKind::kAsync) continue;  // async only
    for (const bool adam : {false, true}) {
      SCOPED_TRACE(absl::StrCat(adam ? "adam" : "sgd momentum",
                                predict ? ", weight prediction" : ""));
      apapo::v1::OptimizerSpec spec = Sgd();
      // The learning rate halves every 2 steps: the resumed run must continue
      // the schedule at step 3, not restart it.
      spec.mutable_lr_schedule()->set_decay(
          apapo::v1::LearningRateSchedule::DECAY_STEP);
      spec.mutable_lr_schedule()->set_step_size(2);
      spec.mutable_lr_schedule()->set_gamma(0.5);
      if (adam) {
        spec.mutable_adam();  // optimizer state must survive the restart
        spec.set_learning_rate(0.01);
      }
      apapo::v1::CheckpointSpec ck;
      ck.set_every_steps(3);
      ck.set_resume(true);
      const std::string dir =
          absl::StrCat(::testing::TempDir(), "/resume_", static_cast<int>(GetParam()),
                       adam ? "_adam" : "_sgd", predict ? "_predict" : "");
      ck.set_directory(dir + "_full");
      PipelineResult full = RunPipeline(f, sched, spec, 7, false, ck, predict);
      ck.set_directory(dir + "_split");
      PipelineResult first = RunPipeline(f, sched, spec, 4, false, ck, predict);
      for (const auto& s : first.statuses) ASSERT_TRUE(s.ok()) << s;
      // The run stopped at 4 wrote a final checkpoint of step 4; the resumed
      // run takes the interval's (3), as a crash at step 4 would have left.
      std::filesystem::remove_all(dir + "_split/step-4");
      PipelineResult resumed = RunPipeline(f, sched, spec, 7, false, ck, predict);
      for (const auto& s : full.statuses) ASSERT_TRUE(s.ok()) << s;
      for (const auto& s : resumed.statuses) ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(resumed.reports[0].steps, 4);  // only the remaining steps ran
      ASSERT_EQ(full.params.size(), resumed.params.size());
      for (const auto& [name, p] : full.params) {
        EXPECT_TRUE(torch::equal(p, resumed.params[name])) << name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, ResumeTest,
                         ::testing::Values(ScheduleKind::kAsync,
                                           ScheduleKind::k1F1BFlush),
                         [](const auto& info) {
                           return std::string(
                               schedule::ScheduleKindName(info.param));
                         });

// The parameters of a run under any plan by the unsplit graph's names.
std::map<std::string, at::Tensor> ByLayer(const Fixture& f,
                                          const PipelineResult& r,
                                          const std::vector<std::pair<std::string, int>>& splits) {
  auto proto = SplitLinearLayers(f.graph->graph(), splits);
  auto g = AnalyzedGraph::Create(*proto);
  std::map<std::string, std::vector<std::pair<int64_t, at::Tensor>>> parts;
  for (const auto& [name, p] : r.params) {
    const size_t dot = name.find('.');
    const NodeOrigin o = OriginOf(*g, g->IndexOf(name.substr(0, dot)));
    parts[o.id + name.substr(dot)].emplace_back(o.rows.begin, p);
  }
  std::map<std::string, at::Tensor> out;
  for (auto& [name, pieces] : parts) {
    std::sort(pieces.begin(), pieces.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<at::Tensor> ts;
    for (auto& [row, t] : pieces) ts.push_back(t);
    out[name] = torch::cat(ts, 0);
  }
  return out;
}

// A synchronous run under 2 stages checkpoints step 3 and stops; the job
// resumes under another plan: it starts at step 3 from those weights and
// ends where the uninterrupted run ends (within float tolerance: a split
// or a replica sums in another order).
TEST(ResumeTest, AnotherPlanResumesAtTheStepWithTheLoadedWeights) {
  Fixture f = MakeFixture();
  apapo::v1::OptimizerSpec spec = Sgd();
  spec.mutable_adam();
  spec.set_learning_rate(0.01);
  schedule::ScheduleOptions two;
  two.kind = ScheduleKind::k1F1BFlush;
  two.num_stages = 2;
  two.micro_batches_per_iteration = 4;
  PipelineResult full = RunPipeline(f, two, spec, 6);
  for (const auto& s : full.statuses) ASSERT_TRUE(s.ok()) << s;
  const auto want = ByLayer(f, full, {});
  struct Other {
    std::string name;
    schedule::ScheduleOptions sched;
    std::vector<std::pair<std::string, int>> splits;
  };
  schedule::ScheduleOptions three = two;
  three.num_stages = 3;
  schedule::ScheduleOptions dp;
  dp.kind = ScheduleKind::kDataParallel;
  dp.num_stages = 1;
  dp.replicas = {2};
  dp.micro_batches_per_iteration = 2;
  for (const Other& b : {Other{"3 stages", three, {}},
                         Other{"2 stages, fc2 in 8", two, {{"fc2", 8}}},
                         Other{"1 stage x 2 replicas", dp, {}}}) {
    SCOPED_TRACE(b.name);
    apapo::v1::CheckpointSpec ck;
    ck.set_every_steps(3);
    ck.set_resume(true);
    ck.set_directory(absl::StrCat(::testing::TempDir(), "/replan_",
                                  b.sched.num_stages, "_", b.splits.size(),
                                  "_", b.sched.Replicas(0)));
    PipelineResult first = RunPipeline(f, two, spec, 3, false, ck);
    for (const auto& s : first.statuses) ASSERT_TRUE(s.ok()) << s;
    PipelineResult resumed =
        RunPipeline(f, b.sched, spec, 6, false, ck, false, b.splits);
    for (const auto& s : resumed.statuses) ASSERT_TRUE(s.ok()) << s;
    for (const StageReport& r : resumed.reports) EXPECT_EQ(r.steps, 3);
    const auto got = ByLayer(f, resumed, b.splits);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, w] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_LE((got.at(name) - w).abs().max().item<double>(), 1e-5) << name;
    }
  }
}

// A file system whose writes of step-2 files wait for the test.
class GatedFileSystem : public testing::MemoryFileSystem {
 public:
  absl::Status WriteAtomically(const std::string& path,
                               absl::string_view bytes) override {
    if (absl::StrContains(path, "/step-2/")) {
      if (!entered.HasBeenNotified()) entered.Notify();
      open.WaitForNotification();
    }
    return MemoryFileSystem::WriteAtomically(path, bytes);
  }
  absl::Notification entered, open;
};

// Step 3 is taken while the file system holds step 2's write; then lets it
// through. Records what it saw.
class TrainsWhileWriting : public StageObserver {
 public:
  explicit TrainsWhileWriting(GatedFileSystem* fs) : fs_(fs) {}
  void OnCounters(const StageReport& r) override {
    if (r.steps != 3) return;
    write_pending_at_step_3 =
        fs_->entered.WaitForNotificationWithTimeout(absl::Seconds(60)) &&
        !fs_->open.HasBeenNotified();
    fs_->open.Notify();
  }
  bool write_pending_at_step_3 = false;

 private:
  GatedFileSystem* fs_;
};

// One unreplicated stage, created directly (no transport): checkpoints
// every 2 steps into `store`, 5 steps.
absl::StatusOr<std::unique_ptr<StageExecutor>> SingleStage(
    const Fixture& f, CheckpointStore* store, StageObserver* observer) {
  std::vector<std::string> all;
  for (const NodeInfo& n : f.graph->nodes()) all.push_back(n.id());
  auto layouts = LayoutStages(*f.graph, {all});
  if (!layouts.ok()) return layouts.status();
  ExecutorConfig c;
  c.graph = f.graph.get();
  c.layouts = *layouts;
  c.schedule.kind = ScheduleKind::k1F1BFlush;
  c.schedule.num_stages = 1;
  c.schedule.micro_batches_per_iteration = 2;
  c.seed = pipeline_test::kSeed;
  c.data.batch_size = kBatch;
  c.optimizer = Sgd();
  c.limits.max_steps = 5;
  c.evaluation.every_epochs = 0;
  c.checkpoint.store = store;
  c.checkpoint.every_steps = 2;
  c.observer = observer;
  c.progress_every = 1;
  return StageExecutor::Create(c, nullptr, f.split.train.get(),
                               f.split.test.get());
}

TEST(CheckpointWriterTest, TrainingGoesOnWhileACheckpointIsWritten) {
  Fixture f = MakeFixture();
  GatedFileSystem fs;
  FileCheckpointStore store("/ckpt", 2, f.graph.get(), &fs);
  TrainsWhileWriting observer(&fs);
  auto exec = SingleStage(f, &store, &observer);
  ASSERT_TRUE(exec.ok()) << exec.status();
  absl::Status st = (*exec)->Run();
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(observer.write_pending_at_step_3);
  // Steps 2, 4 and the final 5; pruning kept the newest two.
  EXPECT_THAT(*fs.List("/ckpt"), ::testing::UnorderedElementsAre("step-4", "step-5"));
  auto newest = store.NewestCompleteStep();
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(*newest, std::optional<int64_t>(5));
}

TEST(CheckpointWriterTest, AWriteErrorFailsTheRunNamingTheFile) {
  Fixture f = MakeFixture();
  testing::MemoryFileSystem fs;
  fs.Fail("/ckpt/step-4/stage-0.manifest");
  FileCheckpointStore store("/ckpt", 2, f.graph.get(), &fs);
  auto exec = SingleStage(f, &store, nullptr);
  ASSERT_TRUE(exec.ok()) << exec.status();
  absl::Status st = (*exec)->Run();
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("/ckpt/step-4/stage-0.manifest"));
  EXPECT_THAT(st.message(), HasSubstr("stage 0 replica 0"));
}

TEST(FailureTest, DeadPeerStopsStageWithNamedError) {
  Fixture f = MakeFixture();
  auto split = BalancedSplit(*f.graph, 2);
  auto layouts = LayoutStages(*f.graph, *split);
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok());
  const schedule::ScheduleOptions sched = AsyncTwoStages(2);
  // Stage 1 connects and then dies (its transport closes its sockets).
  std::thread peer([&] {
    GlooTransportOptions t;
    t.store_port = (*server)->port();
    t.rank = 1;
    t.world_size = 2;
    t.groups = {{0}, {1}};
    auto transport = CreateGlooTransport(t);
    EXPECT_TRUE(transport.ok());
  });
  GlooTransportOptions t;
  t.store_port = (*server)->port();
  t.rank = 0;
  t.world_size = 2;
  t.groups = {{0}, {1}};
  t.timeout = absl::Seconds(60);
  t.label = "stage 0";
  auto transport = CreateGlooTransport(t);
  ASSERT_TRUE(transport.ok());
  peer.join();
  ExecutorConfig c;
  c.graph = f.graph.get();
  c.layouts = *layouts;
  c.schedule = sched;
  c.data.batch_size = kBatch;
  c.optimizer = Sgd();
  c.limits.max_steps = 4;
  c.evaluation.every_epochs = 0;
  auto exec = StageExecutor::Create(c, transport->get(), f.split.train.get(),
                                    f.split.test.get());
  ASSERT_TRUE(exec.ok());
  absl::Status st = (*exec)->Run();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("stage 0"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("rank 1"));
}

TEST(ExecutorConfigTest, BatchNotDivisibleByMicroBatchesIsRefused) {
  Fixture f = MakeFixture();
  auto layouts = LayoutStages(*f.graph, *BalancedSplit(*f.graph, 1));
  ExecutorConfig c;
  c.graph = f.graph.get();
  c.layouts = *layouts;
  c.schedule.micro_batches_per_iteration = 3;
  c.data.batch_size = 16;
  c.optimizer = Sgd();
  auto exec = StageExecutor::Create(c, nullptr, f.split.train.get(),
                                    f.split.test.get());
  ASSERT_FALSE(exec.ok());
  EXPECT_THAT(std::string(exec.status().message()), HasSubstr("batch_size"));
}

}  // namespace
}  // namespace worker
}  // namespace apapo
