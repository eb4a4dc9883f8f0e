#include "worker/confined_files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/file_system.h"

namespace apapo::worker {
namespace {

using ::testing::HasSubstr;

namespace fs = std::filesystem;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string ReadPlain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A data root and, beside it, a directory outside every root holding a
// "secret"; the process is confined to the root for the test's duration.
class ConfinedFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TEST_TMPDIR");
    std::string base = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/confinedXXXXXX");
    ASSERT_NE(mkdtemp(base.data()), nullptr);
    base_ = base;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    fs::create_directories(root_ + "/data");
    fs::create_directories(outside_);
    WriteFile(root_ + "/data/train.txt", "training text");
    WriteFile(outside_ + "/secret", "secret");
    ConfineToDataRoots({root_});
  }
  void TearDown() override {
    ConfineToDataRoots({});
    std::error_code ec;
    fs::remove_all(base_, ec);
  }

  std::string base_, root_, outside_;
};

TEST_F(ConfinedFilesTest, AFileUnderTheRootIsRead) {
  auto text = ReadFileConfined(root_ + "/data/train.txt", "text file", 1 << 20);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "training text");
  // A symlink that stays beneath the root is followed.
  fs::create_symlink(root_ + "/data/train.txt", root_ + "/data/link.txt");
  text = ReadFileConfined(root_ + "/data/link.txt", "text file", 1 << 20);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "training text");
}

TEST_F(ConfinedFilesTest, PathsOutsideTheRootsAreRefusedByName) {
  auto fd = OpenForReading(outside_ + "/secret", "text file");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(fd.status().message(), HasSubstr("is outside the data roots (" + root_));
  // A root is a directory, not a prefix: <root>x is not under <root>.
  fs::create_directories(root_ + "x");
  WriteFile(root_ + "x/f", "x");
  EXPECT_EQ(OpenForReading(root_ + "x/f", "f").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(ConfinedFilesTest, SymlinksAndDotDotLeavingTheRootAreRefused) {
  fs::create_symlink(outside_ + "/secret", root_ + "/data/escape");
  auto fd = OpenForReading(root_ + "/data/escape", "text file");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << fd.status();
  EXPECT_THAT(fd.status().message(), HasSubstr("resolves to " + fs::canonical(outside_).string() + "/secret, outside the data roots"));
  // A directory symlink on the way out, and "..".
  fs::create_directory_symlink(outside_, root_ + "/data/dir");
  EXPECT_EQ(OpenForReading(root_ + "/data/dir/secret", "f").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(OpenForReading(root_ + "/data/../../outside/secret", "f").status().code(),
            absl::StatusCode::kPermissionDenied);
  // /proc/self/fd-style magic links are refused too.
  const int fd_outside = ::open((outside_ + "/secret").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd_outside, 0);
  fs::create_symlink(absl::StrCat("/proc/self/fd/", fd_outside), root_ + "/data/magic");
  EXPECT_EQ(OpenForReading(root_ + "/data/magic", "f").status().code(),
            absl::StatusCode::kPermissionDenied);
  ::close(fd_outside);
}

// The race the daemon's name-based check leaves: the path is a regular file
// under the root when checked, and a symlink to a secret when opened.
TEST_F(ConfinedFilesTest, ASymlinkSwappedInAfterTheCheckIsRefusedAtTheOpen) {
  const std::string path = root_ + "/data/train.txt";
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  ASSERT_TRUE(S_ISREG(st.st_mode));  // what a check by name sees
  fs::create_symlink(outside_ + "/secret", root_ + "/data/swap");
  ASSERT_EQ(std::rename((root_ + "/data/swap").c_str(), path.c_str()), 0);
  auto text = ReadFileConfined(path, "text file", 1 << 20);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kPermissionDenied) << text.status();
  // Unconfined, the same open reads the secret: the test sees the race.
  ConfineToDataRoots({});
  text = ReadFileConfined(path, "text file", 1 << 20);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "secret");
}

TEST_F(ConfinedFilesTest, OnlyRegularFilesAreOpenedAndAFifoDoesNotHang) {
  ASSERT_EQ(::mkfifo((root_ + "/data/fifo").c_str(), 0600), 0);
  auto fd = OpenForReading(root_ + "/data/fifo", "data file");
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fd.status().message(), HasSubstr("is not a regular file"));
  EXPECT_EQ(OpenForReading(root_ + "/data", "data file").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenForReading(root_ + "/data/missing", "data file").status().code(),
            absl::StatusCode::kNotFound);
  auto big = ReadFileConfined(root_ + "/data/train.txt", "text file", 4);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
}

