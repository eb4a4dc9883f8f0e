#include "partitioner/optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "partitioner/pipedream_format.h"
#include "partitioner/simulator.h"
#include "partitioner/synthetic.h"
#include "partitioner/testdata.h"

namespace apapo {
namespace partitioner {
namespace {

Graph LoadProfile(const std::string& name) {
  absl::StatusOr<Graph> g = ReadPipeDreamGraph(ProfilePath(name));
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

Cluster Flat(int workers) {
  absl::StatusOr<Cluster> c = MakeCluster(workers, "", "", "");
  EXPECT_TRUE(c.ok());
  return *c;
}

PlannerOptions PipeDreamOptions() {
  PlannerOptions o;
  o.cost_model = CostModel::kPipeDream;
  o.activation_compression_ratio = 1;
  return o;
}

// Every node in exactly one stage, edges never go backwards, workers distinct.
void ExpectValidPlan(const Graph& g, const Cluster& c, const Plan& plan) {
  std::vector<int> stage_of(g.num_nodes(), -1);
  std::set<int> workers;
  int replicas = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& stage = plan.stages[s];
    EXPECT_FALSE(stage.nodes.empty()) << "stage " << s;
    EXPECT_EQ(static_cast<int>(stage.workers.size()), stage.replicas);
    replicas += stage.replicas;
    for (int v : stage.nodes) {
      EXPECT_EQ(stage_of[v], -1) << g.node(v).id << " in two stages";
      stage_of[v] = s;
    }
    for (int w : stage.workers) {
      EXPECT_TRUE(workers.insert(w).second) << "worker " << w << " reused";
      EXPECT_LT(w, c.num_workers());
    }
    if (c.memory_bytes > 0) {
      EXPECT_LE(stage.peak_memory_bytes, c.memory_bytes);
    }
  }
  EXPECT_LE(replicas, c.num_workers());
  for (int v = 0; v < g.num_nodes(); ++v) {
    EXPECT_GE(stage_of[v], 0) << g.node(v).id << " not placed";
  }
  for (const Edge& e : g.edges()) {
    EXPECT_LE(stage_of[e.from], stage_of[e.to])
        << g.node(e.from).id << " -> " << g.node(e.to).id;
  }
}

struct Pinned {
  const char* profile;
  int workers;
  double seconds;  // PipeDream's reported "Time per stage in pipeline"
};

// ../shared/profiles/README.md, measured with PipeDream's own optimizer.
constexpr Pinned kPipeDream[] = {
    {"alexnet", 4, 0.0342171},      {"alexnet", 8, 0.0188744},
    {"alexnet", 16, 0.0188744},     {"vgg16", 4, 0.205521},
    {"vgg16", 8, 0.103833},         {"vgg16", 16, 0.0565298},
    {"gnmt", 4, 0.025868},          {"gnmt", 8, 0.019285},
    {"gnmt", 16, 0.019285},         {"squeezenet1_0", 4, 0.074414},
    {"squeezenet1_0", 8, 0.0376931}, {"squeezenet1_0", 16, 0.0188813},
    {"resnet18", 4, 0.100004},      {"resnet18", 8, 0.0507833},
    {"resnet18", 16, 0.0256901},    {"resnet50", 4, 0.162881},
    {"resnet50", 8, 0.0920123},     {"resnet50", 16, 0.0478013},
    {"densenet121", 4, 0.089976},   {"densenet121", 8, 0.0471184},
    {"densenet121", 16, 0.0245459},
};

TEST(OptimizerTest, EqualsOrBeatsPipeDreamOnEveryProfile) {
  ASSERT_NE(ProfilesDir(), "");
  for (const Pinned& p : kPipeDream) {
    const Graph g = LoadProfile(p.profile);
    const Cluster c = Flat(p.workers);
    absl::StatusOr<Plan> plan = PlanPipeline(g, c, PipeDreamOptions());
    ASSERT_TRUE(plan.ok()) << p.profile << ": " << plan.status();
    // The reference is printed to 6 significant digits.
    EXPECT_LE(plan->bottleneck_seconds, p.seconds * (1 + 5e-6))
        << p.profile << " @" << p.workers;
    EXPECT_NEAR(plan->bottleneck_seconds, p.seconds, p.seconds * 1e-5)
        << p.profile << " @" << p.workers;
    EXPECT_TRUE(plan->exact) << p.profile;
    ExpectValidPlan(g, c, *plan);
  }
}

TEST(OptimizerTest, Vgg16AtFourMatchesPipeDreamsShape) {
  // PipeDream: stages (0-17) x3 + (17-40) x1.
  const Graph g = LoadProfile("vgg16");
  absl::StatusOr<Plan> plan = PlanPipeline(g, Flat(4), PipeDreamOptions());
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[0].replicas, 3);
  EXPECT_EQ(plan->stages[1].replicas, 1);
}

TEST(OptimizerTest, PlansEveryProfileAtScaleAndOnTwoLevels) {
  for (const std::string& name : ProfileNames()) {
    const Graph g = LoadProfile(name);
    for (const char* levels : {"4:1e9", "8:1e9", "16:1e9", "64:1e9",
                               "8:300e9,4:25e9"}) {
      absl::StatusOr<Cluster> c = MakeCluster(0, levels, "", "");
      ASSERT_TRUE(c.ok());
      for (CostModel model : {CostModel::kPipeDream, CostModel::kApapo}) {
        PlannerOptions o;
        o.cost_model = model;
        absl::StatusOr<Plan> plan = PlanPipeline(g, *c, o);
        ASSERT_TRUE(plan.ok()) << name << " " << levels << ": " << plan.status();
        EXPECT_GT(plan->bottleneck_seconds, 0);
        EXPECT_LE(plan->bottleneck_seconds, g.TotalComputeSeconds() * 1.0001);
        ExpectValidPlan(g, *c, *plan);
      }
    }
  }
}

TEST(OptimizerTest, CoarseningNeverBeatsTheExactDp) {
  for (const char* name : {"resnet50", "densenet121", "squeezenet1_0"}) {
    const Graph g = LoadProfile(name);
    PlannerOptions exact = PipeDreamOptions();
    exact.max_states = -1;
    PlannerOptions coarse = PipeDreamOptions();
    coarse.max_states = 60;
    absl::StatusOr<Plan> a = PlanPipeline(g, Flat(16), exact);
    absl::StatusOr<Plan> b = PlanPipeline(g, Flat(16), coarse);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(a->exact);
    EXPECT_FALSE(b->exact);
    EXPECT_GE(b->bottleneck_seconds, a->bottleneck_seconds * (1 - 1e-12));
    // Quality lost stays moderate even at a tiny cap.
    EXPECT_LE(b->bottleneck_seconds, a->bottleneck_seconds * 1.5) << name;
  }
}

// ---- Independent brute force over PipeDream's cost model ------------------

struct Brute {
  const Graph& g;
  int M;
  double bw = 1e9;
  std::vector<std::set<int>> anc;

  explicit Brute(const Graph& graph, int machines) : g(graph), M(machines) {
    anc.resize(g.num_nodes());
    for (int v = 0; v < g.num_nodes(); ++v) {
      std::vector<int> stack = {v};
      while (!stack.empty()) {
        int x = stack.back();
        stack.pop_back();
        for (int p : g.predecessors(x)) {
          if (anc[v].insert(p).second) stack.push_back(p);
        }
      }
    }
  }
  // PipeDream's augmented-antichain activation bytes of ideal `d`.
  double Out(unsigned d) const {
    std::set<int> aug;
    for (int a = 0; a < g.num_nodes(); ++a) {
      if (!(d >> a & 1)) continue;
      bool maximal = true;
      for (int s : g.successors(a)) maximal &= !(d >> s & 1);
      if (!maximal) continue;
      aug.insert(a);
      for (int p : anc[a]) {
        for (int o : g.successors(p)) {
          if (o != a && !anc[a].count(o)) aug.insert(p);
        }
      }
    }
    double total = 0;
    for (int v : aug) total += g.node(v).activation_bytes;
    return total;
  }
  bool IsIdeal(unsigned d) const {
    for (const Edge& e : g.edges()) {
      if ((d >> e.to & 1) && !(d >> e.from & 1)) return false;
    }
    return true;
  }
  double StageTime(unsigned lo, unsigned hi, int y, bool first, bool last) {
    double c = 0, p = 0;
    for (int v = 0; v < g.num_nodes(); ++v) {
      if ((hi >> v & 1) && !(lo >> v & 1)) {
        c += g.node(v).compute_seconds();
        p += g.node(v).parameter_bytes;
      }
    }
    double t = (c + 4.0 * (y - 1) * p / (bw * y)) / y;
    if (!first) {
      t = std::max(t, 2 * Out(lo) / (bw * y));
      if (!last) t = std::max(t, 2 * Out(hi) / (bw * y));
    }
    return t;
  }
  // Best bottleneck over all chains of ideals and replica counts (<= M),
  // with exactly `stages` stages and `replicas` replicas each (0: any);
  // 1e300 when there is none.
  double Solve(int stages = 0, int replicas = 0) {
    const unsigned full = (1u << g.num_nodes()) - 1;
    std::vector<unsigned> ideals;
    for (unsigned d = 1; d <= full; ++d) {
      if (IsIdeal(d)) ideals.push_back(d);
    }
    double best = 1e300;
    std::function<void(unsigned, int, double, int)> go =
        [&](unsigned lo, int used, double worst, int count) {
          for (unsigned hi : ideals) {
            if ((hi & lo) != lo || hi == lo) continue;
            for (int y = 1; used + y <= M; ++y) {
              if (replicas > 0 && y != replicas) continue;
              const double t =
                  std::max(worst, StageTime(lo, hi, y, lo == 0, hi == full));
              if (t >= best) continue;
              if (hi == full) {
                if (stages == 0 || count + 1 == stages) best = t;
              } else if (stages == 0 || count + 1 < stages) {
                go(hi, used + y, t, count + 1);
              }
            }
          }
        };
    go(0, 0, 0, 0);
    return best;
  }
};

// A small random DAG whose costs are comparable, so that cuts, transfers
// and replication all matter.
Graph ComparableCostDag(int n, uint64_t seed, std::mt19937& rng) {
  const Graph g = SyntheticDag(n, seed, 3, 4);
  Graph h;
  std::uniform_real_distribution<double> u(0.1, 1.0);
  for (int v = 0; v < g.num_nodes(); ++v) {
    Node node = g.node(v);
    node.forward_seconds = u(rng) * 0.01;
    node.backward_seconds = u(rng) * 0.01;
    node.activation_bytes = u(rng) * 4e6;
    node.parameter_bytes = u(rng) * 4e6;
    h.AddNode(node);
  }
  for (const Edge& e : g.edges()) (void)h.AddEdge(e.from, e.to);
  return h;
}

TEST(OptimizerTest, MatchesBruteForceOnSmallRandomDags) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 3 + trial % 5;
    const Graph h = ComparableCostDag(n, trial, rng);
    ASSERT_TRUE(h.Validate().ok());
    for (int machines : {1, 2, 3, 4}) {
      Brute brute(h, machines);
      const double expected = brute.Solve();
      PlannerOptions o = PipeDreamOptions();
      o.max_states = -1;
      absl::StatusOr<Plan> plan = PlanPipeline(h, Flat(machines), o);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_NEAR(plan->bottleneck_seconds, expected, expected * 1e-9)
          << "trial " << trial << " n=" << n << " M=" << machines;
    }
  }
}

