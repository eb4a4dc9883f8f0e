#include "bench/fleet/fleet_benchmark.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/fleet/canned.h"
#include "bench/fleet/fleet_sim.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo::bench {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(60);
constexpr absl::Duration kStopTimeout = absl::Seconds(30);

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }
double S(absl::Duration d) { return absl::ToDoubleSeconds(d); }

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The coordinator's CPU seconds so far, or -1 when not measured.
double CpuNow(int pid) {
  if (pid <= 0) return -1;
  absl::StatusOr<double> s = ProcessCpuSeconds(pid);
  return s.ok() ? *s : -1;
}

double CpuSince(int pid, double before) {
  const double now = CpuNow(pid);
  return before < 0 || now < 0 ? -1 : now - before;
}

// One pass over every page of ListWorkers.
struct Listing {
  grpc::Status status;
  int pages = 0;
  int first_page_workers = 0;
  int total_reported = 0;  // the first page's total
  std::vector<apapo::v1::WorkerStatus> workers;
};

Listing ListAll(apapo::v1::WorkerService::Stub* stub, int page_size,
                const std::vector<apapo::v1::WorkerState>& states,
                int max_pages) {
  Listing out;
  apapo::v1::ListWorkersRequest request;
  request.set_page_size(page_size);
  for (auto s : states) request.add_states(s);
  std::set<std::string> tokens;
  while (true) {
    apapo::v1::ListWorkersResponse response;
    out.status = stub->ListWorkers(Context(kRpcTimeout).get(), request, &response);
    if (!out.status.ok()) return out;
    if (out.pages == 0) {
      out.first_page_workers = response.workers_size();
      out.total_reported = response.total();
    }
    ++out.pages;
    for (auto& w : *response.mutable_workers()) out.workers.push_back(std::move(w));
    if (response.next_page_token().empty()) return out;
    // A token seen before, or more pages than workers allow: the server
    // is not paging forward.
    if (!tokens.insert(response.next_page_token()).second || out.pages >= max_pages) {
      out.status = grpc::Status(grpc::StatusCode::INTERNAL,
                                "ListWorkers paging does not advance");
      return out;
    }
    request.set_page_token(response.next_page_token());
  }
}

// Workers in state LOST, counted on every page rather than trusted to the
// filter (which a server without it ignores); -1 on an RPC error.
int CountLost(apapo::v1::WorkerService::Stub* stub, int page_size,
              int max_pages, int* total_reported,
              std::vector<std::string>* problems) {
  Listing lost =
      ListAll(stub, page_size, {apapo::v1::WORKER_STATE_LOST}, max_pages);
  if (!lost.status.ok()) {
    problems->push_back(
        absl::StrCat("ListWorkers(LOST): ", lost.status.error_message()));
    return -1;
  }
  *total_reported = lost.total_reported;
  return static_cast<int>(
      std::count_if(lost.workers.begin(), lost.workers.end(), [](const auto& w) {
        return w.state() == apapo::v1::WORKER_STATE_LOST;
      }));
}

void Put(google::protobuf::Struct& s, const std::string& key, double v) {
  (*s.mutable_fields())[key].set_number_value(v);
}
void Put(google::protobuf::Struct& s, const std::string& key,
         const std::string& v) {
  (*s.mutable_fields())[key].set_string_value(v);
}

}  // namespace

absl::StatusOr<double> ParseProcStatCpuSeconds(absl::string_view stat,
                                               int64_t ticks_per_second) {
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos || ticks_per_second <= 0) {
    return absl::InvalidArgumentError("proc stat: no command name");
  }
  // After "pid (comm) " come field 3 (state) onwards.
  std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  constexpr int kUtime = 14 - 3, kStime = 15 - 3;
  int64_t utime = 0, stime = 0;
  if (fields.size() <= kStime || !absl::SimpleAtoi(fields[kUtime], &utime) ||
      !absl::SimpleAtoi(fields[kStime], &stime)) {
    return absl::InvalidArgumentError("proc stat: no utime/stime");
  }
  return static_cast<double>(utime + stime) / ticks_per_second;
}

