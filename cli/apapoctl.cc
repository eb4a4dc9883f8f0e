#include "cli/apapoctl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/chrome_trace.h"
#include "cli/spec_file.h"
#include "common/grpc_status.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/time_util.h"
#include "grpcpp/grpcpp.h"

namespace apapo::cli {
namespace {

using apapo::v1::Job;

std::string StateName(apapo::v1::JobState s) {
  std::string name = apapo::v1::JobState_Name(s);
  constexpr absl::string_view kPrefix = "JOB_STATE_";
  if (name.rfind(std::string(kPrefix), 0) == 0) name = name.substr(kPrefix.size());
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  return name;
}

std::string ScheduleName(apapo::v1::ScheduleKind k) {
  switch (k) {
    case apapo::v1::SCHEDULE_KIND_ASYNC: return "async";
    case apapo::v1::SCHEDULE_KIND_2BW: return "2bw";
    case apapo::v1::SCHEDULE_KIND_GPIPE: return "gpipe";
    case apapo::v1::SCHEDULE_KIND_1F1B_FLUSH: return "1f1b_flush";
    case apapo::v1::SCHEDULE_KIND_DATA_PARALLEL: return "dp";
    default: return "auto";
  }
}

bool Ended(apapo::v1::JobState s) {
  return s == apapo::v1::JOB_STATE_SUCCEEDED ||
         s == apapo::v1::JOB_STATE_FAILED ||
         s == apapo::v1::JOB_STATE_CANCELLED;
}

std::string FormatDuration(int64_t seconds) {
  if (seconds < 0) return "?";
  if (seconds < 60) return absl::StrCat(seconds, "s");
  if (seconds < 3600) return absl::StrFormat("%dm%02ds", seconds / 60, seconds % 60);
  return absl::StrFormat("%dh%02dm", seconds / 3600, (seconds % 3600) / 60);
}

std::string FormatTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S",
                          absl::FromUnixSeconds(t.seconds()),
                          absl::LocalTimeZone());
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < (1 << 20)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  if (bytes < (1LL << 30)) return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
  return absl::StrFormat("%.2f GiB", bytes / 1073741824.0);
}

// Decimal units, as network rates are quoted.
std::string FormatRate(double bytes_per_second) {
  if (bytes_per_second >= 1e9) {
    return absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9);
  }
  return absl::StrFormat("%.1f MB/s", bytes_per_second / 1e6);
}

