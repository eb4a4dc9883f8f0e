#include "worker/file_system.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace apapo::worker {
namespace {

class PosixFileSystem : public FileSystem {
 public:
  absl::Status CreateDir(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot create directory '", dir, "': ", ec.message()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    std::vector<std::string> names;
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec);
    if (ec == std::errc::no_such_file_or_directory) return names;
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot list directory '", dir, "': ", ec.message()));
    }
    for (const auto& entry : it) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  // Durable as well as atomic: the data reaches the disk before the rename
  // (fsync of the file) and the rename does too (fsync of the directory),
  // so after a crash `path` holds the old or the new bytes, whole.
  absl::Status WriteAtomically(const std::string& path,
                               absl::string_view bytes) override {
    const std::string tmp = path + ".tmp";
    auto failed = [&](absl::string_view what, const std::string& p) {
      return absl::InternalError(absl::StrCat(what, " '", p, "' failed: ",
                                              std::strerror(errno)));
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                          0644);
    if (fd < 0) return failed("creating", tmp);
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        absl::Status st = failed("writing", tmp);
        ::close(fd);
        ::unlink(tmp.c_str());
        return st;
      }
      done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0) {
      absl::Status st = failed("syncing", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return st;
    }
    if (::close(fd) != 0) return failed("closing", tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("renaming '", tmp, "' to '", path,
                                              "' failed: ",
                                              std::strerror(errno)));
    }
    const std::string dir =
        std::filesystem::path(path).parent_path().string();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(),
                           O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return failed("opening directory", dir);
    const int synced = ::fsync(dfd);
    ::close(dfd);
    if (synced != 0) return failed("syncing directory", dir);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Read(const std::string& path) override {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ",
                                              std::strerror(errno)));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  absl::Status Remove(const std::string& path) override {
    if (std::remove(path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat("removing '", path, "' failed: ",
                                              std::strerror(errno)));
    }
    return absl::OkStatus();
  }
};

}  // namespace

FileSystem* LocalFileSystem() {
  static FileSystem* fs = new PosixFileSystem();
  return fs;
}

}  // namespace apapo::worker
