#!/usr/bin/env bash
# Builds APapo's libFuzzer targets with clang (libFuzzer + ASan + UBSan,
# outside Bazel: Bazel's toolchain here is gcc, which has no libFuzzer) and
# runs each over its seed corpus. Exits non-zero on any finding (crash,
# sanitizer report, timeout, leak) and prints the input that caused it.
#   fuzz/fuzz.sh [SECONDS | --runs=N] [TARGET...]
# SECONDS (default 20) per target, or N executions per target (bench/fuzz/).
# Targets (default: all): profile_parser spec planner stage_channel
# checkpoint_manifest idx. Needs the generated protobuf sources: it builds
# //proto/apapo/v1 with Bazel first (a no-op after `bazel build //...`).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PROFILES="${APAPO_PROFILES_DIR:-$ROOT/../shared/profiles}"
BUDGET="-max_total_time=20"
case "${1:-}" in
  --runs=*) BUDGET="-runs=${1#--runs=}"; shift ;;
  [0-9]*) BUDGET="-max_total_time=$1"; shift ;;
esac
ALL=(profile_parser spec planner stage_channel checkpoint_manifest idx)
TARGETS=("$@")
[ "${#TARGETS[@]}" -eq 0 ] && TARGETS=("${ALL[@]}")

cd "$ROOT"
bazel build ${APAPO_BAZEL_DISK_CACHE:+--disk_cache="$APAPO_BAZEL_DISK_CACHE"} \
  //proto/apapo/v1:job_cc_proto //proto/apapo/v1:worker_cc_proto \
  //proto/apapo/v1:metrics_cc_proto >/dev/null 2>&1 || {
  echo "fuzz: cannot build the protobuf sources"; exit 1; }
GEN="$(bazel info bazel-bin 2>/dev/null)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

ABSL_LIBS=$(ls /usr/lib/x86_64-linux-gnu/libabsl_*.so | sed -E 's|.*/lib(absl_[a-z0-9_]+)\.so|-l\1|' | tr '\n' ' ')
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CXX="clang++ -std=c++17 -O1 -g -fno-omit-frame-pointer -I$ROOT -I$GEN -Wno-deprecated-declarations"
PB="job model plan profile metrics worker"

# Library code: instrumented for coverage, no main; one object per source.
obj() {
  local src="$1" out="$WORK/obj/${1//\//_}.o"
  mkdir -p "$WORK/obj"
  [ -f "$out" ] || $CXX $SAN -fsanitize=fuzzer-no-link -c "$src" -o "$out"
  echo "$out"
}
pb_objs() { for p in $PB; do obj "$GEN/proto/apapo/v1/$p.pb.cc"; done; }

sources() {
  case "$1" in
    profile_parser) echo partitioner/pipedream_format_fuzz.cc partitioner/pipedream_format.cc partitioner/graph.cc ;;
    spec) echo fuzz/spec_fuzz.cc coordinator/spec_validator.cc common/spec_paths.cc \
        worker/model_graph.cc worker/layer_kinds.cc PB ;;
    planner) echo fuzz/planner_fuzz.cc planning/partitioner_planner.cc planning/core_sharing.cc \
        planning/network_levels.cc \
        partitioner/graph.cc partitioner/cluster.cc partitioner/optimizer.cc partitioner/plan_proto.cc \
        partitioner/simulator.cc partitioner/pipedream_format.cc planning/stage_plan.cc \
        schedule/schedule.cc PB ;;
    stage_channel) echo fuzz/stage_channel_fuzz.cc worker/daemon/stage_channel.cc PB ;;
    checkpoint_manifest) echo fuzz/checkpoint_manifest_fuzz.cc worker/checkpoint_manifest.cc PB ;;
    idx) echo fuzz/idx_fuzz.cc worker/data.cc worker/confined_files.cc worker/model_graph.cc worker/layer_kinds.cc PB ;;
    *) echo "fuzz: unknown target '$1' (targets: ${ALL[*]})" >&2; return 1 ;;
  esac
}

# Seeds: the committed corpus, plus real inputs where there are some.
seed() {
  local name="$1" dir="$WORK/corpus/$1"
  mkdir -p "$dir"
  [ -d "$ROOT/fuzz/corpus/$name" ] && cp "$ROOT/fuzz/corpus/$name"/* "$dir/" 2>/dev/null || true
  case "$name" in
    profile_parser)
      for f in "$PROFILES"/*/graph.txt; do
        [ -f "$f" ] && cp "$f" "$dir/$(basename "$(dirname "$f")").txt"
      done
      [ -f "$PROFILES/gnmt/graph.txt" ] && head -c 2000 "$PROFILES/gnmt/graph.txt" > "$dir/gnmt_head.txt" ;;
    spec)
      for f in "$ROOT"/examples/*.textproto; do
        { printf '\0'; cat "$f"; } > "$dir/$(basename "$f")"
      done ;;
    idx)
      local mnist=/usr/share/datasets/fashion-mnist
      [ -f "$mnist/t10k-labels-idx1-ubyte.gz" ] && head -c 4096 "$mnist/t10k-labels-idx1-ubyte.gz" > "$dir/labels_head.gz" ;;
  esac
  echo "$dir"
}

failed=0
for t in "${TARGETS[@]}"; do
  srcs=$(sources "$t") || exit 2
  objs=()
  main=""
  for s in $srcs; do
    if [ "$s" = PB ]; then
      for o in $(pb_objs); do objs+=("$o"); done
    elif [ -z "$main" ]; then
      main="$s"
    else
      objs+=("$(obj "$s")")
    fi
  done
  echo "== fuzz $t (${BUDGET#-})"
  $CXX $SAN -fsanitize=fuzzer "$main" "${objs[@]}" -o "$WORK/$t" \
    -Wl,--start-group $ABSL_LIBS -lprotobuf -lz -Wl,--end-group
  corpus="$(seed "$t")"
  mkdir -p "$WORK/artifacts/$t"
  if ! (cd "$WORK" && "./$t" "$BUDGET" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
          -print_final_stats=1 -artifact_prefix="$WORK/artifacts/$t/" "$corpus" \
          > "$WORK/$t.log" 2>&1); then
    failed=1
    echo "fuzz $t: FOUND SOMETHING"
    grep -v '^#[0-9]' "$WORK/$t.log" | tail -n 60
    for a in "$WORK/artifacts/$t"/*; do
      [ -f "$a" ] && { echo "-- input $(basename "$a") (base64):"; base64 -w0 "$a" | head -c 4000; echo; }
    done
  else
    grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|stat::peak_rss_mb)' "$WORK/$t.log" | tr '\n' ' '
    echo
  fi
done
exit "$failed"
