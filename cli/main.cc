// apapoctl: submit and watch APapo training jobs.
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "cli/apapoctl.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, coordinator, "localhost:7070",
          "Coordinator address HOST:PORT.");
ABSL_FLAG(std::string, tls_ca, "",
          "Verify the coordinator against this CA (PEM; deploy/pki.sh).");
ABSL_FLAG(std::string, tls_cert, "", "A client certificate to present (PEM).");
ABSL_FLAG(std::string, tls_key, "", "Its private key (PEM).");
ABSL_FLAG(std::string, token_file, "",
          "A file holding the bearer token to send (the coordinator's "
          "--tokens_file gives it a role).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30),
          "Deadline of each unary call.");
ABSL_FLAG(bool, watch, false, "submit: watch the job until it ends.");
ABSL_FLAG(std::string, name, "", "submit: override spec.name.");
ABSL_FLAG(int, workers, 0, "submit: override spec.resources.workers.");
ABSL_FLAG(int, epochs, 0, "submit: override spec.limits.epochs.");
ABSL_FLAG(int64_t, max_steps, 0, "submit: override spec.limits.max_steps.");
ABSL_FLAG(std::string, schedule, "",
          "submit: override spec.schedule.kind (auto, async, 2bw, gpipe, "
          "1f1b_flush, dp).");
ABSL_FLAG(int, micro_batches, 0, "submit: override spec.schedule.micro_batches.");
ABSL_FLAG(int, batch_size, 0, "submit: override spec.data.batch_size.");
ABSL_FLAG(std::string, out, "",
          "trace: write the Chrome trace JSON to this file (default: stdout).");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Submits and watches APapo training jobs.\n"
      "Usage: apapoctl [--coordinator=HOST:PORT] COMMAND [ARG]\n"
      "  submit FILE   queue a job (JobSpec as text proto or JSON); --watch\n"
      "  list          jobs, newest first\n"
      "  get JOB       one job in full\n"
      "  watch JOB     live progress until the job ends (exit 0 = succeeded)\n"
      "  cancel JOB    stop a job and free its workers\n"
      "  plan JOB      the stage table with predictions and measurements\n"
      "  trace JOB     Chrome trace JSON (chrome://tracing, ui.perfetto.dev):\n"
      "                each stage's measured forward/backward/send/recv/\n"
      "                all-reduce/optimizer spans over a few steps after\n"
      "                warm-up, on its own clock from 0, beside the\n"
      "                simulator's timeline of the plan; --out=FILE\n"
      "  workers       registered workers\n"
      "Exit codes: 0 ok, 1 job failed/cancelled, 2 usage or invalid spec, "
      "3 coordinator unavailable, 4 not found, 5 refused in this state, "
      "6 other error.");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());

  apapo::cli::SubmitOverrides o;
  if (!absl::GetFlag(FLAGS_name).empty()) o.name = absl::GetFlag(FLAGS_name);
  if (absl::GetFlag(FLAGS_workers) != 0) o.workers = absl::GetFlag(FLAGS_workers);
  if (absl::GetFlag(FLAGS_epochs) != 0) o.epochs = absl::GetFlag(FLAGS_epochs);
  if (absl::GetFlag(FLAGS_max_steps) != 0) o.max_steps = absl::GetFlag(FLAGS_max_steps);
  if (!absl::GetFlag(FLAGS_schedule).empty()) o.schedule = absl::GetFlag(FLAGS_schedule);
  if (absl::GetFlag(FLAGS_micro_batches) != 0) {
    o.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  }
  if (absl::GetFlag(FLAGS_batch_size) != 0) o.batch_size = absl::GetFlag(FLAGS_batch_size);

  // A watch outlives coordinator restarts: have the channel retry its
  // connection every few seconds at most, not after gRPC's 2-minute cap.
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      apapo::MakeChannelCredentials({absl::GetFlag(FLAGS_tls_ca),
                                     absl::GetFlag(FLAGS_tls_cert),
                                     absl::GetFlag(FLAGS_tls_key)});
  if (!credentials.ok()) {
    std::cerr << "apapoctl: " << credentials.status().message() << "\n";
    return apapo::cli::kExitUsage;
  }
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_coordinator),
                                           *credentials, channel_args);
  auto jobs = apapo::v1::JobService::NewStub(channel);
  auto workers = apapo::v1::WorkerService::NewStub(channel);
  apapo::cli::Apapoctl ctl(jobs.get(), workers.get(), std::cout, std::cerr,
                           absl::GetFlag(FLAGS_timeout));
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    std::ifstream in(path);
    std::string token;
    if (!in || !(in >> token)) {
      std::cerr << "apapoctl: --token_file: cannot read a token from " << path << "\n";
      return apapo::cli::kExitUsage;
    }
    ctl.SetToken(token);
  }
  ctl.SetTraceOut(absl::GetFlag(FLAGS_out));
  return ctl.Run(args, o, absl::GetFlag(FLAGS_watch), isatty(STDOUT_FILENO));
}
