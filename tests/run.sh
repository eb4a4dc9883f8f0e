#!/usr/bin/env bash
# Runs every APapo test: installs what is missing, builds everything, runs
# the unit tests (bazel test //...), the multi-process tests under tests/,
# the LibTorch-free unit tests again under ASan + UBSan and the bounded
# fuzzing runs, then prints one line "N passed, N failed" counting
# test cases. Exit status 0 only if nothing failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

bash deploy/install-deps.sh || { echo "install-deps failed"; echo "0 passed, 1 failed"; exit 1; }

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PY=/usr/bin/python3
# Tests pin their own thread counts; keep OpenBLAS from oversubscribing the
# shared cores in every test process.
export OPENBLAS_NUM_THREADS=1
# One Bazel disk cache for this tree's builds and for the fresh clone in which
# tests/test_accuracy.py runs the README's main command as a new user would
# (its output base has built nothing; the cache keeps that affordable).
export APAPO_BAZEL_DISK_CACHE=${APAPO_BAZEL_DISK_CACHE:-$HOME/.cache/apapo/bazel-disk}
mkdir -p "$APAPO_BAZEL_DISK_CACHE"
BAZEL_FLAGS=(--disk_cache="$APAPO_BAZEL_DISK_CACHE")

extra=()
# The CUDA/NCCL path must keep compiling even where no GPU runs it (its test
# runs on a GPU machine: see worker/nccl_transport_test.cc). Built first, so
# the CPU build below leaves the CPU variant of the test in bazel-bin.
if [ -f /usr/local/cuda/include/nccl.h ]; then
  echo "== bazel build --config=cuda //worker:nccl_transport_test (compile check)"
  if bazel build "${BAZEL_FLAGS[@]}" --config=cuda //worker:nccl_transport_test 2>&1 | grep -vE '^\s*[0-9]+\.[0-9]+: src/main/tools' | tail -n 20; then
    echo '{"passed": 1, "failed": 0}' > "$OUT/cuda.json"
  else
    echo '{"passed": 0, "failed": 1}' > "$OUT/cuda.json"
  fi
  extra+=("$OUT/cuda.json")
else
  echo "== no /usr/local/cuda: the CUDA compile check is skipped"
fi

echo "== bazel build //..."
if ! bazel build "${BAZEL_FLAGS[@]}" //... 2>&1 | tail -n 30; then :; fi

echo "== bazel test //..."
bazel test "${BAZEL_FLAGS[@]}" //... --test_summary=short --test_output=errors 2>&1 | tee "$OUT/bazel.log" | grep -vE '^\s*[0-9]+\.[0-9]+: src/main/tools'

echo "== tests/ (multi-process, Python clients)"
# Their clusters' folders (state, checkpoints, logs) go under $OUT, which
# the trap removes: 556 of them had piled up in /tmp here.
mkdir -p "$OUT/tmp"
TEST_TMPDIR="$OUT/tmp" $PY tests/lib/run_python_tests.py "$OUT/python.json"

extra+=("$OUT/python.json")
echo "== LibTorch-free unit tests under ASan + UBSan and TSan (tests/sanitizers.sh)"
bash tests/sanitizers.sh "$OUT/sanitizers.json" "${BAZEL_FLAGS[@]}"
extra+=("$OUT/sanitizers.json")
echo "== fuzzing: every libFuzzer target, briefly (fuzz/fuzz.sh)"
if bash fuzz/fuzz.sh "${FUZZ_SECONDS:-15}"; then
  echo '{"passed": 1, "failed": 0}' > "$OUT/fuzz.json"
else
  echo '{"passed": 0, "failed": 1}' > "$OUT/fuzz.json"
fi
extra+=("$OUT/fuzz.json")

echo "== summary"
$PY tests/lib/summarize.py "$ROOT" "$OUT/bazel.log" "${extra[@]}"
