#!/usr/bin/env bash
# End-to-end checks of the apapo-partition tool: plans, JSON, --compare,
# --trace, and one-line errors with exit code 2 on bad input.
set -u
BIN="partitioner/apapo-partition"
PROFILES="${APAPO_PROFILES_DIR:-$(dirname "$(readlink -f partitioner/BUILD)")/../../shared/profiles}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

out=$("$BIN" --profile="$PROFILES/vgg16/graph.txt" --workers=4 --cost-model=pipedream) \
  || fail "vgg16 plan exited $?"
echo "$out" | grep -q "bottleneck 0.20552" || fail "vgg16 bottleneck: $out"

json=$("$BIN" --profile="$PROFILES/gnmt/graph.txt" --workers=8 --format=json) \
  || fail "json exited $?"
echo "$json" | grep -q '"nodeIds"' || fail "no nodeIds in json"
echo "$json" | grep -q '"replicas"' || fail "no replicas in json"

cmp=$("$BIN" --profile="$PROFILES/resnet50/graph.txt" --workers=8 --compare \
  --trace="$TMP/trace.json") || fail "compare exited $?"
for s in dp gpipe 1f1b_flush async; do
  echo "$cmp" | grep -q "^  $s " || fail "compare lacks $s: $cmp"
done
grep -q '"traceEvents"' "$TMP/trace.json" || fail "trace not written"

"$BIN" --profile="$PROFILES/inception_v3/graph.txt" --levels=8:300e9,4:25e9 \
  >/dev/null || fail "inception two-level"

# --stages: vgg16 on 4 workers is 2 stages when free; asked for 4, 4.
staged=$("$BIN" --profile="$PROFILES/vgg16/graph.txt" --workers=4 --stages=4 \
  --format=json) || fail "--stages=4 exited $?"
[ "$(echo "$staged" | grep -o '"nodeIds"' | wc -l)" -eq 4 ] || fail "--stages=4 plan: $staged"
echo "$staged" | grep -q '4 stage(s) as asked' || fail "no --stages note: $staged"

# A slow link: vgg16's stage 0 would need 4 in flight to hide it. Without
# --max_in_flight it keeps the schedule's depth (2) and a note names the
# flag; with it, the depth it asks for, and a faster prediction.
shallow=$("$BIN" --profile="$PROFILES/vgg16/graph.txt" --levels=2:1e8) || fail "shallow exited $?"
echo "$shallow" | grep -qE '^ +0 .* 2$' || fail "stage 0 not at depth 2: $shallow"
echo "$shallow" | grep -q "note: stage 0 would need 4 micro-batches in flight.*--max_in_flight=4" \
  || fail "no depth note: $shallow"
deep=$("$BIN" --profile="$PROFILES/vgg16/graph.txt" --levels=2:1e8 --max_in_flight=4) \
  || fail "deep exited $?"
echo "$deep" | grep -qE '^ +0 .* 4$' || fail "stage 0 not at depth 4: $deep"
echo "$deep" | grep -q "would need" && fail "depth note with --max_in_flight=4: $deep"
rate() { echo "$1" | sed -n 's/.* \([0-9.]*\) mini-batches\/s.*/\1/p'; }
awk -v a="$(rate "$shallow")" -v b="$(rate "$deep")" 'BEGIN { exit !(b > a) }' \
  || fail "depth 4 predicts $(rate "$deep") mini-batches/s, not above $(rate "$shallow")"

# The split backward, as the coordinator plans by default: on a profile
# that marks fc2's weight gradients after the send (as apapo-worker
# measures), stage 1 sends its input gradients first, so stage 0's round
# trip is shorter and the prediction faster; --split_backward=false plans
# the backward in one pass, as a job with schedule.split_backward false.
cat > "$TMP/marked.json" <<'JSON'
{"model": "chain", "batchSize": 128, "updateSeconds": 0.002, "nodes": [
 {"id": "input", "activationBytes": "1000000"},
 {"id": "fc1", "inputs": ["input"], "forwardSeconds": 0.02, "backwardSeconds": 0.04,
  "activationBytes": "1000000", "parameterBytes": "16000000",
  "weightGradientsAfterSend": true, "weightGradientsInProduct": true},
 {"id": "fc2", "inputs": ["fc1"], "forwardSeconds": 0.02, "backwardSeconds": 0.04,
  "activationBytes": "1000000", "parameterBytes": "16000000",
  "weightGradientsAfterSend": true, "weightGradientsInProduct": true},
 {"id": "loss", "inputs": ["fc2"], "activationBytes": "4"}]}
