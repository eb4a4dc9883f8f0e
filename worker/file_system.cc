#include "worker/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/confined_files.h"

namespace apapo::worker {
namespace {

// Every operation goes through a directory opened beneath its data root
// (confined_files.h) and names only a last component relative to it, which
// is never followed if it is a symlink: a checkpoint folder cannot be
// redirected out of its root between a check and a write.
class PosixFileSystem : public FileSystem {
 public:
  absl::Status CreateDir(const std::string& dir) override {
    return OpenDirectory(dir, /*create=*/true).status();
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    std::vector<std::string> names;
    auto fd = OpenDirectory(dir, /*create=*/false);
    if (absl::IsNotFound(fd.status())) return names;
    if (!fd.ok()) return fd.status();
    DIR* d = ::fdopendir(fd->get());
    if (d == nullptr) {
      return absl::InternalError(
          absl::StrCat("cannot list directory '", dir, "': ", std::strerror(errno)));
    }
    fd->release();  // closedir closes it
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    return names;
  }

  // Durable as well as atomic: the data reaches the disk before the rename
  // (fsync of the file) and the rename does too (fsync of the directory),
  // so after a crash `path` holds the old or the new bytes, whole.
  absl::Status WriteAtomically(const std::string& path,
                               absl::string_view bytes) override {
    auto [dir, name] = Split(path);
    auto dfd = OpenDirectory(dir, /*create=*/false);
    if (!dfd.ok()) return dfd.status();
    const std::string tmp_name = name + ".tmp";
    const std::string tmp = path + ".tmp";
    auto failed = [&](absl::string_view what, const std::string& p) {
      return absl::InternalError(absl::StrCat(what, " '", p, "' failed: ",
                                              std::strerror(errno)));
    };
    UniqueFd fd(::openat(dfd->get(), tmp_name.c_str(),
                         O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640));
    if (fd.get() < 0) return failed("creating", tmp);
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        absl::Status st = failed("writing", tmp);
        ::unlinkat(dfd->get(), tmp_name.c_str(), 0);
        return st;
      }
      done += static_cast<size_t>(n);
    }
    if (::fsync(fd.get()) != 0) {
      absl::Status st = failed("syncing", tmp);
      ::unlinkat(dfd->get(), tmp_name.c_str(), 0);
      return st;
    }
    if (::close(fd.release()) != 0) return failed("closing", tmp);
    if (::renameat(dfd->get(), tmp_name.c_str(), dfd->get(), name.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("renaming '", tmp, "' to '", path,
                                              "' failed: ",
                                              std::strerror(errno)));
    }
    if (::fsync(dfd->get()) != 0) return failed("syncing directory", dir);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Read(const std::string& path) override {
    return ReadFileConfined(path, "file", std::numeric_limits<int64_t>::max());
  }

  absl::Status Remove(const std::string& path) override {
    auto [dir, name] = Split(path);
    auto dfd = OpenDirectory(dir, /*create=*/false);
    if (absl::IsNotFound(dfd.status())) return absl::OkStatus();
    if (!dfd.ok()) return dfd.status();
    if (::unlinkat(dfd->get(), name.c_str(), 0) == 0 || errno == ENOENT) {
      return absl::OkStatus();
    }
    if ((errno == EISDIR || errno == EPERM) &&
        (::unlinkat(dfd->get(), name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT)) {
      return absl::OkStatus();
    }
    return absl::InternalError(absl::StrCat("removing '", path, "' failed: ",
                                            std::strerror(errno)));
  }

 private:
  // (parent directory, last component); "." for a bare name.
  static std::pair<std::string, std::string> Split(const std::string& path) {
    const std::filesystem::path p(path);
    std::string dir = p.parent_path().string();
    return {dir.empty() ? "." : dir, p.filename().string()};
  }
};

}  // namespace

FileSystem* LocalFileSystem() {
  static FileSystem* fs = new PosixFileSystem();
  return fs;
}

}  // namespace apapo::worker
