#include "partitioner/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace apapo {
namespace partitioner {

absl::StatusOr<CostModel> ParseCostModel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "pipedream") return CostModel::kPipeDream;
  if (lower == "apapo") return CostModel::kApapo;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown cost model '", name, "' (expected pipedream or apapo)"));
}

absl::string_view CostModelName(CostModel model) {
  return model == CostModel::kPipeDream ? "pipedream" : "apapo";
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using Bits = std::vector<uint64_t>;

inline bool Test(const Bits& b, int i) { return (b[i >> 6] >> (i & 63)) & 1; }
inline void Set(Bits* b, int i) { (*b)[i >> 6] |= uint64_t{1} << (i & 63); }
inline bool SubsetOf(const Bits& a, const Bits& b) {
  for (size_t w = 0; w < a.size(); ++w) {
    if (a[w] & ~b[w]) return false;
  }
  return true;
}

struct BitsHash {
  size_t operator()(const Bits& b) const {
    return absl::HashOf(absl::MakeConstSpan(b.data(), b.size()));
  }
};

// The graph the DP works on: the input minus the nodes PipeDream's optimizer
// drops (Input* sources, then __getitem__ sinks), which are re-attached to the
// first stage / their producer's stage afterwards.
struct WorkGraph {
  int n = 0;
  std::vector<int> original;            // work index -> graph index
  std::vector<int> work_of;             // graph index -> work index or -1
  std::vector<std::vector<int>> succ, pred;
  std::vector<int> topo;                // work indices
  std::vector<double> compute, params, acts;
  std::vector<double> weight_gradients;  // Node::weight_gradient_seconds
  std::vector<double> backward;          // Node::backward_seconds
  std::vector<double> hooked_params;  // Graph::PassOneProductBytes
  std::vector<double> cut;  // Node::cut_bytes: what a cut after it sends
};

// `rho`: the wire's compression ratio (Node::cut_bytes).
WorkGraph BuildWorkGraph(const Graph& graph, double rho) {
  const int n = graph.num_nodes();
  std::vector<bool> removed(n, false);
  int removed_count = 0;
  for (int v = 0; v < n; ++v) {
    if (graph.predecessors(v).empty() &&
        absl::StartsWith(graph.node(v).description, "Input")) {
      removed[v] = true;
      ++removed_count;
    }
  }
  // Sinks of the graph after the inputs are gone.
  for (int v = 0; v < n; ++v) {
    if (removed[v] || !graph.successors(v).empty()) continue;
    if (absl::StartsWith(graph.node(v).description, "__getitem__")) {
      removed[v] = true;
      ++removed_count;
    }
  }
  if (removed_count == n) std::fill(removed.begin(), removed.end(), false);
  WorkGraph w;
  w.work_of.assign(n, -1);
  for (int v = 0; v < n; ++v) {
    if (removed[v]) continue;
    w.work_of[v] = w.n++;
    w.original.push_back(v);
    const Node& node = graph.node(v);
    w.compute.push_back(node.compute_seconds());
    w.weight_gradients.push_back(node.weight_gradient_seconds());
    w.backward.push_back(node.backward_seconds);
    w.params.push_back(node.parameter_bytes);
    w.acts.push_back(node.activation_bytes);
    w.cut.push_back(node.cut_bytes(rho));
  }
  w.succ.resize(w.n);
  w.pred.resize(w.n);
  for (const Edge& e : graph.edges()) {
    const int a = w.work_of[e.from], b = w.work_of[e.to];
    if (a < 0 || b < 0) continue;
    w.succ[a].push_back(b);
    w.pred[b].push_back(a);
  }
  std::vector<int> indegree(w.n);
  for (int v = 0; v < w.n; ++v) indegree[v] = w.pred[v].size();
  for (int v = 0; v < w.n; ++v) {
    if (indegree[v] == 0) w.topo.push_back(v);
  }
  for (size_t h = 0; h < w.topo.size(); ++h) {
    for (int s : w.succ[w.topo[h]]) {
      if (--indegree[s] == 0) w.topo.push_back(s);
    }
  }
  const std::vector<double> hooked = graph.PassOneProductBytes();
  for (int v : w.original) w.hooked_params.push_back(hooked[v]);
  return w;
}

// Ancestor bitsets (strict) over work nodes.
std::vector<Bits> Ancestors(const WorkGraph& w) {
  const int words = (w.n + 63) / 64;
  std::vector<Bits> anc(w.n, Bits(words, 0));
  for (int v : w.topo) {
    for (int p : w.pred[v]) {
      for (int i = 0; i < words; ++i) anc[v][i] |= anc[p][i];
      Set(&anc[v], p);
    }
  }
  return anc;
}

// Counts what one PlanPipeline call uses against PlannerOptions::budget.
class SearchBudget {
 public:
  explicit SearchBudget(const PlannerOptions::Budget& limits)
      : limits_(limits) {}

  // States an enumeration over sets of `words` words may hold: the state
  // list and the hash set each keep a copy (vector header + words), plus the
  // set's slot.
  int64_t StateLimit(int words) const {
    const int64_t per_state = 2 * (24 + 8 * int64_t{words}) + 16;
    return std::max<int64_t>(
        1, std::min(limits_.max_states, limits_.max_bytes / per_state));
  }

  // The error for an enumeration that needed more than StateLimit(words).
  absl::Status StatesExceeded(int words, const std::string& what) const {
    const int64_t limit = StateLimit(words);
    const bool by_states = limit == limits_.max_states;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "planner budget exceeded: %s needs more than %d DP states (budget: "
        "%s); plan with the default state cap (max_states 0), which "
        "coarsens the graph",
        what, limit,
        by_states ? absl::StrFormat("max_states %d", limits_.max_states)
                  : absl::StrFormat("max_bytes %d at %d B per state",
                                    limits_.max_bytes,
                                    limits_.max_bytes / limit)));
  }

  // Charges `bytes` of `what` before it is allocated.
  absl::Status ChargeBytes(double bytes, absl::string_view what) {
    if (bytes_ + bytes > static_cast<double>(limits_.max_bytes)) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "planner budget exceeded: %s need %.4g B, with %d B already in use "
          "over the budget of max_bytes %d",
          what, bytes, bytes_, limits_.max_bytes));
    }
    bytes_ += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }

  // Charges DP steps; false once over the budget.
  bool ChargeSteps(int64_t steps) {
    steps_ += steps;
    return steps_ <= limits_.max_dp_steps;
  }
  // `level` -1: while listing the states' subsets, before any level.
  absl::Status StepsExceeded(int level) const {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "planner budget exceeded: the DP took more than max_dp_steps %d "
        "steps (%s); use fewer states (max_states) or fewer workers per "
        "level",
        limits_.max_dp_steps,
        level < 0 ? std::string("listing subsets of states")
                  : absl::StrCat("at level ", level)));
  }

  int64_t max_bytes() const { return limits_.max_bytes; }
  int64_t* enumerated() { return &enumerated_; }
  int64_t enumerated_states() const { return enumerated_; }
  int64_t bytes() const { return bytes_; }
  int64_t steps() const { return steps_; }

 private:
  PlannerOptions::Budget limits_;
  int64_t enumerated_ = 0;
  int64_t bytes_ = 0;
  int64_t steps_ = 0;
};

// A coarsening of the work graph: units are groups of work nodes whose
// quotient is a DAG; DP states are ideals of the quotient.
struct Units {
  int n = 0;
  std::vector<int> unit_of;                 // work node -> unit
  std::vector<std::vector<int>> members;    // unit -> work nodes
  std::vector<std::vector<int>> succ, pred;
  std::vector<int> topo;
  int first = 0;  // unit holding the first source (file order)
};

Units MakeUnits(const WorkGraph& w, std::vector<int> unit_of) {
  Units u;
  u.unit_of = std::move(unit_of);
  u.n = 0;
  for (int x : u.unit_of) u.n = std::max(u.n, x + 1);
  u.members.resize(u.n);
  for (int v : w.topo) u.members[u.unit_of[v]].push_back(v);
  u.succ.resize(u.n);
  u.pred.resize(u.n);
  absl::flat_hash_set<std::pair<int, int>> seen;
  for (int v = 0; v < w.n; ++v) {
    for (int s : w.succ[v]) {
      const int a = u.unit_of[v], b = u.unit_of[s];
      if (a != b && seen.insert({a, b}).second) {
        u.succ[a].push_back(b);
        u.pred[b].push_back(a);
      }
    }
  }
  std::vector<int> indegree(u.n);
  for (int x = 0; x < u.n; ++x) indegree[x] = u.pred[x].size();
  for (int x = 0; x < u.n; ++x) {
    if (indegree[x] == 0) u.topo.push_back(x);
  }
  for (size_t h = 0; h < u.topo.size(); ++h) {
    for (int s : u.succ[u.topo[h]]) {
      if (--indegree[s] == 0) u.topo.push_back(s);
    }
  }
  int first_source = 0;
  for (int v = 0; v < w.n; ++v) {
    if (w.pred[v].empty()) {
      first_source = v;
      break;
    }
  }
  u.first = u.unit_of[first_source];
  return u;
}

// Enumerates ideals of the unit DAG reachable from {} by adding the closure of
// the first source, then of any successor of the current ideal. Returns false
// as soon as more than `cap` states exist (cap < 0: unlimited, only for
// graphs known to be small). Adds the states visited to `*enumerated`.
bool EnumerateIdeals(const Units& u, int64_t cap, std::vector<Bits>* out,
                     int64_t* enumerated = nullptr) {
  const int words = (u.n + 63) / 64;
  std::vector<Bits> closure(u.n, Bits(words, 0));  // ancestors + self
  for (int x : u.topo) {
    for (int p : u.pred[x]) {
      for (int i = 0; i < words; ++i) closure[x][i] |= closure[p][i];
    }
    Set(&closure[x], x);
  }
  absl::flat_hash_set<Bits, BitsHash> seen;
  std::vector<Bits> states;
  Bits empty(words, 0);
  states.push_back(empty);
  seen.insert(empty);
  Bits full(words, 0);
  for (int x = 0; x < u.n; ++x) Set(&full, x);
  std::vector<int> stamp(u.n, -1);
  for (size_t h = 0; h < states.size(); ++h) {
    const Bits current = states[h];
    std::vector<int> candidates;
    if (h == 0) {
      candidates.push_back(u.first);
    } else {
      for (int x = 0; x < u.n; ++x) {
        if (!Test(current, x)) continue;
        for (int s : u.succ[x]) {
          if (!Test(current, s) && stamp[s] != static_cast<int>(h)) {
            stamp[s] = h;
            candidates.push_back(s);
          }
        }
      }
    }
    for (int s : candidates) {
      Bits next = current;
      for (int i = 0; i < words; ++i) next[i] |= closure[s][i];
      if (seen.insert(next).second) {
        states.push_back(std::move(next));
        if (enumerated != nullptr) ++*enumerated;
        if (cap >= 0 && static_cast<int64_t>(states.size()) > cap) return false;
      }
    }
  }
  if (seen.insert(full).second) states.push_back(full);
  if (cap >= 0 && static_cast<int64_t>(states.size()) > cap) return false;
  *out = std::move(states);
  return true;
}