JSON
split=$("$BIN" --profile="$TMP/marked.json" --stages=2 --levels=2:3e7) || fail "split exited $?"
echo "$split" | grep -q "note: split backward: stage 1 sends its input gradients" \
  || fail "no split backward note: $split"
onepass=$("$BIN" --profile="$TMP/marked.json" --stages=2 --levels=2:3e7 --split_backward=false) \
  || fail "one pass exited $?"
echo "$onepass" | grep -q "split backward" && fail "split note with --split_backward=false: $onepass"
awk -v a="$(rate "$onepass")" -v b="$(rate "$split")" 'BEGIN { exit !(b > a) }' \
  || fail "split predicts $(rate "$split") mini-batches/s, not above $(rate "$onepass")"
"$BIN" --profile="$TMP/marked.json" --stages=2 --levels=2:3e7 --format=json \
  | grep -q '"splitBackward": *true' || fail "json plan lacks splitBackward"

# Replicated on 2 workers over 30 MB/s, the 32 MB all-reduce starts in parts
# behind the weight gradients; --allreduce_in_backward=false charges all of
# it after the backward, and the plan says so.
parts=$("$BIN" --profile="$TMP/marked.json" --stages=1 --replicas=2 --levels=2:3e7 \
        --format=json) || fail "replicated exited $?"
after=$("$BIN" --profile="$TMP/marked.json" --stages=1 --replicas=2 --levels=2:3e7 \
        --allreduce_in_backward=false --format=json) || fail "after exited $?"
echo "$parts" | grep -q 'allreduceAfterBackward' && fail "parts plan says after: $parts"
echo "$after" | grep -q '"allreduceAfterBackward": *true' \
  || fail "json plan lacks allreduceAfterBackward: $after"
jrate() { echo "$1" | sed -n 's/.*"samplesPerSecond": *\([0-9.e+-]*\).*/\1/p' | head -1; }
awk -v a="$(jrate "$after")" -v b="$(jrate "$parts")" 'BEGIN { exit !(b > a && a > 0) }' \
  || fail "parts predict $(jrate "$parts") samples/s, not above $(jrate "$after")"

expect_error() {  # expect_error PATTERN ARGS...
  local pattern="$1"; shift
  local err rc
  err=$("$BIN" "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || fail "exit $rc (want 2) for $*: $err"
  [ "$(echo "$err" | wc -l)" -eq 1 ] || fail "multi-line error for $*: $err"
  echo "$err" | grep -q -- "$pattern" || fail "error '$err' lacks '$pattern'"
}
printf 'a -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\nb -- B -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n\ta -- b\n\tb -- a\n' > "$TMP/cycle.txt"
expect_error "cycle.txt:[34]: cycle" --profile="$TMP/cycle.txt" --workers=2
printf 'a -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n\ta -- zz\n' > "$TMP/dangling.txt"
expect_error "dangling.txt:2: dangling edge" --profile="$TMP/dangling.txt" --workers=2
printf 'a -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\na -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n' > "$TMP/dup.txt"
expect_error "dup.txt:2: duplicate node" --profile="$TMP/dup.txt" --workers=2
printf 'a -- A -- forward_compute_time=-1, backward_compute_time=1, activation_size=1, parameter_size=1\n' > "$TMP/neg.txt"
expect_error "neg.txt:1:" --profile="$TMP/neg.txt" --workers=2
printf 'a -- A -- forward_compute_time=abc, backward_compute_time=1, activation_size=1, parameter_size=1\n' > "$TMP/nan.txt"
expect_error "nan.txt:1:" --profile="$TMP/nan.txt" --workers=2
: > "$TMP/empty.txt"
expect_error "empty.txt:0: empty graph" --profile="$TMP/empty.txt" --workers=2
expect_error "workers" --profile="$PROFILES/vgg16/graph.txt" --workers=0
expect_error "cannot open" --profile="$TMP/missing.txt" --workers=2
expect_error "schedule" --profile="$PROFILES/vgg16/graph.txt" --workers=2 --schedule=zz
expect_error "stages: 3 asked for, but a stage needs a worker and there are 2" \
  --profile="$PROFILES/vgg16/graph.txt" --workers=2 --stages=3
echo PASS