// The bandwidth the plan assumed and the links the workers measured, slowest
// first (at most kShownLinks of them).
std::string FormatNetwork(const apapo::v1::ClusterSpec& cluster) {
  constexpr int kShownLinks = 8;
  // ", token bucket 97.7 KiB" where a link passes that much at once after
  // it idled (LinkMeasurement.burst_bytes).
  const auto bucket = [](double bytes) {
    return bytes >= 1 && std::isfinite(bytes) ? absl::StrCat(", token bucket ",
                                     FormatBytes(static_cast<int64_t>(bytes)))
                      : std::string();
  };
  std::string out;
  if (cluster.levels_size() == 1) {
    const auto& level = cluster.levels(0);
    absl::StrAppend(&out, absl::StrFormat(
        "network: %d worker(s) at %s%s%s\n", level.group_size(),
        FormatRate(level.bandwidth_bytes_per_second()),
        cluster.links().empty() ? " (assumed: no links measured)"
                                : " (slowest measured link)",
        bucket(level.burst_bytes())));
  }
  // Levels the coordinator found in the measured links, innermost first.
  for (int i = 0; i < cluster.levels_size() && cluster.levels_size() > 1; ++i) {
    const auto& level = cluster.levels(i);
    absl::StrAppend(&out, absl::StrFormat(
        "network level %d: %d %s at %s (slowest link %s), latency %.1f us%s\n",
        i + 1, level.group_size(), i == 0 ? "worker(s) per group" : "group(s)",
        FormatRate(level.bandwidth_bytes_per_second()),
        i == 0 ? "inside a group" : "between groups",
        level.latency_seconds() * 1e6, bucket(level.burst_bytes())));
  }
  std::vector<apapo::v1::LinkMeasurement> links(cluster.links().begin(),
                                                cluster.links().end());
  std::sort(links.begin(), links.end(), [](const auto& a, const auto& b) {
    return a.bandwidth_bytes_per_second() < b.bandwidth_bytes_per_second();
  });
  for (int i = 0; i < static_cast<int>(links.size()) && i < kShownLinks; ++i) {
    const auto& l = links[i];
    // The fastest round trip's rate, which groups workers into levels.
    const double peak = l.peak_bandwidth_bytes_per_second();
    absl::StrAppend(&out, absl::StrFormat(
        "  link %s -> %s: %s%s, latency %.1f us", l.from_worker(), l.to_worker(),
        FormatRate(l.bandwidth_bytes_per_second()),
        std::isfinite(peak) && peak > 0 ? absl::StrCat(" (peak ", FormatRate(peak), ")")
                                        : std::string(),
        l.latency_seconds() * 1e6));
    if (l.cpu_seconds_per_byte() > 0) {
      absl::StrAppend(&out, absl::StrFormat(", %.2f ns of CPU per byte",
                                            l.cpu_seconds_per_byte() * 1e9));
    }
    absl::StrAppend(&out, bucket(l.burst_bytes()));
    absl::StrAppend(&out, absl::StrFormat(" (measured with %s messages)\n",
                                          FormatBytes(l.message_bytes())));
  }
  if (links.size() > kShownLinks) {
    absl::StrAppend(&out, "  ... and ", links.size() - kShownLinks,
                    " more link(s)\n");
  }
  // The all-reduces the workers timed: the median of their timings at
  // each size, in ascending bytes, over every worker, then inside each
  // host that some shared (named).
  std::map<std::pair<std::string, int64_t>, std::vector<apapo::v1::AllReduceMeasurement>>
      reduces;
  for (const auto& a : cluster.allreduces()) {
    reduces[{absl::StrJoin(a.worker_ids(), ", "), a.bytes()}].push_back(a);
  }
  for (auto& [key, timed] : reduces) {
    std::sort(timed.begin(), timed.end(), [](const auto& a, const auto& b) {
      return a.seconds() < b.seconds();
    });
    const auto& a = timed[timed.size() / 2];
    const std::string among =
        key.first.empty() ? "" : absl::StrCat(" on one host (", key.first, ")");
    absl::StrAppend(&out, absl::StrFormat(
        "  all-reduce of %s over %d worker(s)%s: %.1f ms (median of %d timing(s))\n",
        FormatBytes(key.second), a.ranks(), among, a.seconds() * 1e3, timed.size()));
  }
  // What a message cost the workers' CPU by size (the median per size).
  std::map<int64_t, std::vector<double>> by_size;
  for (const auto& t : cluster.transfer_cpu()) {
    if (t.cpu_seconds_per_byte() > 0) {
      by_size[t.message_bytes()].push_back(t.cpu_seconds_per_byte());
    }
  }
  if (!by_size.empty()) {
    absl::StrAppend(&out, "  transfer CPU by message size:");
    const char* sep = " ";
    for (auto& [bytes, cpu] : by_size) {
      std::sort(cpu.begin(), cpu.end());
      absl::StrAppend(&out, absl::StrFormat("%s%s %.2f ns", sep, FormatBytes(bytes),
                                            cpu[cpu.size() / 2] * 1e9));
      sep = ", ";
    }
    absl::StrAppend(&out, " per byte (timed on each worker's loopback)\n");
  }
  return out;
}

}  // namespace

std::unique_ptr<grpc::ClientContext> Apapoctl::Context(bool with_deadline) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (with_deadline) ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  return ctx;
}

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return kExitOk;
    case absl::StatusCode::kInvalidArgument: return kExitUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: return kExitUnavailable;
    case absl::StatusCode::kNotFound: return kExitNotFound;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAlreadyExists: return kExitRefused;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied: return kExitDenied;
    default: return kExitError;
  }
}