// The same small DAGs with every stage count the workers allow: the DP's
// best with exactly that many stages is the brute force's, and a count the
// DAG has no cuts for is INVALID_ARGUMENT naming `stages`.
TEST(OptimizerTest, AStageCountAskedForIsTheBestWithExactlyThatMany) {
  std::mt19937 rng(11);
  int impossible = 0, pipelines = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const int n = 3 + trial % 5;
    const Graph h = ComparableCostDag(n, 100 + trial, rng);
    ASSERT_TRUE(h.Validate().ok());
    for (int machines : {2, 3, 4}) {
      Brute brute(h, machines);
      for (int stages = 1; stages <= machines; ++stages) {
       for (int replicas : {0, 1, 2}) {
        if (stages * std::max(1, replicas) > machines) continue;
        const double expected = brute.Solve(stages, replicas);
        PlannerOptions o = PipeDreamOptions();
        o.max_states = -1;
        o.stages = stages;
        o.replicas = replicas;
        absl::StatusOr<Plan> plan = PlanPipeline(h, Flat(machines), o);
        const std::string where =
            absl::StrCat("trial ", trial, " n=", n, " M=", machines,
                         " stages=", stages, " replicas=", replicas);
        if (expected >= 1e300) {
          ASSERT_FALSE(plan.ok()) << where;
          EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument)
              << where << ": " << plan.status();
          EXPECT_TRUE(absl::StartsWith(plan.status().message(), "stages: "))
              << plan.status();
          ++impossible;
          continue;
        }
        ASSERT_TRUE(plan.ok()) << where << ": " << plan.status();
        EXPECT_NEAR(plan->bottleneck_seconds, expected, expected * 1e-9)
            << where;
        EXPECT_EQ(static_cast<int>(plan->stages.size()), stages) << where;
        if (replicas > 0) {
          for (const StagePlan& st : plan->stages) {
            EXPECT_EQ(st.replicas, replicas) << where;
          }
        }
        ExpectValidPlan(h, Flat(machines), *plan);
        pipelines += stages > 1;
       }
      }
    }
  }
  // Both outcomes were exercised.
  EXPECT_GT(impossible, 0);
  EXPECT_GT(pipelines, 50);
}

// On two levels (and with the apapo cost model) every count from 1 to the
// workers gives a valid plan with that many stages, none better than the
// free plan, and the best of them is the free plan.
TEST(OptimizerTest, StageCountsCoverTheFreePlanOnTwoLevels) {
  for (const char* name : {"vgg16", "resnet18"}) {
    const Graph g = LoadProfile(name);
    absl::StatusOr<Cluster> c = MakeCluster(8, "4:10e9,2:1e8", "", "");
    ASSERT_TRUE(c.ok());
    PlannerOptions free;
    free.max_states = 120;  // the same states with and without a count
    absl::StatusOr<Plan> best = PlanPipeline(g, *c, free);
    ASSERT_TRUE(best.ok()) << best.status();
    double best_forced = 1e300;
    for (int stages = 1; stages <= 8; ++stages) {
      PlannerOptions o = free;
      o.stages = stages;
      absl::StatusOr<Plan> plan = PlanPipeline(g, *c, o);
      ASSERT_TRUE(plan.ok()) << name << " stages=" << stages << ": "
                             << plan.status();
      EXPECT_EQ(static_cast<int>(plan->stages.size()), stages) << name;
      ExpectValidPlan(g, *c, *plan);
      EXPECT_GE(plan->bottleneck_seconds,
                best->bottleneck_seconds * (1 - 1e-12))
          << name << " stages=" << stages;
      const std::string note = absl::StrCat(stages, " stage(s) as asked");
      EXPECT_TRUE(std::any_of(
          plan->notes.begin(), plan->notes.end(),
          [&](const std::string& n) { return absl::StartsWith(n, note); }))
          << absl::StrJoin(plan->notes, "\n");
      best_forced = std::min(best_forced, plan->bottleneck_seconds);
    }
    EXPECT_NEAR(best_forced, best->bottleneck_seconds,
                best->bottleneck_seconds * 1e-9)
        << name << ": the free plan has " << best->stages.size()
        << " stage(s)";
  }
}

// Replicas asked for on two levels: every stage has that many, planned on
// one level at the slowest link (said in a note); the data-parallel plan
// takes the fastest that many workers.
TEST(OptimizerTest, AReplicaCountAskedForIsExact) {
  const Graph g = LoadProfile("vgg16");
  absl::StatusOr<Cluster> c = MakeCluster(8, "4:10e9,2:1e8", "", "");
  ASSERT_TRUE(c.ok());
  for (int stages : {0, 2, 4}) {
    PlannerOptions o;
    o.stages = stages;
    o.replicas = 2;
    absl::StatusOr<Plan> plan = PlanPipeline(g, *c, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    if (stages > 0) EXPECT_EQ(static_cast<int>(plan->stages.size()), stages);
    for (const StagePlan& st : plan->stages) EXPECT_EQ(st.replicas, 2);
    ExpectValidPlan(g, *c, *plan);
    EXPECT_TRUE(std::any_of(plan->notes.begin(), plan->notes.end(),
                            [](const std::string& n) {
                              return absl::StrContains(
                                  n, "one level of 8 workers at the slowest "
                                     "link (1e+08 B/s)");
                            }))
        << absl::StrJoin(plan->notes, "\n");
  }
  PlannerOptions too_many;
  too_many.stages = 3;
  too_many.replicas = 3;
  absl::StatusOr<Plan> none = PlanPipeline(g, *c, too_many);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message(),
            "replicas: 3 per stage asked for (x 3 stage(s)), but there are 8 "
            "workers");

  absl::StatusOr<Cluster> mixed = MakeCluster(4, "", "", "1.0,2.0,1.0,3.0");
  ASSERT_TRUE(mixed.ok());
  PlannerOptions two;
  two.replicas = 2;
  absl::StatusOr<Plan> dp = DataParallelPlan(g, *mixed, two);
  ASSERT_TRUE(dp.ok()) << dp.status();
  ASSERT_EQ(dp->stages.size(), 1u);
  EXPECT_EQ(dp->stages[0].workers, (std::vector<int>{1, 3}));
}

TEST(OptimizerTest, AStageCountPastTheWorkersOrTheCutsIsInvalid) {
  const Graph g = LoadProfile("vgg16");
  PlannerOptions o;
  o.stages = 5;
  absl::StatusOr<Plan> plan = PlanPipeline(g, Flat(4), o);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "stages: 5 asked for, but a stage needs a worker and there are 4")
      << plan.status();
  o.stages = -1;
  EXPECT_EQ(PlanPipeline(g, Flat(4), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A chain of three layers has at most three stages.
  Graph chain = SyntheticChain(3, 1);
  o.stages = 4;
  plan = PlanPipeline(chain, Flat(8), o);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(plan.status().message(),
                               "stages: 4 asked for, but the model has at most"))
      << plan.status();
}