// Nodes comparable with every other node: cuts right after them are clean
// and they are never merged away.
std::vector<bool> TrunkNodes(const WorkGraph& w, const std::vector<Bits>& anc) {
  // Descendant bitsets in reverse topological order, then popcounts.
  const int words = (w.n + 63) / 64;
  std::vector<Bits> desc(w.n, Bits(words, 0));
  for (auto it = w.topo.rbegin(); it != w.topo.rend(); ++it) {
    const int v = *it;
    for (int s : w.succ[v]) {
      for (int i = 0; i < words; ++i) desc[v][i] |= desc[s][i];
      Set(&desc[v], s);
    }
  }
  std::vector<bool> trunk(w.n);
  for (int v = 0; v < w.n; ++v) {
    int related = 0;
    for (int i = 0; i < words; ++i) {
      related += __builtin_popcountll(anc[v][i] | desc[v][i]);
    }
    trunk[v] = related + 1 == w.n;
  }
  return trunk;
}

// Merges in-branch chain links (u -> v with out(u) = in(v) = 1, not both on
// the trunk) into pieces of at most `max_piece` nodes.
std::vector<int> MergeBranchChains(const WorkGraph& w,
                                   const std::vector<bool>& trunk,
                                   int max_piece) {
  std::vector<int> unit(w.n, -1);
  std::vector<int> piece_size;
  int next = 0;
  for (int v : w.topo) {
    if (w.pred[v].size() == 1) {
      const int p = w.pred[v][0];
      if (w.succ[p].size() == 1 && !(trunk[p] && trunk[v]) &&
          piece_size[unit[p]] < max_piece) {
        unit[v] = unit[p];
        ++piece_size[unit[v]];
        continue;
      }
    }
    unit[v] = next++;
    piece_size.push_back(1);
  }
  return unit;
}

// Cuts a topological order into at most `blocks` equal-compute blocks.
std::vector<int> TopologicalBlocks(const WorkGraph& w, int blocks) {
  double total = 0;
  for (double c : w.compute) total += c;
  const int n = w.n;
  blocks = std::max(1, std::min(blocks, n));
  std::vector<int> unit(n, 0);
  double done = 0;
  int last = -1, dense = -1;
  for (int idx = 0; idx < n; ++idx) {
    const int v = w.topo[idx];
    const int b =
        total > 0
            ? std::min(blocks - 1, static_cast<int>(done / total * blocks))
            : static_cast<int>(static_cast<int64_t>(idx) * blocks / n);
    if (b != last) {
      last = b;
      ++dense;
    }
    unit[v] = dense;
    done += w.compute[v];
  }
  return unit;
}

// Per-state quantities, evaluated on work nodes (so exact for each cut
// whatever coarsening produced the state).
struct States {
  Units units;
  std::vector<Bits> sets;  // over units, sorted by size, [0] = {}, back = all
  std::vector<double> compute, params, acts, out;
  // Node::weight_gradient_seconds summed over the state, like compute, and
  // so are Node::backward_seconds and WorkGraph::hooked_params.
  std::vector<double> weight_gradients, backward, hooked_params;
  // What the cut's values take whole (out counts a ReLU's nonzeros only):
  // its copies' CPU, since packing and unpacking touch every value.
  std::vector<double> out_whole;
  int full = 0;
  std::string search;
  bool exact = true;
};

class OutActivation {
 public:
  // Sums `bytes` (per work node: WorkGraph::cut or ::acts) over a cut.
  OutActivation(const WorkGraph& w, CostModel model, const std::vector<double>& bytes)
      : w_(w), bytes_(bytes), model_(model) {
    in_.assign(w.n, 0);
    stamp_.assign(w.n, 0);
    if (model == CostModel::kPipeDream) extra_.resize(w.n);
  }

  // Activation bytes the cut after ideal `in` (a 0/1 vector) must send.
  double operator()(const std::vector<char>& in) {
    double total = 0;
    if (model_ == CostModel::kApapo) {
      for (int v = 0; v < w_.n; ++v) {
        if (!in[v]) continue;
        for (int s : w_.succ[v]) {
          if (!in[s]) {
            total += bytes_[v];
            break;
          }
        }
      }
      return total;
    }
    // PipeDream: the augmented antichain = maximal nodes a of the ideal plus
    // every ancestor p of a with an out-edge leaving anc(a) + {a}.
    ++epoch_;
    for (int a = 0; a < w_.n; ++a) {
      if (!in[a]) continue;
      bool maximal = true;
      for (int s : w_.succ[a]) {
        if (in[s]) {
          maximal = false;
          break;
        }
      }
      if (!maximal) continue;
      if (stamp_[a] != epoch_) {
        stamp_[a] = epoch_;
        total += bytes_[a];
      }
      for (int p : Extra(a)) {
        if (stamp_[p] != epoch_) {
          stamp_[p] = epoch_;
          total += bytes_[p];
        }
      }
    }
    return total;
  }

 private:
  const std::vector<int>& Extra(int a) {
    if (computed_.empty()) computed_.assign(w_.n, false);
    if (computed_[a]) return extra_[a];
    computed_[a] = true;
    // anc(a) by DFS.
    std::vector<int> stack = {a};
    std::vector<int> ancestors;
    ++epoch_anc_;
    if (mark_.empty()) mark_.assign(w_.n, 0);
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      for (int p : w_.pred[v]) {
        if (mark_[p] != epoch_anc_) {
          mark_[p] = epoch_anc_;
          ancestors.push_back(p);
          stack.push_back(p);
        }
      }
    }
    for (int p : ancestors) {
      for (int o : w_.succ[p]) {
        if (o != a && mark_[o] != epoch_anc_) {
          extra_[a].push_back(p);
          break;
        }
      }
    }
    return extra_[a];
  }

  const WorkGraph& w_;
  const std::vector<double>& bytes_;
  CostModel model_;
  std::vector<char> in_;
  std::vector<int> stamp_;
  int epoch_ = 0;
  std::vector<std::vector<int>> extra_;
  std::vector<bool> computed_;
  std::vector<int> mark_;
  int epoch_anc_ = 0;
};

States BuildStates(const WorkGraph& w, const Units& units,
                   std::vector<Bits> sets, CostModel model) {
  States st;
  st.units = units;
  // Sort by number of work nodes (then keep enumeration order).
  std::vector<int> size(sets.size(), 0);
  for (size_t s = 0; s < sets.size(); ++s) {
    for (int x = 0; x < units.n; ++x) {
      if (Test(sets[s], x)) size[s] += units.members[x].size();
    }
  }
  std::vector<int> order(sets.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return size[a] < size[b]; });
  OutActivation out(w, model, w.cut);
  // Without a ReLU share every cut's whole is its out: not summed twice.
  const bool skipping = w.cut != w.acts;
  OutActivation whole(w, model, w.acts);
  std::vector<char> in(w.n);
  for (int s : order) {
    std::fill(in.begin(), in.end(), 0);
    double c = 0, p = 0, a = 0, g = 0, b = 0, h = 0;
    for (int x = 0; x < units.n; ++x) {
      if (!Test(sets[s], x)) continue;
      for (int v : units.members[x]) {
        in[v] = 1;
        c += w.compute[v];
        g += w.weight_gradients[v];
        b += w.backward[v];
        h += w.hooked_params[v];
        p += w.params[v];
        a += w.acts[v];
      }
    }
    st.compute.push_back(c);
    st.weight_gradients.push_back(g);
    st.backward.push_back(b);
    st.hooked_params.push_back(h);
    st.params.push_back(p);
    st.acts.push_back(a);
    st.out.push_back(out(in));
    st.out_whole.push_back(skipping ? whole(in) : st.out.back());
    st.sets.push_back(std::move(sets[s]));
  }
  st.full = st.sets.size() - 1;
  return st;
}

// Prefixes of the unit order as states: {}, {0}, {0, 1}, ..., all units.
// Right for units that are contiguous ranges of a topological order, numbered
// along it (TopologicalBlocks): every prefix is then an ideal.
std::vector<Bits> UnitPrefixes(const Units& u) {
  const int words = (u.n + 63) / 64;
  std::vector<Bits> sets;
  Bits prefix(words, 0);
  sets.push_back(prefix);
  for (int x = 0; x < u.n; ++x) {
    Set(&prefix, x);
    sets.push_back(prefix);
  }
  return sets;
}

// Branch chains merged into pieces of 2, 4, ... layers, then whole: the
// first whose ideals fit `cap`, if any.
std::optional<States> MergedBranchChainStates(const WorkGraph& w,
                                              CostModel model, int64_t cap,
                                              SearchBudget* budget) {
  const std::vector<Bits> anc = Ancestors(w);
  const std::vector<bool> trunk = TrunkNodes(w, anc);
  std::vector<Bits> sets;
  int previous_units = w.n;
  for (int piece = 2;; piece *= 2) {
    const bool whole = piece >= w.n;
    Units units =
        MakeUnits(w, MergeBranchChains(w, trunk, whole ? w.n : piece));
    if (units.n < previous_units &&
        EnumerateIdeals(units, cap, &sets, budget->enumerated())) {
      States st = BuildStates(w, units, std::move(sets), model);
      st.exact = false;
      st.search = absl::StrCat("branch chains merged into pieces of <= ",
                               whole ? w.n : piece, " layers: ",
                               st.sets.size(), " ideals");
      return st;
    }
    previous_units = std::min(previous_units, units.n);
    if (whole) return std::nullopt;
  }
}

