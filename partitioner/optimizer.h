// Pipeline planner: cuts a layer DAG into stages at augmented antichains,
// chooses replicas per stage and the workers of each replica, minimising the
// steady-state bottleneck stage time (PipeDream's formulation), level by level
// for a bandwidth hierarchy, under a per-device memory limit, with
// heterogeneous worker speeds (on one level of up to 16 workers, each
// worker's own speed in the DP: see PlanPipeline).
//
// Recurrence (symbols: states are ideals D of the DAG ordered by inclusion,
// i is a segment start, j its end, k the last cut inside it, m units of the
// current level available, y units given to the last stage):
//
//   A(i, j, m) = min over k with D_i <= D_k < D_j, 1 <= y <= m of
//                  max( A(i, k, m - y), T(k, j, y) )       A(i, i, m) = 0
//   T(k, j, y) = max( (B(k, j) + AR(P_kj, y)) / y,          stage compute
//                     2 * Out(k) / (bw * y * rho),            input transfer
//                     2 * Out(j) / (bw * y * rho) )           output transfer
//   AR(P, y)   = 4 * (y - 1) * P / (bw * y)                 PipeDream all-reduce
//
// kApapo replaces the first term by (B(k, j) + C(k, j)) / y + R(P_kj, y),
// R(P, y) = 2 (y - 1) P / y * max(1 / bw, 2 c): our replicas split each
// mini-batch and all wait for one ring all-reduce per mini-batch, which
// moves 2 (y - 1) / y of P each way, at the link's rate or at the copies'
// (RingAllReduceSeconds). With a split backward (PlannerOptions::
// split_backward) R is what the replicas wait for of it,
// max(R - W / y, R x s) (ExposedAllReduceSeconds): the weight gradients of
// the segment's last micro-batch on a replica, W(k, j) / y (taking one
// micro-batch per replica, m being chosen after the DP), hide the link's
// part, but not the copies' share s of R, which run on the replica's own
// core. And it replaces the two transfer terms by one,
// (Out(k) + Out(j)) / (bw * y * rho): links are full duplex, so each way a
// stage's link carries what it sends, the gradients of its input and its
// output's activations, while the same amount comes in the other way.
// (Measured on the lab's 100 Mbit/s tbf link: 1 MiB bursts both ways at
// once took 88 ms, as one way alone; PipeDream's 2 Out / bw is 2x that.)
//
// B(k, j) is the compute of D_j \ D_k on one worker at level 0, and at level
// l > 0 the best time of that segment on one group, A_{l-1}(k, j, n_{l-1});
// P_kj its parameter bytes; W(k, j) the weight gradients a split backward
// computes after its send (Node::weight_gradient_seconds); Out(k) the activation bytes crossing cut k; bw the
// level's bandwidth; rho the activation compression ratio; c the CPU a
// worker spends per byte it sends or receives
// (Cluster::transfer_cpu_seconds_per_byte, 0 when unmeasured) and C(k, j) =
// 2 (Out(k) + Out(j)) / rho * c what the stage's transfers take from its
// compute. A(i, j, m) uses at most m units, so it is non-increasing in m;
// with T made non-increasing in y (prefix minimum) the inner min over y is
// found by a moving crossing point, O(M) per (k, j) pair instead of
// PipeDream's O(M^2).
//
// Workers of different speeds (one level, at most 16): the units are the
// workers in an order, each at its own speed, and a segment given y units
// after m - y runs on units [m - y, m) at the pace of the slowest of them
// (its replicas split the mini-batch evenly), so T depends on m as well:
// T(k, j, y; m) = max((B(k, j) + C(k, j)) / (y v) + ..., transfers) with v
// the least speed of the run, O(M^2) per pair (a prefix past the cell's best
// ends the scan over y). The DP runs with the workers fastest first and
// slowest first, and at their mean speed (the fastest then handed the
// heaviest stages); the plan predicted fastest is kept. Each restricts a
// stage's replicas to a run of its order, so none of the three always wins:
// on the shared profiles with 2+2 and 4+4 workers at 1 and 0.5-0.6, fastest
// first won on vgg16, resnet50 and gnmt at 4, slowest first on alexnet at
// 8, the mean on gnmt at 8 and alexnet at 4.
//
// A stage count asked for (PlannerOptions::stages = C) adds a slot per
// count to every cell: A_s(i, j, m) is the best with exactly s level-0
// stages, a level-0 segment counting one and a level-l segment as many as
// the inner slot it is taken from, so
//   A_s(i, j, m) = min over k, y, s' of max(A_{s-s'}(i, k, m - y),
//                                           T_s'(k, j, y))
// with B_s'(k, j) = A_{l-1, s'}(k, j, n_{l-1}); the plan is A_C at the top.
//
// Cost models:
//   kPipeDream  bit-for-bit PipeDream's optimizer_graph_hierarchical.py: Input
//               sources and __getitem__ sinks are dropped, Out(k) sums the
//               *augmented* antichain of cut k, the first stage pays no
//               transfer terms, AR is divided by the inner fan-out only for the
//               first stage. Our value equals or beats (uses at most M
//               workers, a superset of PipeDream's states) PipeDream's.
//   kApapo      same recurrence, but Out(k) counts only the activations that
//               actually cross the cut, every stage pays its transfers and AR
//               is divided by the inner fan-out everywhere.
//
// State space: ideals reachable from the first source by adding the closure of
// a successor (a superset of PipeDream's antichain DAG). When there are more
// than `max_states` of them (inception_v3: >221k), the planner coarsens: first
// it merges in-branch chains into pieces of at most L layers (L = 2, 4, ...),
// then whole branch chains, then cuts a topological order into equal-compute
// blocks and takes the ideals of the block DAG, and when even those exceed
// twice the cap (wide graphs: NASNet-style cells, layered DAGs with wide
// cuts), only the prefixes of the block order: a chain of at most
// `max_states` states, so the search is bounded on any DAG (a graph whose
// per-layer bitsets, 3 n^2 / 8 bytes, exceed budget.max_bytes goes straight
// to the blocks). Every coarsening sets Plan::exact = false and
// Plan::search says which one was used.
//
// Budget: PlannerOptions::budget bounds one call whatever max_states says
// (states an enumeration holds, bytes of the search's tables, DP steps);
// exceeding it fails with RESOURCE_EXHAUSTED naming the limit instead of
// growing. With the default cap it binds only on an exact search
// (max_states = -1) or an explicit cap of a very wide graph.
//
// Thread-safety: PlanPipeline is reentrant (no shared state).