TEST(OptimizerTest, RespectsMemoryAndSaysWhyNothingFits) {
  const Graph g = LoadProfile("vgg16");
  absl::StatusOr<Cluster> roomy = MakeCluster(8, "", "16G", "");
  ASSERT_TRUE(roomy.ok());
  absl::StatusOr<Plan> plan = PlanPipeline(g, *roomy, PlannerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(g, *roomy, *plan);
  absl::StatusOr<Cluster> tiny = MakeCluster(8, "", "1M", "");
  ASSERT_TRUE(tiny.ok());
  absl::StatusOr<Plan> none = PlanPipeline(g, *tiny, PlannerOptions());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("alone needs"), std::string::npos)
      << none.status();
}

// A chain of four layers of 50 ms forward, 100 ms backward, 1 MB of
// activations and 50 MB of weights each (so replication loses to a
// pipeline on a slow link).
// A chain of `layers` equal layers.
Graph Chain(int layers, double forward_seconds, double backward_seconds,
            double activation_bytes, double parameter_bytes) {
  Graph g;
  int prev = -1;
  for (int i = 0; i < layers; ++i) {
    Node n;
    n.id = absl::StrCat("l", i);
    n.forward_seconds = forward_seconds;
    n.backward_seconds = backward_seconds;
    n.activation_bytes = activation_bytes;
    n.parameter_bytes = parameter_bytes;
    const int v = g.AddNode(n);
    if (prev >= 0) EXPECT_TRUE(g.AddEdge(prev, v).ok());
    prev = v;
  }
  EXPECT_TRUE(g.Validate().ok());
  return g;
}

Graph HeavyChain() { return Chain(4, 0.05, 0.1, 1e6, 50e6); }

TEST(OptimizerTest, AsyncStagesRunDeepEnoughToHideTheLinksRoundTrip) {
  const Graph g = HeavyChain();
  PlannerOptions o;
  o.schedule = schedule::ScheduleKind::kAsync;
  o.activation_compression_ratio = 1;
  // 12.5 MB/s (100 Mbit/s): 80 ms each way per mini-batch, 160 ms there and
  // back against a 300 ms period: stage 0 needs one more micro-batch in
  // flight than NOAM's 2.
  absl::StatusOr<Cluster> slow = MakeCluster(2, "2:12.5e6", "", "");
  ASSERT_TRUE(slow.ok());
  absl::StatusOr<Plan> plan = PlanPipeline(g, *slow, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[0].in_flight_depth, 3);
  EXPECT_EQ(plan->stages[0].in_flight, 3);
  EXPECT_EQ(plan->stages[0].staleness, 2);
  EXPECT_EQ(plan->stages[0].weight_versions, 3);
  EXPECT_EQ(plan->stages[1].in_flight_depth, 0);
  EXPECT_EQ(plan->stages[1].in_flight, 1);
  bool noted = false;
  for (const std::string& note : plan->notes) {
    noted |= absl::StrContains(note, "stage 0 keeps 3 micro-batches in flight");
  }
  EXPECT_TRUE(noted) << absl::StrJoin(plan->notes, "; ");
  // The simulator agrees: at the chosen depth the pipeline runs at its
  // stage time, at NOAM's depth it waits for the link.
  SimulationOptions sim;
  sim.iterations = 64;
  absl::StatusOr<SimulationResult> deep =
      Simulate(*plan, *slow, schedule::ScheduleKind::kAsync, sim);
  ASSERT_TRUE(deep.ok()) << deep.status();
  EXPECT_NEAR(deep->mini_batches_per_second, plan->mini_batches_per_second,
              0.03 * plan->mini_batches_per_second);
  Plan noam = *plan;
  noam.stages[0].in_flight_depth = 0;
  absl::StatusOr<SimulationResult> shallow =
      Simulate(noam, *slow, schedule::ScheduleKind::kAsync, sim);
  ASSERT_TRUE(shallow.ok());
  EXPECT_LT(shallow->micro_batches_per_second,
            0.9 * deep->micro_batches_per_second);

  // A fast link needs no more than NOAM; nor may the depth pass the bound
  // the spec's staleness sets.
  absl::StatusOr<Cluster> fast = MakeCluster(2, "2:10e9", "", "");
  ASSERT_TRUE(fast.ok());
  absl::StatusOr<Plan> quick = PlanPipeline(g, *fast, o);
  ASSERT_TRUE(quick.ok());
  for (const StagePlan& s : quick->stages) EXPECT_EQ(s.in_flight_depth, 0);
  o.max_in_flight = 2;
  absl::StatusOr<Plan> bounded = PlanPipeline(g, *slow, o);
  ASSERT_TRUE(bounded.ok());
  for (const StagePlan& s : bounded->stages) EXPECT_EQ(s.in_flight_depth, 0);
  EXPECT_EQ(bounded->stages[0].staleness, 1);
  // Bounded, stage 0's 2 micro-batches each take 0.3 + 0.3 s of compute
  // and 0.16 s of link: 0.38 s a mini-batch, not the stage time of 0.3,
  // and the prediction says so, as the simulator does.
  EXPECT_NEAR(bounded->seconds_per_mini_batch, 0.38, 0.005);
  absl::StatusOr<SimulationResult> capped =
      Simulate(*bounded, *slow, schedule::ScheduleKind::kAsync, sim);
  ASSERT_TRUE(capped.ok());
  EXPECT_NEAR(capped->mini_batches_per_second, bounded->mini_batches_per_second,
              0.05 * bounded->mini_batches_per_second);
  noted = false;
  for (const std::string& note : bounded->notes) {
    noted |= absl::StrContains(note, "stage 0's 2 micro-batches in flight do not cover");
  }
  EXPECT_TRUE(noted) << absl::StrJoin(bounded->notes, "; ");
  // A link with a 250 kB token bucket passes that much of each 1 MB
  // transfer at once: 2 x 0.75 MB at the rate, 0.12 s there and back, so
  // (0.3 + 0.3 + 0.12) / 2 = 0.36 s a mini-batch, and the note says what
  // the buckets took off. A bucket larger than the transfer leaves only
  // the compute, which the stage time already bounds. The depth chosen
  // to hide the link does not count on the bucket.
  Cluster bucketed = *slow;
  bucketed.levels[0].burst_bytes = 250e3;
  absl::StatusOr<Plan> credited = PlanPipeline(g, bucketed, o);
  ASSERT_TRUE(credited.ok()) << credited.status();
  EXPECT_NEAR(credited->seconds_per_mini_batch, 0.36, 0.005);
  EXPECT_DOUBLE_EQ(credited->stages[0].output_burst_bytes, 250e3);
  noted = false;
  for (const std::string& note : credited->notes) {
    noted |= absl::StrContains(note, "ms of transfers there and back per micro-batch, net "
                                     "of 40 ms for what the links' token buckets pass at once");
  }
  EXPECT_TRUE(noted) << absl::StrJoin(credited->notes, "; ");
  // The simulator, which refills each link direction's bucket at the rate
  // while it idles, agrees; without the bucket it runs the 0.38 above.
  absl::StatusOr<SimulationResult> credited_sim =
      Simulate(*credited, bucketed, schedule::ScheduleKind::kAsync, sim);
  ASSERT_TRUE(credited_sim.ok()) << credited_sim.status();
  EXPECT_NEAR(credited_sim->mini_batches_per_second, credited->mini_batches_per_second,
              0.03 * credited->mini_batches_per_second);
  EXPECT_GT(credited_sim->mini_batches_per_second, 1.03 * capped->mini_batches_per_second);
  bucketed.levels[0].burst_bytes = 2e6;
  absl::StatusOr<Plan> covered = PlanPipeline(g, bucketed, o);
  ASSERT_TRUE(covered.ok());
  EXPECT_NEAR(covered->seconds_per_mini_batch, 0.3, 0.005);
  o.max_in_flight = 0;
  absl::StatusOr<Plan> deep_bucketed = PlanPipeline(g, bucketed, o);
  ASSERT_TRUE(deep_bucketed.ok());
  EXPECT_EQ(deep_bucketed->stages[0].in_flight_depth, 3);
  // Deep enough, the bound does not bind.
  EXPECT_NEAR(plan->seconds_per_mini_batch, 0.3, 0.005);
}

// Two layers `first` -> `second` of the same forward and backward seconds
// and parameter bytes each, `cut_bytes` of activations between them (1 kB
// out of the second).
Graph TwoLayers(const std::string& first, const std::string& second,
                double forward, double backward, double cut_bytes,
                double parameter_bytes) {
  Graph g;
  Node a;
  a.id = first;
  a.forward_seconds = forward;
  a.backward_seconds = backward;
  a.activation_bytes = cut_bytes;
  a.parameter_bytes = parameter_bytes;
  Node b = a;
  b.id = second;
  b.activation_bytes = 1e3;
  const int u = g.AddNode(a);
  const int v = g.AddNode(b);
  EXPECT_TRUE(g.AddEdge(u, v).ok());
  EXPECT_TRUE(g.Validate().ok());
  return g;
}

