#include "worker/confined_files.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace apapo::worker {
namespace {

std::vector<std::string>& Roots() {
  static auto* roots = new std::vector<std::string>();
  return *roots;
}

std::string Errno() { return std::strerror(errno); }

// The longest root that contains `path` lexically, or null.
const std::string* RootOf(const std::string& path) {
  const std::string* best = nullptr;
  for (const std::string& r : Roots()) {
    const bool under =
        path == r || (path.size() > r.size() && path.compare(0, r.size(), r) == 0 &&
                      (r.back() == '/' || path[r.size()] == '/'));
    if (under && (best == nullptr || r.size() > best->size())) best = &r;
  }
  return best;
}

// Whether `path` names a root itself.
bool IsRoot(const std::string& path) {
  for (const std::string& r : Roots()) {
    if (path == r) return true;
  }
  return false;
}

absl::Status Outside(const std::string& path, const std::string& what) {
  return absl::PermissionDeniedError(
      absl::StrCat(what, " '", path, "' is outside the data roots (",
                   absl::StrJoin(Roots(), ", "), ")"));
}

// An O_PATH descriptor of `path` (no open of the object itself, so no
// device driver, FIFO or lock is touched), resolved by the kernel with
// magic links (/proc/PID/fd/...) refused; -1 with errno on failure.
// Kernels before 5.6 have no openat2: there a plain O_PATH open is used
// (a magic link is then followed, and judged by where it leads, below).
int OpenPath(int dirfd, const std::string& path, int extra_flags) {
  open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = static_cast<uint64_t>(O_PATH | O_CLOEXEC | extra_flags);
  how.resolve = RESOLVE_NO_MAGICLINKS;
  const int fd = static_cast<int>(
      ::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof(how)));
  if (fd >= 0 || errno != ENOSYS) return fd;
  return ::openat(dirfd, path.c_str(), O_PATH | O_CLOEXEC | extra_flags);
}

// Where the object behind `fd` really is (the kernel's path of it).
std::string RealPathOf(int fd) {
  char real[4096];
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = ::readlink(link.c_str(), real, sizeof(real) - 1);
  return n > 0 ? std::string(real, static_cast<size_t>(n)) : std::string();
}

// Whether `real` (a resolved path) lies under one of the roots, themselves
// resolved through their symlinks.
bool UnderARoot(const std::string& real) {
  if (real.empty() || real.front() != '/') return false;
  for (const std::string& r : Roots()) {
    std::error_code ec;
    const std::string c = std::filesystem::canonical(r, ec).string();
    if (ec) continue;
    if (real == c || c == "/" || absl::StartsWith(real, absl::StrCat(c, "/"))) {
      return true;
    }
  }
  return false;
}

absl::Status OpenError(const std::string& path, const std::string& what) {
  const int e = errno;
  if (e == ELOOP) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " '", path, "' goes through a /proc magic link or too many symlinks"));
  }
  if (e == ENOENT) {
    return absl::NotFoundError(absl::StrCat("cannot open ", what, " '", path,
                                            "': ", std::strerror(e)));
  }
  return absl::InternalError(
      absl::StrCat("cannot open ", what, " '", path, "': ", std::strerror(e)));
}

// `pfd` (an O_PATH descriptor of `path`) checked to lie under a root,
// then reopened with `flags` through /proc/self/fd: the same inode, so what
// was checked is what is opened.
absl::StatusOr<UniqueFd> Reopen(UniqueFd pfd, const std::string& path,
                                const std::string& what, int flags) {
  const std::string real = RealPathOf(pfd.get());
  if (!UnderARoot(real)) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " '", path, "' resolves to ", real.empty() ? "an unknown path" : real,
        ", outside the data roots (", absl::StrJoin(Roots(), ", "), ")"));
  }
  UniqueFd fd(::open(absl::StrCat("/proc/self/fd/", pfd.get()).c_str(),
                     flags | O_CLOEXEC));
  if (fd.get() < 0) return OpenError(path, what);
  return fd;
}

// Opens `path` with `flags`: confined, lexically under a root and resolved
// to an object under a root (checked on the descriptor, not the name).
absl::StatusOr<UniqueFd> Open(const std::string& path, const std::string& what,
                              int flags, bool built_in = false) {
  if (Roots().empty() || built_in) {
    UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC));
    if (fd.get() < 0) return OpenError(path, what);
    return fd;
  }
  if (RootOf(path) == nullptr) return Outside(path, what);
  UniqueFd pfd(OpenPath(AT_FDCWD, path, flags & O_DIRECTORY));
  if (pfd.get() < 0) return OpenError(path, what);
  if ((flags & O_DIRECTORY) == 0) {
    // The type, on the descriptor: no open of a FIFO or a device at all.
    struct stat st;
    if (::fstat(pfd.get(), &st) != 0) return OpenError(path, what);
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", path, "' is not a regular file"));
    }
  }
  return Reopen(std::move(pfd), path, what, flags);
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

