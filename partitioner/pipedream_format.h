// Reader for PipeDream's profile format (graph.txt), see
// ../shared/profiles/README.md:
//
//   nodeID -- description -- forward_compute_time=MS, backward_compute_time=MS,
//       activation_size=BYTES, parameter_size=BYTES [-- stage_id=K]
//   <TAB>nodeA -- nodeB
//
// activation_size may be a list "[a; b]" whose entries are summed. Times are
// converted from milliseconds to seconds. Blank lines are ignored. Every
// error is one line, "FILE:LINE: reason".
//
// Thread-safety: stateless functions, safe to call concurrently.

#ifndef APAPO_PARTITIONER_PIPEDREAM_FORMAT_H_
#define APAPO_PARTITIONER_PIPEDREAM_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "partitioner/graph.h"

namespace apapo {
namespace partitioner {

// Parses `text` (named `filename` in error messages) into a validated graph.
absl::StatusOr<Graph> ParsePipeDreamGraph(absl::string_view text,
                                          absl::string_view filename);

// Reads and parses a file.
absl::StatusOr<Graph> ReadPipeDreamGraph(const std::string& path);

// Writes a graph back in the same format (times in ms, "%.6f").
std::string FormatPipeDreamGraph(const Graph& graph);

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_PIPEDREAM_FORMAT_H_
