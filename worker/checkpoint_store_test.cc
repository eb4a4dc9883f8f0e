// FileCheckpointStore over an in-memory file system: round trip, pruning,
// the newest step every replica has, and errors that name the file.
#include "worker/checkpoint_store.h"

#include <torch/torch.h>

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/testing/memory_file_system.h"

namespace apapo::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

StageCheckpoint Checkpoint(int64_t step) {
  StageCheckpoint c;
  c.step = step;
  c.version = step + 1;
  c.parameters = {torch::full({2, 3}, static_cast<float>(step)),
                  torch::arange(4, torch::kFloat)};
  c.optimizer_state = {torch::ones({2, 3})};
  c.buffers = {torch::zeros({5})};
  return c;
}

TEST(FileCheckpointStoreTest, RoundTrip) {
  testing::MemoryFileSystem fs;
  FileCheckpointStore store("/ckpt", 10, &fs);
  ASSERT_TRUE(store.Save(1, 0, Checkpoint(10)).ok());
  EXPECT_THAT(fs.Paths(), UnorderedElementsAre("/ckpt/step10.stage1.replica0.pt"));
  auto loaded = store.Load(1, 0, 10, 2);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 10);
  EXPECT_EQ(loaded->version, 11);
  ASSERT_EQ(loaded->parameters.size(), 2u);
  EXPECT_TRUE(torch::equal(loaded->parameters[0], torch::full({2, 3}, 10.0f)));
  EXPECT_TRUE(loaded->parameters[1].requires_grad());
  ASSERT_EQ(loaded->optimizer_state.size(), 1u);
  ASSERT_EQ(loaded->buffers.size(), 1u);
  EXPECT_EQ(loaded->buffers[0].numel(), 5);
}

TEST(FileCheckpointStoreTest, KeepsTheLatestIntervalPerReplica) {
  testing::MemoryFileSystem fs;
  FileCheckpointStore store("/ckpt", 10, &fs);
  for (int64_t step : {10, 20, 30}) {
    ASSERT_TRUE(store.Save(0, 0, Checkpoint(step)).ok());
  }
  ASSERT_TRUE(store.Save(0, 1, Checkpoint(10)).ok());
  auto steps = store.Steps(0, 0);
  ASSERT_TRUE(steps.ok());
  EXPECT_THAT(*steps, UnorderedElementsAre(20, 30));
  EXPECT_THAT(*store.Steps(0, 1), UnorderedElementsAre(10));
}

TEST(FileCheckpointStoreTest, NewestCommonStepNeedsEveryReplica) {
  testing::MemoryFileSystem fs;
  FileCheckpointStore store("/ckpt", 100, &fs);
  ASSERT_TRUE(store.Save(0, 0, Checkpoint(10)).ok());
  ASSERT_TRUE(store.Save(0, 0, Checkpoint(20)).ok());
  ASSERT_TRUE(store.Save(1, 0, Checkpoint(10)).ok());
  auto step = NewestCommonStep(store, {{0, 0}, {1, 0}});
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE(step->has_value());
  EXPECT_EQ(**step, 10);
  auto none = NewestCommonStep(store, {{0, 0}, {2, 0}});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(FileCheckpointStoreTest, ErrorsNameTheFile) {
  testing::MemoryFileSystem fs;
  FileCheckpointStore store("/ckpt", 10, &fs);
  // Unreadable bytes.
  fs.Put("/ckpt/step5.stage0.replica0.pt", "not a checkpoint");
  auto garbage = store.Load(0, 0, 5, 2);
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(garbage.status().message(),
              HasSubstr("/ckpt/step5.stage0.replica0.pt"));
  // A checkpoint of another stage shape.
  ASSERT_TRUE(store.Save(0, 0, Checkpoint(6)).ok());
  auto mismatch = store.Load(0, 0, 6, 3);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("holds 2 parameters"));
  // Missing.
  EXPECT_EQ(store.Load(0, 0, 99, 2).status().code(),
            absl::StatusCode::kDataLoss);
  // A failing write says which file.
  fs.Fail("/ckpt/step7.stage0.replica0.pt");
  absl::Status st = store.Save(0, 0, Checkpoint(7));
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("step7.stage0.replica0.pt"));
}

TEST(LocalFileSystemTest, WritesAtomicallyListsAndRemoves) {
  FileSystem* fs = LocalFileSystem();
  const std::string dir = ::testing::TempDir() + "/apapo_fs_test/sub";
  ASSERT_TRUE(fs->CreateDir(dir).ok());
  ASSERT_TRUE(fs->WriteAtomically(dir + "/a", "bytes").ok());
  auto read = fs->Read(dir + "/a");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "bytes");
  EXPECT_THAT(*fs->List(dir), UnorderedElementsAre("a"));
  ASSERT_TRUE(fs->Remove(dir + "/a").ok());
  EXPECT_TRUE(fs->Remove(dir + "/a").ok());  // already gone
  EXPECT_TRUE(fs->List(dir)->empty());
  EXPECT_TRUE(fs->List(dir + "/missing")->empty());
  EXPECT_EQ(fs->Read(dir + "/a").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace apapo::worker