void ConfineToDataRoots(std::vector<std::string> roots) {
  // "/var/lib/apapo/" and "/var/lib/apapo" name the same root (and the
  // folder itself lies under it).
  for (std::string& r : roots) {
    while (r.size() > 1 && r.back() == '/') r.pop_back();
  }
  Roots() = std::move(roots);
}

const std::vector<std::string>& ConfinedDataRoots() { return Roots(); }

absl::StatusOr<UniqueFd> OpenForReading(const std::string& path,
                                        const std::string& what, bool built_in) {
  // O_NONBLOCK: an unconfined open of a FIFO must not hang the stage
  // (confined ones are typed before they are opened); cleared below.
  auto fd = Open(path, what, O_RDONLY | O_NOCTTY | O_NONBLOCK, built_in);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat ", what, " '", path, "': ", Errno()));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' is not a regular file"));
  }
  const int fl = ::fcntl(fd->get(), F_GETFL);
  if (fl < 0 || ::fcntl(fd->get(), F_SETFL, fl & ~O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("fcntl of ", what, " '", path, "': ", Errno()));
  }
  return fd;
}

absl::StatusOr<std::string> ReadFileConfined(const std::string& path,
                                             const std::string& what,
                                             int64_t max_bytes) {
  auto fd = OpenForReading(path, what);
  if (!fd.ok()) return fd.status();
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd->get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat("cannot read ", what, " '", path, "': ", Errno()));
    }
    if (n == 0) break;
    if (static_cast<int64_t>(out.size()) + n > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " '", path, "' is larger than ", max_bytes, " bytes"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::StatusOr<UniqueFd> OpenDirectory(const std::string& dir, bool create) {
  const std::string what = "directory";
  const int flags = O_RDONLY | O_DIRECTORY;
  if (Roots().empty()) {
    if (create) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) {
        return absl::InternalError(
            absl::StrCat("cannot create directory '", dir, "': ", ec.message()));
      }
    }
    return Open(dir, what, flags);
  }
  auto fd = Open(dir, what, flags);
  if (fd.ok() || !absl::IsNotFound(fd.status()) || !create) return fd;
  // Create what is missing below the deepest existing ancestor, one
  // component at a time: each new directory is made relative to its
  // checked parent and opened without following a symlink (mkdirat never
  // follows its last component, and a symlink planted meanwhile fails
  // O_NOFOLLOW).
  std::filesystem::path existing(dir);
  std::vector<std::string> missing;
  while (true) {
    if (!existing.has_parent_path() || existing.parent_path() == existing) {
      return fd.status();
    }
    missing.push_back(existing.filename().string());
    existing = existing.parent_path();
    // A root that does not exist yet (/var/lib/apapo on a machine where
    // nothing was deployed) is made where the operator named it, with its
    // missing parents: the only directories made outside a checked parent.
    // Without it the default checkpoint root failed every job at its first
    // checkpoint.
    if (IsRoot(existing.string())) {
      std::error_code ec;
      if (!std::filesystem::exists(existing, ec)) {
        std::filesystem::create_directories(existing, ec);
        if (ec) {
          return absl::InternalError(absl::StrCat(
              "cannot create data root '", existing.string(), "': ", ec.message()));
        }
        std::filesystem::permissions(existing, std::filesystem::perms(0750),
                                     std::filesystem::perm_options::replace, ec);
      }
    }
    auto parent = Open(existing.string(), what, flags);
    if (parent.ok()) {
      UniqueFd at = *std::move(parent);
      std::string made = existing.string();
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        made = absl::StrCat(made, made.back() == '/' ? "" : "/", *it);
        if (::mkdirat(at.get(), it->c_str(), 0750) != 0 && errno != EEXIST) {
          return absl::InternalError(
              absl::StrCat("cannot create directory '", made, "': ", Errno()));
        }
        UniqueFd next(::openat(at.get(), it->c_str(), flags | O_NOFOLLOW | O_CLOEXEC));
        if (next.get() < 0) {
          if (errno == ELOOP || errno == ENOTDIR) {
            return absl::PermissionDeniedError(absl::StrCat(
                "directory '", made, "' was replaced by a symlink or a file"));
          }
          return OpenError(made, what);
        }
        at = std::move(next);
      }
      return at;
    }
    if (!absl::IsNotFound(parent.status())) return parent.status();
  }
}

}  // namespace apapo::worker
