#include "partitioner/testdata.h"

#include <climits>
#include <cstdlib>
#include <fstream>

namespace apapo {
namespace partitioner {
namespace {

bool HasProfiles(const std::string& dir) {
  std::ifstream in(dir + "/vgg16/graph.txt");
  return in.good();
}

}  // namespace

std::string ProfilesDir() {
  if (const char* env = std::getenv("APAPO_PROFILES_DIR"); env != nullptr) {
    if (HasProfiles(env)) return env;
  }
  std::vector<std::string> candidates;
  char resolved[PATH_MAX];
  if (realpath("partitioner/BUILD", resolved) != nullptr) {
    std::string path(resolved);
    // .../<repo>/partitioner/BUILD -> .../<repo>/../shared/profiles
    const std::string repo = path.substr(0, path.rfind("/partitioner/BUILD"));
    candidates.push_back(repo + "/../shared/profiles");
    candidates.push_back(repo + "/shared/profiles");
  }
  candidates.push_back("../shared/profiles");
  candidates.push_back("../../shared/profiles");
  candidates.push_back("/work/shared/profiles");
  for (const std::string& c : candidates) {
    if (HasProfiles(c)) return c;
  }
  return "";
}

std::string ProfilePath(const std::string& name) {
  return ProfilesDir() + "/" + name + "/graph.txt";
}

const std::vector<std::string>& ProfileNames() {
  static const auto* names = new std::vector<std::string>{
      "alexnet",  "vgg16",    "gnmt",        "squeezenet1_0",
      "resnet18", "resnet50", "densenet121", "inception_v3"};
  return *names;
}

}  // namespace partitioner
}  // namespace apapo
