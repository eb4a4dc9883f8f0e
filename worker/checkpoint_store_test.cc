// FileCheckpointStore over an in-memory file system: checkpoints written
// under one plan load under any other (stage cuts, layer splits, replicas)
// bit-identically per layer; incomplete steps are skipped; pruning; bad files
// are errors naming the file and the key; the background writer.
#include "worker/checkpoint_store.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model_builder.h"
#include "worker/model_graph.h"
#include "worker/optimizer.h"
#include "worker/testing/memory_file_system.h"

namespace apapo::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// A 3-hidden-layer mlp (fc1..fc3 of `hidden` features, fc4 the classifier)
// on 12 features and 4 classes.
apapo::v1::ModelGraph Mlp(int hidden = 20) {
  apapo::v1::BuiltinModel mlp;
  mlp.set_name("mlp");
  (*mlp.mutable_hyper_parameters())["hidden"].set_i(hidden);
  (*mlp.mutable_hyper_parameters())["layers"].set_i(3);
  auto g = BuiltinGraph(mlp, DataShape{{12}, DType::kFloat32, 4});
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

// A plan as far as checkpoints see it: stages, splits, replicas.
struct Plan {
  std::string name;
  int stages = 1;
  std::vector<std::pair<std::string, int>> splits;
  int replicas = 1;
};

// One plan's graph and its stages' models.
struct Planned {
  std::unique_ptr<AnalyzedGraph> graph;
  std::vector<std::unique_ptr<StageModel>> models;
};

Planned PlanFor(const apapo::v1::ModelGraph& proto, const Plan& plan) {
  Planned p;
  auto split = SplitLinearLayers(proto, plan.splits);
  EXPECT_TRUE(split.ok()) << split.status();
  auto g = AnalyzedGraph::Create(*split);
  EXPECT_TRUE(g.ok()) << g.status();
  p.graph = std::make_unique<AnalyzedGraph>(*std::move(g));
  auto cut = BalancedSplit(*p.graph, plan.stages);
  EXPECT_TRUE(cut.ok()) << cut.status();
  auto layouts = LayoutStages(*p.graph, *cut);
  EXPECT_TRUE(layouts.ok()) << layouts.status();
  for (const StageLayout& l : *layouts) {
    auto m = StageModel::Create(*p.graph, l);
    EXPECT_TRUE(m.ok()) << m.status();
    p.models.push_back(*std::move(m));
  }
  return p;
}

// The whole, unsplit model after a few real training steps: parameters and
// optimizer slots by "<node>.<param>".
struct Reference {
  std::map<std::string, at::Tensor> params;
  std::map<std::string, std::vector<at::Tensor>> slots;
  std::vector<std::string> slot_names;
  int64_t optimizer_steps = 0;
};

Reference Train(const apapo::v1::ModelGraph& proto,
                const apapo::v1::OptimizerSpec& spec, int64_t steps) {
  Planned whole = PlanFor(proto, Plan{"1 stage"});
  StageModel& model = *whole.models[0];
  auto opt = Optimizer::Create(spec, steps);
  EXPECT_TRUE(opt.ok());
  std::vector<at::Tensor> params = model.InitParameters(7);
  torch::manual_seed(3);
  for (int64_t k = 0; k < steps; ++k) {
    at::Tensor x = torch::randn({8, 12});
    at::Tensor y = torch::randint(0, 4, {8}, torch::kLong);
    auto fwd = model.Forward({x, y}, params, true);
    EXPECT_TRUE(fwd.ok()) << fwd.status();
    auto grads = torch::autograd::grad({fwd->loss}, params);
    params = (*opt)->Step(params, grads, k);
  }
  Reference r;
  const OptimizerState state = (*opt)->State();
  r.slot_names = state.slot_names;
  r.optimizer_steps = state.steps;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = model.param_names()[i];
    r.params[name] = params[i].detach().clone();
    for (const auto& t : state.per_param[i]) r.slots[name].push_back(t.clone());
  }
  return r;
}

// `whole` (a tensor of the unsplit graph) as plan graph `g`'s parameter
// `name` holds it: a split part's rows.
at::Tensor Slice(const AnalyzedGraph& g, const std::string& name,
                 const at::Tensor& whole) {
  const std::string node = name.substr(0, name.find('.'));
  const NodeOrigin o = OriginOf(g, g.IndexOf(node));
  return o.is_part ? whole.narrow(0, o.rows.begin, o.rows.size()).clone()
                   : whole.clone();
}

