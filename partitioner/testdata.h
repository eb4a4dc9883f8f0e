// Test-only helper locating the real PipeDream profiles in ../shared/profiles
// (outside the Bazel workspace). Looks at $APAPO_PROFILES_DIR, then resolves
// the runfiles symlink of partitioner/BUILD back to the source tree.
//
// Thread-safety: stateless, safe to call concurrently.

#ifndef APAPO_PARTITIONER_TESTDATA_H_
#define APAPO_PARTITIONER_TESTDATA_H_

#include <string>
#include <vector>

namespace apapo {
namespace partitioner {

// Directory holding NAME/graph.txt, or "" if not found.
std::string ProfilesDir();
// ProfilesDir() + "/" + name + "/graph.txt".
std::string ProfilePath(const std::string& name);
// The eight profile names.
const std::vector<std::string>& ProfileNames();

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_TESTDATA_H_
