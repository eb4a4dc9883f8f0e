// Synthetic layer graphs for tests and benchmarks: long chains, random DAGs
// with PipeDream-like cost ranges, NASNet-style stacks of wide cells and
// random layered DAGs with wide cuts. Deterministic for a given seed.
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
// (Input v-1 is always one of them, so the DAG has a Hamiltonian spine and
// only n + 1 ideals.)
Graph SyntheticDag(int n, uint64_t seed, int max_fan_in = 3, int window = 16);

// NASNet-A-style model: an "Input" source, a stem, then `cells` cells. Cell c
// reads the outputs of cells c-1 and c-2 (the stem for the first two), squares
// each input with ReLU -> 1x1 Conv -> BatchNorm, then runs `branches`
// parallel branches (each on one of the two squared inputs, or on an earlier
// pair's sum): separable-conv chains of 8 layers (ReLU, depthwise, pointwise,
// BN, twice), poolings (1 layer) or identities (none); branches are summed in
// pairs and the sums concatenated into the cell's output. Every third cell
// is a reduction cell (activations shrink, channels grow). A classifier head
// follows. The defaults give about 900 nodes, no node through which every
// path runs, and an astronomical number of ideals.
Graph SyntheticNasNet(uint64_t seed, int cells = 15, int branches = 10);

// A random layered DAG of `n` nodes: one source, then layers of about
// `width` nodes, each node reading 1..3 nodes of the previous layer and,
// with probability 1/4, one of the layer before; every node of a layer
// feeds the next one, a final node joins the last layer. Every cut between
// layers is crossed by about `width` activations.
Graph SyntheticLayeredDag(int n, uint64_t seed, int width = 24);

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_SYNTHETIC_H_