// Builds the state family under `cap` (see the header). cap < 0: exact.
absl::StatusOr<States> MakeStates(const WorkGraph& w, CostModel model,
                                  int64_t cap, SearchBudget* budget) {
  std::vector<int> identity(w.n);
  std::iota(identity.begin(), identity.end(), 0);
  Units units = MakeUnits(w, identity);
  std::vector<Bits> sets;
  const int words = (w.n + 63) / 64;
  // The searches over single layers hold a bitset over the layers per layer
  // (the enumeration's closures, the chain merging's ancestors and
  // descendants): quadratic in the graph, so a huge graph goes straight to
  // topological blocks.
  const double per_layer_bytes = 3.0 * w.n * words * sizeof(uint64_t);
  if (per_layer_bytes > budget->max_bytes()) {
    if (cap < 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "planner budget exceeded: the exact search (max_states -1) of %d "
          "layers needs %.4g B of per-layer bitsets, over max_bytes %d",
          w.n, per_layer_bytes, budget->max_bytes()));
    }
  } else {
    const int64_t limit = budget->StateLimit(words);
    const int64_t first_cap = cap < 0 ? limit : std::min(cap, limit);
    if (EnumerateIdeals(units, first_cap, &sets, budget->enumerated())) {
      States st = BuildStates(w, units, std::move(sets), model);
      st.search = absl::StrCat("exact: ", st.sets.size(), " ideals");
      return st;
    }
    if (cap < 0 || cap > limit) {
      return budget->StatesExceeded(
          words, cap < 0 ? std::string("the exact search (max_states -1)")
                         : absl::StrCat("max_states ", cap));
    }
    if (std::optional<States> merged =
            MergedBranchChainStates(w, model, cap, budget)) {
      return *std::move(merged);
    }
  }
  const int blocks = static_cast<int>(std::max<int64_t>(1, cap - 2));
  units = MakeUnits(w, TopologicalBlocks(w, blocks));
  sets.clear();
  // The block DAG's ideals may exceed the cap a little (inception_v3 on two
  // levels: 290 for a cap of 246), which is accepted up to twice the cap; a
  // wide graph's block DAG has as many ideals as the graph (NASNet-style
  // cells: astronomically many), and then only the prefixes of the block
  // order are states.
  const int64_t block_cap =
      std::min<int64_t>(2 * cap, budget->StateLimit((units.n + 63) / 64));
  const bool block_dag =
      EnumerateIdeals(units, block_cap, &sets, budget->enumerated());
  const int block_units = units.n;
  if (!block_dag) {
    // Prefixes at every layer when they fit the cap, at block ends otherwise.
    if (w.n + 1 <= cap) {
      std::vector<int> position(w.n);
      for (int idx = 0; idx < w.n; ++idx) position[w.topo[idx]] = idx;
      units = MakeUnits(w, position);
    }
    sets = UnitPrefixes(units);
    *budget->enumerated() += sets.size();
  }
  States st = BuildStates(w, units, std::move(sets), model);
  st.exact = false;
  st.search =
      block_dag
          ? absl::StrCat("topological order in ", units.n,
                         " equal-compute blocks: ", st.sets.size(), " states")
          : absl::StrCat("prefixes of a topological order ",
                         units.n == block_units
                             ? absl::StrCat("at the ends of ", block_units,
                                            " equal-compute blocks")
                             : std::string("at every layer"),
                         ": ", st.sets.size(), " states (the DAG of ",
                         block_units, " equal-compute blocks has more than ",
                         block_cap, " ideals)");
  return st;
}

// One level's DP tables: for each start state i in `starts`, value and choice
// for every end j, stage-count slot s and unit count m in [0, M].
struct LevelTable {
  int S = 0;
  int M = 0;
  // Stage-count slots: 1 when the planner chooses the count (slot 0: any
  // number of stages); with a count C asked for, C + 1 (slot s: exactly s
  // level-0 stages).
  int NS = 1;
  std::vector<int> start_index;  // state -> row, or -1
  std::vector<double> value;     // [row][j][s][m]
  std::vector<int> choice_k;     // last cut (== start: single stage)
  std::vector<int> choice_y;     // units of the last stage
  std::vector<int> choice_s;     // its level-0 stages (only when NS > 1)
  size_t At(int row, int j, int m, int s = 0) const {
    return ((static_cast<size_t>(row) * S + j) * NS + s) * (M + 1) + m;
  }
  double Value(int start, int j, int m, int s = 0) const {
    return value[At(start_index[start], j, m, s)];
  }
};

struct LevelContext {
  const States* st;
  CostModel model;
  double rho;
  double bandwidth;
  int level = 0;             // l: replicas here span it (its all-reduce factor)
  int inner_fanout;          // n_{l-1} (1 at level 0)
  const LevelTable* inner;   // nullptr at level 0
  double speed;              // level-0 compute speed
  // One level with workers of different speeds: unit u's speed, fastest
  // first (the DP's units are the workers in that order). A segment given
  // y units after m - y before it runs on units [m - y, m): its replicas
  // split each mini-batch evenly, so the slowest of them, unit m - 1, sets
  // its pace. nullptr: every unit at `speed`.
  const std::vector<double>* unit_speeds = nullptr;
  // CPU seconds per byte sent or received (kApapo only; 0 otherwise), at
  // the size of each message (cluster->TransferCpuPerByte).
  double transfer_cpu = 0;
  const Cluster* cluster = nullptr;
  // kApapo with a split backward: a segment's last micro-batch's weight
  // gradients hide its all-reduce's link time (ExposedAllReduceSeconds).
  bool hide_allreduce = false;
  // Graph::update_seconds over all the parameters' bytes (kApapo only): a
  // segment's update is this times its parameter bytes. Charged at level
  // 0, where a stage's replicas are single workers, each of which runs
  // the whole update (outer levels take the inner level's times as they
  // are).
  double update_per_param_byte = 0;
  // Graph::update_prediction_seconds over all the parameters' bytes where
  // the stages predict their weights (PlannerOptions::weight_prediction),
  // else 0: charged like the update, undivided on each replica, to a
  // segment that does not end the model (the last stage's gradients are
  // not delayed, so it does not predict).
  double prediction_per_param_byte = 0;
  // Memory (level 0 only).
  double memory = 0;
  int total_workers = 1;
  bool single_level = true;
  schedule::ScheduleKind kind = schedule::ScheduleKind::kAsync;
  // LevelTable::NS: 1, or the stage count asked for + 1.
  int stage_slots = 1;
  // Replicas every stage must have (0: any); one level only.
  int replicas = 0;
};

// Memory of a stage holding `params`/`acts` with y replicas and `depth`
// micro-batches in flight under the schedule.
double StageMemory(schedule::ScheduleKind kind, double params, double acts,
                   int depth) {
  int versions = 1;
  if (kind == schedule::ScheduleKind::kAsync) versions = depth;
  if (kind == schedule::ScheduleKind::k2BW) versions = 2;
  return versions * params + depth * acts;
}

absl::StatusOr<std::vector<std::vector<int>>> ProperSubsets(
    const States& st, SearchBudget* budget) {
  // States are sorted by size, so only earlier states can be proper subsets.
  const int S = st.sets.size();
  std::vector<int> size(S, 0);
  for (int j = 0; j < S; ++j) {
    for (uint64_t x : st.sets[j]) size[j] += __builtin_popcountll(x);
  }
  std::vector<std::vector<int>> sub(S);
  for (int j = 0; j < S; ++j) {
    for (int k = 0; k < j; ++k) {
      if (size[k] < size[j] && SubsetOf(st.sets[k], st.sets[j])) {
        sub[j].push_back(k);
      }
    }
    // Charged per state, so the lists never outgrow the budget by more than
    // one state's; the subset tests count as DP steps.
    if (!budget->ChargeSteps(j)) return budget->StepsExceeded(-1);
    if (absl::Status s = budget->ChargeBytes(24.0 + 4.0 * sub[j].size(),
                                             "the DP's subset lists");
        !s.ok()) {
      return s;
    }
  }
  return sub;
}

