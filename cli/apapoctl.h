// apapoctl's commands over the JobService / WorkerService stubs, apart from
// main() so tests drive them with a real server and captured output.
//
//   submit FILE [--watch]   queue a job (text proto or JSON JobSpec)
//   list                    jobs, newest first
//   get JOB                 one job in full (text proto)
//   watch JOB               live progress until the job ends
//   cancel JOB              stop a job and free its workers
//   plan JOB                the stage table: predictions next to measurements
//   trace JOB               Chrome trace JSON: measured spans per stage next
//                           to the simulated timeline (--out=FILE)
//   workers                 registered workers and their states
//
// Exit codes (kExit*): what happened, so scripts can branch on them.
// Thread-safety: one Apapoctl per thread.
#ifndef APAPO_CLI_APAPOCTL_H_
#define APAPO_CLI_APAPOCTL_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo::cli {

constexpr int kExitOk = 0;
constexpr int kExitJobFailed = 1;     // watched job ended FAILED or CANCELLED
constexpr int kExitUsage = 2;         // bad command line or invalid spec
constexpr int kExitUnavailable = 3;   // coordinator unreachable / timed out
constexpr int kExitNotFound = 4;      // no such job
constexpr int kExitRefused = 5;       // wrong state (FAILED_PRECONDITION ...)
constexpr int kExitError = 6;         // any other server error
constexpr int kExitDenied = 7;        // no valid token, or its role is too low

// Exit code for a failed call.
int ExitCodeFor(const absl::Status& status);

// Fields of the spec that `submit` flags override.
struct SubmitOverrides {
  std::optional<std::string> name;
  std::optional<int> workers;
  std::optional<int> epochs;
  std::optional<int64_t> max_steps;
  std::optional<std::string> schedule;  // async, 2bw, gpipe, 1f1b_flush, dp, auto
  std::optional<int> micro_batches;
  std::optional<int> batch_size;
};

// Applies overrides; INVALID_ARGUMENT for an unknown schedule name.
absl::Status ApplyOverrides(const SubmitOverrides& o, apapo::v1::JobSpec* spec);

// One-line progress: "[#####-----] 50% epoch 2/3 step 700/1400 ...".
std::string FormatProgress(const apapo::v1::Job& job);
// One restart after a fault, in one line ("restart 1: worker w-2 lost: ...;
// 3 -> 2 stage(s), ...; resumed from step 200 (fault at step 340), 7.4 s
// lost").
std::string FormatRestart(int n, const apapo::v1::JobRestart& restart);
// The stage table of a plan with predicted and measured figures.
std::string FormatPlan(const apapo::v1::GetPlanResponse& plan);

class Apapoctl {
 public:
  // Stubs must outlive the object. Every unary call gets `timeout`. A watch
  // whose coordinator becomes unavailable reconnects (resuming after the
  // last event it printed) for up to `reconnect_for` before it gives up.
  Apapoctl(apapo::v1::JobService::StubInterface* jobs,
           apapo::v1::WorkerService::StubInterface* workers, std::ostream& out,
           std::ostream& err, absl::Duration timeout,
           absl::Duration reconnect_for = absl::Minutes(5));

  // Every call carries "authorization: Bearer `token`" (none when empty).
  void SetToken(std::string token) { token_ = std::move(token); }
  // Where `trace` writes its JSON; empty = the output stream.
  void SetTraceOut(std::string path) { trace_out_ = std::move(path); }

  // Runs `args` (command and its operands); returns the exit code.
  int Run(const std::vector<std::string>& args,
          const SubmitOverrides& overrides, bool watch_after_submit,
          bool interactive);

 private:
  int Submit(const std::string& file, const SubmitOverrides& overrides,
             bool watch, bool interactive);
  int List();
  int Get(const std::string& id);
  int Watch(const std::string& id, bool interactive);
  int Cancel(const std::string& id);
  int Plan(const std::string& id);
  int Trace(const std::string& id);
  int Workers();
  // A call's context: the timeout as its deadline (unless not
  // `with_deadline`) and the bearer token.
  std::unique_ptr<grpc::ClientContext> Context(bool with_deadline = true) const;
  // Prints "apapoctl: <what>: <message>" and returns the exit code.
  int Fail(const std::string& what, const absl::Status& status);

  apapo::v1::JobService::StubInterface* const jobs_;
  apapo::v1::WorkerService::StubInterface* const workers_;
  std::ostream& out_;
  std::ostream& err_;
  const absl::Duration timeout_;
  const absl::Duration reconnect_for_;
  std::string token_;
  std::string trace_out_;
};

}  // namespace apapo::cli

#endif  // APAPO_CLI_APAPOCTL_H_
