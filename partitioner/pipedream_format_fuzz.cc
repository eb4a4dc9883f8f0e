// libFuzzer target for the graph.txt parser: any input must either parse
// into a valid graph or fail with a "FILE:LINE: reason" status, never crash.
// Built outside Bazel by fuzz/fuzz.sh (clang -fsanitize=fuzzer,address).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "partitioner/pipedream_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<apapo::partitioner::Graph> graph =
      apapo::partitioner::ParsePipeDreamGraph(text, "fuzz.txt");
  if (graph.ok()) {
    if (!graph->Validate().ok()) std::abort();  // parser let a bad graph out
    (void)graph->TopologicalOrder();
  } else if (graph.status().message().rfind("fuzz.txt:", 0) != 0) {
    std::abort();  // every error names the file and line
  }
  return 0;
}