absl::StatusOr<double> ProcessCpuSeconds(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("no process ", pid));
  return ParseProcStatCpuSeconds(buffer.str(), sysconf(_SC_CLK_TCK));
}

absl::StatusOr<BenchResult> RunFleetBenchmark(const BenchOptions& o) {
  if (o.target.empty()) return absl::InvalidArgumentError("target must be set");
  if (o.workers < 1 || o.job_workers < 0 || o.job_workers > o.workers ||
      o.list_page_size < 1 || o.list_repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need workers >= 1 (", o.workers, "), 0 <= job_workers <= workers (",
        o.job_workers, "), list_page_size and list_repeats >= 1"));
  }
  BenchResult r;
  r.target = o.target;
  r.workers = o.workers;
  r.workers_per_channel = o.workers_per_channel;
  r.job_workers = o.job_workers;

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  auto channel = grpc::CreateCustomChannel(
      o.target, grpc::InsecureChannelCredentials(), args);
  auto jobs = apapo::v1::JobService::NewStub(channel);
  auto workers = apapo::v1::WorkerService::NewStub(channel);
  const int max_pages = o.workers / o.list_page_size + 10;

  FleetOptions fo;
  fo.target = o.target;
  fo.workers = o.workers;
  fo.workers_per_channel = o.workers_per_channel;
  fo.id_prefix = "fleet";
  fo.train_duration = o.train_duration;
  FleetSimulator fleet(fo);

  // Registration.
  double cpu = CpuNow(o.coordinator_pid);
  if (absl::Status s = fleet.Start(); !s.ok()) return s;
  const bool registered =
      fleet.WaitAllRegistered(absl::Now() + o.register_timeout);
  FleetStats stats = fleet.Stats();
  r.register_coordinator_cpu_s = CpuSince(o.coordinator_pid, cpu);
  r.registered = stats.registered;
  if (registered) r.register_all_s = S(stats.time_to_register_all);
  if (!stats.registration_latencies.empty()) {
    const auto& l = stats.registration_latencies;
    r.register_p50_ms = Ms(l[l.size() / 2]);
    r.register_p99_ms = Ms(l[std::min(l.size() - 1, l.size() * 99 / 100)]);
    r.register_max_ms = Ms(l.back());
  }
  if (!registered) {
    r.problems.push_back(absl::StrCat("only ", stats.registered, " of ",
                                      o.workers, " workers registered"));
  }
  for (const WorkerRecord& w : fleet.Workers()) {
    if (w.registered) {
      r.heartbeat_interval_s = S(w.heartbeat_interval);
      break;
    }
  }

  // Steady heartbeats: from the moment every worker has sent one.
  if (registered &&
      fleet.WaitForHeartbeats(1, absl::Now() + o.register_timeout)) {
    const int64_t before = fleet.Stats().heartbeats_sent();
    cpu = CpuNow(o.coordinator_pid);
    const absl::Time start = absl::Now();
    // A measured interval, not a wait for a condition.
    absl::SleepFor(o.window);
    const double used = CpuSince(o.coordinator_pid, cpu);
    r.window_s = S(absl::Now() - start);
    r.window_heartbeats = fleet.Stats().heartbeats_sent() - before;
    if (used >= 0) {
      r.window_coordinator_cpu_percent = 100 * used / r.window_s;
      if (r.window_heartbeats > 0) {
        r.coordinator_cpu_s_per_1000_heartbeats =
            used / (r.window_heartbeats / 1000.0);
      }
    }
  } else if (registered) {
    r.problems.push_back("not every worker sent a heartbeat in time");
  }
  r.lost_workers = CountLost(workers.get(), o.list_page_size, max_pages,
                             &r.lost_total_reported, &r.problems);

  // ListWorkers latency.
  {
    std::vector<double> first, all;
    for (int i = 0; i < o.list_repeats; ++i) {
      apapo::v1::ListWorkersRequest request;
      request.set_page_size(o.list_page_size);
      apapo::v1::ListWorkersResponse response;
      const absl::Time t0 = absl::Now();
      grpc::Status s =
          workers->ListWorkers(Context(kRpcTimeout).get(), request, &response);
      if (!s.ok()) {
        r.problems.push_back(absl::StrCat("ListWorkers: ", s.error_message()));
        break;
      }
      first.push_back(Ms(absl::Now() - t0));
      r.list_first_page_workers = response.workers_size();
      r.list_total_reported = response.total();
    }
    for (int i = 0; i < o.list_repeats; ++i) {
      const absl::Time t0 = absl::Now();
      Listing listing = ListAll(workers.get(), o.list_page_size, {}, max_pages);
      if (!listing.status.ok()) {
        r.problems.push_back(
            absl::StrCat("ListWorkers paging: ", listing.status.error_message()));
        break;
      }
      all.push_back(Ms(absl::Now() - t0));
      r.list_pages = listing.pages;
      std::set<std::string> ids;
      for (const auto& w : listing.workers) ids.insert(w.info().worker_id());
      r.list_distinct_workers = static_cast<int>(ids.size());
    }
    r.list_first_page_ms = Median(first);
    r.list_all_pages_ms = Median(all);
  }

  // A job on job_workers of the fleet.
  if (o.job_workers > 0 && registered) {
    const int n = o.job_workers;
    apapo::v1::SubmitJobRequest request;
    *request.mutable_spec() = DataParallelJobSpec("fleet-bench", n);
    apapo::v1::SubmitJobResponse response;
    cpu = CpuNow(o.coordinator_pid);
    const absl::Time submitted = absl::Now();
    grpc::Status s = jobs->SubmitJob(Context(kRpcTimeout).get(), request, &response);
    const absl::Time deadline = submitted + o.job_timeout;
    if (!s.ok()) {
      r.problems.push_back(absl::StrCat("SubmitJob: ", s.error_message()));
    } else {
      r.job_id = response.job().id();
      // Each phase's end is the last of its n events, as the fleet saw it.
      absl::Time profiled, assigned, started;
      if (fleet.AwaitJobMilestone(r.job_id, JobMilestone::kProfileResultSent, n,
                                  deadline)) {
        profiled = fleet.Job(r.job_id).at(JobMilestone::kProfileResultSent).last;
        r.submit_to_profiled_s = S(profiled - submitted);
        if (fleet.AwaitJobMilestone(r.job_id, JobMilestone::kAssignReceived, n,
                                    deadline)) {
          assigned = fleet.Job(r.job_id).at(JobMilestone::kAssignReceived).last;
          r.profiled_to_assigned_s = S(assigned - profiled);
          if (fleet.AwaitJobMilestone(r.job_id, JobMilestone::kStartReceived, n,
                                      deadline)) {
            started = fleet.Job(r.job_id).at(JobMilestone::kStartReceived).last;
            r.assigned_to_started_s = S(started - assigned);
          } else {
            r.problems.push_back("not every rank was started in time");
          }
        } else {
          r.problems.push_back("not every rank was assigned in time");
        }
      } else {
        r.problems.push_back("profiling did not complete in time");
      }
      // Its end, as WatchJob reports it.
      apapo::v1::WatchJobRequest watch;
      watch.set_job_id(r.job_id);
      auto ctx = Context(std::max(deadline - absl::Now(), absl::Seconds(1)));
      auto reader = jobs->WatchJob(ctx.get(), watch);
      apapo::v1::WatchJobResponse update;
      bool ended = false;
      while (!ended && reader->Read(&update)) {
        const auto state = update.job().state();
        ended = state == apapo::v1::JOB_STATE_SUCCEEDED ||
                state == apapo::v1::JOB_STATE_FAILED ||
                state == apapo::v1::JOB_STATE_CANCELLED;
      }
      const absl::Time end = absl::Now();
      if (ended) {
        ctx->TryCancel();
        if (started != absl::Time()) r.started_to_end_s = S(end - started);
      } else {
        r.problems.push_back("the job did not end in time");
      }
      reader->Finish().ok();  // cancelled or ended; the state is read below
      r.job_coordinator_cpu_s = CpuSince(o.coordinator_pid, cpu);
      apapo::v1::GetJobRequest get;
      get.set_job_id(r.job_id);
      apapo::v1::Job job;
      s = jobs->GetJob(Context(kRpcTimeout).get(), get, &job);
      if (s.ok()) {
        r.job_state = apapo::v1::JobState_Name(job.state());
        r.job_error = job.error();
      } else {
        r.problems.push_back(absl::StrCat("GetJob: ", s.error_message()));
      }
    }
  }

  int total_ignored = 0;
  r.lost_workers_end = CountLost(workers.get(), o.list_page_size, max_pages,
                                 &total_ignored, &r.problems);
  r.stop_status = fleet.Stop(absl::Now() + kStopTimeout);
  stats = fleet.Stats();
  r.fleet_errors = stats.errors;
  r.streams_ended_early = stats.streams_ended_early;
  for (int64_t v : stats.sent) r.messages_sent += v;
  for (int64_t v : stats.received) r.messages_received += v;
  r.max_timer_lateness_ms = Ms(stats.max_timer_lateness);
  if (!r.stop_status.ok()) {
    r.problems.push_back(std::string(r.stop_status.message()));
  }
  return r;
}