// A root that does not exist yet (the default /var/lib/apapo where nothing
// was deployed) is created with the checkpoint folder under it; a path
// outside every root is still refused, and nothing is made there.
TEST_F(ConfinedFilesTest, ACheckpointFolderCreatesAMissingRoot) {
  const std::string fresh = base_ + "/var/lib/apapo";
  ConfineToDataRoots({root_, fresh + "/"});
  FileSystem* files = LocalFileSystem();
  const std::string dir = fresh + "/checkpoints/job-1/step-100";
  ASSERT_TRUE(files->CreateDir(dir).ok()) << files->CreateDir(dir);
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_EQ(fs::status(fresh).permissions() & fs::perms::all, fs::perms(0750));
  ASSERT_TRUE(files->WriteAtomically(dir + "/stage-0.data", "weights").ok());
  EXPECT_EQ(ReadPlain(dir + "/stage-0.data"), "weights");
  EXPECT_EQ(files->CreateDir(base_ + "/var/other/ckpt").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(base_ + "/var/other"));
}

TEST_F(ConfinedFilesTest, BuiltInPathsAreOpenedAsGiven) {
  auto fd = OpenForReading(outside_ + "/secret", "data file", /*built_in=*/true);
  EXPECT_TRUE(fd.ok()) << fd.status();
}

TEST_F(ConfinedFilesTest, CheckpointWritesStayUnderTheRoot) {
  FileSystem* files = LocalFileSystem();
  const std::string dir = root_ + "/ckpt/job-1/step-10";
  ASSERT_TRUE(files->CreateDir(dir).ok());
  ASSERT_TRUE(files->WriteAtomically(dir + "/stage-0.data", "weights").ok());
  EXPECT_EQ(ReadPlain(dir + "/stage-0.data"), "weights");
  auto read = files->Read(dir + "/stage-0.data");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "weights");
  auto names = files->List(dir);
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ::testing::ElementsAre("stage-0.data"));
  // A symlink planted as the file to write is replaced, not written through.
  fs::create_symlink(outside_ + "/secret", dir + "/stage-0.manifest");
  ASSERT_TRUE(files->WriteAtomically(dir + "/stage-0.manifest", "manifest").ok());
  EXPECT_EQ(ReadPlain(outside_ + "/secret"), "secret");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir + "/stage-0.manifest")));
  // A checkpoint folder redirected out of the root is refused; nothing is
  // created or written outside.
  fs::create_directory_symlink(outside_, root_ + "/ckpt/job-2");
  EXPECT_EQ(files->CreateDir(root_ + "/ckpt/job-2/step-10").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(files->WriteAtomically(root_ + "/ckpt/job-2/x", "x").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(outside_ + "/step-10"));
  EXPECT_FALSE(fs::exists(outside_ + "/x"));
  EXPECT_FALSE(fs::exists(outside_ + "/x.tmp"));
  // Outside the roots altogether.
  EXPECT_EQ(files->CreateDir(outside_ + "/ckpt").code(), absl::StatusCode::kPermissionDenied);
  // Removal, files then the empty directory; a missing one is fine.
  ASSERT_TRUE(files->Remove(dir + "/stage-0.data").ok());
  ASSERT_TRUE(files->Remove(dir + "/stage-0.manifest").ok());
  ASSERT_TRUE(files->Remove(dir).ok());
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(files->Remove(dir).ok());
  names = files->List(dir);
  ASSERT_TRUE(names.ok());
  EXPECT_TRUE(names->empty());
}

}  // namespace
}  // namespace apapo::worker
