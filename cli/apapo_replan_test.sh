#!/usr/bin/env bash
# End-to-end checks of apapo-replan on what a job of the lab was planned on
# (testdata/mlp_100mbit_two_hosts.*: the mlp over a 100 Mbit/s link between
# two hosts, its spec bounding staleness at 3): the plan as the coordinator
# made it, the same inputs under other bounds, and one-line errors with exit
# code 2 on bad input.
set -u
BIN="cli/apapo-replan"
DATA="cli/testdata/mlp_100mbit_two_hosts"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }
ARGS=(--spec="$DATA.spec.txtpb" --profile="$DATA.profile.txtpb" --cluster="$DATA.cluster.txtpb")

# As planned in the lab: two stages, fc3 split, stage 0 4 deep to cover the
# link's round trip (the job predicted 1,826 samples/s).
out=$("$BIN" "${ARGS[@]}") || fail "replan exited $?"
echo "$out" | grep -q "^SCHEDULE_KIND_ASYNC, m=1: predicted 18[0-9][0-9]\.[0-9] samples/s$" \
  || fail "prediction: $out"
[ "$(echo "$out" | grep -c '^  stage [0-9]:')" -eq 2 ] || fail "not 2 stages: $out"
echo "$out" | grep -q "^  stage 0: .* depth 4, staleness 3$" || fail "stage 0 depth: $out"
echo "$out" | grep -q "^  split fc3 in 4 parts$" || fail "no split: $out"

# The default bound (one update): stage 0 at one update of staleness
# (deeper only in micro-batches of one mini-batch), predicted slower.
one=$("$BIN" "${ARGS[@]}" --schedule="max_staleness: 1") || fail "max_staleness 1 exited $?"
echo "$one" | grep -q "^  stage 0: .*, staleness 1$" || fail "stage 0 at 1: $one"
rate() { sed -n 's/.*predicted \([0-9.]*\) samples\/s$/\1/p' | head -1; }
awk -v a="$(echo "$one" | rate)" -v b="$(echo "$out" | rate)" 'BEGIN { exit !(a < b) }' \
  || fail "one update not predicted slower: $one"

# At one update the link binds: the plan lists what bfloat16 transfers
# would buy, at what a job that sets them is planned (that job weighs its
# zeros, splits and micro-batches again); with the bound set in the spec,
# no staleness_2.
alt=$(echo "$one" | sed -n 's/^  alternative bfloat16: \([0-9.]*\) samples\/s$/\1/p')
[ -n "$alt" ] || fail "no bfloat16 alternative: $one"
bf16=$("$BIN" "${ARGS[@]}" \
  --schedule="max_staleness: 1 transfer_precision: TRANSFER_PRECISION_BFLOAT16") \
  || fail "bfloat16 exited $?"
[ "$(echo "$bf16" | rate)" = "$alt" ] || fail "bfloat16 listed at $alt, planned: $bf16"
echo "$bf16" | grep -q "alternative bfloat16" && fail "a bfloat16 job lists bfloat16: $bf16"
echo "$one" | grep -q "alternative staleness_2" && fail "bound set, staleness_2 listed: $one"

# Bad input: one line naming the flag, exit code 2.
expect_2() {
  local what="$1" pattern="$2"; shift 2
  err=$("$BIN" "$@" 2>&1 >/dev/null); code=$?
  [ "$code" -eq 2 ] || fail "$what: exit $code, not 2 ($err)"
  [ "$(echo "$err" | wc -l)" -eq 1 ] || fail "$what: not one line: $err"
  echo "$err" | grep -q -- "$pattern" || fail "$what: $err"
}
expect_2 "no spec" "^--spec: required$" --profile="$DATA.profile.txtpb" --cluster="$DATA.cluster.txtpb"
expect_2 "missing file" "^--cluster: cannot read $TMP/none.pb$" \
  --spec="$DATA.spec.txtpb" --profile="$DATA.profile.txtpb" --cluster="$TMP/none.pb"
printf 'not a proto' > "$TMP/bad.txtpb"
expect_2 "not a profile" "^--profile: .*bad.txtpb:1:[0-9]*: " \
  --spec="$DATA.spec.txtpb" --profile="$TMP/bad.txtpb" --cluster="$DATA.cluster.txtpb"
expect_2 "bad schedule" "^--schedule:1:[0-9]*: .*depth" "${ARGS[@]}" --schedule="depth: 9"
: > "$TMP/empty.pb"  # an empty JobSpec: no model, no batch size
expect_2 "empty spec" "^--spec: .*batch_size" \
  --spec="$TMP/empty.pb" --profile="$DATA.profile.txtpb" --cluster="$DATA.cluster.txtpb"
printf '\x08\x01\x12' > "$TMP/cut.pb"  # a binary message cut short
expect_2 "not a binary cluster" "^--cluster: $TMP/cut.pb: not a binary apapo.v1.ClusterSpec$" \
  --spec="$DATA.spec.txtpb" --profile="$DATA.profile.txtpb" --cluster="$TMP/cut.pb"
echo PASS
