#!/usr/bin/env bash
# Runs every LibTorch-free unit test (partitioner, planning, schedule,
# coordinator, cli, common, the daemon's torch-free parts, the integration
# tests of coordinator + daemon) under AddressSanitizer + UBSan
# (--config=asan in .bazelrc: any report fails its test), and writes
# {"passed": N, "failed": N} (one per test target) to OUT.json.
#   tests/sanitizers.sh OUT.json [extra bazel flags...]
# LibTorch's tests stay out: Debian's libtorch is not built for ASan and its
# own allocator and JIT trip it.
#
# TSan (--config=tsan) builds and runs, but is not part of the suite: Debian's
# Abseil and gRPC are shared libraries built without TSan, so TSan sees none of
# absl::Mutex's locking and reports every field an absl::Mutex guards as a
# race (see SECURITY.md's checks and the README's "Known limits").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_JSON="$1"
shift
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
TARGETS=$(bazel query 'kind(cc_test, //...) except rdeps(//..., //third_party:torch)' 2>/dev/null)
if [ -z "$TARGETS" ]; then
  echo "sanitizers: bazel query found no targets"
  echo '{"passed": 0, "failed": 1}' > "$OUT_JSON"
  exit 1
fi
# No convenience symlinks: bazel-testlogs keeps pointing at the main build's
# results, which tests/lib/summarize.py reads.
# shellcheck disable=SC2086
bazel test --config=asan --symlink_prefix=/ "$@" --test_summary=short \
  --test_output=errors $TARGETS 2>&1 | grep -vE '^\s*[0-9]+\.[0-9]+: src/main/tools' | tee "$LOG"
/usr/bin/python3 - "$LOG" "$OUT_JSON" <<'PY'
import json, re, sys
status = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)")
seen = {}
for line in open(sys.argv[1], errors="replace"):
    m = status.match(line.strip())
    if m:
        seen[m.group(1)] = m.group(2)
passed = sum(1 for s in seen.values() if s == "PASSED")
failed = len(seen) - passed
for label, s in sorted(seen.items()):
    if s != "PASSED":
        print(f"  not passed under ASan/UBSan: {label}: {s}")
if not seen:
    failed = 1
    print("  sanitizers: no test status in the log (the build failed?)")
json.dump({"passed": passed, "failed": failed}, open(sys.argv[2], "w"))
print(f"sanitizers: {passed} target(s) passed, {failed} failed")
PY
