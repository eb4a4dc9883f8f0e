#include "common/spec_paths.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace apapo {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxPathBytes = 4096;

absl::Status Refuse(const SpecPath& p, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(p.field, ": ", why));
}

// `path` equals `root` or lies below it (both absolute, normalised).
bool Under(const std::string& path, const std::string& root) {
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (r == "/") return true;
  return path == r || absl::StartsWith(path, r + "/");
}

bool UnderAny(const std::string& path, const std::vector<std::string>& roots) {
  for (const auto& root : roots) {
    if (Under(path, root)) return true;
  }
  return false;
}

std::string Outside(const std::string& path, const std::vector<std::string>& roots) {
  return absl::StrCat(path, " is outside the data roots (", absl::StrJoin(roots, ", "),
                      ")");
}

absl::Status CheckLexically(const SpecPath& p, const std::vector<std::string>& roots) {
  if (p.path.size() > kMaxPathBytes) {
    return Refuse(p, absl::StrCat("longer than ", kMaxPathBytes, " bytes"));
  }
  if (p.path.find('\0') != std::string::npos) return Refuse(p, "contains a NUL byte");
  if (p.path.empty() || p.path[0] != '/') {
    return Refuse(p, absl::StrCat("must be an absolute path, got \"", p.path, "\""));
  }
  for (absl::string_view part : absl::StrSplit(p.path, '/')) {
    if (part == "." || part == "..") {
      return Refuse(p, absl::StrCat("must not contain \"", part, "\", got \"", p.path,
                                    "\""));
    }
  }
  if (!UnderAny(p.path, roots)) return Refuse(p, Outside(p.path, roots));
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& DefaultDataRoots() {
  static const auto* kRoots =
      new std::vector<std::string>{"/usr/share/datasets", "/var/lib/apapo"};
  return *kRoots;
}

absl::StatusOr<std::vector<std::string>> ParseDataRoots(const std::string& list,
                                                        const std::string& flag) {
  std::vector<std::string> roots;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    std::string root(part);
    if (root[0] != '/' || absl::StrContains(root, "/../") ||
        absl::EndsWith(root, "/..")) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": \"", root, "\" is not an absolute directory without \"..\""));
    }
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    roots.push_back(root);
  }
  if (roots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": no directory given"));
  }
  return roots;
}

std::vector<SpecPath> PathsInSpec(const apapo::v1::JobSpec& spec) {
  std::vector<SpecPath> out;
  const auto& data = spec.data();
  if (data.has_fashion_mnist() && !data.fashion_mnist().directory().empty()) {
    out.push_back({"spec.data.fashion_mnist.directory",
                   data.fashion_mnist().directory(), /*directory=*/true, false});
  }
  if (data.has_text() && !data.text().path().empty()) {
    out.push_back({"spec.data.text.path", data.text().path(), false, false});
  }
  const auto& model = spec.model();
  if (model.has_torchscript() && !model.torchscript().path().empty()) {
    out.push_back({"spec.model.torchscript.path", model.torchscript().path(), false,
                   false});
  }
  if (model.has_graph()) {
    for (int i = 0; i < model.graph().nodes_size(); ++i) {
      const auto& attrs = model.graph().nodes(i).attrs();
      auto it = attrs.find("path");
      if (it != attrs.end()) {
        out.push_back({absl::StrCat("spec.model.graph.nodes[", i, "].attrs[\"path\"]"),
                       it->second.s(), false, false});
      }
    }
  }
  if (!spec.checkpoint().directory().empty()) {
    out.push_back({"spec.checkpoint.directory", spec.checkpoint().directory(), true,
                   /*writable=*/true});
  }
  return out;
}

absl::Status CheckSpecPaths(const apapo::v1::JobSpec& spec,
                            const std::vector<std::string>& roots) {
  for (const SpecPath& p : PathsInSpec(spec)) {
    if (absl::Status s = CheckLexically(p, roots); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckSpecPathsOnDisk(const apapo::v1::JobSpec& spec,
                                  const std::vector<std::string>& roots) {
  // The roots themselves may be symlinks: compare resolved with resolved.
  std::vector<std::string> real_roots;
  for (const auto& root : roots) {
    std::error_code ec;
    fs::path real = fs::weakly_canonical(root, ec);
    real_roots.push_back(ec ? root : real.string());
  }
  for (const SpecPath& p : PathsInSpec(spec)) {
    if (absl::Status s = CheckLexically(p, roots); !s.ok()) return s;
    std::error_code ec;
    // A directory to write may not exist yet (nor its root): its nearest
    // existing parent decides where it lands, and the parts below it, which
    // do not exist and so cannot be symlinks, follow lexically.
    fs::path existing = p.path;
    fs::path missing;
    if (p.writable) {
      while (!fs::exists(existing, ec) && existing.has_parent_path() &&
             existing != existing.parent_path()) {
        missing = existing.filename() / missing;
        existing = existing.parent_path();
      }
    }
    fs::path real = fs::canonical(existing, ec);
    if (ec) {
      return Refuse(p, absl::StrCat(p.path, " cannot be read on this worker: ",
                                    ec.message()));
    }
    const bool exists = missing.empty();
    if (!exists) real = (real / missing).lexically_normal();
    if (!real.empty() && real.filename().empty()) real = real.parent_path();
    if (!UnderAny(real.string(), real_roots)) {
      return Refuse(p, absl::StrCat(p.path, " resolves to ", real.string(), ", ",
                                    Outside(real.string(), real_roots)));
    }
    if (!exists) continue;  // created under the roots when written
    const fs::file_status st = fs::status(real, ec);
    if (p.directory ? !fs::is_directory(st) : !fs::is_regular_file(st)) {
      return Refuse(p, absl::StrCat(p.path, " is not a ",
                                    p.directory ? "directory" : "regular file"));
    }
  }
  return absl::OkStatus();
}

}  // namespace apapo