// The mlp of bench/cluster at 100 Mbit/s in miniature: two layers of 67 ms
// a mini-batch, 1 MB of activations between them, 10 MB of weights each.
TEST(OptimizerTest, ALinkCarriesActivationsAndGradientsBothWaysAtOnce) {
  const Graph g = TwoLayers("fc1", "fc2", 0.022, 0.045, 1e6, 10e6);
  absl::StatusOr<Cluster> slow = MakeCluster(2, "2:12.5e6", "", "");
  ASSERT_TRUE(slow.ok());
  PlannerOptions o;
  o.schedule = schedule::ScheduleKind::kAsync;
  // 1 MB forward and 1 MB of gradients back per mini-batch, 80 ms each
  // way at once: the pipeline (80 ms a mini-batch) beats one worker (134).
  absl::StatusOr<Plan> plan = PlanPipeline(g, *slow, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  for (const StagePlan& st : plan->stages) {
    EXPECT_NEAR(st.comm_seconds, 0.08, 1e-9);
  }
  EXPECT_NEAR(plan->seconds_per_mini_batch, 0.08, 1e-9);
  // PipeDream's model sends them one after the other (160 ms): one worker.
  o.cost_model = CostModel::kPipeDream;
  absl::StatusOr<Plan> pd = PlanPipeline(g, *slow, o);
  ASSERT_TRUE(pd.ok()) << pd.status();
  EXPECT_EQ(pd->stages.size(), 1u);
}

// The same at a flush (1F1B, m = 4): the link carries 4 micro-batches of
// 250 KB, 20 ms each, each way (t = 80 ms a mini-batch, 20 a slot), and
// one micro-batch's path, its compute on both stages (2 x 67 / 4 ms) and
// its transfer there and back (2 x 20), is not overlapped: 3 x 20 + 73.5
// = 133.5 ms an iteration. PipeDream's (m + p - 1) t / m gave 100 ms; the
// bench ran such a plan 36% below that (bench/cluster, 2026-12-03 12:35).
TEST(OptimizerTest, AFlushPaysOneMicroBatchsPathThroughTheLinkThereAndBack) {
  const Graph g = TwoLayers("fc1", "fc2", 0.022, 0.045, 1e6, 10e6);
  absl::StatusOr<Cluster> slow = MakeCluster(2, "2:12.5e6", "", "");
  ASSERT_TRUE(slow.ok());
  PlannerOptions o;
  o.schedule = schedule::ScheduleKind::k1F1BFlush;
  o.micro_batches = 4;
  o.stages = 2;
  absl::StatusOr<Plan> plan = PlanPipeline(g, *slow, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_NEAR(plan->bottleneck_seconds, 0.08, 1e-9);
  EXPECT_NEAR(plan->seconds_per_mini_batch, 3 * 0.02 + 2 * 0.067 / 4 + 2 * 0.02, 1e-9);
  // Without a link the path is the stages' own slots: the closed form.
  absl::StatusOr<Cluster> fast = MakeCluster(2, "2:1e15", "", "");
  ASSERT_TRUE(fast.ok());
  plan = PlanPipeline(g, *fast, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->seconds_per_mini_batch,
              plan->bottleneck_seconds * (4 + 2 - 1) / 4, 1e-6);
}

// Two layers of 50 ms forward, 100 ms backward and 5 MB of weights, with
// 19 MB of activations between them: at 1 GB/s the wire hides under the
// compute, and only the copies' CPU can tell a pipeline from replicas.
Graph WideCut() { return TwoLayers("conv", "head", 0.05, 0.1, 19e6, 5e6); }

// The CPU a transfer takes per byte grows with its messages' size
// (measured: a message past the caches copies at memory speed), linear in
// log bytes between the measured sizes and below them flat; above them the
// last rise goes on, up to kMaxTransferCpuFactor.
TEST(ClusterTest, TransferCpuPerByteGrowsWithMessageSize) {
  Cluster c;
  c.transfer_cpu_seconds_per_byte = 0.2e-9;
  EXPECT_DOUBLE_EQ(c.TransferCpuPerByte(64e6), 0.2e-9);  // no scale: flat
  c.transfer_cpu_scale = {{4 << 20, 1.0}, {16 << 20, 2.0}, {64 << 20, 8.0}};
  EXPECT_NEAR(c.TransferCpuPerByte(1 << 20), 0.2e-9, 1e-18);
  EXPECT_NEAR(c.TransferCpuPerByte(4 << 20), 0.2e-9, 1e-18);
  EXPECT_NEAR(c.TransferCpuPerByte(8 << 20), 0.3e-9, 1e-18);
  EXPECT_NEAR(c.TransferCpuPerByte(16 << 20), 0.4e-9, 1e-18);
  EXPECT_NEAR(c.TransferCpuPerByte(32 << 20), 1.0e-9, 1e-18);
  // Past 64 MiB, 6 more per 4x: 11 at 128 MiB, and never above 20.
  EXPECT_NEAR(c.TransferCpuPerByte(128 << 20), 2.2e-9, 1e-18);
  EXPECT_NEAR(c.TransferCpuPerByte(1e12), 0.2e-9 * kMaxTransferCpuFactor, 1e-18);
  // A last segment that falls (a noisy probe) is not extended downwards,
  // nor is a single point.
  c.transfer_cpu_scale = {{4 << 20, 1.0}, {16 << 20, 3.0}, {32 << 20, 2.0}};
  EXPECT_NEAR(c.TransferCpuPerByte(1e9), 0.4e-9, 1e-18);
  c.transfer_cpu_scale = {{4 << 20, 1.0}};
  EXPECT_NEAR(c.TransferCpuPerByte(1e9), 0.2e-9, 1e-18);
  c.transfer_cpu_seconds_per_byte = 0;  // unmeasured: transfers are free
  EXPECT_EQ(c.TransferCpuPerByte(32 << 20), 0);
}


// The optimizer's update is in the profile's backward; the replicas of a
// stage split the backward but each runs all of the update, on top of its
// share (measured, the mlp's 1 x 2: 22-36 ms of update per step on each
// replica, which the plan had divided between them). The simulator runs
// it at each replica's kUpdate, outside the backward, and agrees.
TEST(OptimizerTest, EveryReplicaRunsTheWholeUpdate) {
  Graph g = TwoLayers("fc1", "fc2", 0.05, 0.1, 1e3, 8e6);
  absl::StatusOr<Cluster> c = MakeCluster(2, "2:1e12", "", "");
  ASSERT_TRUE(c.ok());
  SimulationOptions sim;
  absl::StatusOr<Plan> before = DataParallelPlan(g, *c, PlannerOptions());
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_NEAR(before->stages[0].compute_seconds, 0.15, 1e-9);
  g.set_update_seconds(0.04);  // of the 0.2 s of backward
  absl::StatusOr<Plan> dp = DataParallelPlan(g, *c, PlannerOptions());
  ASSERT_TRUE(dp.ok()) << dp.status();
  ASSERT_EQ(dp->stages.size(), 1u);
  // 0.3 s of compute split in two, and the other half of the update.
  EXPECT_NEAR(dp->stages[0].compute_seconds, 0.17, 1e-9);
  EXPECT_NEAR(dp->stages[0].update_seconds, 0.04, 1e-9);
  EXPECT_NEAR(dp->stages[0].backward_seconds, 0.16 / dp->micro_batches, 1e-9);
  absl::StatusOr<SimulationResult> run =
      Simulate(*dp, *c, schedule::ScheduleKind::kDataParallel, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, dp->mini_batches_per_second,
              0.03 * dp->mini_batches_per_second);
  EXPECT_LT(dp->mini_batches_per_second, before->mini_batches_per_second);
  // One replica per stage: its update is its own, nothing changes.
  absl::StatusOr<Plan> piped = PlanPipeline(g, *c, PlannerOptions());
  ASSERT_TRUE(piped.ok()) << piped.status();
  ASSERT_EQ(piped->stages.size(), 2u);
  EXPECT_NEAR(piped->stages[0].compute_seconds, 0.15, 1e-9);
  EXPECT_NEAR(piped->stages[0].update_seconds, 0.02, 1e-9);
  // PipeDream's cost model has no update of its own.
  absl::StatusOr<Plan> pd = DataParallelPlan(g, *c, PipeDreamOptions());
  ASSERT_TRUE(pd.ok()) << pd.status();
  EXPECT_EQ(pd->stages[0].update_seconds, 0);
}

// An async stage whose gradients are delayed (all but the last) predicts
// its weights with its update, which costs it the profile's
// update_prediction_seconds more by parameter bytes (measured, the mlp's
// first stage: 14-17 ms of update against the 12 ms charged without it);
// the last stage, the flush schedules and a job that turns prediction off
// pay nothing. The simulator runs it at the stage's kUpdate and agrees.
TEST(OptimizerTest, StagesThatPredictTheirWeightsPayForItInTheirUpdate) {
  Graph g = TwoLayers("fc1", "fc2", 0.05, 0.1, 1e3, 8e6);
  g.set_update_seconds(0.04);
  g.set_update_prediction_seconds(0.02);  // 0.01 s for each layer's weights
  absl::StatusOr<Cluster> c = MakeCluster(2, "2:1e12", "", "");
  ASSERT_TRUE(c.ok());
  absl::StatusOr<Plan> piped = PlanPipeline(g, *c, PlannerOptions());
  ASSERT_TRUE(piped.ok()) << piped.status();
  ASSERT_EQ(piped->stages.size(), 2u);
  EXPECT_NEAR(piped->stages[0].compute_seconds, 0.16, 1e-9);
  EXPECT_NEAR(piped->stages[0].update_seconds, 0.03, 1e-9);
  EXPECT_NEAR(piped->stages[1].compute_seconds, 0.15, 1e-9);
  EXPECT_NEAR(piped->stages[1].update_seconds, 0.02, 1e-9);
  // The backward the simulator runs is without either.
  EXPECT_NEAR(piped->stages[0].backward_seconds, 0.08 / piped->micro_batches, 1e-9);
  EXPECT_TRUE(std::any_of(piped->notes.begin(), piped->notes.end(),
                          [](const std::string& n) {
                            return absl::StrContains(
                                n, "stage 0 predicts its weights (its gradients are "
                                   "delayed): its update costs 10 ms more per mini-batch");
                          }))
      << absl::StrJoin(piped->notes, "\n");
  SimulationOptions sim;
  absl::StatusOr<SimulationResult> run =
      Simulate(*piped, *c, schedule::ScheduleKind::kAsync, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, piped->mini_batches_per_second,
              0.03 * piped->mini_batches_per_second);
  EXPECT_NEAR(piped->mini_batches_per_second, 1 / 0.16, 1e-6);

  PlannerOptions off;
  off.weight_prediction = false;
  absl::StatusOr<Plan> stashing = PlanPipeline(g, *c, off);
  ASSERT_TRUE(stashing.ok()) << stashing.status();
  ASSERT_EQ(stashing->stages.size(), 2u);
  EXPECT_NEAR(stashing->stages[0].compute_seconds, 0.15, 1e-9);
  EXPECT_NEAR(stashing->stages[0].update_seconds, 0.02, 1e-9);

  PlannerOptions flush;
  flush.schedule = schedule::ScheduleKind::k1F1BFlush;
  flush.micro_batches = 4;
  absl::StatusOr<Plan> synchronous = PlanPipeline(g, *c, flush);
  ASSERT_TRUE(synchronous.ok()) << synchronous.status();
  for (const StagePlan& stage : synchronous->stages) {
    EXPECT_NEAR(stage.update_seconds, 0.04 * stage.parameter_bytes / 16e6, 1e-9);
  }
}

// The all-reduce's factor, timed at two sizes while profiling, is read at
// each all-reduce's own size: linear in log bytes between the sizes timed,
// flat outside them (nothing is extrapolated: the larger size is the
// largest a stage all-reduces on the hosts it was timed on).
TEST(ClusterTest, TheAllReduceFactorIsReadAtTheAllReducesSize) {
  Cluster c;
  EXPECT_EQ(c.AllReduceFactor(64e6), 1);  // nothing timed: as modelled
  c.allreduce_factor = {{4 << 20, 0.8}, {64 << 20, 1.6}};
  EXPECT_DOUBLE_EQ(c.AllReduceFactor(1e3), 0.8);
  EXPECT_DOUBLE_EQ(c.AllReduceFactor(4 << 20), 0.8);
  EXPECT_NEAR(c.AllReduceFactor(16 << 20), 1.2, 1e-12);
  EXPECT_DOUBLE_EQ(c.AllReduceFactor(64 << 20), 1.6);
  EXPECT_DOUBLE_EQ(c.AllReduceFactor(1e12), 1.6);
  // The simulator and the plan charge a replicated stage its size's factor:
  // two replicas of 16 MiB at 1 GB/s move 16 MiB each way (16.8 ms), 1.2x.
  const Graph g = TwoLayers("a", "b", 0.05, 0.05, 1e3, 8 << 20);
  absl::StatusOr<Cluster> two = MakeCluster(2, "2:1e9", "", "");
  ASSERT_TRUE(two.ok());
  two->allreduce_factor = c.allreduce_factor;
  absl::StatusOr<Plan> dp = DataParallelPlan(g, *two, PlannerOptions());
  ASSERT_TRUE(dp.ok()) << dp.status();
  ASSERT_EQ(dp->stages.size(), 1u);
  EXPECT_NEAR(dp->stages[0].allreduce_seconds, 1.2 * (16 << 20) / 1e9, 1e-9);
}
// The cnn's case: the figure the link test measured at 4 MiB (0.1 ns)
// keeps the 2-stage pipeline (150 + 2 x 1.9 ms against the replicas'
// 150 + 10 ms all-reduce); at the cut's 19 MB messages the host spends 6x
// that per byte (11.4 ms each way), and the replicas win.
TEST(OptimizerTest, LargeMessagesCostTheirOwnCpuPerByte) {
  const Graph g = TwoLayers("conv", "head", 0.05, 0.1, 19e6, 5e6);
  absl::StatusOr<Cluster> c = MakeCluster(2, "2:1e9", "", "");
  ASSERT_TRUE(c.ok());
  Cluster copying = *c;
  copying.transfer_cpu_seconds_per_byte = 0.1e-9;
  absl::StatusOr<Plan> flat = PlanPipeline(g, copying, PlannerOptions());
  ASSERT_TRUE(flat.ok()) << flat.status();
  ASSERT_EQ(flat->stages.size(), 2u);
  EXPECT_NEAR(flat->bottleneck_seconds, 0.1538, 1e-9);

  copying.transfer_cpu_scale = {{4 << 20, 1.0}, {19e6, 6.0}};
  absl::StatusOr<Plan> replicas = PlanPipeline(g, copying, PlannerOptions());
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  ASSERT_EQ(replicas->stages.size(), 1u);
  EXPECT_EQ(replicas->stages[0].replicas, 2);
  EXPECT_NEAR(replicas->bottleneck_seconds, 0.16, 1e-9);

  // Forced to 2 stages, each stage is charged its messages' figure, and
  // the note gives it.
  PlannerOptions two;
  two.stages = 2;
  absl::StatusOr<Plan> piped = PlanPipeline(g, copying, two);
  ASSERT_TRUE(piped.ok()) << piped.status();
  ASSERT_EQ(piped->stages.size(), 2u);
  for (const StagePlan& st : piped->stages) {
    EXPECT_NEAR(st.transfer_cpu_seconds, 19e6 * 0.6e-9, 1e-12);
  }
  EXPECT_NEAR(piped->bottleneck_seconds, 0.15 + 2 * 19e6 * 0.6e-9, 1e-9);
  bool noted = false;
  for (const std::string& note : piped->notes) {
    noted |= absl::StrContains(note, "(0.6 ns per byte, both ways");
  }
  EXPECT_TRUE(noted) << absl::StrJoin(piped->notes, "; ");
}

TEST(OptimizerTest, TransferCopiesTakeTheStagesCpu) {
  const Graph g = WideCut();
  absl::StatusOr<Cluster> c = MakeCluster(2, "2:1e9", "", "");
  ASSERT_TRUE(c.ok());
  // Without the copies' CPU: stages of 150 ms (the 38 ms link overlaps)
  // beat replicas at 300 / 2 + a 10 ms ring all-reduce of 10 MB.
  absl::StatusOr<Plan> free_copies = PlanPipeline(g, *c, PlannerOptions());
  ASSERT_TRUE(free_copies.ok()) << free_copies.status();
  ASSERT_EQ(free_copies->stages.size(), 2u);
  EXPECT_NEAR(free_copies->bottleneck_seconds, 0.15, 1e-9);

  // At 2 ns per byte each stage also spends 2 x 19 MB x 2 ns = 76 ms
  // copying (226 ms), while the replicas' all-reduce copies 10 MB out and
  // in at 2 ns: 40 ms (190 ms). The replicas win (the cnn on one-core
  // workers).
  Cluster copying = *c;
  copying.transfer_cpu_seconds_per_byte = 2e-9;
  absl::StatusOr<Plan> replicas = PlanPipeline(g, copying, PlannerOptions());
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  ASSERT_EQ(replicas->stages.size(), 1u);
  EXPECT_EQ(replicas->stages[0].replicas, 2);
  EXPECT_NEAR(replicas->stages[0].allreduce_seconds, 0.04, 1e-9);
  EXPECT_NEAR(replicas->bottleneck_seconds, 0.19, 1e-9);
  absl::StatusOr<Plan> dp = DataParallelPlan(g, copying, PlannerOptions());
  ASSERT_TRUE(dp.ok());
  EXPECT_NEAR(dp->bottleneck_seconds, replicas->bottleneck_seconds, 1e-9);
  // The simulator charges the same all-reduce once per mini-batch.
  SimulationOptions sim;
  sim.iterations = 32;
  absl::StatusOr<SimulationResult> dp_run = Simulate(
      *dp, copying, schedule::ScheduleKind::kDataParallel, sim);
  ASSERT_TRUE(dp_run.ok()) << dp_run.status();
  EXPECT_NEAR(dp_run->mini_batches_per_second, dp->mini_batches_per_second,
              0.03 * dp->mini_batches_per_second);

  // Cheaper copies keep the pipeline; the stage's times include them, for
  // the simulator too (per micro-batch), and a note says how much.
  copying.transfer_cpu_seconds_per_byte = 0.1e-9;
  absl::StatusOr<Plan> cheap = PlanPipeline(g, copying, PlannerOptions());
  ASSERT_TRUE(cheap.ok()) << cheap.status();
  ASSERT_EQ(cheap->stages.size(), 2u);
  const double per_pass = 19e6 * 0.1e-9;  // 1.9 ms each way
  const double m = cheap->micro_batches;
  for (const StagePlan& st : cheap->stages) {
    EXPECT_NEAR(st.transfer_cpu_seconds, per_pass, 1e-12);
    EXPECT_NEAR(st.compute_seconds, 0.15 + 2 * per_pass, 1e-9);
    EXPECT_NEAR(st.forward_seconds, (0.05 + per_pass) / m, 1e-9);
    EXPECT_NEAR(st.backward_seconds, (0.1 + per_pass) / m, 1e-9);
  }
  EXPECT_NEAR(cheap->bottleneck_seconds, 0.15 + 2 * per_pass, 1e-9);
  bool noted = false;
  for (const std::string& note : cheap->notes) {
    noted |= absl::StrContains(
        note, "stage 1 spends 3.8 ms of CPU per mini-batch on its transfers");
  }
  EXPECT_TRUE(noted) << absl::StrJoin(cheap->notes, "; ");
  absl::StatusOr<SimulationResult> run =
      Simulate(*cheap, copying, schedule::ScheduleKind::kAsync, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, cheap->mini_batches_per_second,
              0.03 * cheap->mini_batches_per_second);

  // A measured all-reduce 3x the ring model (the cluster's factor, at
  // every size) makes
  // the replicas' 40 ms 120 ms (270 ms): the pipeline wins again, and the
  // simulator charges the same.
  copying.transfer_cpu_seconds_per_byte = 2e-9;
  copying.allreduce_factor = {{4 << 20, 3.0}};
  absl::StatusOr<Plan> dear = DataParallelPlan(g, copying, PlannerOptions());
  ASSERT_TRUE(dear.ok());
  EXPECT_NEAR(dear->stages[0].allreduce_seconds, 0.12, 1e-9);
  EXPECT_NEAR(dear->bottleneck_seconds, 0.27, 1e-9);
  bool charged = false;
  for (const std::string& note : dear->notes) {
    charged |= absl::StrContains(
        note, "stage 0's all-reduce is charged 120 ms per mini-batch: 3.00x");
  }
  EXPECT_TRUE(charged) << absl::StrJoin(dear->notes, "; ");
  absl::StatusOr<SimulationResult> dear_run = Simulate(
      *dear, copying, schedule::ScheduleKind::kDataParallel, sim);
  ASSERT_TRUE(dear_run.ok());
  EXPECT_NEAR(dear_run->mini_batches_per_second, dear->mini_batches_per_second,
              0.03 * dear->mini_batches_per_second);
  absl::StatusOr<Plan> piped = PlanPipeline(g, copying, PlannerOptions());
  ASSERT_TRUE(piped.ok());
  EXPECT_EQ(piped->stages.size(), 2u);
  EXPECT_NEAR(piped->bottleneck_seconds, 0.226, 1e-9);
  copying.allreduce_factor.clear();

  // PipeDream's cost model has no such term.
  PlannerOptions pd = PipeDreamOptions();
  copying.transfer_cpu_seconds_per_byte = 2e-9;
  absl::StatusOr<Plan> with = PlanPipeline(g, copying, pd);
  absl::StatusOr<Plan> without = PlanPipeline(g, *c, pd);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(with->bottleneck_seconds, without->bottleneck_seconds);
  EXPECT_EQ(with->stages.size(), without->stages.size());
}

// A split backward's last micro-batch computes its weight gradients while
// the all-reduce runs: they hide its link time, never the copies and sums
// that run on the worker's own core.
TEST(ClusterTest, TheWeightGradientsHideTheAllReducesLinkNotItsCopies) {
  EXPECT_EQ(RingAllReduceCpuShare(1e9, 0), 0);
  EXPECT_DOUBLE_EQ(RingAllReduceCpuShare(1e9, 0.25e-9), 0.5);
  EXPECT_DOUBLE_EQ(RingAllReduceCpuShare(1e9, 1e-9), 1);  // copies bind
  EXPECT_DOUBLE_EQ(RingAllReduceCpuShare(0, 1e-9), 1);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0, 0.03, 1), 0.07);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.5, 0.03, 1), 0.07);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.5, 0.2, 1), 0.05);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0, 0.2, 1), 0);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 1, 0.2, 1), 0.1);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.5, 0, 1), 0.1);
  EXPECT_EQ(ExposedAllReduceSeconds(0, 0.5, 0.2, 1), 0);
}