// Solves one level for the given start states.
//
// With a stage count asked for (ctx.stage_slots = C + 1 > 1), slot s of
// A(i, j, m) holds the best with exactly s level-0 stages: a level-0 segment
// is one stage; a level-l segment (k, j) is as many as the inner table's
// slot it is taken from, B_s'(k, j) = A_{l-1}(k, j, n_{l-1}, s'), and
// A_s(i, j, m) = min over k, y, s' of max(A_{s-s'}(i, k, m - y), T_s'(k, j, y)).
// Slot 0 (the planner's choice) runs exactly the recurrence of the header.
absl::StatusOr<LevelTable> SolveLevel(const LevelContext& ctx, int M,
                                      const std::vector<int>& starts,
                                      const std::vector<std::vector<int>>& sub,
                                      int level, SearchBudget* budget) {
  const States& st = *ctx.st;
  const int S = st.sets.size();
  const int NS = ctx.stage_slots;
  const bool counted = NS > 1;
  LevelTable t;
  t.S = S;
  t.M = M;
  t.NS = NS;
  // value, choice_k and choice_y (and choice_s) per cell.
  const double cell_bytes =
      sizeof(double) + (counted ? 3 : 2) * sizeof(int);
  if (absl::Status s = budget->ChargeBytes(
          static_cast<double>(starts.size()) * S * NS * (M + 1) * cell_bytes,
          absl::StrFormat("the level-%d DP table (%d starts x %d states x %d "
                          "stage counts x %d unit counts)",
                          level, starts.size(), S, NS, M + 1));
      !s.ok()) {
    return s;
  }
  t.start_index.assign(S, -1);
  for (size_t r = 0; r < starts.size(); ++r) t.start_index[starts[r]] = r;
  const size_t cells = starts.size() * static_cast<size_t>(S) * NS * (M + 1);
  t.value.assign(cells, kInf);
  t.choice_k.assign(cells, -1);
  t.choice_y.assign(cells, 0);
  if (counted) t.choice_s.assign(cells, 0);
  // The stage counts a segment (k, j) of this level may stand for: any
  // (slot 0); one stage at level 0; 1..C at the levels above.
  const int inner_lo = counted ? 1 : 0;
  const int inner_hi = !counted ? 0 : (ctx.inner == nullptr ? 1 : NS - 1);

  std::vector<double> tv(M + 1), tmin(M + 1), inv(M + 1), frac4(M + 1),
      ring(M + 1), pv(M + 1), qv(M + 1), rv(M + 1), av(M + 1), wv(M + 1);
  std::vector<int> targ(M + 1);
  for (int y = 1; y <= M; ++y) {
    inv[y] = 1.0 / y;
    frac4[y] = 4.0 * (y - 1) / y;
    ring[y] = 2.0 * (y - 1) / y;
  }
  std::vector<char> is_super(S);
  std::vector<double*> best_row(NS);
  std::vector<int*> bk_row(NS), by_row(NS), bs_row(NS);
  for (size_t r = 0; r < starts.size(); ++r) {
    const int i = starts[r];
    for (int k = 0; k < S; ++k) {
      is_super[k] = k == i || SubsetOf(st.sets[i], st.sets[k]);
    }
    if (!budget->ChargeSteps(S)) return budget->StepsExceeded(level);
    for (int m = 0; m <= M; ++m) t.value[t.At(r, i, m, 0)] = 0;
    for (int j = 0; j < S; ++j) {
      if (j == i || !is_super[j]) continue;
      int64_t steps = 0;
      // Row of cells (j, s, m = 0..M) per slot, hoisted out of the k loop.
      for (int s = 0; s < NS; ++s) {
        const size_t at = t.At(r, j, 0, s);
        best_row[s] = &t.value[at];
        bk_row[s] = &t.choice_k[at];
        by_row[s] = &t.choice_y[at];
        bs_row[s] = counted ? &t.choice_s[at] : nullptr;
      }
      for (int k : sub[j]) {
        if (!is_super[k]) continue;
        // One inner slot (the planner's count, or level 0): skip an
        // infeasible segment before pricing it.
        if (inner_lo == inner_hi && ctx.inner != nullptr &&
            !(ctx.inner->Value(k, j, ctx.inner->M, inner_lo) < kInf)) {
          continue;
        }
        const bool first = k == i;
        const double params = st.params[j] - st.params[k];
        const double acts = st.acts[j] - st.acts[k];
        // Transfer terms (seconds with one replica).
        double transfer = 0;
        const bool pipedream = ctx.model == CostModel::kPipeDream;
        if (pipedream) {
          if (!first) {
            transfer = std::max(transfer, 2.0 * st.out[k] /
                                              (ctx.bandwidth * ctx.rho));
          }
          if (!first && j != st.full) {
            transfer = std::max(transfer, 2.0 * st.out[j] /
                                              (ctx.bandwidth * ctx.rho));
          }
        } else {
          // Full duplex: each way, the stage's link carries its input's
          // gradients back and its output forward (see optimizer.h).
          double crossing = 0;
          if (!first || i != 0) crossing += st.out[k];
          if (j != st.full) crossing += st.out[j];
          transfer = crossing / (ctx.bandwidth * ctx.rho);
        }
        // The copies of those transfers, both ways, take the stage's CPU.
        // Each message is taken as a whole mini-batch's (m is chosen after
        // the DP): an upper bound where the CPU per byte grows with size.
        double copies = 0;
        if (ctx.transfer_cpu > 0) {
          const Cluster& c = *ctx.cluster;
          if (!first || i != 0) {
            copies += 2.0 * c.TransferCpuSeconds(st.out_whole[k] / ctx.rho);
          }
          if (j != st.full) {
            copies += 2.0 * c.TransferCpuSeconds(st.out_whole[j] / ctx.rho);
          }
        }
        const double ar_divisor =
            (pipedream && !first) ? 1.0 : static_cast<double>(ctx.inner_fanout);
        // T(k, j, y) for y = 1..M, then its prefix minimum; P divided by
        // the inner fan-out. PipeDream: AR(P, y) = 4 (y-1) P / (bw y),
        // shared by the replicas like compute. Ours: the y replicas split
        // each mini-batch and all wait for one ring all-reduce of
        // 2 (y-1) P / y each way per mini-batch, which is not divided by y:
        // 2 (y-1) P / y x max(1 / bw, 2 x CPU per byte).
        double ar_coef = params / (ctx.bandwidth * ar_divisor);
        // Each replica copies what it sends and receives, 2 x 2 (y-1)/y P,
        // on its own CPU; where that is slower than the wire it binds.
        ar_coef = std::max(ar_coef, 2.0 * params / ar_divisor * ctx.transfer_cpu);
        if (!pipedream) ar_coef *= ctx.cluster->AllReduceFactor(params, ctx.level);
        // With a split backward, the weight gradients of a replica's last
        // micro-batch hide the all-reduce's link time but not its copies'
        // share: ExposedAllReduceSeconds(AR, cpu_share, W / y, f), W the
        // segment's weight gradients on one speed-1 unit, one micro-batch
        // per replica (m is chosen after the DP), over the inner fan-out
        // like the parameters at outer levels, whose units' speeds the
        // inner table already counts (the mean speed here), f the share of
        // the window's seconds that hide it (Cluster::allreduce_window_factor).
        const double ar_cpu_share =
            ctx.cluster->AllReduceCpuShare(ctx.bandwidth);
        const double ar_window_factor = ctx.cluster->allreduce_window_factor;
        // The first segment (k = 0, no stage before it) starts its product
        // nodes' parts in pass 1 (AllReduceWindowSeconds).
        const double window =
            ctx.hide_allreduce
                ? AllReduceWindowSeconds(
                      st.weight_gradients[j] - st.weight_gradients[k],
                      st.backward[j] - st.backward[k] - ctx.update_per_param_byte * params,
                      k == 0 ? st.hooked_params[j] : 0.0, params) /
                      (ctx.inner == nullptr ? 1.0 : ar_divisor * ctx.speed)
                : 0.0;
        const bool memory_binds =
            ctx.memory > 0 && ctx.inner == nullptr &&
            StageMemory(ctx.kind, params, acts, ctx.total_workers) > ctx.memory;
        const bool per_unit = ctx.unit_speeds != nullptr && ctx.inner == nullptr;
        for (int si = inner_lo; si <= inner_hi; ++si) {
          // Compute on one speed-1 unit (level 0), or the inner level's
          // best time for the segment on one group.
          const double work = ctx.inner == nullptr
                                  ? st.compute[j] - st.compute[k]
                                  : ctx.inner->Value(k, j, ctx.inner->M, si);
          if (!(work < kInf)) continue;
          // The replicas split the compute (the update included, as the
          // profile counts it in the backward) but each runs all of the
          // update: the rest of it, (1 - 1/y), on top.
          const double update_work =
              ctx.inner == nullptr ? ctx.update_per_param_byte * params : 0;
          const double prediction_work =
              ctx.inner == nullptr && j != st.full
                  ? ctx.prediction_per_param_byte * params
                  : 0;
          // T(k, j, y) with the replicas at speed v is max(P[y] / v + Q[y]
          // + E(A[y], W[y] / v), R[y]): the work's share over the speed,
          // plus what does not scale with it (copies; the all-reduce A, of
          // which E is what the weight gradients W of one micro-batch on a
          // replica leave exposed), against the transfer. Outer levels take
          // v = 1: the inner table's times already count their workers'
          // speeds.
          for (int y = 1; y <= M; ++y) {
            av[y] = 0;
            wv[y] = 0;
            if (ctx.replicas > 0 && y != ctx.replicas) {
              pv[y] = 0;
              qv[y] = kInf;
              rv[y] = kInf;
            } else if (pipedream) {
              pv[y] = work * inv[y];
              qv[y] = (copies + ar_coef * frac4[y]) * inv[y];
              rv[y] = transfer * inv[y];
            } else {
              pv[y] = work * inv[y] + update_work * (1.0 - inv[y]) + prediction_work;
              qv[y] = copies * inv[y];
              av[y] = ar_coef * ring[y];
              wv[y] = window * inv[y];
              rv[y] = transfer * inv[y];
            }
          }
          const auto stage_time = [&](int y, double per_speed) {
            return std::max(
                pv[y] * per_speed + qv[y] +
                    ExposedAllReduceSeconds(av[y], ar_cpu_share,
                                            wv[y] * per_speed, ar_window_factor),
                rv[y]);
          };
          // One speed for every unit (per_unit: the scan below prices each).
          const double per_speed = ctx.inner == nullptr ? 1.0 / ctx.speed : 1.0;
          for (int y = 1; y <= M; ++y) tv[y] = stage_time(y, per_speed);
          if (!memory_binds && !per_unit) {
            tmin[0] = kInf;
            for (int y = 1; y <= M; ++y) {
              if (tv[y] < tmin[y - 1]) {
                tmin[y] = tv[y];
                targ[y] = y;
              } else {
                tmin[y] = tmin[y - 1];
                targ[y] = targ[y - 1];
              }
            }
          }
          // Slots s this segment completes: s = what came before + si.
          const int s_lo = counted ? si : 0;
          const int s_hi = counted ? NS - 1 : 0;
          for (int s = s_lo; s <= s_hi; ++s) {
            const int before = s - si;  // slot of the prefix (0: free)
            // A first segment has nothing before it; a later one needs a
            // prefix of at least one stage when stages are counted.
            if (counted && (first ? before != 0 : before < 1)) continue;
            steps += M;
            double* best = best_row[s];
            int* bk = bk_row[s];
            int* by = by_row[s];
            int* bs = bs_row[s];
            auto take = [&](int m, double cand, int y) {
              best[m] = cand;
              bk[m] = k;
              by[m] = y;
              if (bs != nullptr) bs[m] = si;
            };
            if (memory_binds || per_unit) {
              // Exact but O(M^2): the in-flight depth depends on how many
              // workers remain downstream, ceil((y + M - m) / y) on one
              // level; with per-unit speeds the segment's pace depends on
              // m (its slowest unit, m - 1).
              steps += static_cast<int64_t>(M) * (M + 1) / 2;
              for (int m = 1; m <= M; ++m) {
                const double unit_speed = per_unit ? 1.0 / (*ctx.unit_speeds)[m - 1] : 0;
                for (int y = 1; y <= m; ++y) {
                  if (memory_binds) {
                    const int downstream = ctx.single_level
                                               ? ctx.total_workers - m
                                               : ctx.total_workers;
                    const int depth = (y + downstream + y - 1) / y;
                    if (StageMemory(ctx.kind, params, acts, depth) >
                        ctx.memory) {
                      continue;
                    }
                  }
                  const double prefix =
                      first ? 0.0 : t.value[t.At(r, k, m - y, before)];
                  // The prefix's time only rises with y (fewer units
                  // before): past best[m] nothing further improves it.
                  if (prefix >= best[m]) break;
                  const double cand = std::max(
                      prefix, per_unit ? stage_time(y, unit_speed) : tv[y]);
                  if (cand < best[m]) take(m, cand, y);
                }
              }
              continue;
            }
            if (first) {
              for (int m = 1; m <= M; ++m) {
                if (tmin[m] < best[m]) take(m, tmin[m], targ[m]);
              }
              continue;
            }
            const double* a = &t.value[t.At(r, k, 0, before)];
            // f_m(y) = max(a[m - y], tmin[y]): a[m-y] rises with y, tmin
            // falls. ystar(m) = smallest y with a[m - y] >= tmin[y];
            // non-decreasing in m.
            int ystar = 1;
            for (int m = 1; m <= M; ++m) {
              if (ystar > m) ystar = m;
              while (ystar < m && a[m - ystar] < tmin[ystar]) ++ystar;
              // Candidate at ystar and ystar - 1.
              double cand = std::max(a[m - ystar], tmin[ystar]);
              int cy = ystar;
              if (ystar > 1) {
                const double c2 = std::max(a[m - ystar + 1], tmin[ystar - 1]);
                if (c2 < cand) {
                  cand = c2;
                  cy = ystar - 1;
                }
              }
              if (cand < best[m]) take(m, cand, targ[cy]);
            }
          }
        }
      }
      if (!budget->ChargeSteps(steps)) return budget->StepsExceeded(level);
      // At most m units: non-increasing in m.
      for (int s = 0; s < NS; ++s) {
        const size_t at = t.At(r, j, 0, s);
        double* best = &t.value[at];
        int* bk = &t.choice_k[at];
        int* by = &t.choice_y[at];
        int* bs = counted ? &t.choice_s[at] : nullptr;
        for (int m = 1; m <= M; ++m) {
          if (best[m - 1] <= best[m]) {
            best[m] = best[m - 1];
            bk[m] = bk[m - 1];
            by[m] = by[m - 1];
            if (bs != nullptr) bs[m] = bs[m - 1];
          }
        }
      }
    }
  }
  return t;
}

struct FlatStage {
  int k = 0, j = 0;
  std::vector<int> workers;
};

