#include "coordinator/spec_validator.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

using apapo::v1::JobSpec;
using ::testing::HasSubstr;

constexpr char kValidSpec[] = R"pb(
  name: "mlp-fashion"
  model { builtin { name: "mlp" hyper_parameters { key: "hidden" value { i: 2048 } } } }
  data { fashion_mnist {} batch_size: 128 shuffle: true }
  optimizer { sgd { momentum: 0.9 } learning_rate: 0.05 }
  schedule { kind: SCHEDULE_KIND_ASYNC micro_batches: 4 }
  resources { workers: 2 }
  limits { epochs: 3 }
)pb";

JobSpec Parse(const std::string& text) {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec))
      << text;
  return spec;
}

JobSpec Valid() { return Parse(kValidSpec); }

TEST(SpecValidatorTest, AcceptsValidSpec) {
  EXPECT_TRUE(ValidateJobSpec(Valid()).ok()) << ValidateJobSpec(Valid());
}

// Every key a built-in model reads can be set (the table is the worker's):
// the transformer's mlp_ratio and the cnn's widths were refused before.
TEST(SpecValidatorTest, AcceptsEveryHyperParameterTheBuildersRead) {
  for (const auto& [model, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"transformer_lm", "key: 'mlp_ratio' value { i: 2 }"},
           {"cnn", "key: 'conv1' value { i: 16 }"},
           {"cnn", "key: 'fc1' value { i: 64 }"},
           {"cnn", "key: 'dropout1' value { f: 0.1 }"},
           {"resnet", "key: 'width' value { i: 8 }"},
       }) {
    JobSpec spec = Valid();
    spec.clear_model();
    ASSERT_TRUE(google::protobuf::TextFormat::MergeFromString(
        absl::StrCat("model { builtin { name: '", model,
                     "' hyper_parameters { ", value, " } } }"),
        &spec));
    if (model == "transformer_lm") {
      spec.mutable_data()->clear_fashion_mnist();
      spec.mutable_data()->mutable_text()->set_path("/data/corpus.txt");
      spec.mutable_data()->mutable_text()->set_context(64);
    }
    EXPECT_TRUE(ValidateJobSpec(spec).ok())
        << model << " " << value << ": " << ValidateJobSpec(spec);
  }
}