// Beside the compute an all-reduce runs slower than alone: a window hides
// its factor of its seconds, and the tail left grows; the core's share
// still bounds it from below.
TEST(ClusterTest, AnAllReduceSlowerBesideTheComputeHidesLessOfItsTime) {
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.2, 0.05, 0.6), 0.07);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.2, 0.05, 0), 0.1);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.2, 0.2, 0.6), 0.02);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.3, 0.15, 0.6), 0.03);
  // Outside [0, 1] it is clamped.
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.2, 0.05, 2), 0.05);
  EXPECT_DOUBLE_EQ(ExposedAllReduceSeconds(0.1, 0.2, 0.05, -1), 0.1);
}

// The all-reduce's CPU share: the copies' model, or what was measured
// (per byte moved each way, so its share is that times the bandwidth).
TEST(ClusterTest, TheAllReducesCpuShareIsTheMeasuredOneWhereMeasured) {
  Cluster c;
  c.transfer_cpu_seconds_per_byte = 0.25e-9;
  EXPECT_DOUBLE_EQ(c.AllReduceCpuShare(1e9), 0.5);
  c.allreduce_cpu_seconds_per_byte = 0.3e-9;
  EXPECT_DOUBLE_EQ(c.AllReduceCpuShare(1e9), 0.3);
  EXPECT_DOUBLE_EQ(c.AllReduceCpuShare(1e8), 0.03);
  EXPECT_DOUBLE_EQ(c.AllReduceCpuShare(1e10), 1);  // the CPU binds
}

