// ThreadSanitizer annotations for Debian's uninstrumented Abseil locks
// (linked only under --config=tsan, see .bazelrc and third_party/BUILD).
//
// Debian ships Abseil as shared libraries built without TSan, so TSan sees
// none of absl::Mutex's locking: every field an absl::Mutex guards looks
// raced. This file defines the synchronisation entry points of
// libabsl_synchronization.so in the executable itself. The dynamic linker
// resolves every call to them to these definitions first (the executable
// comes first in symbol lookup), from our code and from libgrpc's alike; each
// calls the library's own function (dlsym RTLD_NEXT) and tells TSan what it
// did: a release before anything unlocks, an acquire after anything locks or
// is woken (Await and CondVar::Wait release and re-acquire the mutex).
// Notification gets the same on its own address and on its flag's, which
// the inline HasBeenNotified() reads with an acquire load in our (instrumented)
// code.
//
// Not annotated: lock-free code inside uninstrumented libraries (gRPC's
// queues, protobuf's arenas): tests/tsan.supp suppresses reports whose
// stacks pass through them.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}

namespace {

template <typename Fn>
Fn Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found: %s\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

// The mangled name of a member function of this build's absl::Mutex etc.:
// the inline namespace (Debian's "debian3") comes from the headers.
#define APAPO_REAL(type, name, sig) \
  static auto* real = Real<sig>(name)

// A condition's evaluation is a critical section of its mutex: absl
// evaluates it with the lock held, inside the library (in the waiter, or in
// whichever thread unlocks), where the wrappers below see nothing. So each
// condition handed to the library is wrapped: acquire before it is
// evaluated, release after.
struct Guarded {
  const absl::Condition* cond;
  absl::Mutex* mu;
  // The library may evaluate it in another thread (the one that unlocks),
  // having received `arg` through its own, invisible, queue: the wrapper
  // releases on `arg` once it has filled it in, Eval acquires before reading.
  static bool Eval(void* arg) {
    __tsan_acquire(arg);
    auto* g = static_cast<Guarded*>(arg);
    __tsan_acquire(g->mu);
    const bool r = g->cond->Eval();
    __tsan_release(g->mu);
    return r;
  }
};

void* FlagOf(const absl::Notification* n) {
  // Notification is { mutable Mutex mutex_; std::atomic<bool> notified_yet_; }.
  return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(absl::Mutex));
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  using Fn = void (*)(Mutex*);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex4LockEv", Fn);
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  using Fn = void (*)(Mutex*);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex10ReaderLockEv", Fn);
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  using Fn = bool (*)(Mutex*);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex7TryLockEv", Fn);
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  using Fn = bool (*)(Mutex*);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex13ReaderTryLockEv", Fn);
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  using Fn = void (*)(Mutex*);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex6UnlockEv", Fn);
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  using Fn = void (*)(Mutex*);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex12ReaderUnlockEv", Fn);
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  using Fn = void (*)(Mutex*, const Condition&);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE", Fn);
  Guarded g{&cond, this};
  __tsan_release(&g);
  real(this, Condition(&Guarded::Eval, &g));
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  using Fn = void (*)(Mutex*, const Condition&);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE", Fn);
  Guarded g{&cond, this};
  __tsan_release(&g);
  real(this, Condition(&Guarded::Eval, &g));
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  using Fn = bool (*)(Mutex*, const Condition&, absl::Duration);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
             Fn);
  Guarded g{&cond, this};
  __tsan_release(&g);
  const bool r = real(this, Condition(&Guarded::Eval, &g), timeout);
  __tsan_acquire(this);  // held either way
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  using Fn = bool (*)(Mutex*, const Condition&, absl::Time);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
             Fn);
  Guarded g{&cond, this};
  __tsan_release(&g);
  const bool r = real(this, Condition(&Guarded::Eval, &g), deadline);
  __tsan_acquire(this);
  return r;
}

void Mutex::Await(const Condition& cond) {
  using Fn = void (*)(Mutex*, const Condition&);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE", Fn);
  __tsan_release(this);
  Guarded g{&cond, this};
  __tsan_release(&g);
  real(this, Condition(&Guarded::Eval, &g));
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  using Fn = bool (*)(Mutex*, const Condition&, absl::Duration);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE",
             Fn);
  __tsan_release(this);
  Guarded g{&cond, this};
  __tsan_release(&g);
  const bool r = real(this, Condition(&Guarded::Eval, &g), timeout);
  __tsan_acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  using Fn = bool (*)(Mutex*, const Condition&, absl::Time);
  APAPO_REAL(Fn, "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
             Fn);
  __tsan_release(this);
  Guarded g{&cond, this};
  __tsan_release(&g);
  const bool r = real(this, Condition(&Guarded::Eval, &g), deadline);
  __tsan_acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  using Fn = void (*)(CondVar*, Mutex*);
  APAPO_REAL(Fn, "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE", Fn);
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  using Fn = bool (*)(CondVar*, Mutex*, absl::Duration);
  APAPO_REAL(Fn, "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE", Fn);
  __tsan_release(mu);
  const bool r = real(this, mu, timeout);
  __tsan_acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  using Fn = bool (*)(CondVar*, Mutex*, absl::Time);
  APAPO_REAL(Fn, "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE", Fn);
  __tsan_release(mu);
  const bool r = real(this, mu, deadline);
  __tsan_acquire(mu);
  return r;
}

void Notification::Notify() {
  using Fn = void (*)(Notification*);
  APAPO_REAL(Fn, "_ZN4absl7debian312Notification6NotifyEv", Fn);
  __tsan_release(this);
  __tsan_release(FlagOf(this));
  real(this);
}

void Notification::WaitForNotification() const {
  using Fn = void (*)(const Notification*);
  APAPO_REAL(Fn, "_ZNK4absl7debian312Notification19WaitForNotificationEv", Fn);
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
  __tsan_acquire(FlagOf(this));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  using Fn = bool (*)(const Notification*, absl::Duration);
  APAPO_REAL(Fn,
             "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE",
             Fn);
  const bool r = real(this, timeout);
  if (r) {
    __tsan_acquire(const_cast<Notification*>(this));
    __tsan_acquire(FlagOf(this));
  }
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
