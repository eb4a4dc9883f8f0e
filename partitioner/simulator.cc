#include "partitioner/simulator.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace apapo {
namespace partitioner {
namespace {

using schedule::Op;

struct Replica {
  int stage = 0;
  int index = 0;
  double speed = 1;
  schedule::StageProgram program;
  Op next;
  bool has_next = false;
  bool arrived = false;  // at the pending kUpdate collective
  double free = 0;
  double busy = 0;
  // When the last backward's input gradients were ready: its end, less
  // the weight gradients a split backward computes after sending them.
  double gradients_ready = 0;
  // With record_trace: that backward was recorded as two events (before
  // and after the send) and the send goes between them.
  bool send_between = false;
  std::vector<std::pair<double, double>> intervals;
  // Weight-version bookkeeping.
  std::multiset<int64_t> live;
  int64_t version = 0;
  int max_versions = 1;
  int max_in_flight = 0;
  int64_t max_staleness = 0;
};

struct Collective {
  int arrived = 0;
  double ready = 0;
  double done = -1;
};

// Replica r's speed: its worker's, or 1 where the plan names none.
double ReplicaSpeed(const Cluster& cluster, const StagePlan& stage, int r) {
  if (r < static_cast<int>(stage.workers.size()) &&
      stage.workers[r] < cluster.num_workers()) {
    return cluster.speed(stage.workers[r]);
  }
  return 1.0;
}

double Overlap(const std::vector<std::pair<double, double>>& intervals,
               double lo, double hi) {
  double total = 0;
  for (const auto& [a, b] : intervals) {
    total += std::max(0.0, std::min(b, hi) - std::max(a, lo));
  }
  return total;
}

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const Plan& plan,
                                          const Cluster& cluster,
                                          schedule::ScheduleKind kind,
                                          const SimulationOptions& options) {
  const int p = plan.stages.size();
  if (p == 0) return absl::InvalidArgumentError("plan has no stages");
  if (options.iterations < 2) {
    return absl::InvalidArgumentError("simulate at least 2 iterations");
  }
  schedule::ScheduleOptions so;
  so.kind = kind;
  so.num_stages = p;
  for (const StagePlan& s : plan.stages) so.replicas.push_back(s.replicas);
  // The planned depths (0: the default), which only the async schedule takes.
  if (kind == schedule::ScheduleKind::kAsync) {
    for (const StagePlan& s : plan.stages) {
      so.in_flight_depth.push_back(s.in_flight_depth);
    }
  }
  so.micro_batches_per_iteration =
      options.micro_batches > 0 ? options.micro_batches : plan.micro_batches;
  so.num_iterations = options.iterations;
  so.max_in_flight = options.max_in_flight;
  if (absl::Status s = schedule::ValidateScheduleOptions(so); !s.ok()) return s;
  const int64_t m = so.micro_batches_per_iteration;
  const int64_t n = m * options.iterations;

  // When micro-batch j's activations from stage s / input gradients from
  // stage s reach the neighbour (-1: not sent yet). A link carries one
  // transfer at a time each way: a send waits for the one before it on
  // the same link and direction (link_free), so m micro-batches sent
  // back to back arrive one wire time apart, not all at once. A link with
  // a token bucket (StagePlan::output_burst_bytes) passes what the bucket
  // holds at once; the bucket refills at the link's rate while that
  // direction idles, up to its size, as tc's tbf does.
  std::vector<std::vector<double>> activations_arrive(p, std::vector<double>(n, -1));
  std::vector<std::vector<double>> gradients_arrive(p, std::vector<double>(n, -1));
  // (stage, replica, peer replica, forward?) -> when that link direction
  // is free again, and the bytes its bucket held then (starts full).
  struct Direction {
    double free = 0;
    double tokens = -1;  // -1: full
  };
  std::map<std::tuple<int, int, int, bool>, Direction> link_free;
  // Sends `bytes` over link `d` of `bandwidth` and `burst` once ready at
  // `ready`; returns when they arrive.
  const auto transfer = [](Direction& d, double ready, double bytes, double bandwidth,
                           double burst) {
    if (!(bandwidth > 0)) return d.free = std::max(d.free, ready);
    const double start = std::max(d.free, ready);
    double tokens = d.tokens < 0 ? burst : d.tokens;
    tokens = std::min(burst, tokens + (start - d.free) * bandwidth);
    const double lent = std::min(tokens, bytes);
    d.free = start + (bytes - lent) / bandwidth;
    d.tokens = tokens - lent;
    return d.free;
  };
  std::vector<std::vector<Collective>> allreduces(
      p, std::vector<Collective>(options.iterations + 1));
  // When every replica of stage s had applied update v.
  std::vector<std::vector<double>> update_done(
      p, std::vector<double>(options.iterations + 1, 0));
  std::vector<double> allreduce(p, 0);
  for (int s = 0; s < p; ++s) {
    const StagePlan& st = plan.stages[s];
    const int r = st.replicas;
    if (r > 1 && st.allreduce_bandwidth > 0) {
      // One ring all-reduce per iteration, as the runtime runs it and the
      // apapo cost model charges it: less what the weight gradients of the
      // last micro-batch on the slowest replica hide of its link time
      // (StagePlan::allreduce_window_seconds).
      const double ring = cluster.AllReduceFactor(st.parameter_bytes,
                                                  SpanLevel(cluster, st.workers)) *
                          RingAllReduceSeconds(st.parameter_bytes, r,
                                               st.allreduce_bandwidth,
                                               cluster.transfer_cpu_seconds_per_byte);
      double slowest = ReplicaSpeed(cluster, st, 0);
      for (int q = 1; q < r; ++q) {
        slowest = std::min(slowest, ReplicaSpeed(cluster, st, q));
      }
      allreduce[s] = ExposedAllReduceSeconds(
          ring,
          cluster.AllReduceCpuShare(st.allreduce_bandwidth),
          st.allreduce_window_seconds / slowest, cluster.allreduce_window_factor);
    }
  }
  std::vector<Replica> reps;
  for (int s = 0; s < p; ++s) {
    for (int r = 0; r < plan.stages[s].replicas; ++r) {
      absl::StatusOr<schedule::StageProgram> program =
          schedule::StageProgram::Create(so, s, r);
      if (!program.ok()) return program.status();
      Replica rep{s, r, ReplicaSpeed(cluster, plan.stages[s], r),
                  *std::move(program)};
      rep.has_next = rep.program.Next(&rep.next);
      reps.push_back(std::move(rep));
    }
  }
  SimulationResult result;
  bool pending = true;
  while (pending) {
    pending = false;
    bool progress = false;
    for (Replica& rep : reps) {
      const int s = rep.stage;
      const StagePlan& st = plan.stages[s];
      while (rep.has_next) {
        const Op& op = rep.next;
        double ready = 0, duration = 0;
        if (op.type == Op::kForward) {
          if (s > 0) {
            if (activations_arrive[s - 1][op.micro_batch] < 0) break;
            ready = activations_arrive[s - 1][op.micro_batch];
          }
          duration = st.forward_seconds / rep.speed;
        } else if (op.type == Op::kBackward) {
          if (s + 1 < p) {
            if (gradients_arrive[s + 1][op.micro_batch] < 0) break;
            ready = gradients_arrive[s + 1][op.micro_batch];
          }
          duration = st.backward_seconds / rep.speed;
        } else if (op.type == Op::kUpdate) {
          duration = st.update_seconds / rep.speed;
        } else if (op.type == Op::kAllReduce) {
          Collective& c = allreduces[s][op.weight_version];
          if (!rep.arrived) {
            rep.arrived = true;
            ++c.arrived;
            c.ready = std::max(c.ready, rep.free);
            if (c.arrived == st.replicas) c.done = c.ready + allreduce[s];
            progress = true;
          }
          if (c.done < 0) break;
          rep.arrived = false;
          ready = c.done - allreduce[s];
          duration = allreduce[s];
        }
        // Posting a receive, enqueueing a send and draining sends take no
        // modelled time: transfers run on their own threads and arrive
        // `comm` after their link direction is free.
        // A send of input gradients leaves once they are ready: before
        // the weight gradients of a split backward (StagePlan::
        // backward_weight_seconds), which the replica computes meanwhile.
        const double start = op.type == Op::kSendGradients
                                 ? std::min(rep.free, rep.gradients_ready)
                                 : std::max(rep.free, ready);
        const double end = start + duration;
        if (op.type == Op::kBackward) {
          rep.gradients_ready = end - st.backward_weight_seconds / rep.speed;
        }
        rep.free = std::max(rep.free, end);
        rep.busy += duration;
        if (duration > 0) rep.intervals.push_back({start, end});
        if (options.record_trace) {
          if (op.type == Op::kBackward && s > 0 && end > rep.gradients_ready &&
              rep.gradients_ready > start) {
            // As the runtime's trace shows it: backward, send, backward.
            result.trace.push_back(TraceEvent{s, rep.index, op, start, rep.gradients_ready});
            result.trace.push_back(TraceEvent{s, rep.index, op, rep.gradients_ready, end});
            rep.send_between = true;
          } else if (op.type == Op::kSendGradients && rep.send_between) {
            result.trace.insert(result.trace.end() - 1,
                                TraceEvent{s, rep.index, op, start, end});
            rep.send_between = false;
          } else {
            result.trace.push_back(TraceEvent{s, rep.index, op, start, end});
          }
        }
        if (op.type == Op::kSendActivations) {
          const StagePlan& out = plan.stages[s];
          activations_arrive[s][op.micro_batch] =
              transfer(link_free[{s, rep.index, op.peer, true}], end, out.output_bytes,
                       out.output_bandwidth, std::max(0.0, out.output_burst_bytes));
        } else if (op.type == Op::kSendGradients) {
          const StagePlan& in = plan.stages[s - 1];
          gradients_arrive[s][op.micro_batch] =
              transfer(link_free[{s, rep.index, op.peer, false}], start, in.output_bytes,
                       in.output_bandwidth, std::max(0.0, in.output_burst_bytes));
        } else if (op.type == Op::kUpdate) {
          update_done[s][op.weight_version] =
              std::max(update_done[s][op.weight_version], end);
        }
        if (!op.IsCompute()) {
          rep.has_next = rep.program.Next(&rep.next);
          progress = true;
          continue;
        }
        if (op.type == Op::kForward) {
          rep.live.insert(op.weight_version);
          rep.max_in_flight =
              std::max(rep.max_in_flight, static_cast<int>(rep.live.size()));
        } else if (op.type == Op::kBackward) {
          rep.max_staleness =
              std::max(rep.max_staleness, rep.version - op.weight_version);
          rep.live.erase(rep.live.find(op.weight_version));
        } else {
          rep.version = op.weight_version;
        }
        if (op.type != Op::kBackward) {
          std::set<int64_t> distinct(rep.live.begin(), rep.live.end());
          distinct.insert(rep.version);
          rep.max_versions =
              std::max(rep.max_versions, static_cast<int>(distinct.size()));
        }
        rep.has_next = rep.program.Next(&rep.next);
        progress = true;
      }
      pending |= rep.has_next;
    }
    if (pending && !progress) {
      return absl::InternalError(
          "simulation deadlocked: the schedule's programs wait on each other");
    }
  }
  // Iteration k ends when every replica finished its k-th update.
  const int64_t iters = options.iterations;
  std::vector<double> iteration_end(iters + 1, 0);
  for (int s = 0; s < p; ++s) {
    for (int64_t v = 1; v <= iters; ++v) {
      iteration_end[v] = std::max(iteration_end[v], update_done[s][v]);
    }
  }
  double makespan = 0;
  for (const Replica& rep : reps) makespan = std::max(makespan, rep.free);
  result.makespan_seconds = makespan;
  // Steady state: the middle half of the run, away from fill and drain.
  const int64_t first = iters / 4, last = std::max(first + 1, iters - iters / 4);
  const double lo = iteration_end[first], hi = iteration_end[last];
  result.seconds_per_iteration = (hi - lo) / (last - first);
  result.micro_batches_per_second =
      result.seconds_per_iteration > 0 ? m / result.seconds_per_iteration : 0;
  result.mini_batches_per_second =
      result.seconds_per_iteration > 0 ? 1.0 / result.seconds_per_iteration : 0;
  double busy_window = 0;
  for (const Replica& rep : reps) busy_window += Overlap(rep.intervals, lo, hi);
  result.bubble_fraction =
      hi > lo ? 1.0 - busy_window / (reps.size() * (hi - lo)) : 0;
  result.stages.resize(p);
  for (int s = 0; s < p; ++s) {
    StageStats& stats = result.stages[s];
    int count = 0;
    for (const Replica& rep : reps) {
      if (rep.stage != s) continue;
      ++count;
      stats.busy_seconds += rep.busy;
      stats.weight_versions = std::max(stats.weight_versions, rep.max_versions);
      stats.max_staleness = std::max(stats.max_staleness, rep.max_staleness);
      stats.max_in_flight = std::max(stats.max_in_flight, rep.max_in_flight);
    }
    stats.busy_seconds /= std::max(1, count);
    stats.idle_seconds = makespan - stats.busy_seconds;
    stats.peak_memory_bytes =
        stats.weight_versions * plan.stages[s].parameter_bytes +
        stats.max_in_flight * plan.stages[s].activation_bytes;
  }
  return result;
}

std::string ChromeTraceJson(const SimulationResult& result) {
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  for (const TraceEvent& e : result.trace) {
    // Only what takes modelled time: compute and all-reduces.
    if (e.end <= e.start &&
        (e.op.type == Op::kUpdate || !e.op.IsCompute())) {
      continue;
    }
    const char* cat = e.op.type == Op::kForward    ? "forward"
                      : e.op.type == Op::kBackward ? "backward"
                      : e.op.type == Op::kAllReduce ? "allreduce"
                                                    : "update";
    absl::StrAppendFormat(
        &out,
        "%s{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,"
        "\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{\"micro_batch\":%d,"
        "\"weight_version\":%d}}",
        first ? "" : ",\n", e.op.ToString(), cat, e.start * 1e6,
        (e.end - e.start) * 1e6, e.stage, e.replica, e.op.micro_batch,
        e.op.weight_version);
    first = false;
  }
  int max_stage = -1;
  for (const TraceEvent& e : result.trace) max_stage = std::max(max_stage, e.stage);
  for (int s = 0; s <= max_stage; ++s) {
    absl::StrAppendFormat(&out,
                          "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
                          "\"args\":{\"name\":\"stage %d\"}}",
                          first ? "" : ",\n", s, s);
    first = false;
  }
  absl::StrAppend(&out, "],\"displayTimeUnit\":\"ms\"}\n");
  return out;
}

}  // namespace partitioner
}  // namespace apapo