absl::Status ApplyOverrides(const SubmitOverrides& o, apapo::v1::JobSpec* spec) {
  if (o.name) spec->set_name(*o.name);
  if (o.workers) spec->mutable_resources()->set_workers(*o.workers);
  if (o.epochs) spec->mutable_limits()->set_epochs(*o.epochs);
  if (o.max_steps) spec->mutable_limits()->set_max_steps(*o.max_steps);
  if (o.micro_batches) spec->mutable_schedule()->set_micro_batches(*o.micro_batches);
  if (o.batch_size) spec->mutable_data()->set_batch_size(*o.batch_size);
  if (o.schedule) {
    static const std::pair<const char*, apapo::v1::ScheduleKind> kNames[] = {
        {"auto", apapo::v1::SCHEDULE_KIND_UNSPECIFIED},
        {"async", apapo::v1::SCHEDULE_KIND_ASYNC},
        {"2bw", apapo::v1::SCHEDULE_KIND_2BW},
        {"gpipe", apapo::v1::SCHEDULE_KIND_GPIPE},
        {"1f1b_flush", apapo::v1::SCHEDULE_KIND_1F1B_FLUSH},
        {"dp", apapo::v1::SCHEDULE_KIND_DATA_PARALLEL},
    };
    bool found = false;
    for (const auto& [name, kind] : kNames) {
      if (*o.schedule == name) {
        spec->mutable_schedule()->set_kind(kind);
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--schedule: unknown schedule \"", *o.schedule,
          "\"; expected auto, async, 2bw, gpipe, 1f1b_flush or dp"));
    }
  }
  return absl::OkStatus();
}

std::string FormatRestart(int n, const apapo::v1::JobRestart& r) {
  std::string line = absl::StrCat("restart ", n, ": ", r.cause());
  absl::StrAppend(&line, absl::StrFormat("; %d -> %d stage(s), %d -> %d worker(s)",
                                         r.stages_before(), r.stages_after(),
                                         r.workers_before(), r.workers_after()));
  if (r.seconds_lost() > 0) {
    absl::StrAppend(&line, absl::StrFormat("; resumed from step %d (fault at step %d), "
                                           "%.1f s lost",
                                           r.resumed_step(), r.step_at_fault(),
                                           r.seconds_lost()));
  } else {
    absl::StrAppend(&line, "; recovering");
  }
  return line;
}