// The window of a first stage: its product nodes' bytes travel behind the
// whole backward, the rest behind the weight gradients.
TEST(ClusterTest, TheFirstStagesProductNodesWaitForTheWholeBackward) {
  EXPECT_DOUBLE_EQ(AllReduceWindowSeconds(0.05, 0.2, 0, 10), 0.05);
  EXPECT_DOUBLE_EQ(AllReduceWindowSeconds(0.05, 0.2, 10, 10), 0.2);
  EXPECT_DOUBLE_EQ(AllReduceWindowSeconds(0.05, 0.2, 5, 10), 0.125);
  EXPECT_DOUBLE_EQ(AllReduceWindowSeconds(0.05, 0.01, 10, 10), 0.05);  // W at least
  EXPECT_DOUBLE_EQ(AllReduceWindowSeconds(0.05, 0.2, 5, 0), 0.05);
}

// Two layers of 50 ms forward and 100 ms backward a mini-batch whose
// weight gradients follow the input gradients' send (half the backward:
// 100 ms of the two), 5 MB of weights each and `cut_bytes` between them;
// node `product` (0 or 1) computes its weight gradient in one product.
Graph SplitLayers(double cut_bytes, int product = -1) {
  Graph g;
  Node a;
  a.id = "fc1";
  a.forward_seconds = 0.05;
  a.backward_seconds = 0.1;
  a.activation_bytes = cut_bytes;
  a.parameter_bytes = 5e6;
  a.weights_after_send = true;
  Node b = a;
  b.id = "fc2";
  b.activation_bytes = 1e3;
  a.weights_in_product = product == 0;
  b.weights_in_product = product == 1;
  const int u = g.AddNode(a);
  const int v = g.AddNode(b);
  EXPECT_TRUE(g.AddEdge(u, v).ok());
  EXPECT_TRUE(g.Validate().ok());
  return g;
}

bool HasNote(const Plan& plan, absl::string_view text) {
  return std::any_of(plan.notes.begin(), plan.notes.end(),
                     [&](const std::string& n) { return absl::StrContains(n, text); });
}

// As above, with fc2 a product node (a Linear after fc1, whose weights
// make pass 1 run through it): on the first stage its part starts in pass
// 1, so its 5 MB travel behind the whole 100 ms backward of a replica's
// micro-batch, fc1's behind the 50 ms of weight gradients: a window of
// 75 ms, 25 ms of the 100 ms all-reduce left. fc1 as the product node
// instead (its input is the data: pass 1 never reaches it) hides no more.
TEST(OptimizerTest, TheFirstStagesProductNodesHideTheirAllReduceBehindTheWholeBackward) {
  absl::StatusOr<Cluster> slow = MakeCluster(2, "2:1e8", "", "");
  ASSERT_TRUE(slow.ok());
  PlannerOptions o;
  o.split_backward = true;
  for (const bool second : {true, false}) {
    SCOPED_TRACE(second ? "fc2 in a product" : "fc1 in a product");
    const Graph g = SplitLayers(1e3, second ? 1 : 0);
    absl::StatusOr<Plan> dp = DataParallelPlan(g, *slow, o);
    ASSERT_TRUE(dp.ok()) << dp.status();
    ASSERT_EQ(dp->micro_batches, 2);
    const double window = second ? 0.075 : 0.05;
    EXPECT_NEAR(dp->stages[0].allreduce_window_seconds, window, 1e-12);
    EXPECT_NEAR(dp->stages[0].allreduce_seconds, 0.1 - window, 1e-9);
    EXPECT_NEAR(dp->bottleneck_seconds, 0.15 + 0.1 - window, 1e-9);
    EXPECT_EQ(HasNote(*dp, "hidden behind its last micro-batch's backward"), second)
        << absl::StrJoin(dp->notes, "; ");
    SimulationOptions sim;
    sim.iterations = 32;
    absl::StatusOr<SimulationResult> run =
        Simulate(*dp, *slow, schedule::ScheduleKind::kDataParallel, sim);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_NEAR(run->mini_batches_per_second, dp->mini_batches_per_second,
                0.03 * dp->mini_batches_per_second);
  }
}

