#!/usr/bin/env bash
# Runs every LibTorch-free unit test (partitioner, planning, schedule,
# coordinator, cli, common, the daemon's torch-free parts, the integration
# tests of coordinator + daemon) under AddressSanitizer + UBSan
# (--config=asan in .bazelrc), and all but the partitioner's optimizer test
# under ThreadSanitizer (--config=tsan, with tests/tsan.supp); any report
# fails its test. Writes {"passed": N,
# "failed": N} (one per test target and sanitizer) to OUT.json.
#   tests/sanitizers.sh OUT.json [extra bazel flags...]
# LibTorch's tests stay out: Debian's libtorch is not built for the
# sanitizers and its own allocator and JIT trip them.
#
# TSan and Debian's uninstrumented Abseil/gRPC: the test binaries annotate
# every absl::Mutex/CondVar/Notification call for TSan
# (third_party/tsan_absl_sync.cc); tests/tsan.supp says what is still
# suppressed (gRPC's lock-free hand-offs) and why.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_JSON="$1"
shift
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
TARGETS=$(bazel query 'kind(cc_test, //...) except rdeps(//..., //third_party:torch)' 2>/dev/null)
# All of them but the partitioner's optimizer test: the planner is
# single-threaded, and that test runs past its 5-minute timeout in TSan's
# unoptimised build (ASan's covers it).
TSAN_TARGETS=$(bazel query 'kind(cc_test, //...) except rdeps(//..., //third_party:torch) except //partitioner:optimizer_test' 2>/dev/null)
if [ -z "$TARGETS" ] || [ -z "$TSAN_TARGETS" ]; then
  echo "sanitizers: bazel query found no targets"
  echo '{"passed": 0, "failed": 1}' > "$OUT_JSON"
  exit 1
fi
# No convenience symlinks: bazel-testlogs keeps pointing at the main build's
# results, which tests/lib/summarize.py reads.
run() {
  local name=$1
  shift
  echo "=== sanitizer: $name"
  # shellcheck disable=SC2086
  bazel test --symlink_prefix=/ "$@" --test_summary=short --test_output=errors 2>&1 \
    | grep -vE '^\s*[0-9]+\.[0-9]+: src/main/tools' | sed -E "s|^(//\S+)|$name \1|" | tee -a "$LOG"
}
# shellcheck disable=SC2086
run asan --config=asan "$@" $TARGETS
# shellcheck disable=SC2086
run tsan --config=tsan "$@" \
  --test_env=TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
  $TSAN_TARGETS
# The annotations themselves: TSan must see absl's locks (a guarded
# hand-off runs clean; without tsan_absl_sync.cc it is reported) and must
# still report a real race (exit 66).
PROBE_OUT="$(bazel info --config=tsan "$@" bazel-bin 2>/dev/null)/tests/tsan/tsan_probe"
if bazel build --config=tsan --symlink_prefix=/ "$@" //tests/tsan:tsan_probe >/dev/null 2>&1 &&
    [ -x "$PROBE_OUT" ]; then
  if TSAN_OPTIONS=halt_on_error=1 "$PROBE_OUT" guarded >/dev/null 2>&1; then
    echo "tsan //tests/tsan:tsan_probe_guarded PASSED" | tee -a "$LOG"
  else
    echo "tsan //tests/tsan:tsan_probe_guarded FAILED (absl's locks not seen)" | tee -a "$LOG"
  fi
  TSAN_OPTIONS=halt_on_error=1 "$PROBE_OUT" racy >/dev/null 2>&1
  if [ $? -eq 66 ]; then
    echo "tsan //tests/tsan:tsan_probe_racy PASSED" | tee -a "$LOG"
  else
    echo "tsan //tests/tsan:tsan_probe_racy FAILED (a race went unreported)" | tee -a "$LOG"
  fi
else
  echo "tsan //tests/tsan:tsan_probe_guarded FAILED TO BUILD" | tee -a "$LOG"
  echo "tsan //tests/tsan:tsan_probe_racy FAILED TO BUILD" | tee -a "$LOG"
fi
EXPECTED=$(( $(echo $TARGETS | wc -w) + $(echo $TSAN_TARGETS | wc -w) + 2 ))
/usr/bin/python3 - "$LOG" "$OUT_JSON" "$EXPECTED" <<'PY'
import json, re, sys
status = re.compile(r"^((?:asan|tsan) //\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)")
seen = {}
for line in open(sys.argv[1], errors="replace"):
    m = status.match(line.strip())
    if m:
        seen[m.group(1)] = m.group(2)
passed = sum(1 for s in seen.values() if s == "PASSED")
failed = len(seen) - passed
for label, s in sorted(seen.items()):
    if s != "PASSED":
        print(f"  not passed: {label}: {s}")
missing = int(sys.argv[3]) - len(seen)
if missing > 0:
    failed += missing
    print(f"  sanitizers: {missing} target(s) without a test status (a build failed?)")
json.dump({"passed": passed, "failed": failed}, open(sys.argv[2], "w"))
print(f"sanitizers: {passed} target(s) passed, {failed} failed")
PY
