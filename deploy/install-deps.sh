#!/usr/bin/env bash
# Installs every Debian package APapo builds, tests and benchmarks with.
# Idempotent: when everything is present it returns after one dpkg query.
set -euo pipefail

PACKAGES=(
  # build
  bazel-bootstrap g++ clang libclang-rt-14-dev
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libabsl-dev
  prometheus-cpp-dev libsqlite3-dev libgtest-dev libgmock-dev libbenchmark-dev
  # compute
  libtorch-dev libgloo-dev libopenblas0-pthread
  # data, tests, benchmark peers
  dataset-fashion-mnist prometheus python3-torch python3-grpcio python3-protobuf
  python3-yaml
  # the emulated cluster (deploy/cluster-lab.sh), certificates (deploy/pki.sh)
  iproute2 openssl
  # the container image (deploy/image/build.sh, tests/test_image.py)
  podman debootstrap

)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