TEST(SpecValidatorTest, AcceptsGraphModelWithResidualEdge) {
  JobSpec spec = Valid();
  spec.clear_model();
  ASSERT_TRUE(google::protobuf::TextFormat::MergeFromString(R"pb(
    model {
      graph {
        nodes { id: "x" kind: LAYER_KIND_INPUT }
        nodes { id: "fc1" kind: LAYER_KIND_LINEAR inputs: "x" }
        nodes { id: "act" kind: LAYER_KIND_RELU inputs: "fc1" }
        nodes { id: "res" kind: LAYER_KIND_ADD inputs: "act" inputs: "fc1" }
        nodes { id: "loss" kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: "res" }
      }
    })pb", &spec));
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(SpecValidatorTest, UnsetMicroBatchesAreLeftToThePlanner) {
  JobSpec spec = Valid();
  spec.mutable_schedule()->clear_micro_batches();
  EXPECT_EQ(EffectiveMicroBatches(spec), 0);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  // Even with a batch size no fixed default would divide.
  spec.mutable_data()->set_batch_size(7);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

struct Case {
  std::string name;
  std::string mutation;  // text proto merged over the valid spec
  std::string expected;  // substring of the error message
};

class InvalidSpecTest : public ::testing::TestWithParam<Case> {};

TEST_P(InvalidSpecTest, RefusedWithFieldPathAndReason) {
  const Case& c = GetParam();
  JobSpec spec = Valid();
  ASSERT_TRUE(
      google::protobuf::TextFormat::MergeFromString(c.mutation, &spec))
      << c.mutation;
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
  EXPECT_THAT(std::string(status.message()), HasSubstr(c.expected)) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Table, InvalidSpecTest,
    ::testing::Values(
        Case{"ZeroMicroBatches", "schedule { micro_batches: 0 }",
             "spec.schedule.micro_batches: must be >= 1, got 0"},
        Case{"MicroBatchesNotDividingBatch", "schedule { micro_batches: 3 }",
             "spec.schedule.micro_batches: must divide spec.data.batch_size "
             "(128), got 3"},
        Case{"NegativeStaleness", "schedule { max_staleness: -1 }",
             "spec.schedule.max_staleness: must be >= 0, got -1"},
        Case{"TooManyStages", "schedule { stages: 3 }",
             "spec.schedule: stages x replicas = 3 exceeds "
             "spec.resources.workers (2)"},
        Case{"DataParallelWithStages",
             "schedule { kind: SCHEDULE_KIND_DATA_PARALLEL stages: 2 }",
             "spec.schedule.stages: data parallelism runs one stage"},
        Case{"AllReducePartsWithoutSplitBackward",
             "schedule { split_backward: false allreduce_in_backward: true }",
             "spec.schedule.allreduce_in_backward: true needs "
             "spec.schedule.split_backward"},
        Case{"EmptyName", "name: ''", "spec.name: must be 1..128"},
        Case{"BadName", "name: 'a b'", "spec.name: must be 1..128"},
        Case{"UnknownBuiltin", "model { builtin { name: 'vgg' } }",
             "spec.model.builtin.name: unknown built-in model \"vgg\""},
        Case{"UnknownHyperParameter",
             "model { builtin { hyper_parameters { key: 'depth' value { i: 3 } "
             "} } }",
             "spec.model.builtin.hyper_parameters[\"depth\"]: not a "
             "hyper-parameter of \"mlp\""},
        Case{"HyperParameterTheModelDoesNotRead",
             "model { builtin { name: 'transformer_lm' hyper_parameters { "
             "key: 'context' value { i: 64 } } } }",
             "spec.model.builtin.hyper_parameters[\"context\"]: not a "
             "hyper-parameter of \"transformer_lm\"; expected one of "
             "d_model, heads, layers, mlp_ratio"},
        Case{"DropoutPastOne",
             "model { builtin { name: 'cnn' hyper_parameters { key: "
             "'dropout2' value { f: 1.5 } } } }",
             "spec.model.builtin.hyper_parameters[\"dropout2\"]: must be in "
             "[0, 1)"},
        Case{"NonPositiveHyperParameter",
             "model { builtin { hyper_parameters { key: 'hidden' value { i: 0 "
             "} } } }",
             "spec.model.builtin.hyper_parameters[\"hidden\"]: must be >= 1, "
             "got 0"},
        Case{"GraphDuplicateNode",
             "model { graph { nodes { id: 'a' kind: LAYER_KIND_INPUT } nodes "
             "{ id: 'a' kind: LAYER_KIND_RELU inputs: 'a' } } }",
             "spec.model.graph.nodes[1].id: duplicate node id \"a\""},
        Case{"GraphUnknownInput",
             "model { graph { nodes { id: 'a' kind: LAYER_KIND_INPUT } nodes "
             "{ id: 'b' kind: LAYER_KIND_RELU inputs: 'zz' } } }",
             "spec.model.graph.nodes[1].inputs[0]: unknown node \"zz\""},
        Case{"GraphCycle",
             "model { graph { nodes { id: 'x' kind: LAYER_KIND_INPUT } nodes "
             "{ id: 'a' kind: LAYER_KIND_RELU inputs: 'x' inputs: 'b' } nodes "
             "{ id: 'b' kind: LAYER_KIND_RELU inputs: 'a' } nodes { id: 'l' "
             "kind: LAYER_KIND_CROSS_ENTROPY_LOSS inputs: 'b' } } }",
             "spec.model.graph.nodes: the graph has a cycle through a, b"},
        Case{"GraphUnspecifiedKind",
             "model { graph { nodes { id: 'a' } } }",
             "spec.model.graph.nodes[0].kind: must be set"},
        Case{"GraphTwoSinks",
             "model { graph { nodes { id: 'x' kind: LAYER_KIND_INPUT } nodes "
             "{ id: 'a' kind: LAYER_KIND_RELU inputs: 'x' } nodes { id: 'b' "
             "kind: LAYER_KIND_RELU inputs: 'x' } } }",
             "must have exactly one output node (the loss), found 2"},
        Case{"TorchScriptNoPath", "model { torchscript { input_shape: 4 } }",
             "spec.model.torchscript.path: must not be empty"},
        Case{"ZeroBatch", "data { batch_size: -5 }",
             "spec.data.batch_size: must be >= 1, got -5"},
        Case{"TextNoContext", "data { text { path: '/tmp/x.txt' } }",
             "spec.data.text.context: must be >= 1, got 0"},
        Case{"SyntheticOneClass",
             "data { synthetic { sample_shape: 4 num_classes: 1 "
             "samples_per_epoch: 10 } }",
             "spec.data.synthetic.num_classes: must be >= 2, got 1"},
        Case{"ZeroLearningRate", "optimizer { learning_rate: 0 }",
             "spec.optimizer.learning_rate: must be a finite number > 0, got "
             "0"},
        Case{"NaNLearningRate", "optimizer { learning_rate: nan }",
             "spec.optimizer.learning_rate: must be a finite number > 0"},
        Case{"MomentumOne", "optimizer { sgd { momentum: 1 } }",
             "spec.optimizer.sgd.momentum: must be in [0, 1), got 1"},
        Case{"AdamBadBeta", "optimizer { adam { beta2: 1.5 } }",
             "spec.optimizer.adam.beta2: must be in [0, 1), got 1.5"},
        Case{"NegativeWeightDecay", "optimizer { weight_decay: -0.1 }",
             "spec.optimizer.weight_decay: must be a finite number >= 0"},
        Case{"StepDecayNoSize",
             "optimizer { lr_schedule { decay: DECAY_STEP gamma: 0.5 } }",
             "spec.optimizer.lr_schedule.step_size: must be >= 1, got 0"},
        Case{"ZeroWorkers", "resources { workers: 0 }",
             "spec.resources.workers: must be >= 1, got 0"},
        Case{"BadDevice", "resources { device: 'tpu' }",
             "spec.resources.device: must be \"cpu\" or \"cuda\", got \"tpu\""},
        Case{"NoLimits", "limits { epochs: 0 }",
             "spec.limits: set epochs or max_steps"},
        Case{"TargetAccuracyAboveOne", "limits { target_accuracy: 1.2 }",
             "spec.limits.target_accuracy: must be in [0, 1], got 1.2"},
        Case{"ResumeWithoutDirectory", "checkpoint { resume: true }",
             "spec.checkpoint.resume: needs spec.checkpoint.directory"},
        Case{"NegativeEvalEvery", "eval_every_epochs: -1",
             "spec.eval_every_epochs: must be >= 0, got -1"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(SpecValidatorTest, NoModelNoDataNoOptimizerAllReported) {
  JobSpec spec = Valid();
  spec.clear_model();
  spec.mutable_data()->clear_fashion_mnist();
  spec.mutable_optimizer()->clear_sgd();
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("spec.model: one of builtin, graph or torchscript"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("spec.data: one of fashion_mnist, text or synthetic"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("spec.optimizer: one of sgd or adam"));
}

TEST(SpecValidatorTest, ASpecTooLargeForEveryReplyIsRefusedWithItsSize) {
  JobSpec spec = Valid();
  (*spec.mutable_labels())["blob"] = std::string(2 << 20, 'x');
  absl::Status s = ValidateJobSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("spec: 2.0 MiB serialized, at most 1 MiB"));
}

TEST(SpecValidatorTest, ABatchNoWorkerCanHoldIsRefusedWithTheSizeItNeeds) {
  JobSpec spec = Valid();
  spec.mutable_data()->set_batch_size(2000000000);
  spec.mutable_schedule()->set_micro_batches(4);
  std::string message(ValidateJobSpec(spec).message());
  EXPECT_THAT(message, HasSubstr("spec.data.batch_size: must be <= 1048576, got 2000000000"));
  EXPECT_THAT(message, HasSubstr("spec.data.batch_size: a batch of 2000000000 samples "
                                 "of 784 values is 5.7 TiB of input alone; at most "
                                 "64.0 GiB fits a worker"));
  // Within the batch bound, but too large for the memory the spec gives.
  spec = Valid();
  spec.mutable_data()->clear_fashion_mnist();
  auto* synthetic = spec.mutable_data()->mutable_synthetic();
  synthetic->add_sample_shape(1);
  synthetic->add_sample_shape(1024);
  synthetic->add_sample_shape(1024);
  synthetic->set_num_classes(10);
  synthetic->set_samples_per_epoch(1000);
  spec.mutable_data()->set_batch_size(512);
  spec.mutable_resources()->set_memory_per_worker_bytes(int64_t{1} << 30);
  message = std::string(ValidateJobSpec(spec).message());
  EXPECT_THAT(message, HasSubstr("a batch of 512 samples of 1048576 values is 2.0 GiB "
                                 "of input alone; at most 1.0 GiB fits "
                                 "spec.resources.memory_per_worker_bytes"));
  spec.mutable_data()->set_batch_size(128);  // 512 MiB: fits
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(SpecValidatorTest, AnUnknownTransferPrecisionIsRefusedNamingTheField) {
  JobSpec spec = Valid();
  spec.mutable_schedule()->set_transfer_precision(
      apapo::v1::TRANSFER_PRECISION_BFLOAT16);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_schedule()->set_transfer_precision(
      static_cast<apapo::v1::TransferPrecision>(7));
  absl::Status s = ValidateJobSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("spec.schedule.transfer_precision: unknown value 7"));
}

TEST(SpecValidatorTest, NumbersPastTheirUpperBoundsAreRefusedNamingTheField) {
  JobSpec spec = Valid();
  spec.mutable_resources()->set_workers(20000);
  spec.mutable_schedule()->set_micro_batches(8192);
  spec.mutable_limits()->set_epochs(2000000);
  (*spec.mutable_model()->mutable_builtin()->mutable_hyper_parameters())["hidden"].set_i(
      int64_t{1} << 40);
  std::string message(ValidateJobSpec(spec).message());
  EXPECT_THAT(message, HasSubstr("spec.resources.workers: must be <= 10000, got 20000"));
  EXPECT_THAT(message, HasSubstr("spec.schedule.micro_batches: must be <= 4096, got 8192"));
  EXPECT_THAT(message, HasSubstr("spec.limits.epochs: must be <= 1000000, got 2000000"));
  EXPECT_THAT(message, HasSubstr("spec.model.builtin.hyper_parameters[\"hidden\"]: "
                                 "must be <= 1048576, got 1099511627776"));
}

}  // namespace
}  // namespace apapo::coordinator
