#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz/fuzz.sh) for N executions each (default
# 10^6), printing each target's executions, rate, corpus growth and peak
# memory; exits non-zero on any finding.
#   bench/fuzz/run.sh [N] [TARGET...]
set -euo pipefail
N="${1:-1000000}"
shift || true
exec bash "$(dirname "$0")/../../fuzz/fuzz.sh" --runs="$N" "$@"