// Two replicas (m = 2) of the two layers: 150 ms of compute each and a ring
// all-reduce of the 10 MB, 100 ms at 100 MB/s. With a split backward each
// replica's micro-batch ends with 50 ms of weight gradients, during which
// the all-reduce's link runs: 50 ms of it is left (200 ms a mini-batch, not
// 250); the simulator charges the same.
TEST(OptimizerTest, ASplitBackwardHidesTheAllReduceBehindTheLastWeightGradients) {
  const Graph g = SplitLayers(1e3);
  absl::StatusOr<Cluster> slow = MakeCluster(2, "2:1e8", "", "");
  ASSERT_TRUE(slow.ok());
  SimulationOptions sim;
  sim.iterations = 32;
  PlannerOptions o;
  o.split_backward = true;
  absl::StatusOr<Plan> dp = DataParallelPlan(g, *slow, o);
  ASSERT_TRUE(dp.ok()) << dp.status();
  ASSERT_EQ(dp->stages.size(), 1u);
  ASSERT_EQ(dp->micro_batches, 2);
  EXPECT_NEAR(dp->stages[0].allreduce_window_seconds, 0.05, 1e-12);
  EXPECT_NEAR(dp->stages[0].allreduce_seconds, 0.1 - 0.05, 1e-9);
  EXPECT_NEAR(dp->bottleneck_seconds, 0.15 + 0.05, 1e-9);
  EXPECT_TRUE(HasNote(*dp, "stage 0's all-reduce takes 100 ms per mini-batch, "
                           "50 ms of it hidden behind its last micro-batch's "
                           "weight gradients"))
      << absl::StrJoin(dp->notes, "; ");
  absl::StatusOr<SimulationResult> run =
      Simulate(*dp, *slow, schedule::ScheduleKind::kDataParallel, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, dp->mini_batches_per_second,
              0.03 * dp->mini_batches_per_second);

  // Where the all-reduce runs at 0.6 of its pace alone beside the compute
  // (its window factor), the 50 ms of weight gradients hide 30 ms of it:
  // 70 ms are left, in the DP, the plan and the simulator alike.
  Cluster slower = *slow;
  slower.allreduce_window_factor = 0.6;
  absl::StatusOr<Plan> paced = DataParallelPlan(g, slower, o);
  ASSERT_TRUE(paced.ok()) << paced.status();
  EXPECT_NEAR(paced->stages[0].allreduce_seconds, 0.1 - 0.6 * 0.05, 1e-9);
  EXPECT_NEAR(paced->bottleneck_seconds, 0.15 + 0.07, 1e-9);
  EXPECT_TRUE(HasNote(*paced, "30 ms of it hidden behind its last micro-batch's "
                              "weight gradients; a second of that compute hides "
                              "0.60 s of the all-reduce"))
      << absl::StrJoin(paced->notes, "; ");
  run = Simulate(*paced, slower, schedule::ScheduleKind::kDataParallel, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, paced->mini_batches_per_second,
              0.03 * paced->mini_batches_per_second);
  absl::StatusOr<Plan> searched = PlanPipeline(g, slower, o);
  ASSERT_TRUE(searched.ok()) << searched.status();
  if (searched->stages.size() == 1) {
    EXPECT_NEAR(searched->bottleneck_seconds, paced->bottleneck_seconds, 1e-9);
  }

  // Without the split backward the replicas wait for all of it.
  PlannerOptions whole;
  absl::StatusOr<Plan> unsplit = DataParallelPlan(g, *slow, whole);
  ASSERT_TRUE(unsplit.ok()) << unsplit.status();
  EXPECT_EQ(unsplit->stages[0].allreduce_window_seconds, 0);
  EXPECT_NEAR(unsplit->stages[0].allreduce_seconds, 0.1, 1e-9);
  EXPECT_NEAR(unsplit->bottleneck_seconds, 0.25, 1e-9);
  EXPECT_FALSE(HasNote(*unsplit, "hidden")) << absl::StrJoin(unsplit->notes, "; ");
  run = Simulate(*unsplit, *slow, schedule::ScheduleKind::kDataParallel, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, unsplit->mini_batches_per_second,
              0.03 * unsplit->mini_batches_per_second);
  // Nor in PipeDream's cost model.
  PlannerOptions pd = PipeDreamOptions();
  absl::StatusOr<Plan> pd_whole = DataParallelPlan(g, *slow, pd);
  pd.split_backward = true;
  absl::StatusOr<Plan> pd_split = DataParallelPlan(g, *slow, pd);
  ASSERT_TRUE(pd_whole.ok() && pd_split.ok());
  EXPECT_EQ(pd_split->stages[0].allreduce_seconds,
            pd_whole->stages[0].allreduce_seconds);
  EXPECT_EQ(pd_split->stages[0].allreduce_window_seconds, 0);
  EXPECT_EQ(pd_split->bottleneck_seconds, pd_whole->bottleneck_seconds);

  // At 1 GB/s with copies at 0.25 ns a byte each way, the ring takes 10 ms,
  // half of it the copies' CPU: the 50 ms of weight gradients hide the
  // link's half only.
  absl::StatusOr<Cluster> fast = MakeCluster(2, "2:1e9", "", "");
  ASSERT_TRUE(fast.ok());
  Cluster copying = *fast;
  copying.transfer_cpu_seconds_per_byte = 0.25e-9;
  absl::StatusOr<Plan> wide = DataParallelPlan(g, copying, o);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_NEAR(wide->stages[0].allreduce_seconds, 0.01 * 0.5, 1e-9);
  EXPECT_NEAR(wide->bottleneck_seconds, 0.15 + 0.005, 1e-9);
  run = Simulate(*wide, copying, schedule::ScheduleKind::kDataParallel, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, wide->mini_batches_per_second,
              0.03 * wide->mini_batches_per_second);
  // Copies slower than the wire (1 ns a byte each way: 20 ms) bind the
  // ring: nothing of it is hidden.
  copying.transfer_cpu_seconds_per_byte = 1e-9;
  absl::StatusOr<Plan> cpu_bound = DataParallelPlan(g, copying, o);
  ASSERT_TRUE(cpu_bound.ok()) << cpu_bound.status();
  EXPECT_NEAR(cpu_bound->stages[0].allreduce_seconds, 0.02, 1e-9);
  EXPECT_FALSE(HasNote(*cpu_bound, "hidden")) << absl::StrJoin(cpu_bound->notes, "; ");

  // The slowest replica sets the window: at half speed its weight
  // gradients take 100 ms, as long as the all-reduce.
  absl::StatusOr<Cluster> mixed = MakeCluster(2, "2:1e8", "", "1,0.5");
  ASSERT_TRUE(mixed.ok());
  absl::StatusOr<Plan> slowest = DataParallelPlan(g, *mixed, o);
  ASSERT_TRUE(slowest.ok()) << slowest.status();
  EXPECT_NEAR(slowest->stages[0].allreduce_seconds, 0, 1e-9);
  run = Simulate(*slowest, *mixed, schedule::ScheduleKind::kDataParallel, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, slowest->mini_batches_per_second,
              0.03 * slowest->mini_batches_per_second);
}

// The layers with 22 MB between them at 100 MB/s: two stages carry it
// 220 ms each way a mini-batch, which beats two replicas that wait for a
// 100 ms all-reduce (250 ms), but not replicas that hide half of it behind
// their weight gradients (200 ms). The DP prices that, and the simulator
// agrees with its plan.
TEST(OptimizerTest, HidingTheAllReduceCanMakeReplicasBeatThePipeline) {
  const Graph g = SplitLayers(22e6);
  absl::StatusOr<Cluster> slow = MakeCluster(2, "2:1e8", "", "");
  ASSERT_TRUE(slow.ok());
  PlannerOptions o;
  o.schedule = schedule::ScheduleKind::kAsync;
  absl::StatusOr<Plan> piped = PlanPipeline(g, *slow, o);
  ASSERT_TRUE(piped.ok()) << piped.status();
  ASSERT_EQ(piped->stages.size(), 2u);
  EXPECT_NEAR(piped->bottleneck_seconds, 0.22, 1e-9);

  o.split_backward = true;
  absl::StatusOr<Plan> replicas = PlanPipeline(g, *slow, o);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  ASSERT_EQ(replicas->stages.size(), 1u);
  EXPECT_EQ(replicas->stages[0].replicas, 2);
  EXPECT_NEAR(replicas->stages[0].allreduce_seconds, 0.05, 1e-9);
  EXPECT_NEAR(replicas->bottleneck_seconds, 0.2, 1e-9);
  SimulationOptions sim;
  sim.iterations = 32;
  absl::StatusOr<SimulationResult> run =
      Simulate(*replicas, *slow, schedule::ScheduleKind::kAsync, sim);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NEAR(run->mini_batches_per_second, replicas->mini_batches_per_second,
              0.03 * replicas->mini_batches_per_second);
}