std::string Unsplit(const AnalyzedGraph& g, const std::string& name) {
  const size_t dot = name.find('.');
  return OriginOf(g, g.IndexOf(name.substr(0, dot))).id + name.substr(dot);
}

// What stage `s` of `p` holds when the whole model is `ref`.
StageCheckpoint Holding(const Planned& p, int s, const Reference& ref,
                        int64_t step) {
  StageCheckpoint c;
  c.step = step;
  c.version = step;
  c.parameter_names = p.models[s]->param_names();
  c.optimizer.steps = ref.optimizer_steps;
  c.optimizer.slot_names = ref.slot_names;
  for (const std::string& name : c.parameter_names) {
    const std::string whole = Unsplit(*p.graph, name);
    c.parameters.push_back(Slice(*p.graph, name, ref.params.at(whole)));
    std::vector<at::Tensor> slots;
    for (const auto& t : ref.slots.at(whole)) {
      slots.push_back(Slice(*p.graph, name, t));
    }
    c.optimizer.per_param.push_back(std::move(slots));
  }
  c.buffers = p.models[s]->Buffers();
  return c;
}

// What stage `s` of `p` asks a store to fill: names, shapes, slots.
StageCheckpoint Template(const Planned& p, int s,
                         const std::vector<std::string>& slot_names) {
  StageCheckpoint c;
  c.parameter_names = p.models[s]->param_names();
  c.parameters = p.models[s]->InitParameters(99);
  c.optimizer.slot_names = slot_names;
  c.buffers = p.models[s]->Buffers();
  return c;
}

const std::vector<Plan>& Plans() {
  static const auto* plans = new std::vector<Plan>{
      {"1 stage", 1, {}, 1},
      {"2 stages", 2, {}, 1},
      {"3 stages", 3, {}, 1},
      {"2 stages, fc2 split in 8", 2, {{"fc2", 8}}, 1},
      {"2 stages, fc2 split in 3", 2, {{"fc2", 3}}, 1},
      {"1 stage x 2 replicas", 1, {}, 2},
  };
  return *plans;
}

apapo::v1::OptimizerSpec SgdMomentum() {
  apapo::v1::OptimizerSpec o;
  o.mutable_sgd()->set_momentum(0.9);
  o.set_learning_rate(0.1);
  return o;
}

apapo::v1::OptimizerSpec Adam() {
  apapo::v1::OptimizerSpec o;
  o.mutable_adam();
  o.set_learning_rate(0.01);
  return o;
}

class ReshardTest : public ::testing::TestWithParam<bool> {};

