#!/usr/bin/env bash
# Builds APapo's container image with podman, from Debian's packages alone
# (no registry): localhost/apapo:VERSION, VERSION being deploy/image/VERSION
# (the tag deploy/kubernetes/apapo.yaml pins).
#
#   deploy/image/build.sh                    # Bazel-builds in the builder stage (~10 min cold, 2 cores)
#   deploy/image/build.sh --prebuilt bazel-bin   # copies binaries built here (tests/test_image.py)
#   deploy/image/build.sh --refresh          # no cached layers (today's security updates)
#   deploy/image/build.sh --no-datasets      # without Fashion-MNIST (30 MB)
#   deploy/image/build.sh --print-tag        # prints the tag and exits
#
# The base image is made once with `debootstrap --variant=minbase bookworm`
# under $APAPO_IMAGE_CACHE (default ~/.cache/apapo/image-base) and imported
# as localhost/debian-bookworm-minbase:DATE (the day it was made); delete
# that folder to make a fresh one. Builds run with --isolation=chroot (no
# OCI runtime needed). Needs root, podman and debootstrap.
# Env: APAPO_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VERSION=$(tr -d '[:space:]' < "$HERE/VERSION")
IMAGE="localhost/apapo:$VERSION"
CACHE=${APAPO_IMAGE_CACHE:-$HOME/.cache/apapo/image-base}
MIRROR=${APAPO_DEBIAN_MIRROR:-http://deb.debian.org/debian}

prebuilt=""
cache_flags=(--layers)
dataset_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt=${2:?--prebuilt needs a folder}; shift 2 ;;
    --prebuilt=*) prebuilt=${1#*=}; shift ;;
    --refresh) cache_flags=(--no-cache); shift ;;
    --no-datasets) dataset_flags=(--build-arg DATASETS=); shift ;;
    --print-tag) echo "$IMAGE"; exit 0 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then echo "build.sh: run as root (debootstrap, podman build --isolation=chroot)" >&2; exit 1; fi
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done

# --- the base: Debian 12 minbase, made once, imported once -----------------
if [ ! -f "$CACHE/made" ]; then
  echo "build.sh: debootstrap --variant=minbase bookworm into $CACHE (once)" >&2
  mkdir -p "$CACHE"
  rm -rf "$CACHE/rootfs" "$CACHE/rootfs.partial"
  nice -n 19 debootstrap --variant=minbase bookworm "$CACHE/rootfs.partial" "$MIRROR" >&2
  fs="$CACHE/rootfs.partial"
  # Security updates too, like any Debian 12 host.
  rm -f "$fs/etc/apt/sources.list"
  cat > "$fs/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR}-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  # What debootstrap leaves of this host and of its own run.
  rm -rf "$fs/var/cache/apt/archives/"*.deb "$fs/var/lib/apt/lists/"* "$fs/var/log/"*.log \
         "$fs/debootstrap"
  : > "$fs/etc/hostname"
  mv "$fs" "$CACHE/rootfs"
  date -u +%Y%m%d > "$CACHE/made"
fi
BASE="localhost/debian-bookworm-minbase:$(cat "$CACHE/made")"
if ! podman image exists "$BASE"; then
  echo "build.sh: importing $BASE" >&2
  tar -C "$CACHE/rootfs" --numeric-owner -c . \
    | podman import --message "debootstrap --variant=minbase bookworm" - "$BASE" >/dev/null
fi

# --- the build context: a temp folder, not the tree (no bazel-* links) -----
ctx=$(mktemp -d "${TMPDIR:-/tmp}/apapo-image-XXXXXX")
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/src" "$ctx/prebuilt"
cp "$HERE/Containerfile" "$ctx/"
if [ -n "$prebuilt" ]; then
  binaries=prebuilt
  for b in coordinator/apapo-coordinator worker/apapo-worker cli/apapoctl; do
    [ -f "$prebuilt/$b" ] || { echo "build.sh: $prebuilt/$b is missing: bazel build it first" >&2; exit 1; }
    install -m 0755 "$prebuilt/$b" "$ctx/prebuilt/"
  done
else
  binaries=builder
  # The working tree as git sees it (tracked and untracked, not ignored).
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
     | tar --null -T - --ignore-failed-read -c 2>/dev/null) | tar -C "$ctx/src" -x
fi

old=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
echo "build.sh: podman build $IMAGE (binaries: $binaries)" >&2
nice -n 19 podman build --isolation=chroot "${cache_flags[@]}" "${dataset_flags[@]}" --target=runtime \
  --build-arg BASE="$BASE" --build-arg BINARIES="$binaries" --build-arg VERSION="$VERSION" \
  --tag "$IMAGE" --file "$ctx/Containerfile" "$ctx" >&2
new=$(podman image inspect --format '{{.Id}}' "$IMAGE")
# The image this tag named before is now untagged: drop it (its cached
# layers stay while the new image uses them).
if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
podman image prune --force --filter label=io.apapo.image.stage=prebuilt >/dev/null 2>&1 || true
echo "$IMAGE"
