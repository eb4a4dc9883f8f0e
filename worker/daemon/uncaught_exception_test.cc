// ReportUncaughtExceptions (stage_channel.h): an exception no thread of a
// child process catches ends it with exit code 1 and a status frame the
// daemon reports, not an abort. The real case: Gloo refusing, in its I/O
// thread, a peer's message longer than the buffer posted for it (it aborted
// the receiving process before: verified with torch.distributed, 2026-12-05).
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/daemon/stage_channel.h"
#include "worker/transport.h"

namespace apapo::worker {
namespace {

using ::testing::HasSubstr;

TEST(EscapedExceptionStatusTest, GlooRefusingALongMessageIsDataLoss) {
  absl::Status s = EscapedExceptionStatus(
      "[enforce fail at ./gloo/transport/tcp/pair.cc:510] op.preamble.length <= "
      "op.nbytes. 400 vs 40");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("a peer sent a message longer than the buffer"));
  EXPECT_THAT(s.message(), HasSubstr("400 vs 40"));
}

TEST(EscapedExceptionStatusTest, AnythingElseIsInternalOnOneBoundedLine) {
  absl::Status s = EscapedExceptionStatus("first\nsecond\r" + std::string(1000, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("an exception escaped a thread of this process (first "
                                     "second "));
  EXPECT_EQ(s.message().find('\n'), absl::string_view::npos);
  EXPECT_LT(s.message().size(), 500u);
}

GlooTransportOptions Options(int port, int rank) {
  GlooTransportOptions o;
  o.store_port = port;
  o.rank = rank;
  o.world_size = 2;
  o.timeout = absl::Seconds(30);
  o.label = "rank " + std::to_string(rank);
  o.groups = {{0, 1}};
  return o;
}

// The child: two Gloo ranks in threads; rank 1 sends 400 bytes where rank 0
// posted 40. Exit codes other than 1 say where it went wrong.
[[noreturn]] void LongMessageChild(int fd) {
  static FrameWriter writer(fd);
  ReportUncaughtExceptions(&writer, "stage process");
  auto server = StartStoreServer();
  if (!server.ok()) _exit(10);
  const int port = (*server)->port();
  // The peer keeps its transport open until rank 0's Recv returns, which
  // it must not: Gloo's thread ends the process first.
  std::promise<void> received;
  std::shared_future<void> done = received.get_future().share();
  std::thread peer([port, done] {
    auto t = CreateGlooTransport(Options(port, 1));
    if (!t.ok()) _exit(11);
    if (!(*t)->Send(0, 0, torch::zeros({400}, torch::kUInt8)).ok()) _exit(12);
    (void)(*t)->Flush();
    done.wait();
  });
  auto t = CreateGlooTransport(Options(port, 0));
  if (!t.ok()) _exit(13);
  if (!(*t)->ExpectRecv(1, 0, 40).ok()) _exit(14);
  (void)(*t)->Recv(1, 0);
  received.set_value();
  _exit(15);
}

TEST(ReportUncaughtExceptionsTest, APeersLongMessageEndsTheProcessWithDataLoss) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    LongMessageChild(fds[1]);
  }
  close(fds[1]);
  // Read every frame until the child closes the pipe, with a deadline.
  FrameReader reader;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n <= 0) {
      closed = true;
    } else {
      reader.Append(buf, static_cast<size_t>(n));
    }
  }
  close(fds[0]);
  if (!closed) kill(pid, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(closed) << "the child did not end within 90 s";
  ASSERT_TRUE(WIFEXITED(wstatus)) << "ended by signal " << WTERMSIG(wstatus);
  EXPECT_EQ(WEXITSTATUS(wstatus), 1);
  FrameType type;
  std::string payload;
  absl::Status error;
  ASSERT_TRUE(reader.Next(&type, &payload, &error)) << error;
  EXPECT_EQ(type, FrameType::kStatus);
  absl::Status s = DecodeStatus(payload);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("longer than the buffer this process posted"));
  EXPECT_THAT(s.message(), HasSubstr("400 vs 40"));
  EXPECT_FALSE(reader.Next(&type, &payload, &error)) << "one frame only";
}

}  // namespace
}  // namespace apapo::worker