// Expands the level-l solution of segment (i, j) with m units and stage
// slot `slot` (see LevelTable::NS), replicated over `copies` (each a list of
// m unit ids at level l), into level-0 stages.
void Flatten(const std::vector<LevelTable>& tables,
             const std::vector<Level>& levels, int l, int i, int j, int m,
             int slot, const std::vector<std::vector<int>>& copies,
             std::vector<FlatStage>* out) {
  const LevelTable& t = tables[l];
  struct Segment {
    int k, y, slot;
  };
  // Walk back from j.
  std::vector<Segment> segments;  // from last to first
  int cur = j, units = m;
  while (cur != i) {
    const size_t at = t.At(t.start_index[i], cur, units, slot);
    const Segment seg{t.choice_k[at], t.choice_y[at],
                      t.NS > 1 ? t.choice_s[at] : 0};
    segments.push_back(seg);
    units -= seg.y;
    slot -= seg.slot;
    cur = seg.k;
  }
  std::reverse(segments.begin(), segments.end());
  int offset = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const int k = segments[s].k;
    const int y = segments[s].y;
    const int seg_end = s + 1 < segments.size() ? segments[s + 1].k : j;
    if (l == 0) {
      FlatStage fs;
      fs.k = k;
      fs.j = seg_end;
      for (const std::vector<int>& copy : copies) {
        for (int r = 0; r < y; ++r) fs.workers.push_back(copy[offset + r]);
      }
      out->push_back(std::move(fs));
    } else {
      const int fan = levels[l - 1].fanout;
      std::vector<std::vector<int>> inner;
      for (const std::vector<int>& copy : copies) {
        for (int r = 0; r < y; ++r) {
          std::vector<int> sub(fan);
          for (int q = 0; q < fan; ++q) sub[q] = copy[offset + r] * fan + q;
          inner.push_back(std::move(sub));
        }
      }
      Flatten(tables, levels, l - 1, k, seg_end, fan, segments[s].slot, inner,
              out);
    }
    offset += y;
  }
}

int DefaultMicroBatches(const PlannerOptions& options,
                        const std::vector<int>& replicas) {
  if (options.micro_batches > 0) return options.micro_batches;
  return schedule::DefaultMicroBatches(
      options.schedule, replicas,
      static_cast<int64_t>(std::llround(options.batch_size)));
}

// Async schedule: PipeDream's in-flight depth (NOAM) keeps a stage busy
// while a micro-batch goes through the downstream stages' compute, but not
// while it also crosses the links there and back: a replica of stage s
// waits 2 * sum_{t >= s} x_t per micro-batch for transfers (x_t: one
// micro-batch's activations over the link from stage t to t + 1), and its
// period per micro-batch is R_s * T / m (T: the bottleneck stage time per
// mini-batch). So that those waits overlap other micro-batches' compute,
// as the stage times assume, d_s gets ceil(2 * sum x_t / period) more
// micro-batches. A replica running k = m / R_s micro-batches a mini-batch
// computes on weights ceil((d_s - 1) / k) updates old
// (schedule::MaxInFlightForStaleness), so up to (NOAM_s - 1) k + 1 keeps
// the staleness NOAM's depth has with whole mini-batches: that much is
// always allowed. Beyond it each micro-batch more costs staleness, which
// costs accuracy (the mlp at 100 Mbit/s lost 0.9-1.2 point at 3 updates
// against 1), so only where `allowed` (PlannerOptions::deepen_for_links),
// within max_in_flight; otherwise a note names the depth and the staleness
// it would take. A round trip under kMinRoundTripShare of a period, which
// could gain at most that share of throughput, is left to the slack of the
// non-bottleneck stages (on loopback the mlp's is ~6% on a fast machine).
void CoverTransferRoundTrips(double bottleneck_seconds, int micro_batches,
                             bool allowed, schedule::ScheduleOptions* sched,
                             Plan* plan) {
  const int p = plan->stages.size();
  if (p < 2 || bottleneck_seconds <= 0) return;
  std::vector<int> depth(p, 0);
  bool deeper = false;
  double round_trip = 0;  // 2 * sum_{t >= s} x_t, built from the end
  schedule::ScheduleOptions whole = *sched;  // NOAM's depth, no bound
  whole.max_in_flight = 0;
  whole.in_flight_depth.clear();
  const int m = std::max(1, micro_batches);
  for (int s = p - 2; s >= 0; --s) {
    const StagePlan& st = plan->stages[s];
    if (st.output_bandwidth > 0) {
      round_trip += 2.0 * st.output_bytes / st.output_bandwidth;
    }
    const double period = st.replicas * bottleneck_seconds / m;
    constexpr double kMinRoundTripShare = 0.15;
    const double share = round_trip / period;
    const int extra =
        share < kMinRoundTripShare ? 0 : static_cast<int>(std::ceil(share - 0.05));
    if (extra <= 0) continue;
    const int base = schedule::InFlightDepth(*sched, s);
    const int want = base + extra;
    // Micro-batches this replica runs a mini-batch, and what NOAM's depth
    // costs in staleness with whole mini-batches.
    const int k = std::max(1, m / std::max(1, st.replicas));
    const int noam = schedule::InFlightDepth(whole, s);
    const int natural = (noam - 1) * k + 1;
    int d = want;
    if (!allowed && want > natural) {
      plan->notes.push_back(absl::StrFormat(
          "stage %d would need %d micro-batches in flight (default %d) to "
          "cover %.3g ms of transfers there and back per micro-batch (period "
          "%.3g ms): schedule.max_staleness: %d allows it (apapo-partition: "
          "--max_in_flight=%d), each update of staleness at some accuracy",
          s, want, base, 1e3 * round_trip, 1e3 * period,
          schedule::StalenessAtDepth(want, k), want));
      d = natural;
    }
    if (sched->max_in_flight > 0) d = std::min(d, sched->max_in_flight);
    if (d <= base) continue;
    depth[s] = d;
    deeper = true;
    plan->notes.push_back(absl::StrFormat(
        "stage %d keeps %d micro-batches in flight (default %d) to cover "
        "%.3g ms of transfers there and back per micro-batch (period "
        "%.3g ms)%s",
        s, d, base, 1e3 * round_trip, 1e3 * period,
        d <= natural && k > 1
            ? absl::StrFormat(": %d micro-batches a mini-batch keep it at %d "
                              "update(s) of staleness, as %d in flight would "
                              "with whole mini-batches",
                              k, schedule::StalenessAtDepth(d, k), noam)
            : std::string()));
  }
  if (!deeper) return;
  sched->in_flight_depth = depth;
  for (int s = 0; s < p; ++s) plan->stages[s].in_flight_depth = depth[s];
}

// Async schedule: a replica of stage s with d_s micro-batches in flight
// admits a new one only when one comes back, and each is away for a cycle:
// its forward and backward on this and every later stage plus its
// transfers there and back (2 * sum_{t >= s} x_t, as above); a later stage
// that splits its backward sends the gradients on before its weight
// gradients (StagePlan::backward_weight_seconds), which the cycle then
// leaves out. So the replica
// runs at most d_s micro-batches per cycle: T >= cycle_s * m / (d_s * R_s).
// Where the depth could not cover the round trips (max_staleness caps it,
// or memory does), this bound, not the bottleneck stage, sets the pace
// (measured: the mlp at 100 Mbit/s with max_staleness 1 ran 971 samples/s
// where the stage times alone predicted 1,550).
// A link with a token bucket (Level::burst_bytes) passes the first
// min(burst, x_t) of each transfer at once when its direction idled long
// enough to refill it. Here it has: a stage bound by its depth sends one
// micro-batch's x_t a period per direction, and a period longer than
// x_t's time at the rate leaves the bucket full again (what it lent
// refills with the rest of the period; where the bound applies, the
// period exceeds the bottleneck's, which covers the link's time). So each
// transfer is charged
// (x_t - min(burst, x_t)) / bandwidth. Measured in the lab (100 KB at
// 100 Mbit/s): 2 x 64 micro-batches of the mlp, 524 KB each way, bound
// here, ran 7-16% above this bound without the credit (bench/cluster,
// 2026-12-05 03:06 and 03:16).
void BoundByInFlightDepth(int micro_batches, Plan* plan) {
  const int p = plan->stages.size();
  const int m = std::max(1, micro_batches);
  // One micro-batch's compute on stages s+1..p-1 before its gradients
  // leave each of them (all of it, or without the weight gradients that
  // a split backward computes after the send).
  double later = 0;
  double round_trip = 0;  // 2 * sum_{t >= s} x_t, less the buckets' credit
  double credit = 0;      // the buckets' share, seconds
  for (int s = p - 1; s >= 0; --s) {
    const StagePlan& st = plan->stages[s];
    const double own = st.compute_seconds * st.replicas / m;
    const double downstream = own + later;
    const double pass = st.forward_seconds + st.backward_seconds;
    const double after_send =
        own * (pass > 0 ? std::min(1.0, st.backward_weight_seconds / pass) : 0.0);
    later += own - after_send;
    if (after_send > 0) {
      plan->notes.push_back(absl::StrFormat(
          "split backward: stage %d sends its input gradients %.3g ms per "
          "micro-batch before its backward ends (its weight gradients follow "
          "the send), which the cycles of the stages before it leave out",
          s, 1e3 * after_send));
    }
    if (s == p - 1 || st.in_flight <= 0) continue;
    if (st.output_bandwidth > 0) {
      const double lent = std::min(std::max(0.0, st.output_burst_bytes), st.output_bytes);
      round_trip += 2.0 * (st.output_bytes - lent) / st.output_bandwidth;
      credit += 2.0 * lent / st.output_bandwidth;
    }
    const double cycle = downstream + round_trip;
    const double bound = cycle * m / (st.in_flight * st.replicas);
    if (bound > plan->bottleneck_seconds * 1.001) {
      plan->notes.push_back(absl::StrFormat(
          "stage %d's %d micro-batches in flight do not cover their cycle "
          "(%.3g ms of compute and %.3g ms of transfers there and back per "
          "micro-batch%s): it bounds the pipeline at %.3g ms per mini-batch, "
          "not %.3g",
          s, st.in_flight, 1e3 * downstream, 1e3 * round_trip,
          credit > 0 ? absl::StrFormat(", net of %.3g ms for what the links' "
                                       "token buckets pass at once",
                                       1e3 * credit)
                     : std::string(),
          1e3 * bound, 1e3 * plan->bottleneck_seconds));
      plan->bottleneck_seconds = bound;
      plan->depth_bound = true;
    }
  }
}

