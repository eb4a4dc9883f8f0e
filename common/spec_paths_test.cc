#include "common/spec_paths.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SpecPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = fs::path(tmp ? tmp : "/tmp") / "roots";
    fs::remove_all(root_);
    fs::create_directories(root_ / "data");
    std::ofstream(root_ / "data" / "corpus.txt") << "hello";
    roots_ = {root_.string()};
  }

  apapo::v1::JobSpec TextJob(const std::string& path) {
    apapo::v1::JobSpec spec;
    spec.mutable_data()->mutable_text()->set_path(path);
    return spec;
  }

  std::string Message(const absl::Status& s) { return std::string(s.message()); }

  fs::path root_;
  std::vector<std::string> roots_;
};

TEST_F(SpecPathsTest, AFileUnderARootPasses) {
  auto spec = TextJob((root_ / "data" / "corpus.txt").string());
  EXPECT_TRUE(CheckSpecPaths(spec, roots_).ok());
  EXPECT_TRUE(CheckSpecPathsOnDisk(spec, roots_).ok()) << CheckSpecPathsOnDisk(spec, roots_);
}

TEST_F(SpecPathsTest, OutsideRelativeAndDotDotAreRefusedNamingTheField) {
  absl::Status s = CheckSpecPaths(TextJob("/etc/passwd"), roots_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("spec.data.text.path: /etc/passwd is outside the "
                                    "data roots (" + root_.string() + ")"));
  s = CheckSpecPaths(TextJob("data/corpus.txt"), roots_);
  EXPECT_THAT(Message(s), HasSubstr("spec.data.text.path: must be an absolute path"));
  s = CheckSpecPaths(TextJob((root_ / "data" / ".." / ".." / "x").string()), roots_);
  EXPECT_THAT(Message(s), HasSubstr("must not contain \"..\""));
  apapo::v1::JobSpec spec;
  spec.mutable_checkpoint()->set_directory("/tmp/../etc");
  EXPECT_THAT(Message(CheckSpecPaths(spec, roots_)),
              HasSubstr("spec.checkpoint.directory: must not contain \"..\""));
  // A root is a directory boundary, not a string prefix.
  s = CheckSpecPaths(TextJob(root_.string() + "-evil/x"), roots_);
  EXPECT_THAT(Message(s), HasSubstr("is outside the data roots"));
}

TEST_F(SpecPathsTest, ASymlinkOutOfTheRootsIsRefusedOnTheWorker) {
  fs::create_symlink("/etc/passwd", root_ / "data" / "innocent.txt");
  auto spec = TextJob((root_ / "data" / "innocent.txt").string());
  EXPECT_TRUE(CheckSpecPaths(spec, roots_).ok());  // lexically fine
  absl::Status s = CheckSpecPathsOnDisk(spec, roots_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("resolves to /etc/passwd"));
}

TEST_F(SpecPathsTest, NonRegularFilesAndMissingFilesAreRefused) {
  fs::create_symlink("/dev/zero", root_ / "data" / "zero");
  auto roots = roots_;
  roots.push_back("/dev");
  absl::Status s = CheckSpecPathsOnDisk(TextJob((root_ / "data" / "zero").string()), roots);
  EXPECT_THAT(Message(s), HasSubstr("is not a regular file"));
  s = CheckSpecPathsOnDisk(TextJob((root_ / "data").string()), roots_);
  EXPECT_THAT(Message(s), HasSubstr("is not a regular file"));
  s = CheckSpecPathsOnDisk(TextJob((root_ / "data" / "missing.txt").string()), roots_);
  EXPECT_THAT(Message(s), HasSubstr("cannot be read on this worker"));
}

TEST_F(SpecPathsTest, ACheckpointDirectoryMayBeNewButNotLeadOutside) {
  apapo::v1::JobSpec spec;
  spec.mutable_checkpoint()->set_directory((root_ / "ckpt" / "job-1").string());
  EXPECT_TRUE(CheckSpecPathsOnDisk(spec, roots_).ok()) << CheckSpecPathsOnDisk(spec, roots_);
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path outside = fs::path(tmp ? tmp : "/tmp") / "outside";
  fs::create_directories(outside);
  fs::create_symlink(outside, root_ / "escape");
  spec.mutable_checkpoint()->set_directory((root_ / "escape" / "new").string());
  EXPECT_THAT(Message(CheckSpecPathsOnDisk(spec, roots_)),
              HasSubstr("spec.checkpoint.directory: " + (root_ / "escape" / "new").string() +
                        " resolves to " + outside.string()));
}

TEST_F(SpecPathsTest, ACheckpointDirectoryMayLieUnderARootNotCreatedYet) {
  // A new machine's /var/lib/apapo: the first checkpoint creates it.
  const std::vector<std::string> roots = {(root_ / "not-yet").string()};
  apapo::v1::JobSpec spec;
  spec.mutable_checkpoint()->set_directory((root_ / "not-yet" / "checkpoints" / "job-1").string());
  EXPECT_TRUE(CheckSpecPathsOnDisk(spec, roots).ok()) << CheckSpecPathsOnDisk(spec, roots);
  spec.mutable_checkpoint()->set_directory((root_ / "elsewhere" / "job-1").string());
  EXPECT_FALSE(CheckSpecPathsOnDisk(spec, roots).ok());
}

TEST_F(SpecPathsTest, GraphNodePathsAndTorchScriptAreChecked) {
  apapo::v1::JobSpec spec;
  auto* node = spec.mutable_model()->mutable_graph()->add_nodes();
  (*node->mutable_attrs())["path"].set_s("/root/model.pt");
  EXPECT_THAT(Message(CheckSpecPaths(spec, roots_)),
              HasSubstr("spec.model.graph.nodes[0].attrs[\"path\"]: /root/model.pt is "
                        "outside"));
  spec.Clear();
  spec.mutable_model()->mutable_torchscript()->set_path("/root/model.pt");
  EXPECT_THAT(Message(CheckSpecPaths(spec, roots_)),
              HasSubstr("spec.model.torchscript.path: /root/model.pt is outside"));
}

TEST(DataRootsTest, ParsesAListAndRefusesRelativeEntries) {
  auto roots = ParseDataRoots("/usr/share/datasets,/srv/data/,", "--data_roots");
  ASSERT_TRUE(roots.ok());
  EXPECT_THAT(*roots, ::testing::ElementsAre("/usr/share/datasets", "/srv/data"));
  EXPECT_THAT(std::string(ParseDataRoots("data", "--data_roots").status().message()),
              HasSubstr("--data_roots: \"data\" is not an absolute directory"));
  EXPECT_FALSE(ParseDataRoots("", "--data_roots").ok());
}

}  // namespace
}  // namespace apapo