std::string FormatProgress(const Job& job) {
  const auto& p = job.progress();
  constexpr int kWidth = 24;
  double fraction = p.total_steps() > 0
                        ? std::min(1.0, static_cast<double>(p.step()) / p.total_steps())
                        : 0.0;
  if (job.state() == apapo::v1::JOB_STATE_SUCCEEDED) fraction = 1.0;
  int filled = static_cast<int>(std::round(fraction * kWidth));
  std::string bar = absl::StrCat("[", std::string(filled, '#'),
                                 std::string(kWidth - filled, '-'), "]");
  std::string line = absl::StrFormat("%s %3d%% %-10s", bar,
                                     static_cast<int>(fraction * 100),
                                     StateName(job.state()));
  int epochs = job.spec().limits().epochs();
  if (p.epoch() > 0) {
    absl::StrAppend(&line, " epoch ", p.epoch(),
                    epochs > 0 ? absl::StrCat("/", epochs) : "");
  }
  absl::StrAppend(&line, " step ", p.step());
  if (p.total_steps() > 0) absl::StrAppend(&line, "/", p.total_steps());
  if (p.samples_per_second() > 0) {
    absl::StrAppend(&line, absl::StrFormat(" %.0f samples/s", p.samples_per_second()));
  }
  if (p.loss() > 0) absl::StrAppend(&line, absl::StrFormat(" loss %.4f", p.loss()));
  if (p.has_test_accuracy()) {
    absl::StrAppend(&line, absl::StrFormat(" acc %.2f%%", 100 * p.test_accuracy()));
  }
  if (job.restarts() > 0) absl::StrAppend(&line, " restarts ", job.restarts());
  if (p.has_eta() && !Ended(job.state())) {
    absl::StrAppend(&line, " ETA ", FormatDuration(p.eta().seconds()));
  }
  // Every stage streams its counters: the share of its time spent computing
  // (busy / (busy + idle)), in stage order, shows an unbalanced pipeline.
  std::vector<std::pair<int, double>> busy;
  for (const auto& s : p.stages()) {
    const double total = s.busy_seconds() + s.idle_seconds();
    if (total > 0) busy.emplace_back(s.stage(), s.busy_seconds() / total);
  }
  if (busy.size() > 1) {
    std::stable_sort(busy.begin(), busy.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    absl::StrAppend(&line, " busy");
    for (const auto& [stage, share] : busy) {
      absl::StrAppend(&line, absl::StrFormat(" s%d %.0f%%", stage, 100 * share));
    }
  }
  return line;
}

std::string FormatPlan(const apapo::v1::GetPlanResponse& response) {
  const auto& plan = response.plan();
  std::string out = absl::StrFormat(
      "plan for %s: %d stage(s) on %d worker(s), schedule %s, %d micro-batches, "
      "in-flight %d, cost model %s\n",
      plan.model(), plan.stages_size(), plan.num_workers(),
      ScheduleName(plan.schedule()), plan.micro_batches(), plan.in_flight(),
      plan.cost_model().empty() ? "apapo" : plan.cost_model());
  // Per stage, the prediction (compute and all-reduce per mini-batch)
  // beside the measurement: busy s/mb is a replica's busy seconds per
  // optimizer step, the mean over the stage's replicas that reported.
  absl::StrAppend(&out, absl::StrFormat(
      "%-5s %-28s %-4s %-16s %10s %10s %10s %11s %10s %10s %10s\n", "stage",
      "layers", "reps", "workers", "pred s/mb", "allreduce", "comm s",
      "memory", "busy s", "idle s", "busy s/mb"));
  for (const auto& stage : plan.stages()) {
    std::string layers;
    if (stage.node_ids_size() <= 3) {
      layers = absl::StrJoin(stage.node_ids(), ",");
    } else {
      layers = absl::StrCat(stage.node_ids(0), "..",
                            stage.node_ids(stage.node_ids_size() - 1), " (",
                            stage.node_ids_size(), ")");
    }
    std::vector<std::string> workers;
    for (const auto& r : stage.placement()) workers.push_back(r.worker_id());
    double busy = 0, idle = 0, per_step = 0;
    int stepped = 0;
    bool measured = false;
    for (const auto& s : response.measured().stages()) {
      if (s.stage() == stage.index()) {
        busy += s.busy_seconds();
        idle += s.idle_seconds();
        measured = true;
        if (s.steps() > 0) {
          per_step += s.busy_seconds() / static_cast<double>(s.steps());
          ++stepped;
        }
      }
    }
    absl::StrAppend(&out, absl::StrFormat(
        "%-5d %-28s %-4d %-16s %10.5f %10.5f %10.5f %11s %10s %10s %10s\n",
        stage.index(), layers, stage.replicas(), absl::StrJoin(workers, ","),
        stage.compute_seconds(), stage.allreduce_seconds(),
        stage.comm_seconds(), FormatBytes(stage.peak_memory_bytes()),
        measured ? absl::StrFormat("%.2f", busy) : "-",
        measured ? absl::StrFormat("%.2f", idle) : "-",
        stepped > 0 ? absl::StrFormat("%.5f", per_step / stepped) : "-"));
  }
  const auto& pred = plan.prediction();
  absl::StrAppend(&out, absl::StrFormat(
      "predicted: %.5f s per mini-batch, %.1f samples/s, bubble %.1f%%, "
      "%.2fx over one worker\n",
      pred.seconds_per_mini_batch(), pred.samples_per_second(),
      100 * pred.bubble_fraction(), pred.speedup_over_single_worker()));
  // A checkpointing job's rate is predicted over whole checkpoint
  // intervals, pauses included, as the run measures it.
  const bool checkpoints = pred.samples_per_second_with_checkpoints() > 0;
  if (checkpoints) {
    absl::StrAppend(&out, absl::StrFormat(
        "predicted with a checkpoint every %d steps (%.3f s each): %.1f samples/s\n",
        pred.checkpoint_every_steps(), pred.checkpoint_seconds(),
        pred.samples_per_second_with_checkpoints()));
  }
  const double predicted =
      checkpoints ? pred.samples_per_second_with_checkpoints() : pred.samples_per_second();
  if (response.measured().samples_per_second() > 0) {
    absl::StrAppend(&out, absl::StrFormat(
        "measured:  %.1f samples/s (%.2fx the prediction%s)\n",
        response.measured().samples_per_second(),
        predicted > 0 ? response.measured().samples_per_second() / predicted : 0.0,
        checkpoints ? " with checkpoints" : ""));
  }
  std::vector<std::pair<std::string, double>> alternatives(
      pred.alternatives_samples_per_second().begin(),
      pred.alternatives_samples_per_second().end());
  std::sort(alternatives.begin(), alternatives.end());
  for (const auto& [name, sps] : alternatives) {
    absl::StrAppend(&out, absl::StrFormat("  alternative %-12s %10.1f samples/s\n",
                                          name, sps));
  }
  absl::StrAppend(&out, FormatNetwork(response.cluster()));
  for (const auto& note : plan.notes()) absl::StrAppend(&out, "note: ", note, "\n");
  return out;
}

Apapoctl::Apapoctl(apapo::v1::JobService::StubInterface* jobs,
                   apapo::v1::WorkerService::StubInterface* workers,
                   std::ostream& out, std::ostream& err, absl::Duration timeout,
                   absl::Duration reconnect_for)
    : jobs_(jobs),
      workers_(workers),
      out_(out),
      err_(err),
      timeout_(timeout),
      reconnect_for_(reconnect_for) {}

int Apapoctl::Fail(const std::string& what, const absl::Status& status) {
  std::string code = absl::StatusCodeToString(status.code());
  err_ << "apapoctl: " << what << ": " << status.message() << " (" << code
       << ")\n";
  return ExitCodeFor(status);
}

int Apapoctl::Run(const std::vector<std::string>& args,
                  const SubmitOverrides& overrides, bool watch_after_submit,
                  bool interactive) {
  auto need = [&](size_t n) {
    if (args.size() != n + 1) {
      err_ << "apapoctl: " << args[0] << " takes " << n << " argument"
           << (n == 1 ? "" : "s") << " (see --help)\n";
      return false;
    }
    return true;
  };
  if (args.empty()) {
    err_ << "apapoctl: no command; one of submit, list, get, watch, cancel, "
            "plan, trace, workers (see --help)\n";
    return kExitUsage;
  }
  const std::string& cmd = args[0];
  if (cmd == "submit") {
    return need(1) ? Submit(args[1], overrides, watch_after_submit, interactive)
                   : kExitUsage;
  }
  if (cmd == "list") return need(0) ? List() : kExitUsage;
  if (cmd == "get") return need(1) ? Get(args[1]) : kExitUsage;
  if (cmd == "watch") return need(1) ? Watch(args[1], interactive) : kExitUsage;
  if (cmd == "cancel") return need(1) ? Cancel(args[1]) : kExitUsage;
  if (cmd == "plan") return need(1) ? Plan(args[1]) : kExitUsage;
  if (cmd == "trace") return need(1) ? Trace(args[1]) : kExitUsage;
  if (cmd == "workers") return need(0) ? Workers() : kExitUsage;
  err_ << "apapoctl: unknown command \"" << cmd
       << "\"; one of submit, list, get, watch, cancel, plan, trace, workers\n";
  return kExitUsage;
}

int Apapoctl::Submit(const std::string& file, const SubmitOverrides& overrides,
                     bool watch, bool interactive) {
  absl::StatusOr<apapo::v1::JobSpec> spec = LoadJobSpec(file);
  if (!spec.ok()) {
    err_ << "apapoctl: " << spec.status().message() << "\n";
    return kExitUsage;
  }
  if (absl::Status s = ApplyOverrides(overrides, &*spec); !s.ok()) {
    err_ << "apapoctl: " << s.message() << "\n";
    return kExitUsage;
  }
  apapo::v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  apapo::v1::SubmitJobResponse response;
  grpc::Status status =
      jobs_->SubmitJob(Context().get(), request, &response);
  if (!status.ok()) return Fail("submit " + file, FromGrpcStatus(status));
  out_ << response.job().id() << "\n" << std::flush;
  return watch ? Watch(response.job().id(), interactive) : kExitOk;
}

int Apapoctl::List() {
  apapo::v1::ListJobsResponse response;
  grpc::Status status = jobs_->ListJobs(Context().get(),
                                        apapo::v1::ListJobsRequest(), &response);
  if (!status.ok()) return Fail("list", FromGrpcStatus(status));
  out_ << absl::StrFormat("%-12s %-20s %-11s %-8s %8s %12s %9s  %s\n", "JOB",
                          "NAME", "STATE", "WORKERS", "STEP", "SAMPLES/S",
                          "ACCURACY", "CREATED");
  for (const Job& job : response.jobs()) {
    const auto& p = job.progress();
    out_ << absl::StrFormat(
        "%-12s %-20s %-11s %-8d %8d %12.1f %9s  %s\n", job.id(),
        job.spec().name(), StateName(job.state()),
        job.spec().resources().workers(), p.step(), p.samples_per_second(),
        p.has_test_accuracy() ? absl::StrFormat("%.2f%%", 100 * p.test_accuracy())
                              : "-",
        FormatTime(job.create_time()));
  }
  return kExitOk;
}

int Apapoctl::Get(const std::string& id) {
  apapo::v1::GetJobRequest request;
  request.set_job_id(id);
  Job job;
  grpc::Status status = jobs_->GetJob(Context().get(), request, &job);
  if (!status.ok()) return Fail("get " + id, FromGrpcStatus(status));
  std::string text;
  google::protobuf::TextFormat::PrintToString(job, &text);
  out_ << text;
  // Still a text proto: the count even when 0, each restart as a comment.
  if (job.restarts() == 0) out_ << "restarts: 0\n";
  for (int i = 0; i < job.restart_history_size(); ++i) {
    out_ << "# " << FormatRestart(i + 1, job.restart_history(i)) << "\n";
  }
  return kExitOk;
}

int Apapoctl::Watch(const std::string& id, bool interactive) {
  apapo::v1::WatchJobRequest request;
  request.set_job_id(id);
  Job last;
  std::string last_line;
  // Once connected, a coordinator that becomes unavailable (restarting, a
  // network cut) is reconnected to with backoff, and the watch resumes after
  // the last event printed. Unreachable from the start: fail at once.
  constexpr absl::Duration kFirstRetry = absl::Milliseconds(200);
  absl::Duration retry = kFirstRetry;
  absl::Time unavailable_since = absl::InfiniteFuture();
  bool connected = false;
  grpc::Status status;
  while (true) {
    // No deadline: a watch lasts the job.
    std::unique_ptr<grpc::ClientContext> context = Context(/*with_deadline=*/false);
    auto reader = jobs_->WatchJob(context.get(), request);
    apapo::v1::WatchJobResponse message;
    while (reader->Read(&message)) {
      connected = true;
      retry = kFirstRetry;
      if (unavailable_since != absl::InfiniteFuture()) {
        err_ << "apapoctl: watch " << id << ": reconnected\n" << std::flush;
        unavailable_since = absl::InfiniteFuture();
      }
      last = message.job();
      if (message.has_event()) {
        request.set_after_sequence(message.event().sequence());
        if (interactive) out_ << "\r\033[K";
        out_ << FormatTime(message.event().time()) << " " << id << " "
             << StateName(message.event().state()) << ": "
             << message.event().message() << "\n";
        last_line.clear();
      }
      std::string line = FormatProgress(last);
      if (line != last_line &&
          (interactive || last.state() == apapo::v1::JOB_STATE_RUNNING)) {
        // A live bar on a terminal; one line per change in a log.
        out_ << (interactive ? "\r\033[K" : "") << line
             << (interactive ? "" : "\n") << std::flush;
        last_line = line;
      }
    }
    status = reader->Finish();
    // UNAVAILABLE: the connection broke; CANCELLED: the server cancelled the
    // call as it shut down (this client never cancels its watch).
    const bool went_away = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::CANCELLED;
    if (!connected || !went_away) break;
    const absl::Time now = absl::Now();
    if (unavailable_since == absl::InfiniteFuture()) {
      unavailable_since = now;
      if (interactive) out_ << "\n";
      last_line.clear();
      err_ << "apapoctl: watch " << id << ": coordinator unavailable ("
           << status.error_message() << "); reconnecting for up to "
           << absl::FormatDuration(reconnect_for_) << "\n"
           << std::flush;
    }
    if (now - unavailable_since >= reconnect_for_) break;
    absl::SleepFor(retry);  // the client's retry backoff
    retry = std::min(retry * 2, absl::Seconds(5));
  }
  if (interactive) out_ << "\n";
  if (!status.ok()) return Fail("watch " + id, FromGrpcStatus(status));
  out_ << id << " " << StateName(last.state());
  if (last.progress().has_test_accuracy()) {
    out_ << absl::StrFormat(": test accuracy %.2f%%, %.1f samples/s",
                            100 * last.progress().test_accuracy(),
                            last.progress().samples_per_second());
  }
  if (!last.error().empty()) out_ << ": " << last.error();
  out_ << "\n";
  return last.state() == apapo::v1::JOB_STATE_SUCCEEDED ? kExitOk
                                                        : kExitJobFailed;
}

int Apapoctl::Cancel(const std::string& id) {
  apapo::v1::CancelJobRequest request;
  request.set_job_id(id);
  request.set_reason("apapoctl cancel");
  Job job;
  grpc::Status status = jobs_->CancelJob(Context().get(), request, &job);
  if (!status.ok()) return Fail("cancel " + id, FromGrpcStatus(status));
  out_ << id << " " << StateName(job.state()) << "\n";
  return kExitOk;
}

int Apapoctl::Plan(const std::string& id) {
  apapo::v1::GetPlanRequest request;
  request.set_job_id(id);
  apapo::v1::GetPlanResponse response;
  grpc::Status status =
      jobs_->GetPlan(Context().get(), request, &response);
  if (!status.ok()) return Fail("plan " + id, FromGrpcStatus(status));
  out_ << FormatPlan(response);
  return kExitOk;
}

int Apapoctl::Trace(const std::string& id) {
  apapo::v1::GetTraceRequest request;
  request.set_job_id(id);
  apapo::v1::GetTraceResponse response;
  grpc::Status status = jobs_->GetTrace(Context().get(), request, &response);
  if (!status.ok()) return Fail("trace " + id, FromGrpcStatus(status));
  const std::string json = ChromeTraceJson(response);
  if (trace_out_.empty()) {
    out_ << json;
  } else {
    std::ofstream file(trace_out_, std::ios::binary | std::ios::trunc);
    file << json;
    file.close();
    if (!file) {
      err_ << "apapoctl: trace " << id << ": cannot write " << trace_out_ << "\n";
      return kExitError;
    }
    int spans = 0;
    for (const auto& t : response.stages()) spans += t.spans_size();
    out_ << "wrote " << trace_out_ << ": " << response.stages_size()
         << " measured stage replica(s), " << spans << " span(s); "
         << response.simulated_size() << " simulated";
    if (!response.simulated_note().empty()) {
      out_ << " (" << response.simulated_note() << ")";
    }
    out_ << "\n";
  }
  if (response.stages_size() == 0) {
    err_ << "apapoctl: trace " << id << ": no stage has sent its measured "
            "timeline yet (a stage sends it after its warm-up and window "
            "steps)\n";
  }
  return kExitOk;
}

int Apapoctl::Workers() {
  // CPU LIMIT: the cores' worth of CPU time its cgroups allow (a
  // container's CPU limit), "-" for none.
  out_ << absl::StrFormat("%-20s %-16s %-6s %-6s %-9s %10s %-12s %s\n", "WORKER",
                          "HOST", "STATE", "CORES", "CPU LIMIT", "MEMORY", "JOB",
                          "LAST HEARTBEAT");
  // Page through the fleet: one reply stays small however many there are.
  apapo::v1::ListWorkersRequest request;
  std::map<std::string, int> by_state;
  int shown = 0;
  do {
    apapo::v1::ListWorkersResponse response;
    grpc::Status status =
        workers_->ListWorkers(Context().get(), request, &response);
    if (!status.ok()) return Fail("workers", FromGrpcStatus(status));
    for (const auto& w : response.workers()) {
      std::string state = apapo::v1::WorkerState_Name(w.state());
      state = state.substr(std::string("WORKER_STATE_").size());
      std::transform(state.begin(), state.end(), state.begin(), ::tolower);
      ++by_state[state];
      ++shown;
      out_ << absl::StrFormat("%-20s %-16s %-6s %-6d %-9s %10s %-12s %s\n",
                              w.info().worker_id(), w.info().host(), state,
                              w.info().cores(),
                              w.info().cpu_quota() > 0
                                  ? absl::StrFormat("%.2f", w.info().cpu_quota())
                                  : std::string("-"),
                              FormatBytes(w.info().memory_bytes()),
                              w.job_id().empty() ? "-" : w.job_id(),
                              FormatTime(w.last_heartbeat()));
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  std::vector<std::string> parts;
  for (const auto& [state, n] : by_state) parts.push_back(absl::StrCat(n, " ", state));
  out_ << shown << " worker(s)"
       << (parts.empty() ? "" : ": " + absl::StrJoin(parts, ", ")) << "\n";
  return kExitOk;
}

}  // namespace apapo::cli
