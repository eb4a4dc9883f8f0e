#!/usr/bin/env bash
# Runs apapo-worker --local=2 on a tiny synthetic job and checks the summary.
set -euo pipefail
BIN="worker/apapo-worker"
SPEC="worker/testdata/tiny_synthetic.textproto"
OUT="${TEST_TMPDIR:-/tmp}/summary.json"

"$BIN" --local=2 --spec="$SPEC" --summary="$OUT" --timeout_s=60
for key in samples_per_s final_test_accuracy final_loss comm_hidden_share \
           max_staleness busy_s idle_s comm_exposed_s; do
  grep -q "\"$key\"" "$OUT" || { echo "summary lacks $key"; cat "$OUT"; exit 1; }
done
# Async on 2 stages: stage 0's gradients are 1 update stale.
grep -q '"max_staleness": 1,' "$OUT" || { echo "staleness"; cat "$OUT"; exit 1; }
# The learnable synthetic task is learnt above chance (0.25).
python3 - "$OUT" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["final_test_accuracy"] > 0.5, s
assert s["samples_per_s"] > 0, s
assert len(s["stages"]) == 2, s
PY

# Usage errors exit 2 and say why.
set +e
"$BIN" --local=2 --spec=/nonexistent.textproto 2>err.txt; code=$?
set -e
[ "$code" -eq 2 ] || { echo "missing spec exited $code"; exit 1; }
grep -q "/nonexistent.textproto" err.txt
"$BIN" 2>/dev/null && { echo "no args should fail"; exit 1; } || true

# Confined to a data root (--confine_to, what the daemon passes its stage
# processes): checkpoints are written beneath it; a checkpoint folder that is
# a symlink out of the root fails the stage at the open, and nothing is
# written outside.
ROOT="${TEST_TMPDIR:-/tmp}/root"
OUTSIDE="${TEST_TMPDIR:-/tmp}/outside"
rm -rf "$ROOT" "$OUTSIDE"
mkdir -p "$ROOT" "$OUTSIDE"
with_checkpoints() {
  cat "$SPEC"
  echo "checkpoint { directory: \"$1\" every_steps: 8 }"
}
with_checkpoints "$ROOT/ckpt" > "$ROOT/in.textproto"
"$BIN" --local=2 --confine_to="$ROOT" --spec="$ROOT/in.textproto" --timeout_s=60
ls "$ROOT"/ckpt/step-*/stage-1.manifest >/dev/null
ln -s "$OUTSIDE" "$ROOT/escape"
with_checkpoints "$ROOT/escape/ckpt" > "$ROOT/out.textproto"
set +e
"$BIN" --local=2 --confine_to="$ROOT" --spec="$ROOT/out.textproto" --timeout_s=60 2>err.txt
code=$?
set -e
[ "$code" -ne 0 ] || { echo "a checkpoint folder out of the root was written"; exit 1; }
grep -q "outside the data roots ($ROOT)" err.txt || { cat err.txt; exit 1; }
[ -z "$(ls -A "$OUTSIDE")" ] || { echo "written outside:"; ls -R "$OUTSIDE"; exit 1; }
echo PASS