std::string ResultJson(const BenchResult& r) {
  google::protobuf::Struct s;
  Put(s, "target", r.target);
  Put(s, "workers", r.workers);
  Put(s, "workers_per_channel", r.workers_per_channel);
  Put(s, "registered", r.registered);
  Put(s, "register_all_s", r.register_all_s);
  Put(s, "register_p50_ms", r.register_p50_ms);
  Put(s, "register_p99_ms", r.register_p99_ms);
  Put(s, "register_max_ms", r.register_max_ms);
  Put(s, "register_coordinator_cpu_s", r.register_coordinator_cpu_s);
  Put(s, "window_s", r.window_s);
  Put(s, "window_heartbeats", static_cast<double>(r.window_heartbeats));
  Put(s, "heartbeat_interval_s", r.heartbeat_interval_s);
  Put(s, "window_coordinator_cpu_percent", r.window_coordinator_cpu_percent);
  Put(s, "coordinator_cpu_s_per_1000_heartbeats",
      r.coordinator_cpu_s_per_1000_heartbeats);
  Put(s, "lost_workers", r.lost_workers);
  Put(s, "lost_total_reported", r.lost_total_reported);
  Put(s, "lost_workers_end", r.lost_workers_end);
  Put(s, "list_first_page_ms", r.list_first_page_ms);
  Put(s, "list_first_page_workers", r.list_first_page_workers);
  Put(s, "list_total_reported", r.list_total_reported);
  Put(s, "list_all_pages_ms", r.list_all_pages_ms);
  Put(s, "list_pages", r.list_pages);
  Put(s, "list_distinct_workers", r.list_distinct_workers);
  Put(s, "job_workers", r.job_workers);
  Put(s, "job_id", r.job_id);
  Put(s, "job_state", r.job_state);
  Put(s, "job_error", r.job_error);
  Put(s, "submit_to_profiled_s", r.submit_to_profiled_s);
  Put(s, "profiled_to_assigned_s", r.profiled_to_assigned_s);
  Put(s, "assigned_to_started_s", r.assigned_to_started_s);
  Put(s, "started_to_end_s", r.started_to_end_s);
  Put(s, "job_coordinator_cpu_s", r.job_coordinator_cpu_s);
  Put(s, "fleet_errors", static_cast<double>(r.fleet_errors));
  Put(s, "streams_ended_early", r.streams_ended_early);
  Put(s, "messages_sent", static_cast<double>(r.messages_sent));
  Put(s, "messages_received", static_cast<double>(r.messages_received));
  Put(s, "max_timer_lateness_ms", r.max_timer_lateness_ms);
  auto* problems = (*s.mutable_fields())["problems"].mutable_list_value();
  for (const std::string& p : r.problems) problems->add_values()->set_string_value(p);
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(s, &json).ok()) {
    return "{}";  // a Struct of numbers and strings always converts
  }
  return json;
}

