#!/usr/bin/env bash
# Runs apapo-worker --local=2 on a scripted nn.Sequential (written here with
# Debian's python3-torch) and tiny synthetic data, and checks the summary.
set -euo pipefail
BIN="worker/apapo-worker"
DIR="${TEST_TMPDIR:-/tmp}"
MODEL="$DIR/seq.pt"
SPEC="$DIR/torchscript.textproto"
OUT="$DIR/summary.json"

/usr/bin/python3 - "$MODEL" <<'PY' || { echo "needs /usr/bin/python3 with torch (python3-torch)"; exit 1; }
import sys, torch
from torch import nn
torch.manual_seed(0)
torch.jit.script(nn.Sequential(nn.Linear(20, 32), nn.ReLU(),
                               nn.Linear(32, 4))).save(sys.argv[1])
PY
cat > "$SPEC" <<EOT
name: "tiny_torchscript"
model { torchscript { path: "$MODEL" input_shape: 20 } }
data {
  synthetic { sample_shape: 20 num_classes: 4 samples_per_epoch: 512 }
  batch_size: 32
  shuffle: true
}
optimizer { sgd { momentum: 0.9 } learning_rate: 0.05 }
schedule { kind: SCHEDULE_KIND_ASYNC micro_batches: 4 stages: 2 }
limits { epochs: 2 }
seed: 3
EOT

"$BIN" --local=2 --spec="$SPEC" --summary="$OUT" --timeout_s=60
python3 - "$OUT" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(s["final_test_accuracy"], s["final_loss"])
assert len(s["stages"]) == 2, s
assert s["samples_per_s"] > 0, s
assert s["final_test_accuracy"] > 0.5, s  # chance is 0.25
PY

# A missing model file fails before training, naming the path.
sed -i "s|$MODEL|$DIR/missing.pt|" "$SPEC"
set +e
"$BIN" --local=2 --spec="$SPEC" --timeout_s=60 2>err.txt; code=$?
set -e
[ "$code" -ne 0 ] || { echo "missing model exited 0"; exit 1; }
grep -q "$DIR/missing.pt" err.txt || { cat err.txt; exit 1; }
echo PASS
