#include "worker/file_system.h"

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

  absl::Status WriteAtomically(const std::string& path,
                               absl::string_view bytes) override {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      out.flush();
      if (!out) {
        return absl::InternalError(absl::StrCat("writing '", tmp, "' failed: ",
                                                std::strerror(errno)));
      }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("renaming '", tmp, "' to '", path,
                                              "' failed: ",
                                              std::strerror(errno)));
    }
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