// Fills per-stage metrics and plan-level predictions from flattened stages.
absl::Status FinishPlan(const Graph& graph, const WorkGraph& w,
                        const States& st, const Cluster& cluster,
                        const PlannerOptions& options,
                        const std::vector<FlatStage>& flat, double dp_value,
                        Plan* plan) {
  plan->schedule = options.schedule;
  plan->cost_model = options.cost_model;
  plan->bottleneck_seconds = dp_value;
  plan->single_worker_seconds = st.compute[st.full];
  const int p = flat.size();
  std::vector<int> replicas;
  for (const FlatStage& f : flat) replicas.push_back(f.workers.size());
  plan->micro_batches = DefaultMicroBatches(options, replicas);
  schedule::ScheduleOptions sched;
  sched.kind = options.schedule;
  sched.num_stages = p;
  sched.replicas = replicas;
  sched.micro_batches_per_iteration = plan->micro_batches;
  sched.num_iterations = 1;
  sched.max_in_flight = options.max_in_flight;
  if (const int bound = schedule::MaxInFlightForStaleness(
          options.max_staleness, plan->micro_batches, replicas);
      bound > 0) {
    sched.max_in_flight = sched.max_in_flight > 0
                              ? std::min(sched.max_in_flight, bound)
                              : bound;
  }
  if (absl::Status s = schedule::ValidateScheduleOptions(sched); !s.ok()) {
    return s;
  }
  // Stage of each work node.
  std::vector<int> stage_of_work(w.n, -1);
  for (int s = 0; s < p; ++s) {
    const Bits& hi = st.sets[flat[s].j];
    const Bits& lo = st.sets[flat[s].k];
    for (int x = 0; x < st.units.n; ++x) {
      if (Test(hi, x) && !Test(lo, x)) {
        for (int v : st.units.members[x]) stage_of_work[v] = s;
      }
    }
  }
  std::vector<int> stage_of(graph.num_nodes(), -1);
  for (int v = 0; v < w.n; ++v) stage_of[w.original[v]] = stage_of_work[v];
  absl::StatusOr<std::vector<int>> topo = graph.TopologicalOrder();
  if (!topo.ok()) return topo.status();
  // Re-attach dropped nodes: sources to the stage of their first consumer
  // (the first stage for Input*), sinks to their producer's stage.
  for (int v : *topo) {
    if (stage_of[v] >= 0) continue;
    if (graph.predecessors(v).empty()) {
      stage_of[v] = 0;
    } else {
      int s = 0;
      for (int q : graph.predecessors(v)) s = std::max(s, stage_of[q]);
      stage_of[v] = s;
    }
  }
  plan->stages.assign(p, StagePlan());
  for (int v : *topo) plan->stages[stage_of[v]].nodes.push_back(v);
  const double rho = options.activation_compression_ratio;
  const bool pipedream = options.cost_model == CostModel::kPipeDream;
  // Micro-batches of batch / m rows compute each row at their measured
  // cost (Graph::MicroBatchScale; the update excluded: it runs once per
  // mini-batch). The DP's value does not include it: the stage times below
  // decide then.
  const double rows = options.batch_size / std::max(1, plan->micro_batches);
  const double row_scale = pipedream ? 1.0 : graph.MicroBatchScale(rows);
  // A replica that runs k = m / r micro-batches of a mini-batch adds k - 1
  // of their gradients into the first's (the runtime's add_ per parameter).
  const double accumulate =
      pipedream ? 0.0 : graph.accumulate_seconds_per_byte();
  bool accumulating = false;
  for (int r : replicas) accumulating |= accumulate > 0 && r < plan->micro_batches;
  const bool rescaled = row_scale != 1.0 || accumulating;
  if (std::abs(row_scale - 1.0) >= 0.005) {
    plan->notes.push_back(absl::StrFormat(
        "micro-batches of %.4g rows compute at %.2fx the per-row cost of the "
        "size profiled, as measured while profiling",
        rows, row_scale));
  }
  double bottleneck = 0;
  double busy_sum = 0;
  // Whether a split backward hid part of an all-reduce: the DP took one
  // micro-batch per replica for it, so the stage times below decide.
  bool hidden = false;
  plan->num_workers = 0;
  for (int s = 0; s < p; ++s) {
    StagePlan& stage = plan->stages[s];
    const FlatStage& f = flat[s];
    stage.workers = f.workers;
    stage.replicas = f.workers.size();
    plan->num_workers += stage.replicas;
    double slowest = kInf;
    for (int worker : f.workers) slowest = std::min(slowest, cluster.speed(worker));
    const int r = stage.replicas;
    double compute = st.compute[f.j] - st.compute[f.k];
    stage.parameter_bytes = st.params[f.j] - st.params[f.k];
    stage.activation_bytes = st.acts[f.j] - st.acts[f.k];
    if (!pipedream && st.params[st.full] > 0) {
      stage.update_seconds =
          graph.update_seconds() * stage.parameter_bytes / st.params[st.full];
    }
    if (rescaled) {
      compute = row_scale * std::max(0.0, compute - stage.update_seconds) +
                stage.update_seconds;
    }
    stage.compute_seconds = compute / (r * slowest);
    stage.compute_seconds += stage.update_seconds * (1.0 - 1.0 / r) / slowest;
    // Every stage but the last predicts its weights with its update, each
    // replica all of it (added to update_seconds below, once the backward
    // has given back the update the profile counts in it).
    double prediction = 0;
    if (PredictsWeights(options) && f.j != st.full && st.params[st.full] > 0) {
      prediction = graph.update_prediction_seconds() * stage.parameter_bytes /
                   st.params[st.full];
      stage.compute_seconds += prediction / slowest;
      if (prediction >= 5e-4) {
        plan->notes.push_back(absl::StrFormat(
            "stage %d predicts its weights (its gradients are delayed): its "
            "update costs %.3g ms more per mini-batch, as measured while profiling",
            s, 1e3 * prediction));
      }
    }
    const double adds = static_cast<double>(plan->micro_batches) / r - 1.0;
    if (accumulate > 0 && adds > 0) {
      const double added_bytes =
          AddedGradientBytes(graph, stage.nodes, options.split_backward);
      stage.accumulate_seconds = adds * added_bytes * accumulate;
      stage.compute_seconds += stage.accumulate_seconds / slowest;
      if (stage.accumulate_seconds >= 5e-4) {
        plan->notes.push_back(absl::StrFormat(
            "stage %d adds %.4g micro-batches' gradients into the first's per "
            "mini-batch: %.3g ms over %.3g MB of its parameters, as measured "
            "while profiling",
            s, adds, 1e3 * stage.accumulate_seconds, added_bytes / 1e6));
      }
    }
    const int ar_level = SpanLevel(cluster, f.workers);
    const double ar_bw = cluster.levels[ar_level].bandwidth;
    // The whole all-reduce; a split backward hides part of it below.
    const double full_allreduce =
        pipedream ? 4.0 * (r - 1) * stage.parameter_bytes / (ar_bw * r) / r
                  : cluster.AllReduceFactor(stage.parameter_bytes, ar_level) *
                        RingAllReduceSeconds(stage.parameter_bytes, r, ar_bw,
                                             cluster.transfer_cpu_seconds_per_byte);
    stage.allreduce_seconds = full_allreduce;
    // One boundary's transfer per mini-batch: PipeDream charges the
    // activations and their gradients one after the other (2x, the larger
    // boundary binds); ours charges each way of a full-duplex link what
    // it carries, one boundary's gradients plus the other's activations.
    double comm = 0;
    auto boundary = [&](int neighbour, double bytes) {
      std::vector<int> both = f.workers;
      both.insert(both.end(), flat[neighbour].workers.begin(),
                  flat[neighbour].workers.end());
      const double bw = cluster.levels[SpanLevel(cluster, both)].bandwidth;
      return bytes / (bw * r * rho);
    };
    if (pipedream) {
      if (s > 0) comm = std::max(comm, 2.0 * boundary(s - 1, st.out[f.k]));
      if (s > 0 && s + 1 < p) {
        comm = std::max(comm, 2.0 * boundary(s + 1, st.out[f.j]));
      }
    } else {
      if (s > 0) comm += boundary(s - 1, st.out[f.k]);
      if (s + 1 < p) comm += boundary(s + 1, st.out[f.j]);
    }
    stage.comm_seconds = comm;
    stage.allreduce_bandwidth = ar_bw;
    // The profile's figures are per mini-batch; one op of the simulator
    // is one micro-batch, 1/m of it.
    const double per_micro = 1.0 / plan->micro_batches;
    double weight_gradients = 0;  // per micro-batch, as profiled
    for (int v : stage.nodes) {
      stage.forward_seconds += graph.node(v).forward_seconds * per_micro;
      stage.backward_seconds += graph.node(v).backward_seconds * per_micro;
      weight_gradients += graph.node(v).weight_gradient_seconds() * per_micro;
    }
    stage.forward_seconds *= row_scale;
    const double backward_without_update =
        std::max(0.0, stage.backward_seconds - stage.update_seconds * per_micro);
    stage.backward_seconds =
        row_scale * backward_without_update + stage.accumulate_seconds * r * per_micro;
    stage.update_seconds += prediction;
    if (options.split_backward && !pipedream && s > 0) {
      stage.backward_weight_seconds =
          row_scale * std::min(weight_gradients, backward_without_update) +
          stage.accumulate_seconds * r * per_micro;
    }
    // Every replica's last backward before the all-reduce computes its
    // weight gradients after the rest, while the all-reduce of the
    // parameters done before them starts in buckets: at the slowest
    // replica's pace, they hide the all-reduce's link time. The first
    // stage has no send: its product nodes' parts start in pass 1 and
    // travel behind about the whole backward (AllReduceWindowSeconds).
    if (options.split_backward && options.allreduce_in_backward && !pipedream) {
      stage.allreduce_window_seconds =
          row_scale * AllReduceWindowSeconds(
                          std::min(weight_gradients, backward_without_update),
                          backward_without_update, f.k == 0 ? st.hooked_params[f.j] : 0.0,
                          stage.parameter_bytes);
      stage.allreduce_seconds = ExposedAllReduceSeconds(
          full_allreduce,
          cluster.AllReduceCpuShare(ar_bw),
          stage.allreduce_window_seconds / slowest, cluster.allreduce_window_factor);
      hidden |= stage.allreduce_seconds < full_allreduce;
    }
    // The stage's share of its transfers' copies: activations in and out
    // on the forward pass, their gradients on the backward pass.
    // A message is one micro-batch's; its CPU per byte grows with its size.
    if (!pipedream && cluster.transfer_cpu_seconds_per_byte > 0 && p > 1) {
      // Per mini-batch: m messages of 1/m of the bytes.
      const auto copy = [&](double bytes) {
        return cluster.TransferCpuSeconds(bytes / rho * per_micro) / per_micro;
      };
      if (s > 0) stage.transfer_cpu_seconds += copy(st.out_whole[f.k]);
      if (s + 1 < p) stage.transfer_cpu_seconds += copy(st.out_whole[f.j]);
      stage.forward_seconds += stage.transfer_cpu_seconds * per_micro;
      stage.backward_seconds += stage.transfer_cpu_seconds * per_micro;
      stage.compute_seconds += 2.0 * stage.transfer_cpu_seconds / r;
    }
    if (s + 1 < p) {
      std::vector<int> both = f.workers;
      both.insert(both.end(), flat[s + 1].workers.begin(),
                  flat[s + 1].workers.end());
      const Level& link = cluster.levels[SpanLevel(cluster, both)];
      stage.output_bandwidth = link.bandwidth;
      stage.output_burst_bytes = link.burst_bytes;
      stage.output_bytes = st.out[f.j] / rho * per_micro;
    }
    stage.time_seconds =
        std::max(stage.compute_seconds + stage.allreduce_seconds, comm);
    bottleneck = std::max(bottleneck, stage.time_seconds);
    busy_sum += stage.time_seconds;
    const double hidden_allreduce = full_allreduce - stage.allreduce_seconds;
    if (!pipedream && r > 1 &&
        (cluster.allreduce_measured() || hidden_allreduce >= 5e-7)) {
      std::string note =
          !cluster.allreduce_measured()
              ? absl::StrFormat("stage %d's all-reduce takes %.3g ms per "
                                "mini-batch",
                                s, 1e3 * full_allreduce)
              : absl::StrFormat(
                    "stage %d's all-reduce is charged %.3g ms per "
                    "mini-batch: %.2fx the ring over its link at its %.3g "
                    "MB, as the all-reduces measured while profiling ran",
                    s, 1e3 * full_allreduce,
                    cluster.AllReduceFactor(stage.parameter_bytes, ar_level),
                    stage.parameter_bytes / 1e6);
      if (hidden_allreduce >= 5e-7) {
        absl::StrAppend(
            &note,
            absl::StrFormat(", %.3g ms of it hidden behind its last "
                            "micro-batch's %s",
                            1e3 * hidden_allreduce,
                            f.k == 0 && st.hooked_params[f.j] > 0 ? "backward"
                                                                  : "weight gradients"));
        if (cluster.allreduce_cpu_seconds_per_byte > 0) {
          absl::StrAppend(
              &note, absl::StrFormat(" (not the %.0f%% of it its replicas' cores run, as "
                                     "measured while profiling)",
                                     100 * cluster.AllReduceCpuShare(ar_bw)));
        }
        if (cluster.allreduce_window_factor < 1) {
          absl::StrAppend(
              &note, absl::StrFormat("; a second of that %s hides %.2f s of the "
                                     "all-reduce, which runs slower beside the compute "
                                     "than alone, as measured while profiling",
                                     f.k == 0 && st.hooked_params[f.j] > 0
                                         ? "backward"
                                         : "compute",
                                     cluster.allreduce_window_factor));
        }
      }
      plan->notes.push_back(std::move(note));
    }
    if (stage.transfer_cpu_seconds > 0) {
      double crossing = 0;
      if (s > 0) crossing += st.out_whole[f.k];
      if (s + 1 < p) crossing += st.out_whole[f.j];
      plan->notes.push_back(absl::StrFormat(
          "stage %d spends %.3g ms of CPU per mini-batch on its transfers "
          "(%.3g ns per byte, both ways, at its messages' size), counted as "
          "compute",
          s, 2e3 * stage.transfer_cpu_seconds / r,
          stage.transfer_cpu_seconds / (crossing / rho) * 1e9));
    }
  }
  if (options.schedule == schedule::ScheduleKind::kAsync &&
      options.cost_model == CostModel::kApapo) {
    CoverTransferRoundTrips(
        cluster.heterogeneous() || dp_value <= 0 || rescaled || hidden
            ? bottleneck
            : dp_value,
        plan->micro_batches, options.deepen_for_links, &sched, plan);
  }
  for (int s = 0; s < p; ++s) {
    StagePlan& stage = plan->stages[s];
    while (true) {
      absl::StatusOr<schedule::StageScheduleStats> stats =
          schedule::AnalyzeStage(sched, s);
      if (!stats.ok()) return stats.status();
      stage.weight_versions = stats->weight_versions;
      stage.in_flight = stats->max_activations_in_flight;
      stage.staleness = stats->max_staleness;
      stage.peak_memory_bytes = stage.weight_versions * stage.parameter_bytes +
                                stage.in_flight * stage.activation_bytes;
      // A deeper pipeline that does not fit runs at the default depth.
      if (stage.in_flight_depth == 0 || cluster.memory_bytes <= 0 ||
          stage.peak_memory_bytes <= cluster.memory_bytes) {
        break;
      }
      plan->notes.push_back(absl::StrFormat(
          "stage %d stays at the default in-flight depth: %d would need "
          "%.4g B",
          s, stage.in_flight_depth, stage.peak_memory_bytes));
      stage.in_flight_depth = 0;
      sched.in_flight_depth[s] = 0;
    }
  }
  // The DP's value is the cost model's prediction on a homogeneous cluster;
  // with heterogeneous workers, rescaled micro-batches or a hidden
  // all-reduce the stage times decide.
  if (cluster.heterogeneous() || dp_value <= 0 || rescaled || hidden) {
    plan->bottleneck_seconds = bottleneck;
  }
  if (options.schedule == schedule::ScheduleKind::kAsync &&
      options.cost_model == CostModel::kApapo && p > 1) {
    BoundByInFlightDepth(plan->micro_batches, plan);
  }
  const double t = plan->bottleneck_seconds;
  if (schedule::IsAsynchronous(options.schedule) || p == 1) {
    plan->seconds_per_mini_batch = t;
    plan->bubble_fraction = t > 0 ? 1.0 - busy_sum / (p * t) : 0;
    if (options.schedule == schedule::ScheduleKind::kDataParallel) {
      plan->bubble_fraction = 0;
    }
  } else {
    // Flush: an iteration of m micro-batches takes (m - 1) slots of the
    // bottleneck's t / m plus the fill and drain of one micro-batch's path:
    // PipeDream's (m + p - 1) t / m counts that path as p slots of t / m.
    // The apapo model walks it: each stage's own compute and, between
    // stages, the micro-batch's activations and then its gradients over the
    // link, which nothing overlaps at a flush (bench/cluster, 2026-12-03
    // 12:35: at 100 Mbit/s the mlp's 1F1B-flush plan, predicted with p
    // slots, ran 36% below it, each stage idle 40-55% of the step).
    const double m = plan->micro_batches;
    double iteration = t * (m + p - 1) / m;
    if (options.cost_model == CostModel::kApapo) {
      double path = 0;
      for (const StagePlan& stage : plan->stages) {
        // The all-reduce's exposed part (StagePlan::allreduce_seconds).
        path += (stage.compute_seconds + stage.allreduce_seconds) / m;
        if (stage.output_bandwidth > 0) {
          path += 2.0 * stage.output_bytes / stage.output_bandwidth;
        }
      }
      iteration = t * (m - 1) / m + path;
    }
    plan->seconds_per_mini_batch = iteration;
    plan->bubble_fraction =
        iteration > 0 ? 1.0 - busy_sum / (p * iteration) : 0;
  }
  plan->mini_batches_per_second =
      plan->seconds_per_mini_batch > 0 ? 1.0 / plan->seconds_per_mini_batch
                                       : 0;
  plan->samples_per_second = plan->mini_batches_per_second * options.batch_size;
  if (cluster.memory_bytes > 0) {
    for (int s = 0; s < p; ++s) {
      if (plan->stages[s].peak_memory_bytes > cluster.memory_bytes) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "stage %d needs %.4g B (%d weight versions x %.4g B + %d "
            "micro-batches x %.4g B) but a device has %.4g B",
            s, plan->stages[s].peak_memory_bytes,
            plan->stages[s].weight_versions, plan->stages[s].parameter_bytes,
            plan->stages[s].in_flight, plan->stages[s].activation_bytes,
            cluster.memory_bytes));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status NothingFits(const Graph& graph, const Cluster& cluster,
                         const PlannerOptions& options) {
  int worst = 0;
  double worst_bytes = 0;
  for (int v = 0; v < graph.num_nodes(); ++v) {
    const Node& n = graph.node(v);
    const double bytes = StageMemory(options.schedule, n.parameter_bytes,
                                     n.activation_bytes, 1);
    if (bytes > worst_bytes) {
      worst_bytes = bytes;
      worst = v;
    }
  }
  if (worst_bytes > cluster.memory_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no plan fits in %.4g B per device: layer '%s' alone needs %.4g B "
        "(parameters + one micro-batch of activations)",
        cluster.memory_bytes, graph.node(worst).id, worst_bytes));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "no plan fits in %.4g B per device on %d workers: the weight versions "
      "and in-flight activations of schedule %s exceed it for every cut "
      "(try more workers, more memory, --max_in_flight, or 2bw/1f1b_flush)",
      cluster.memory_bytes, cluster.num_workers(),
      schedule::ScheduleKindName(options.schedule)));
}

