// The layer kinds of the model DSL (apapo::v1::LayerKind) as the graph
// library knows them: the attributes each kind accepts, and how a node's
// output shape and dtype, parameters and forward cost follow from its
// attributes and its inputs.
//
// All of it is one table in layer_kinds.cc, one entry per kind, so a new kind
// is one entry (with its inference function) there, plus its kernel in
// model_builder.cc's table; tests check that the proto enum, this table and
// the builder's table name the same kinds. Part of the torch-free
// //worker:model_graph library; AnalyzedGraph::Create is its caller.
//
// Thread-safety: free functions over an immutable table; thread-safe.

#ifndef APAPO_WORKER_LAYER_KINDS_H_
#define APAPO_WORKER_LAYER_KINDS_H_

#include <vector>

#include "absl/status/status.h"
#include "proto/apapo/v1/model.pb.h"
#include "worker/model_graph.h"

namespace apapo {
namespace worker {

// Every kind the table has an entry for, in table order.
std::vector<apapo::v1::LayerKind> GraphLayerKinds();

// Checks that the table knows `node`'s kind and that the kind accepts each of
// its attributes. Errors are INVALID_ARGUMENT naming the node (and the
// attribute).
absl::Status CheckLayerAttributes(const apapo::v1::LayerNode& node);

// Fills `info`'s out_shape, out_dtype, params, num_params and forward_ops
// from its node's attributes and its inputs, `nodes[i]` for each i in
// info.inputs (already inferred). Errors are INVALID_ARGUMENT naming the
// node; shape mismatches name the node and both shapes.
absl::Status InferLayer(const std::vector<NodeInfo>& nodes, NodeInfo& info);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_LAYER_KINDS_H_