#ifndef APAPO_PARTITIONER_OPTIMIZER_H_
#define APAPO_PARTITIONER_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "partitioner/cluster.h"
#include "partitioner/graph.h"
#include "schedule/schedule.h"

namespace apapo {
namespace partitioner {

enum class CostModel { kPipeDream, kApapo };
absl::StatusOr<CostModel> ParseCostModel(absl::string_view name);
absl::string_view CostModelName(CostModel model);

struct PlannerOptions {
  CostModel cost_model = CostModel::kApapo;
  double activation_compression_ratio = 1.0;  // rho
  schedule::ScheduleKind schedule = schedule::ScheduleKind::kAsync;
  // Micro-batches per iteration (m). 0: a multiple of every stage's replica
  // count; for flush schedules at least 4 x stages, for 2bw enough to cover
  // the in-flight depth.
  int micro_batches = 0;
  int max_in_flight = 0;  // see schedule::ScheduleOptions
  // Bound on every stage's gradient delay, in updates (< 0: none): with the
  // plan's micro-batches it bounds the depth as
  // schedule::MaxInFlightForStaleness does (and max_in_flight, when both
  // are set, whichever is lower).
  int max_staleness = -1;
  // kAsync, kApapo cost model: a stage keeps more micro-batches in flight
  // than NOAM's depth where that hides its links' round trips. Within the
  // staleness NOAM's depth has with whole mini-batches (stage s of p
  // unreplicated: p - 1 - s updates) it always may: with m micro-batches a
  // mini-batch, m - 1 more cost no staleness. Beyond that only when this is
  // set (up to max_in_flight / max_staleness): each update more of
  // staleness costs accuracy, so the coordinator sets it only where the
  // spec sets max_staleness; otherwise a plan note names the depth it would
  // take.
  bool deepen_for_links = true;
  // kApapo: a stage after the first sends its input gradients before it
  // computes its weight gradients (ScheduleSpec.split_backward), so the
  // round trip of an upstream stage's micro-batch leaves the later
  // stages' weight gradients out (StagePlan::backward_weight_seconds).
  // And a replicated stage's all-reduce starts in buckets during its last
  // micro-batch's weight gradients, which hide its link time, not its
  // copies (StagePlan::allreduce_window_seconds, every stage).
  bool split_backward = false;
  // With split_backward: a replicated stage's all-reduce starts in parts
  // behind its last micro-batch's weight gradients (the window above);
  // false: one all-reduce after the backward, all of it waited for
  // (Plan.allreduce_after_backward).
  bool allreduce_in_backward = true;
  // kApapo, kAsync: every stage but the last predicts its weights
  // (ScheduleSpec.weight_prediction), whose update then costs
  // Graph::update_prediction_seconds more, in proportion to its parameter
  // bytes, on each replica.
  bool weight_prediction = true;
  // Exactly this many pipeline stages (0: the planner chooses). The DP then
  // keeps, per state and unit count, the best for every count up to it
  // (LevelTable::NS), and plans only with that many; a count the cuts or
  // the workers cannot give fails with INVALID_ARGUMENT naming `stages`.
  int stages = 0;
  // Exactly this many replicas of every stage (0: the planner chooses);
  // stages x replicas must not exceed the workers. Exact on one level; a
  // hierarchy is then planned as one level at its slowest link (a note says
  // so). DataParallelPlan takes the fastest this many workers.
  int replicas = 0;
  // Cap on DP states per level. 0: derived from a work budget so planning
  // stays well under a second; -1: exact (may be very slow; `budget` still
  // bounds it).
  int max_states = 0;
  // Hard limits on one PlanPipeline call; exceeding one fails it with
  // RESOURCE_EXHAUSTED naming the limit.
  struct Budget {
    // States one enumeration of ideals may hold.
    int64_t max_states = int64_t{2} << 20;
    // Bytes of the state sets, subset lists and DP tables (estimated from
    // their element counts before they are allocated).
    int64_t max_bytes = int64_t{2} << 30;
    // DP steps: one per (segment, last cut, unit count) candidate examined,
    // a few nanoseconds each.
    int64_t max_dp_steps = int64_t{20'000'000'000};
  } budget;
  // Samples per mini-batch, only to express throughput in samples/s.
  double batch_size = 1;
};

struct StagePlan {
  std::vector<int> nodes;    // graph node indices, in topological order
  int replicas = 1;
  std::vector<int> workers;  // worker index per replica
  double compute_seconds = 0;    // per mini-batch, after replicas and speed
  // Of which: one pass's CPU for the stage's transfers (sends and receives
  // of one direction; charged to forward and to backward), per mini-batch
  // on one replica; see Cluster::transfer_cpu_seconds_per_byte.
  double transfer_cpu_seconds = 0;
  // Per mini-batch: the ring all-reduce's part that the stage waits for
  // (ExposedAllReduceSeconds with allreduce_window_seconds).
  double allreduce_seconds = 0;
  // kApapo with a split backward: what hides the all-reduce's link time, on
  // one speed-1 replica: the weight gradients of one micro-batch (the sum
  // of Node::weight_gradient_seconds, per micro-batch, at its rows' cost),
  // which a replica's last backward before the all-reduce computes while
  // the all-reduce of the parameters finished before them starts in
  // buckets. 0: nothing hidden (PipeDream, or no split backward).
  double allreduce_window_seconds = 0;
  // Transfers per mini-batch: kApapo each way of the stage's link (input
  // gradients + output activations), kPipeDream max(input, output) x 2.
  double comm_seconds = 0;
  double time_seconds = 0;       // max(compute + allreduce, comm)
  double parameter_bytes = 0;
  double activation_bytes = 0;   // per micro-batch held for backward
  // Per micro-batch (1/m of the profile's per mini-batch figures) on one
  // speed-1 worker, unreplicated (simulator inputs).
  double forward_seconds = 0;
  double backward_seconds = 0;
  // Of backward_seconds: what runs after the input gradients are sent
  // (PlannerOptions::split_backward; 0 on the first stage and without it):
  // half the backward of the stage's nodes whose weight gradients follow
  // the send (Node::weights_after_send: a Linear's or a convolution's
  // weight gradient is one product the size of its input gradient's) plus
  // the adds of the micro-batches' gradients.
  double backward_weight_seconds = 0;
  // The stage's share of the optimizer update (Graph::update_seconds, in
  // proportion to its parameters; kApapo only), per mini-batch on one
  // speed-1 worker: every replica runs all of it, at its kUpdate, and
  // backward_seconds leaves it out.
  double update_seconds = 0;
  // A replica's adds of its later micro-batches' gradients into the
  // first's (Graph::accumulate_seconds_per_byte; kApapo only), per
  // mini-batch on one speed-1 worker: counted in compute_seconds and, per
  // micro-batch, in backward_seconds. With split_backward, over the
  // parameters of the nodes not Node::weights_in_product only.
  double accumulate_seconds = 0;
  double output_bytes = 0;       // activations sent to the next stage
  double output_bandwidth = 0;   // bytes/s of the link to the next stage
  double output_burst_bytes = 0;  // that link's Level::burst_bytes
  double allreduce_bandwidth = 0;  // bytes/s of the replicas' slowest link
  int weight_versions = 1;
  int in_flight = 1;
  // kAsync: the in-flight depth chosen for the stage when deeper than the
  // schedule's default (0: the default); see ScheduleOptions.
  int in_flight_depth = 0;
  int64_t staleness = 0;
  double peak_memory_bytes = 0;
};

struct Plan {
  std::vector<StagePlan> stages;
  schedule::ScheduleKind schedule = schedule::ScheduleKind::kAsync;
  CostModel cost_model = CostModel::kApapo;
  int micro_batches = 1;
  int num_workers = 0;  // workers used
  // The DP's bottleneck stage time (seconds per mini-batch in steady state).
  double bottleneck_seconds = 0;
  // Seconds per mini-batch including the schedule's bubble.
  double seconds_per_mini_batch = 0;
  double mini_batches_per_second = 0;
  double samples_per_second = 0;
  double bubble_fraction = 0;
  double single_worker_seconds = 0;  // everything on one speed-1 worker
  // kAsync: whether a stage's in-flight depth, not its time, sets the pace
  // (its micro-batches in flight do not cover their transfers' round trips:
  // the staleness bound or memory kept it shallower).
  bool depth_bound = false;
  // Search statistics.
  int num_states = 0;     // DP states at the final level
  bool exact = true;      // false if the state space was coarsened
  std::string search;     // how the state space was built
  int64_t states_enumerated = 0;  // ideals visited, all attempts together
  int64_t search_bytes = 0;  // state sets + subset lists + DP tables (est.)
  int64_t dp_steps = 0;      // see PlannerOptions::Budget::max_dp_steps
  std::vector<std::string> notes;
};

// Workers of different speeds on one level of at most this many enter the
// DP each at its own speed (PlanPipeline); otherwise at their mean speed,
// the fastest then handed the heaviest stages.
inline constexpr int kMaxWorkersEachAtItsSpeed = 16;

// Plans `graph` (validated) on `cluster`. Fails with INVALID_ARGUMENT on bad
// options and RESOURCE_EXHAUSTED when no plan fits in memory or the search
// would exceed options.budget (the message says what does not fit).
absl::StatusOr<Plan> PlanPipeline(const Graph& graph, const Cluster& cluster,
                                  const PlannerOptions& options);

// Whether a plan under `options` has its stages but the last predict
// their weights, charged Graph::update_prediction_seconds
// (PlannerOptions::weight_prediction; kApapo, kAsync only); Plan.
// weight_prediction records it.
bool PredictsWeights(const PlannerOptions& options);

// Whether any stage of `plan` has more than one replica (an all-reduce to
// run: Plan.allreduce_after_backward says how).
bool Replicated(const Plan& plan);

// The data-parallel plan (one stage, every worker a replica, or the
// options.replicas fastest) under the same cost model, for comparisons.
absl::StatusOr<Plan> DataParallelPlan(const Graph& graph,
                                      const Cluster& cluster,
                                      const PlannerOptions& options);

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_OPTIMIZER_H_