// Why no plan has exactly `stages` stages: too few cuts in the searched
// states (the longest chain of states from {} to the whole graph), or else
// memory.
absl::Status NoPlanWithStages(const States& st,
                              const std::vector<std::vector<int>>& sub,
                              int stages) {
  // States are sorted by size: a state's proper subsets come first.
  std::vector<int> chain(st.sets.size(), 0);  // segments from {} to it
  for (size_t j = 1; j < st.sets.size(); ++j) {
    for (int k : sub[j]) chain[j] = std::max(chain[j], chain[k] + 1);
  }
  if (chain[st.full] < stages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stages: %d asked for, but the model has at most %d%s",
        stages, chain[st.full],
        st.exact ? " cut into stages"
                 : absl::StrCat(" in the states the planner searched (",
                                st.search, ")")));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "stages: no plan with exactly %d stages fits the devices' memory",
      stages));
}

int64_t StateCap(const PlannerOptions& options, const Cluster& cluster) {
  if (options.max_states < 0) return -1;
  if (options.max_states > 0) return options.max_states;
  // Work budget: single level ~ S^2/2 * M pair-steps; multi-level inner
  // levels ~ S^3/6 * n.
  // A stage count asked for multiplies the work by its slots (C + 1) on
  // one level, by about their square above it (a segment's count and the
  // prefix's).
  const double slots = options.stages > 0 ? options.stages + 1 : 1;
  if (cluster.levels.size() == 1) {
    constexpr double kBudget = 3e7;
    const double m = std::max(1, cluster.num_workers());
    return static_cast<int64_t>(
        std::clamp(std::sqrt(2 * kBudget / (m * slots)), 64.0, 3000.0));
  }
  constexpr double kBudget = 2e7;
  int max_inner = 1;
  for (size_t l = 0; l + 1 < cluster.levels.size(); ++l) {
    max_inner = std::max(max_inner, cluster.levels[l].fanout);
  }
  const double inner_levels = cluster.levels.size() - 1;
  return static_cast<int64_t>(std::clamp(
      std::cbrt(6 * kBudget / (max_inner * inner_levels * slots * slots)),
      48.0, 300.0));
}

