// Synthetic layer graphs for tests and benchmarks: long chains and random
// DAGs with PipeDream-like cost ranges. Deterministic for a given seed.
//
// Thread-safety: stateless functions, safe to call concurrently.

#ifndef APAPO_PARTITIONER_SYNTHETIC_H_
#define APAPO_PARTITIONER_SYNTHETIC_H_

#include <cstdint>

#include "partitioner/graph.h"

namespace apapo {
namespace partitioner {

// A chain of `n` layers with random costs.
Graph SyntheticChain(int n, uint64_t seed);

// A random DAG of `n` nodes: node v > 0 has 1..max_fan_in inputs chosen among
// the `window` nodes before it, so the graph is connected with one source.
Graph SyntheticDag(int n, uint64_t seed, int max_fan_in = 3, int window = 16);

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_SYNTHETIC_H_