std::string ResultTable(const BenchResult& r) {
  // "-" for figures not measured.
  auto f = [](double v, const char* format) {
    return v < 0 ? std::string("-") : absl::StrFormat(format, v);
  };
  std::string out;
  auto row = [&](absl::string_view name, const std::string& value) {
    absl::StrAppend(&out, absl::StrFormat("  %-44s %s\n", name, value));
  };
  absl::StrAppend(&out, "fleet benchmark: ", r.workers, " workers (",
                  r.workers_per_channel, " per connection) against ", r.target,
                  "\n");
  row("registered", absl::StrCat(r.registered, " / ", r.workers));
  row("time to register all (s)", f(r.register_all_s, "%.2f"));
  row("registration latency p50 / p99 / max (ms)",
      absl::StrCat(f(r.register_p50_ms, "%.1f"), " / ", f(r.register_p99_ms, "%.1f"),
                   " / ", f(r.register_max_ms, "%.1f")));
  row("coordinator CPU while registering (s)", f(r.register_coordinator_cpu_s, "%.2f"));
  row("heartbeat interval (s)", f(r.heartbeat_interval_s, "%.2f"));
  row("window (s) / heartbeats sent",
      absl::StrCat(absl::StrFormat("%.1f", r.window_s), " / ", r.window_heartbeats));
  row("coordinator CPU in window (% of one core)",
      f(r.window_coordinator_cpu_percent, "%.1f"));
  row("coordinator CPU-s per 1000 heartbeats",
      f(r.coordinator_cpu_s_per_1000_heartbeats, "%.4f"));
  row("workers marked lost (total reported)",
      absl::StrCat(r.lost_workers, " (", r.lost_total_reported, ")"));
  row("ListWorkers first page: median ms / workers",
      absl::StrCat(f(r.list_first_page_ms, "%.2f"), " / ",
                   r.list_first_page_workers, " (total ", r.list_total_reported,
                   ")"));
  row("ListWorkers all pages: median ms / pages",
      absl::StrCat(f(r.list_all_pages_ms, "%.2f"), " / ", r.list_pages, " (",
                   r.list_distinct_workers, " distinct)"));
  if (r.job_workers > 0) {
    row("job", absl::StrCat(r.job_id, " on ", r.job_workers, " workers: ",
                            r.job_state.empty() ? "-" : r.job_state,
                            r.job_error.empty() ? "" : " (" + r.job_error + ")"));
    row("submit -> profiled (s)", f(r.submit_to_profiled_s, "%.3f"));
    row("profiled -> all assigned (s)", f(r.profiled_to_assigned_s, "%.3f"));
    row("assigned -> all started (s)", f(r.assigned_to_started_s, "%.3f"));
    row("started -> job ended (s)", f(r.started_to_end_s, "%.3f"));
    row("coordinator CPU over the job (s)", f(r.job_coordinator_cpu_s, "%.2f"));
  }
  row("workers lost by the end", f(r.lost_workers_end, "%.0f"));
  row("fleet errors / streams ended early",
      absl::StrCat(r.fleet_errors, " / ", r.streams_ended_early));
  row("messages sent / received",
      absl::StrCat(r.messages_sent, " / ", r.messages_received));
  row("simulator timer lateness, max (ms)", f(r.max_timer_lateness_ms, "%.1f"));
  for (const std::string& p : r.problems) absl::StrAppend(&out, "  PROBLEM: ", p, "\n");
  return out;
}

}  // namespace apapo::bench