absl::Status CheckInputs(const Graph& graph, const Cluster& cluster,
                         const PlannerOptions& options) {
  if (graph.num_nodes() == 0) {
    return absl::InvalidArgumentError("empty graph: no nodes");
  }
  if (cluster.levels.empty() || cluster.num_workers() < 1) {
    return absl::InvalidArgumentError("the cluster has no workers");
  }
  if (!(options.activation_compression_ratio > 0) ||
      !std::isfinite(options.activation_compression_ratio)) {
    return absl::InvalidArgumentError(
        "activation compression ratio must be > 0");
  }
  if (options.schedule == schedule::ScheduleKind::kDataParallel) {
    return absl::InvalidArgumentError(
        "schedule dp is not a pipeline; use DataParallelPlan");
  }
  if (options.stages < 0 || options.stages > cluster.num_workers()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stages: %d asked for, but a stage needs a worker and there are %d",
        options.stages, cluster.num_workers()));
  }
  if (options.replicas < 0 ||
      static_cast<int64_t>(std::max(1, options.stages)) * options.replicas >
          cluster.num_workers()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "replicas: %d per stage asked for (x %d stage(s)), but there are %d "
        "workers",
        options.replicas, std::max(1, options.stages), cluster.num_workers()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> PlanPipeline(const Graph& graph, const Cluster& cluster,
                                  const PlannerOptions& options) {
  if (absl::Status s = CheckInputs(graph, cluster, options); !s.ok()) return s;
  if (options.replicas > 0 && cluster.levels.size() > 1) {
    // A stage's replicas are the product of its units' counts over the
    // levels, which the DP does not track: plan on one level at the
    // slowest link (every transfer and all-reduce priced as if it crossed
    // it), where the count is exact.
    Cluster one = cluster;
    double slowest = cluster.levels.front().bandwidth;
    for (const Level& level : cluster.levels) {
      slowest = std::min(slowest, level.bandwidth);
    }
    one.levels = {Level{cluster.num_workers(), slowest}};
    absl::StatusOr<Plan> plan = PlanPipeline(graph, one, options);
    if (plan.ok()) {
      plan->notes.push_back(absl::StrFormat(
          "%d replicas per stage asked for: planned on one level of %d "
          "workers at the slowest link (%.4g B/s), not the hierarchy",
          options.replicas, cluster.num_workers(), slowest));
    }
    return plan;
  }
  const WorkGraph w = BuildWorkGraph(graph, options.activation_compression_ratio);
  const int64_t cap = StateCap(options, cluster);
  SearchBudget budget(options.budget);
  absl::StatusOr<States> made = MakeStates(w, options.cost_model, cap, &budget);
  if (!made.ok()) return made.status();
  const States& st = *made;
  if (absl::Status s = budget.ChargeBytes(
          static_cast<double>(st.sets.size()) *
              (24 + 8 * st.sets.front().size()),
          "the DP states");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<std::vector<int>>> subsets =
      ProperSubsets(st, &budget);
  if (!subsets.ok()) return subsets.status();
  const std::vector<std::vector<int>>& sub = *subsets;
  double mean_speed = 0;
  for (int worker = 0; worker < cluster.num_workers(); ++worker) {
    mean_speed += cluster.speed(worker);
  }
  mean_speed /= cluster.num_workers();
  // The DP and its plan with every level-0 unit at the mean speed (then
  // the fastest workers are handed the heaviest stages), or, where
  // `order` is given (one level only), with unit u being worker order[u]
  // at its own speed.
  auto solve = [&](const std::vector<int>* order) -> absl::StatusOr<Plan> {
    std::vector<double> unit_speeds;
    if (order != nullptr) {
      for (int worker : *order) unit_speeds.push_back(cluster.speed(worker));
    }
    const int L = cluster.levels.size();
    std::vector<LevelTable> tables(L);
    std::vector<int> all_starts;
    for (int i = 0; i < static_cast<int>(st.sets.size()); ++i) {
      if (i != st.full) all_starts.push_back(i);
    }
    for (int l = 0; l < L; ++l) {
      LevelContext ctx;
      ctx.st = &st;
      ctx.model = options.cost_model;
      ctx.rho = options.activation_compression_ratio;
      ctx.bandwidth = cluster.levels[l].bandwidth;
      ctx.level = l;
      ctx.inner_fanout = l == 0 ? 1 : cluster.levels[l - 1].fanout;
      ctx.inner = l == 0 ? nullptr : &tables[l - 1];
      ctx.speed = mean_speed;
      ctx.unit_speeds = order != nullptr && l == 0 ? &unit_speeds : nullptr;
      ctx.transfer_cpu = options.cost_model == CostModel::kApapo
                             ? cluster.transfer_cpu_seconds_per_byte
                             : 0;
      ctx.cluster = &cluster;
      ctx.hide_allreduce = options.split_backward && options.allreduce_in_backward &&
                           options.cost_model == CostModel::kApapo;
      ctx.update_per_param_byte =
          options.cost_model == CostModel::kApapo && st.params[st.full] > 0
              ? graph.update_seconds() / st.params[st.full]
              : 0;
      ctx.prediction_per_param_byte =
          PredictsWeights(options) && st.params[st.full] > 0
              ? graph.update_prediction_seconds() / st.params[st.full]
              : 0;
      ctx.memory = cluster.memory_bytes;
      ctx.total_workers = cluster.num_workers();
      ctx.single_level = L == 1;
      ctx.kind = options.schedule;
      ctx.stage_slots = options.stages > 0 ? options.stages + 1 : 1;
      ctx.replicas = options.replicas;
      const bool final_level = l == L - 1;
      absl::StatusOr<LevelTable> table =
          SolveLevel(ctx, cluster.levels[l].fanout,
                     final_level ? std::vector<int>{0} : all_starts, sub, l,
                     &budget);
      if (!table.ok()) return table.status();
      tables[l] = *std::move(table);
    }
    const int top_units = cluster.levels[L - 1].fanout;
    const double value =
        tables[L - 1].Value(0, st.full, top_units, std::max(0, options.stages));
    if (!(value < kInf)) {
      if (options.stages > 0) return NoPlanWithStages(st, sub, options.stages);
      return NothingFits(graph, cluster, options);
    }
    std::vector<int> units(top_units);
    std::iota(units.begin(), units.end(), 0);
    std::vector<FlatStage> flat;
    Flatten(tables, cluster.levels, L - 1, 0, st.full, top_units,
            std::max(0, options.stages), {units}, &flat);

    if (order != nullptr) {
      for (FlatStage& f : flat) {
        for (int& unit : f.workers) unit = (*order)[unit];
      }
    } else if (cluster.heterogeneous()) {
      // Several levels: hand the fastest workers to the stages with the most
      // work per replica, keeping each stage's workers inside the groups the
      // hierarchy gave it (swap only within level-0 groups).
      const int group = cluster.levels[0].fanout;
      absl::flat_hash_map<int, std::vector<std::pair<int, int>>> slots;
      for (size_t s = 0; s < flat.size(); ++s) {
        for (size_t r = 0; r < flat[s].workers.size(); ++r) {
          slots[flat[s].workers[r] / group].push_back({s, r});
        }
      }
      for (auto& [g, list] : slots) {
        std::vector<int> workers;
        for (auto [s, r] : list) workers.push_back(flat[s].workers[r]);
        std::sort(workers.begin(), workers.end(), [&](int a, int b) {
          return cluster.speed(a) > cluster.speed(b);
        });
        std::sort(list.begin(), list.end(), [&](auto a, auto b) {
          const double la = (st.compute[flat[a.first].j] -
                             st.compute[flat[a.first].k]) /
                            flat[a.first].workers.size();
          const double lb = (st.compute[flat[b.first].j] -
                             st.compute[flat[b.first].k]) /
                            flat[b.first].workers.size();
          return la > lb;
        });
        for (size_t q = 0; q < list.size(); ++q) {
          flat[list[q].first].workers[list[q].second] = workers[q];
        }
      }
    }
    Plan plan;
    plan.num_states = st.sets.size();
    plan.exact = st.exact;
    plan.search = st.search;
    plan.states_enumerated = budget.enumerated_states();
    plan.search_bytes = budget.bytes();
    plan.dp_steps = budget.steps();
    if (absl::Status s =
            FinishPlan(graph, w, st, cluster, options, flat, value, &plan);
        !s.ok()) {
      return s;
    }
    return plan;
  };
  absl::StatusOr<Plan> best = solve(nullptr);
  // Workers of different speeds on one level: also the DP with each
  // worker's own speed, its units the workers fastest first and slowest
  // first (the first stages get the fast ones, or the last ones), and the
  // plan predicted fastest of the three is kept. The unit orders restrict
  // each stage's replicas to a run of that order, so neither always beats
  // the mean-speed plan. On several levels the level-0 table stands for
  // every group alike, and past kMaxWorkersEachAtItsSpeed workers each
  // solve costs O(M^2) per cut pair instead of O(M) (seconds at 64 on
  // 2,000-node graphs): the mean speed only.
  if (best.ok() && cluster.heterogeneous() && cluster.levels.size() == 1 &&
      cluster.num_workers() <= kMaxWorkersEachAtItsSpeed) {
    std::vector<int> order(cluster.num_workers());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return cluster.speed(a) > cluster.speed(b);
    });
    const double at_mean = best->mini_batches_per_second;
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1) std::reverse(order.begin(), order.end());
      absl::StatusOr<Plan> own = solve(&order);
      // Past the search budget (or nothing fits this way): the other plans.
      if (own.ok() && own->mini_batches_per_second > best->mini_batches_per_second) {
        best = *std::move(own);
        best->notes.push_back(absl::StrFormat(
            "workers planned each at its own speed, the %s first: predicted "
            "%.4g mini-batches/s against %.4g with the DP at their mean speed",
            pass == 0 ? "fastest" : "slowest", best->mini_batches_per_second, at_mean));
      }
    }
  }
  if (!best.ok()) return best.status();
  Plan& plan = *best;
  if (options.stages > 0) {
    plan.notes.push_back(absl::StrFormat(
        "%d stage(s) as asked: the best plan with exactly that many",
        options.stages));
  }
  if (options.replicas > 0) {
    plan.notes.push_back(absl::StrFormat(
        "%d replica(s) per stage as asked", options.replicas));
  }
  return best;
}

bool Replicated(const Plan& plan) {
  return std::any_of(plan.stages.begin(), plan.stages.end(),
                     [](const StagePlan& st) { return st.replicas > 1; });
}

bool PredictsWeights(const PlannerOptions& options) {
  return options.weight_prediction && options.cost_model == CostModel::kApapo &&
         options.schedule == schedule::ScheduleKind::kAsync;
}

absl::StatusOr<Plan> DataParallelPlan(const Graph& graph,
                                      const Cluster& cluster,
                                      const PlannerOptions& options) {
  PlannerOptions dp = options;
  dp.schedule = schedule::ScheduleKind::kGPipe;  // validated as a pipeline
  dp.stages = 0;  // one stage by definition
  if (absl::Status s = CheckInputs(graph, cluster, dp); !s.ok()) return s;
  // Replicas asked for: the fastest that many workers (stable: the first
  // of equal speed).
  std::vector<int> workers(cluster.num_workers());
  std::iota(workers.begin(), workers.end(), 0);
  std::stable_sort(workers.begin(), workers.end(), [&](int a, int b) {
    return cluster.speed(a) > cluster.speed(b);
  });
  if (options.replicas > 0) workers.resize(options.replicas);
  std::sort(workers.begin(), workers.end());
  const WorkGraph w = BuildWorkGraph(graph, options.activation_compression_ratio);
  std::vector<int> all_one(w.n, 0);
  Units units = MakeUnits(w, all_one);
  std::vector<Bits> sets;
  EnumerateIdeals(units, -1, &sets);
  const States st = BuildStates(w, units, std::move(sets), options.cost_model);
  std::vector<FlatStage> flat = {FlatStage{0, st.full, workers}};
  Plan plan;
  plan.num_states = st.sets.size();
  plan.search = "data parallel";
  dp.schedule = schedule::ScheduleKind::kDataParallel;
  dp.micro_batches = options.micro_batches > 0
                         ? options.micro_batches
                         : static_cast<int>(workers.size());
  if (absl::Status s = FinishPlan(graph, w, st, cluster, dp, flat, 0, &plan);
      !s.ok()) {
    return s;
  }
  return plan;
}

}  // namespace partitioner
}  // namespace apapo
