// A check that TSan sees absl's locks through third_party/tsan_absl_sync.cc
// and still sees races: tests/sanitizers.sh runs it under --config=tsan.
//   tsan_probe guarded   fields handed between threads under absl::Mutex
//                        (Lock/Unlock, Await, LockWhen, CondVar, Notification):
//                        must run clean;
//   tsan_probe racy      the same field written by two threads with no lock:
//                        TSan must report it (exit 66).
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

struct Shared {
  absl::Mutex mu;
  absl::CondVar cv;
  int value = 0;  // guarded by mu
  bool ready = false;
};

int Guarded() {
  Shared s;
  // Lock/Unlock.
  std::thread a([&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock l(&s.mu);
      ++s.value;
    }
  });
  for (int i = 0; i < 1000; ++i) {
    absl::MutexLock l(&s.mu);
    ++s.value;
  }
  a.join();
  // Await on a condition set by another thread.
  int handed = 0;  // written before `ready`, read after it
  std::thread b([&] {
    handed = 42;
    absl::MutexLock l(&s.mu);
    s.ready = true;
  });
  {
    absl::MutexLock l(&s.mu);
    s.mu.Await(absl::Condition(&s.ready));
  }
  const int got = handed;
  b.join();
  // LockWhen, then CondVar.
  s.ready = false;
  std::thread c([&] {
    absl::MutexLock l(&s.mu);
    s.value = 7;
    s.ready = true;
    s.cv.Signal();
  });
  s.mu.LockWhen(absl::Condition(&s.ready));
  s.mu.Unlock();
  {
    absl::MutexLock l(&s.mu);
    while (!s.ready) s.cv.Wait(&s.mu);
  }
  c.join();
  // Notification.
  int posted = 0;
  absl::Notification n;
  std::thread d([&] {
    posted = 5;
    n.Notify();
  });
  n.WaitForNotification();
  const int seen = posted;
  d.join();
  std::printf("guarded: %d %d %d\n", got, seen, s.value);
  return got == 42 && seen == 5 ? 0 : 1;
}

int Racy() {
  int value = 0;
  std::thread a([&] {
    for (int i = 0; i < 1000; ++i) ++value;
  });
  for (int i = 0; i < 1000; ++i) ++value;
  a.join();
  std::printf("racy: %d\n", value);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "guarded") == 0) return Guarded();
  if (argc == 2 && std::strcmp(argv[1], "racy") == 0) return Racy();
  std::fprintf(stderr, "usage: tsan_probe guarded|racy\n");
  return 2;
}
