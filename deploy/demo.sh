#!/usr/bin/env bash
# The README's main job: the whole product on this machine, with embedded
# defaults. Starts a coordinator and two worker daemons on free loopback
# ports, submits the Fashion-MNIST MLP job (examples/mlp_fashion_mnist.textproto,
# or the spec given as $1), shows its live progress, prints the plan, then
# trains the same model in one process for comparison, and shuts everything
# down: about 5 minutes on 2 cores once built. By default both runs train one
# epoch; `--epochs=3` gives the spec's full run (~12 minutes).
# Exit status: 0 if the job succeeded. APAPO_DEMO_RESULT=FILE also writes the
# result table as JSON (tests/test_accuracy.py uses it).
#   bash deploy/demo.sh [SPEC] [apapoctl submit flags, e.g. --epochs=3]
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${1:-examples/mlp_fashion_mnist.textproto}
shift || true
EXTRA=("$@")   # extra apapoctl submit flags, e.g. --epochs=3
if [ "${#EXTRA[@]}" -eq 0 ]; then EXTRA=(--epochs=1); fi

bash deploy/install-deps.sh
echo "== building (first time: several minutes)"
# The binaries and the generated Python modules the one-process comparison
# imports: everything this script runs, nothing else (a fresh clone has
# nothing built; tests/test_accuracy.py runs this script that way in CI).
BUILD_LOG=$(mktemp /tmp/apapo-demo-build.XXXXXX)
if ! bazel build //coordinator:apapo-coordinator //worker:apapo-worker \
    //cli:apapoctl //proto/apapo/v1:py_stubs >"$BUILD_LOG" 2>&1; then
  grep -E "^(ERROR|FAILED)" "$BUILD_LOG" | head -20
  echo "demo: the build failed (full log: $BUILD_LOG)"
  exit 1
fi
grep -E "^INFO: Build completed" "$BUILD_LOG" || true
rm -f "$BUILD_LOG"
BIN=bazel-bin
WORK=$(mktemp -d /tmp/apapo-demo.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # The job's checkpoints are ~200 MB a run: the logs, plan and state stay.
  rm -rf "$WORK/checkpoints"
  echo "(logs kept in $WORK)"
}
trap cleanup EXIT

# Waits up to 120 s for PATTERN (grep -P, \K marks what to print) in FILE.
wait_for() {
  local out
  out=$(timeout 120 grep -m1 -oP "$2" < <(tail -n +1 -f "$1")) || {
    echo "demo: timed out waiting for '$2' in $1:"; tail -20 "$1"; exit 1; }
  echo "$out"
}

# Every process computes on one core: bound OpenBLAS too, not just LibTorch.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

echo "== a throwaway CA: the control plane runs TLS, workers show certificates"
bash deploy/pki.sh "$WORK/pki" --worker=w-1 --worker=w-2 >/dev/null
PKI="$WORK/pki"

echo "== starting a coordinator and two worker daemons"
"$BIN/coordinator/apapo-coordinator" --host=127.0.0.1 --port=0 --metrics_port=0 \
  --tls_cert="$PKI/coordinator.pem" --tls_key="$PKI/coordinator.key" \
  --tls_ca="$PKI/ca.pem" --state="$WORK/coordinator.db" \
  --data_roots="/usr/share/datasets,$WORK" --checkpoint_root="$WORK/checkpoints" \
  >"$WORK/coordinator.log" 2>&1 &
PIDS+=($!)
PORT=$(wait_for "$WORK/coordinator.log" 'listening on port \K[0-9]+')
METRICS=$(wait_for "$WORK/coordinator.log" 'metrics on port \K[0-9]+')
echo "coordinator: 127.0.0.1:$PORT (metrics: http://127.0.0.1:$METRICS/metrics)"
for id in w-1 w-2; do
  "$BIN/worker/apapo-worker" --coordinator="127.0.0.1:$PORT" --id="$id" \
    --threads=1 --tls_ca="$PKI/ca.pem" --tls_cert="$PKI/worker-$id.pem" \
    --tls_key="$PKI/worker-$id.key" --data_roots="/usr/share/datasets,$WORK" \
    >"$WORK/$id.log" 2>&1 &
  PIDS+=($!)
done
for id in w-1 w-2; do wait_for "$WORK/$id.log" "registered as \K$id" >/dev/null; done
CTL=("$BIN/cli/apapoctl" --coordinator="127.0.0.1:$PORT" --tls_ca="$PKI/ca.pem")
"${CTL[@]}" workers

echo "== submitting $SPEC"
JOB=$("${CTL[@]}" submit "$SPEC" "${EXTRA[@]}")
echo "job $JOB"
set +e
"${CTL[@]}" watch "$JOB" | tee "$WORK/watch.log"
STATUS=${PIPESTATUS[0]}
set -e
echo "== the plan (predicted, and measured per stage)"
"${CTL[@]}" plan "$JOB" | tee "$WORK/plan.txt" || true

echo "== the same model in one process on one core, for comparison"
SINGLE_SPEC="$WORK/single.textproto"
# apapoctl's overrides (e.g. --epochs) apply to the baseline too.
/usr/bin/python3 - "$SPEC" "$SINGLE_SPEC" "${EXTRA[@]}" <<'PY'
import sys
sys.path.insert(0, "bazel-bin")
from google.protobuf import text_format
from proto.apapo.v1 import job_pb2
spec = text_format.Parse(open(sys.argv[1]).read(), job_pb2.JobSpec())
for flag in sys.argv[3:]:
    name, _, value = flag.lstrip("-").partition("=")
    if name == "epochs":
        spec.limits.epochs = int(value)
    elif name == "max_steps":
        spec.limits.max_steps = int(value)
spec.resources.workers = 1
open(sys.argv[2], "w").write(text_format.MessageToString(spec))
PY
"$BIN/worker/apapo-worker" --local=1 --threads=1 --spec="$SINGLE_SPEC" \
  --summary="$WORK/single.json" 2>&1 | grep -E "test_acc|error" || true

echo "== result"
/usr/bin/python3 - "$WORK/watch.log" "$WORK/single.json" "${APAPO_DEMO_RESULT:-}" \
  "$WORK/plan.txt" <<'PY'
import json, re, sys
watch = open(sys.argv[1]).read()
m = re.search(r"succeeded: test accuracy ([0-9.]+)%, ([0-9.]+) samples/s", watch)
try:
    single = json.load(open(sys.argv[2]))
except (OSError, ValueError):
    single = {}
acc1 = single.get("final_test_accuracy")
sps1 = single.get("samples_per_s")
print(f"{'':32}{'test accuracy':>15}{'samples/s':>12}")
if m:
    print(f"{'APapo, 2 workers (planned)':32}{m.group(1) + '%':>15}{float(m.group(2)):>12.1f}")
else:
    print("APapo job did not succeed: see the watch output above")
if acc1 is not None and sps1:
    print(f"{'single process, one core':32}{100 * acc1:>14.2f}%{sps1:>12.1f}")
    if m:
        print(f"speed-up: {float(m.group(2)) / sps1:.2f}x")
if len(sys.argv) > 3 and sys.argv[3]:
    # For scripts and tests: APAPO_DEMO_RESULT=FILE gets the figures as JSON.
    json.dump({"apapo_accuracy": float(m.group(1)) / 100 if m else None,
               "apapo_samples_per_s": float(m.group(2)) if m else None,
               "single_accuracy": acc1, "single_samples_per_s": sps1,
               "plan": open(sys.argv[4]).read()},
              open(sys.argv[3], "w"))
PY
exit "$STATUS"
