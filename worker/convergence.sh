#!/usr/bin/env bash
# Convergence checks of issue 4 (long: ~20 minutes on 2 cores; not a unit
# test). Usage: worker/convergence.sh [path/to/apapo-worker] [outdir]
#   1. cnn, async on 2 stages, 3 epochs: test accuracy >= 0.89.
#   2. mlp, async on 2 stages vs the same network and settings in one
#      process (1 stage, same micro-batching): within 0.5 points.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-$ROOT/bazel-bin/worker/apapo-worker}"
OUT="${2:-$(mktemp -d)}"
mkdir -p "$OUT"
acc() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["final_test_accuracy"])' "$1"; }
sps() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_s"])' "$1"; }

# One process: the same spec with one stage (the schedule then has nothing
# to pipeline; gpipe with one stage is plain gradient accumulation).
single_spec() {
  # One thread, like each pipeline process: with 2 LibTorch + 2 OpenBLAS
  # threads in one process this machine spent 2/3 of its time in the kernel.
  sed -e 's/^schedule {.*}/schedule { kind: SCHEDULE_KIND_GPIPE micro_batches: 4 stages: 1 }/' "$1" > "$2"
}

"$BIN" --local=2 --spec="$ROOT/worker/testdata/cnn_fashion_mnist.textproto" \
  --summary="$OUT/cnn_async.json" 2> "$OUT/cnn_async.log"
CNN=$(acc "$OUT/cnn_async.json")

"$BIN" --local=2 --spec="$ROOT/worker/testdata/mlp_fashion_mnist.textproto" \
  --summary="$OUT/mlp_async.json" 2> "$OUT/mlp_async.log"
single_spec "$ROOT/worker/testdata/mlp_fashion_mnist.textproto" "$OUT/mlp_single.textproto"
"$BIN" --local=1 --spec="$OUT/mlp_single.textproto" \
  --summary="$OUT/mlp_single.json" 2> "$OUT/mlp_single.log"
MLP_ASYNC=$(acc "$OUT/mlp_async.json")
MLP_SINGLE=$(acc "$OUT/mlp_single.json")

echo "cnn async 2 stages: test accuracy $CNN ($(sps "$OUT/cnn_async.json") samples/s)"
echo "mlp async 2 stages: test accuracy $MLP_ASYNC ($(sps "$OUT/mlp_async.json") samples/s)"
echo "mlp single process: test accuracy $MLP_SINGLE ($(sps "$OUT/mlp_single.json") samples/s)"
python3 - "$CNN" "$MLP_ASYNC" "$MLP_SINGLE" <<'PY'
import sys
cnn, a, s = map(float, sys.argv[1:])
ok = True
if cnn < 0.89:
    print(f"FAIL: cnn async {cnn:.4f} < 0.89"); ok = False
if abs(a - s) > 0.005:
    print(f"FAIL: mlp async {a:.4f} vs single {s:.4f}: more than 0.5 pt apart"); ok = False
print("PASS" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