TEST(OptimizerTest, GivesFastWorkersTheHeaviestStages) {
  const Graph g = LoadProfile("gnmt");
  absl::StatusOr<Cluster> c = MakeCluster(8, "", "", "4*0.5,4*2");
  ASSERT_TRUE(c.ok());
  absl::StatusOr<Plan> plan = PlanPipeline(g, *c, PlannerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(g, *c, *plan);
  // The stage with most work per replica runs on fast workers.
  const StagePlan* heaviest = &plan->stages[0];
  for (const StagePlan& s : plan->stages) {
    if (s.compute_seconds * c->speed(s.workers[0]) >
        heaviest->compute_seconds * c->speed(heaviest->workers[0])) {
      heaviest = &s;
    }
  }
  EXPECT_EQ(c->speed(heaviest->workers[0]), 2.0);
}

// Six equal layers on a worker at speed 1 and one at 0.5, over a fast
// link: at their mean speed (0.75) the DP cuts 3 + 3, and whichever worker
// gets the slow half binds at 6 s; with each worker's own speed it gives
// the fast one 4 layers and the slow one 2: 4 s each. Whichever of the two
// is listed first.
TEST(OptimizerTest, EachWorkersSpeedEntersTheDp) {
  const Graph g = Chain(6, 1.0 / 3, 2.0 / 3, 1e3, 1e3);
  for (const char* speeds : {"1*1.0,1*0.5", "1*0.5,1*1.0"}) {
    SCOPED_TRACE(speeds);
    absl::StatusOr<Cluster> c = MakeCluster(2, "2:1e12", "", speeds);
    ASSERT_TRUE(c.ok()) << c.status();
    PlannerOptions o;
    o.activation_compression_ratio = 1;
    absl::StatusOr<Plan> plan = PlanPipeline(g, *c, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectValidPlan(g, *c, *plan);
    ASSERT_EQ(plan->stages.size(), 2u);
    const int fast = c->speed(0) == 1.0 ? 0 : 1;
    EXPECT_EQ(plan->stages[0].nodes.size(), 4u);
    EXPECT_EQ(plan->stages[0].workers, std::vector<int>{fast});
    EXPECT_EQ(plan->stages[1].workers, std::vector<int>{1 - fast});
    EXPECT_NEAR(plan->bottleneck_seconds, 4.0, 0.01);
  }
}

TEST(OptimizerTest, ScalesToSyntheticGraphsAndLargeClusters) {
  struct Case {
    Graph graph;
    const char* levels;
  };
  const Case cases[] = {
      {SyntheticChain(10000, 1), "16:1e9"},
      {SyntheticDag(2000, 2), "16:1e9"},
      {SyntheticDag(2000, 3), "8:300e9,16:25e9,8:10e9"},
      {SyntheticChain(500, 4), "8:300e9,16:25e9,8:10e9"},
  };
  for (const Case& k : cases) {
    ASSERT_TRUE(k.graph.Validate().ok());
    absl::StatusOr<Cluster> c = MakeCluster(0, k.levels, "", "");
    ASSERT_TRUE(c.ok());
    absl::StatusOr<Plan> plan = PlanPipeline(k.graph, *c, PlannerOptions());
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectValidPlan(k.graph, *c, *plan);
  }
}

TEST(OptimizerTest, DataParallelBaselineUsesEveryWorker) {
  const Graph g = LoadProfile("vgg16");
  absl::StatusOr<Plan> dp = DataParallelPlan(g, Flat(4), PipeDreamOptions());
  ASSERT_TRUE(dp.ok()) << dp.status();
  ASSERT_EQ(dp->stages.size(), 1u);
  EXPECT_EQ(dp->stages[0].replicas, 4);
  // PipeDream's model zeroes the Input node's costs.
  double compute = 0;
  for (const Node& n : g.nodes()) {
    if (n.description != "Input") compute += n.compute_seconds();
  }
  const double expected =
      (compute + 4.0 * 3 * g.TotalParameterBytes() / (1e9 * 4)) / 4;
  EXPECT_NEAR(dp->bottleneck_seconds, expected, expected * 1e-9);
}

TEST(OptimizerTest, RejectsBadInputs) {
  const Graph g = LoadProfile("alexnet");
  Cluster none;
  EXPECT_FALSE(PlanPipeline(g, none, PlannerOptions()).ok());
  EXPECT_FALSE(PlanPipeline(Graph(), Flat(2), PlannerOptions()).ok());
  PlannerOptions bad;
  bad.activation_compression_ratio = 0;
  EXPECT_FALSE(PlanPipeline(g, Flat(2), bad).ok());
  EXPECT_FALSE(ParseCostModel("gurobi").ok());
  EXPECT_FALSE(MakeCluster(0, "", "", "").ok());
  EXPECT_FALSE(MakeCluster(8, "4:1e9", "", "").ok());
  EXPECT_FALSE(MakeCluster(0, "4:x", "", "").ok());
  EXPECT_FALSE(MakeCluster(2, "", "", "1,2,3").ok());
}

// Issue 12: wide graphs (NASNet-style cells, 2,000-node layered DAGs with
// wide cuts) whose ideals cannot be enumerated. The plan is valid, says it
// is approximate, and what the search used stays within the bound the state
// cap implies (counts, not time: bench/ has the timings).
TEST(OptimizerTest, WideDagsPlanWithinTheStateBound) {
  struct Case {
    std::string name;
    Graph graph;
  };
  const Case cases[] = {
      {"nasnet1", SyntheticNasNet(1)},
      {"nasnet2", SyntheticNasNet(2)},
      {"layered2000/7", SyntheticLayeredDag(2000, 7)},
      {"layered2000/8", SyntheticLayeredDag(2000, 8)},
  };
  for (const Case& c : cases) {
    for (const char* levels : {"16:1e9", "4:300e9,4:25e9"}) {
      for (CostModel model : {CostModel::kPipeDream, CostModel::kApapo}) {
        SCOPED_TRACE(c.name + " " + levels + " " +
                     std::string(CostModelName(model)));
        absl::StatusOr<Cluster> cluster = MakeCluster(0, levels, "", "");
        ASSERT_TRUE(cluster.ok());
        PlannerOptions o;
        o.cost_model = model;
        absl::StatusOr<Plan> plan = PlanPipeline(c.graph, *cluster, o);
        ASSERT_TRUE(plan.ok()) << plan.status();
        ExpectValidPlan(c.graph, *cluster, *plan);
        EXPECT_FALSE(plan->exact);
        EXPECT_NE(plan->search.find("topological order"), std::string::npos)
            << plan->search;
        // The automatic caps: 1,936 states on one level of 16, 300 on two.
        const int64_t cap = cluster->levels.size() == 1 ? 1936 : 300;
        EXPECT_LE(plan->num_states, cap);
        // Exact attempt, one per branch-chain piece size (2, 4, ... n),
        // the block DAG (twice the cap), its prefixes.
        const int64_t attempts =
            2 + static_cast<int64_t>(std::ceil(std::log2(c.graph.num_nodes())));
        EXPECT_LE(plan->states_enumerated, (cap + 1) * attempts + 3 * cap + 1);
        EXPECT_LE(plan->search_bytes, int64_t{128} << 20);
        EXPECT_LE(plan->dp_steps, int64_t{200'000'000});
        EXPECT_GT(plan->bottleneck_seconds, 0);
        // No worse than one stage on one worker.
        EXPECT_LE(plan->bottleneck_seconds, plan->single_worker_seconds);
      }
    }
  }
}

TEST(OptimizerTest, ExceedingTheBudgetIsResourceExhaustedNamingTheLimit) {
  const Graph g = SyntheticNasNet(1);
  PlannerOptions exact = PipeDreamOptions();
  exact.max_states = -1;
  exact.budget.max_states = 5000;
  absl::StatusOr<Plan> plan = PlanPipeline(g, Flat(16), exact);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("max_states 5000"), std::string::npos)
      << plan.status();

  PlannerOptions roomy_cap = PipeDreamOptions();
  roomy_cap.max_states = 1000;
  roomy_cap.budget.max_bytes = 1 << 20;
  plan = PlanPipeline(g, Flat(16), roomy_cap);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("max_bytes 1048576"),
            std::string::npos)
      << plan.status();

  PlannerOptions few_steps = PipeDreamOptions();
  few_steps.budget.max_dp_steps = 100'000;
  plan = PlanPipeline(SyntheticLayeredDag(2000, 7), Flat(16), few_steps);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("max_dp_steps 100000"),
            std::string::npos)
      << plan.status();

  // A graph too large for per-layer bitsets under the byte budget (3 x 20,000
  // layers x 313 words) goes straight to topological blocks; asking for the
  // exact search of it fails.
  const Graph chain = SyntheticChain(20000, 5);
  PlannerOptions small_bytes = PipeDreamOptions();
  small_bytes.budget.max_bytes = 64 << 20;
  plan = PlanPipeline(chain, Flat(16), small_bytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->search.find("equal-compute blocks"), std::string::npos)
      << plan->search;
  EXPECT_LE(plan->search_bytes, 64 << 20);
  small_bytes.max_states = -1;
  plan = PlanPipeline(chain, Flat(16), small_bytes);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("per-layer bitsets"),
            std::string::npos)
      << plan.status();

  // The default budget never binds on the real profiles.
  absl::StatusOr<Plan> inception =
      PlanPipeline(LoadProfile("inception_v3"), Flat(16), PipeDreamOptions());
  ASSERT_TRUE(inception.ok()) << inception.status();
}

}  // namespace
}  // namespace partitioner
}  // namespace apapo
