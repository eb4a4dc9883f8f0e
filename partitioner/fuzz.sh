#!/usr/bin/env bash
# Builds the graph.txt parser fuzzer with clang (libFuzzer + ASan/UBSan) and
# runs it for SECONDS (default 60) over a corpus seeded with the real
# profiles. Exits non-zero on any finding (crash, sanitizer report, abort).
#   partitioner/fuzz.sh [SECONDS]
set -euo pipefail
SECONDS_TO_RUN="${1:-60}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PROFILES="${APAPO_PROFILES_DIR:-$ROOT/../shared/profiles}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ABSL_LIBS="-labsl_status -labsl_statusor -labsl_strings -labsl_strings_internal \
  -labsl_str_format_internal -labsl_int128 -labsl_throw_delegate \
  -labsl_raw_logging_internal -labsl_base -labsl_spinlock_wait -labsl_cord \
  -labsl_cord_internal -labsl_cordz_info -labsl_cordz_handle \
  -labsl_cordz_functions -labsl_exponential_biased -labsl_synchronization \
  -labsl_graphcycles_internal -labsl_time -labsl_time_zone -labsl_civil_time \
  -labsl_stacktrace -labsl_symbolize -labsl_debugging_internal \
  -labsl_demangle_internal -labsl_malloc_internal -labsl_hash -labsl_city \
  -labsl_low_level_hash -labsl_raw_hash_set -labsl_hashtablez_sampler \
  -labsl_bad_optional_access -labsl_bad_variant_access -labsl_strerror"
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined -I"$ROOT" \
  "$ROOT/partitioner/pipedream_format_fuzz.cc" \
  "$ROOT/partitioner/pipedream_format.cc" "$ROOT/partitioner/graph.cc" \
  -o "$WORK/fuzzer" -Wl,--start-group $ABSL_LIBS -Wl,--end-group
mkdir -p "$WORK/corpus"
for f in "$PROFILES"/*/graph.txt; do
  cp "$f" "$WORK/corpus/$(basename "$(dirname "$f")").txt"
done
# Small seeds mutate faster than 30 KB profiles.
head -c 2000 "$PROFILES/gnmt/graph.txt" > "$WORK/corpus/gnmt_head.txt"
grep -P '^\t' "$PROFILES/gnmt/graph.txt" | head -5 >> "$WORK/corpus/gnmt_head.txt"
cd "$WORK"
./fuzzer -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -timeout=10 \
  -print_final_stats=1 corpus
