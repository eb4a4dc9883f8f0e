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
echo PASS