// Every plan's stages (replica 0) write step 3; every replica of every
// other plan loads it: weights and optimizer state equal the trained
// model's, per layer and bit for bit.
TEST_P(ReshardTest, EveryPlanLoadsWhatEveryPlanWrote) {
  const bool adam = GetParam();
  const apapo::v1::ModelGraph proto = Mlp();
  const Reference ref = Train(proto, adam ? Adam() : SgdMomentum(), 3);
  ASSERT_EQ(ref.slot_names.size(), adam ? 2u : 1u);
  for (const Plan& a : Plans()) {
    testing::MemoryFileSystem fs;
    Planned pa = PlanFor(proto, a);
    FileCheckpointStore writer("/ckpt", 10, pa.graph.get(), &fs);
    for (int s = 0; s < a.stages; ++s) {
      ASSERT_TRUE(writer.Save(s, Holding(pa, s, ref, 3)).ok()) << a.name;
    }
    for (const Plan& b : Plans()) {
      SCOPED_TRACE(absl::StrCat("written by ", a.name, ", loaded by ", b.name));
      Planned pb = PlanFor(proto, b);
      FileCheckpointStore reader("/ckpt", 10, pb.graph.get(), &fs);
      auto newest = reader.NewestCompleteStep();
      ASSERT_TRUE(newest.ok()) << newest.status();
      ASSERT_EQ(*newest, std::optional<int64_t>(3));
      for (int s = 0; s < b.stages; ++s) {
        for (int r = 0; r < b.replicas; ++r) {
          StageCheckpoint c = Template(*&pb, s, ref.slot_names);
          absl::Status st = reader.Load(3, &c);
          ASSERT_TRUE(st.ok()) << st;
          EXPECT_EQ(c.step, 3);
          EXPECT_EQ(c.version, 3);
          EXPECT_EQ(c.optimizer.steps, ref.optimizer_steps);
          ASSERT_EQ(c.optimizer.per_param.size(), c.parameters.size());
          for (size_t i = 0; i < c.parameters.size(); ++i) {
            const std::string& name = c.parameter_names[i];
            const std::string whole = Unsplit(*pb.graph, name);
            EXPECT_TRUE(c.parameters[i].requires_grad()) << name;
            EXPECT_TRUE(torch::equal(c.parameters[i],
                                     Slice(*pb.graph, name, ref.params.at(whole))))
                << name;
            for (size_t k = 0; k < ref.slot_names.size(); ++k) {
              EXPECT_TRUE(torch::equal(
                  c.optimizer.per_param[i][k],
                  Slice(*pb.graph, name, ref.slots.at(whole)[k])))
                  << name << " " << ref.slot_names[k];
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SgdAndAdam, ReshardTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Adam" : "SgdMomentum";
                         });

// Loaded state continues training exactly: a stage of another plan that
// loads the checkpoint and steps computes the whole model's next step.
TEST(ReshardTest, LoadedOptimizerStateStepsLikeTheOriginal) {
  const apapo::v1::ModelGraph proto = Mlp();
  for (const auto& spec : {SgdMomentum(), Adam()}) {
    const Reference ref = Train(proto, spec, 2);
    const Reference next = Train(proto, spec, 3);
    testing::MemoryFileSystem fs;
    Planned whole = PlanFor(proto, Plan{"1 stage"});
    FileCheckpointStore store("/ckpt", 10, whole.graph.get(), &fs);
    ASSERT_TRUE(store.Save(0, Holding(whole, 0, ref, 2)).ok());
    // The third step of Train, on one stage that loaded step 2.
    StageCheckpoint c = Template(whole, 0, ref.slot_names);
    ASSERT_TRUE(store.Load(2, &c).ok());
    auto opt = Optimizer::Create(spec, 3);
    ASSERT_TRUE((*opt)->LoadState(c.optimizer, c.parameters.size()).ok());
    // Train's data of step 3: its generator after two steps' draws.
    torch::manual_seed(3);
    for (int k = 0; k < 2; ++k) {
      torch::randn({8, 12});
      torch::randint(0, 4, {8}, torch::kLong);
    }
    at::Tensor x = torch::randn({8, 12});
    at::Tensor y = torch::randint(0, 4, {8}, torch::kLong);
    auto fwd = whole.models[0]->Forward({x, y}, c.parameters, true);
    ASSERT_TRUE(fwd.ok());
    auto grads = torch::autograd::grad({fwd->loss}, c.parameters);
    auto params = (*opt)->Step(c.parameters, grads, 2);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = c.parameter_names[i];
      EXPECT_TRUE(torch::equal(params[i], next.params.at(name))) << name;
    }
  }
}

// BatchNorm running statistics travel with their node across plans.
TEST(FileCheckpointStoreTest, BuffersFollowTheirNodeAcrossPlans) {
  apapo::v1::BuiltinModel resnet;
  resnet.set_name("resnet");
  (*resnet.mutable_hyper_parameters())["width"].set_i(4);
  (*resnet.mutable_hyper_parameters())["blocks"].set_i(1);
  auto proto = BuiltinGraph(resnet, DataShape{{1, 8, 8}, DType::kFloat32, 3});
  ASSERT_TRUE(proto.ok()) << proto.status();
  Planned two = PlanFor(*proto, Plan{"2 stages", 2});
  Planned one = PlanFor(*proto, Plan{"1 stage", 1});
  testing::MemoryFileSystem fs;
  FileCheckpointStore writer("/ckpt", 10, two.graph.get(), &fs);
  std::map<std::string, at::Tensor> written;
  for (int s = 0; s < 2; ++s) {
    StageCheckpoint c;
    c.step = 5;
    c.version = 5;
    c.parameter_names = two.models[s]->param_names();
    c.parameters = two.models[s]->InitParameters(1);
    c.buffers = two.models[s]->Buffers();
    for (auto& [name, b] : c.buffers) {
      b = torch::rand_like(b);
      written[name] = b;
    }
    ASSERT_TRUE(writer.Save(s, c).ok());
  }
  ASSERT_FALSE(written.empty());
  FileCheckpointStore reader("/ckpt", 10, one.graph.get(), &fs);
  StageCheckpoint c = Template(one, 0, {});
  ASSERT_TRUE(reader.Load(5, &c).ok());
  ASSERT_EQ(c.buffers.size(), written.size());
  for (const auto& [name, b] : c.buffers) {
    EXPECT_TRUE(torch::equal(b, written.at(name))) << name;
  }
}

// Two stages of a 2-stage plan; stage 1 of step 20 never made it.
class StepsTest : public ::testing::Test {
 protected:
  StepsTest()
      : proto_(Mlp()),
        plan_(PlanFor(proto_, Plan{"2 stages", 2})),
        ref_(Train(proto_, SgdMomentum(), 1)),
        store_("/ckpt", 10, plan_.graph.get(), &fs_) {}

  absl::Status Save(int stage, int64_t step) {
    return store_.Save(stage, Holding(plan_, stage, ref_, step));
  }
  std::vector<std::string> StepDirs() {
    return *fs_.List("/ckpt");
  }

  apapo::v1::ModelGraph proto_;
  Planned plan_;
  Reference ref_;
  testing::MemoryFileSystem fs_;
  FileCheckpointStore store_;
};

TEST_F(StepsTest, AnIncompleteNewestStepIsSkipped) {
  ASSERT_TRUE(Save(0, 10).ok());
  ASSERT_TRUE(Save(1, 10).ok());
  ASSERT_TRUE(Save(0, 20).ok());  // a crash before stage 1 wrote step 20
  EXPECT_THAT(fs_.Paths(),
              UnorderedElementsAre("/ckpt/step-10/stage-0.data",
                                   "/ckpt/step-10/stage-0.manifest",
                                   "/ckpt/step-10/stage-1.data",
                                   "/ckpt/step-10/stage-1.manifest",
                                   "/ckpt/step-20/stage-0.data",
                                   "/ckpt/step-20/stage-0.manifest"));
  auto newest = store_.NewestCompleteStep();
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, std::optional<int64_t>(10));
  StageCheckpoint c = Template(plan_, 0, ref_.slot_names);
  absl::Status half = store_.Load(20, &c);
  EXPECT_EQ(half.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(half.message(), HasSubstr("not complete"));
  // The resumed run (from 10) discards step 20 before it writes its own.
  ASSERT_TRUE(store_.RemoveStepsAfter(10).ok());
  EXPECT_THAT(StepDirs(), UnorderedElementsAre("step-10"));
  // No checkpoint at all.
  testing::MemoryFileSystem empty;
  FileCheckpointStore none("/ckpt", 10, plan_.graph.get(), &empty);
  EXPECT_EQ(*none.NewestCompleteStep(), std::nullopt);
}

TEST_F(StepsTest, OlderStepsGoOnceANewerOneIsComplete) {
  for (int64_t step : {10, 20}) {
    ASSERT_TRUE(Save(0, step).ok());
    ASSERT_TRUE(Save(1, step).ok());
  }
  ASSERT_TRUE(Save(0, 30).ok());
  // Step 30 is not complete: nothing older goes.
  EXPECT_THAT(StepDirs(), UnorderedElementsAre("step-10", "step-20", "step-30"));
  ASSERT_TRUE(Save(1, 30).ok());
  // 30 complete: 20 (the one before) stays, 10 goes.
  EXPECT_THAT(StepDirs(), UnorderedElementsAre("step-20", "step-30"));
}

TEST_F(StepsTest, CorruptFilesAreDataLossNamingTheFile) {
  ASSERT_TRUE(Save(0, 10).ok());
  ASSERT_TRUE(Save(1, 10).ok());
  // A flipped byte in a data file.
  std::string data = *fs_.Read("/ckpt/step-10/stage-1.data");
  data[data.size() / 2] ^= 0x40;
  fs_.Put("/ckpt/step-10/stage-1.data", data);
  StageCheckpoint c = Template(plan_, 1, ref_.slot_names);
  absl::Status st = store_.Load(10, &c);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("/ckpt/step-10/stage-1.data"));
  // A truncated data file.
  fs_.Put("/ckpt/step-10/stage-1.data", data.substr(0, 10));
  st = store_.Load(10, &c);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("/ckpt/step-10/stage-1.data"));
  // A truncated manifest.
  const std::string manifest = *fs_.Read("/ckpt/step-10/stage-0.manifest");
  fs_.Put("/ckpt/step-10/stage-0.manifest", manifest.substr(0, manifest.size() / 2));
  auto newest = store_.NewestCompleteStep();
  EXPECT_EQ(newest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(newest.status().message(),
              HasSubstr("/ckpt/step-10/stage-0.manifest"));
  fs_.Put("/ckpt/step-10/stage-0.manifest", "garbage");
  EXPECT_EQ(store_.NewestCompleteStep().status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(StepsTest, HostileManifestsAreDataLossNotCrashes) {
  ASSERT_TRUE(Save(0, 10).ok());
  ASSERT_TRUE(Save(1, 10).ok());
  const std::string good = *fs_.Read("/ckpt/step-10/stage-0.manifest");
  // A line of spaces is no record (it used to index an empty split).
  fs_.Put("/ckpt/step-10/stage-0.manifest",
          absl::StrReplaceAll(good, {{"\nend", "\n   \nend"}}));
  EXPECT_TRUE(store_.NewestCompleteStep().ok()) << store_.NewestCompleteStep().status();
  // Dimensions whose product overflows, an offset past the data's end by
  // overflow, a negative data size: refused, naming the file.
  const std::string tensor_line = good.substr(good.find("\ntensor ") + 1,
                                              good.find('\n', good.find("\ntensor ") + 1) -
                                                  good.find("\ntensor ") - 1);
  std::vector<std::string> f = absl::StrSplit(tensor_line, ' ');
  ASSERT_EQ(f.size(), 9u) << tensor_line;
  auto with = [&](int field, const std::string& value) {
    std::vector<std::string> g = f;
    g[field] = value;
    return absl::StrReplaceAll(good, {{tensor_line, absl::StrJoin(g, " ")}});
  };
  for (const std::string& hostile :
       {with(8, "4611686018427387904x4611686018427387904x4"),
        with(6, "9223372036854775800"),
        with(4, "-5"),
        absl::StrReplaceAll(good, {{"\ndata stage-0.data ", "\ndata stage-0.data -"}})}) {
    fs_.Put("/ckpt/step-10/stage-0.manifest", hostile);
    absl::Status st = store_.NewestCompleteStep().status();
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << hostile;
    EXPECT_THAT(st.message(), HasSubstr("/ckpt/step-10/stage-0.manifest"));
  }
}

TEST_F(StepsTest, AManifestOfAnotherModelIsInvalidArgumentNamingTheKey) {
  ASSERT_TRUE(Save(0, 10).ok());
  ASSERT_TRUE(Save(1, 10).ok());
  std::string manifest = *fs_.Read("/ckpt/step-10/stage-1.manifest");
  const size_t at = manifest.find("param/fc4.weight");
  ASSERT_NE(at, std::string::npos);
  std::string renamed = manifest;
  renamed.replace(at, 16, "param/fc9.weight");
  fs_.Put("/ckpt/step-10/stage-1.manifest", renamed);
  auto st = store_.NewestCompleteStep().status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("stage-1.manifest"));
  EXPECT_THAT(st.message(), HasSubstr("param/fc9.weight"));
  fs_.Put("/ckpt/step-10/stage-1.manifest", manifest);
  // The same layers, other widths: shapes disagree.
  Planned wider = PlanFor(Mlp(24), Plan{"2 stages", 2});
  FileCheckpointStore reader("/ckpt", 10, wider.graph.get(), &fs_);
  StageCheckpoint c = Template(wider, 0, ref_.slot_names);
  absl::Status load = reader.Load(10, &c);
  EXPECT_EQ(load.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(load.message(), HasSubstr("param/fc1"));
  EXPECT_THAT(load.message(), HasSubstr("/ckpt/step-10/stage-"));
  // Another optimizer.
  StageCheckpoint adam = Template(plan_, 0, {"exp_avg", "exp_avg_sq"});
  EXPECT_EQ(store_.Load(10, &adam).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StepsTest, AFailingWriteNamesTheFile) {
  fs_.Fail("/ckpt/step-7/stage-0.data");
  absl::Status st = Save(0, 7);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("/ckpt/step-7/stage-0.data"));
}

// A FileSystem whose writes wait until the test lets them through.
class GatedFileSystem : public testing::MemoryFileSystem {
 public:
  absl::Status WriteAtomically(const std::string& path,
                               absl::string_view bytes) override {
    if (!entered_.HasBeenNotified()) entered_.Notify();
    open_.WaitForNotification();
    return MemoryFileSystem::WriteAtomically(path, bytes);
  }
  absl::Notification entered_, open_;
};

TEST_F(StepsTest, TheWriterWritesInTheBackgroundAndReportsErrors) {
  GatedFileSystem gated;
  FileCheckpointStore store("/ckpt", 10, plan_.graph.get(), &gated);
  {
    CheckpointWriter writer(&store, 0);
    ASSERT_TRUE(writer.Submit(Holding(plan_, 0, ref_, 10)).ok());
    // Submit returned while the write waits in the file system.
    ASSERT_TRUE(gated.entered_.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(gated.Paths().empty());
    EXPECT_EQ(writer.written_step(), 0);  // submitted is not written
    gated.open_.Notify();
    EXPECT_TRUE(writer.Wait().ok());
    EXPECT_EQ(writer.written_step(), 10);
    // The write's CPU time is counted once it is done.
    EXPECT_GT(writer.write_cpu_seconds(), 0);
    EXPECT_THAT(gated.Paths(), ::testing::Contains("/ckpt/step-10/stage-0.manifest"));
    gated.Fail("/ckpt/step-20/stage-0.data");
    ASSERT_TRUE(writer.Submit(Holding(plan_, 0, ref_, 20)).ok());
    absl::Status st = writer.Wait();
    EXPECT_THAT(st.message(), HasSubstr("/ckpt/step-20/stage-0.data"));
    EXPECT_EQ(writer.written_step(), 10);  // a failed write is not written
    // The next submission reports it too, and writes nothing.
    EXPECT_FALSE(writer.Submit(Holding(plan_, 0, ref_, 30)).ok());
  }
  for (const auto& path : gated.Paths()) {
    EXPECT_THAT(path, ::testing::Not(HasSubstr("step-30")));
  }
}

// The manifest's torch-free dtype table agrees with c10's names and sizes.
TEST(CheckpointManifestTest, ElementSizesAreC10s) {
  for (c10::ScalarType t :
       {c10::ScalarType::Float, c10::ScalarType::Double, c10::ScalarType::Half,
        c10::ScalarType::BFloat16, c10::ScalarType::Long, c10::ScalarType::Int,
        c10::ScalarType::Byte, c10::ScalarType::Bool}) {
    EXPECT_EQ(CheckpointElementSize(c10::toString(t)),
              static_cast<int64_t>(c10::elementSize(t)))
        << c10::toString(t);
  }
  EXPECT_EQ(CheckpointElementSize("ComplexFloat"), std::nullopt);
}

TEST(LocalFileSystemTest, WritesAtomicallyListsAndRemoves) {
  FileSystem* fs = LocalFileSystem();
  const std::string dir = ::testing::TempDir() + "/apapo_fs_test/sub";
  ASSERT_TRUE(fs->CreateDir(dir + "/step-1").ok());
  ASSERT_TRUE(fs->WriteAtomically(dir + "/a", "bytes").ok());
  ASSERT_TRUE(fs->WriteAtomically(dir + "/a", "other bytes").ok());
  auto read = fs->Read(dir + "/a");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "other bytes");
  EXPECT_THAT(*fs->List(dir), UnorderedElementsAre("a", "step-1"));
  ASSERT_TRUE(fs->Remove(dir + "/a").ok());
  EXPECT_TRUE(fs->Remove(dir + "/a").ok());  // already gone
  ASSERT_TRUE(fs->Remove(dir + "/step-1").ok());  // an empty directory
  EXPECT_TRUE(fs->List(dir)->empty());
  EXPECT_TRUE(fs->List(dir + "/missing")->empty());
  EXPECT_EQ(fs->Read(dir + "/a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs->WriteAtomically(dir + "/missing/b", "x").ok());
}

}  // namespace
}  // namespace apapo::worker
