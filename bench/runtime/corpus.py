"""The transformer_lm benchmark's text corpus, built where it runs: no
download, only files Debian's python3-torch installs on every machine that
ran deploy/install-deps.sh (its Python sources). The same package version
gives the same bytes: files in sorted order of their path under SOURCE,
concatenated, cut at MAX_BYTES.

  python3 bench/runtime/corpus.py DIR     # writes DIR/torch-py.txt, prints its sha256
"""

import hashlib
import os
import subprocess
import sys

SOURCE = "/usr/lib/python3/dist-packages/torch"
NAME = "torch-py.txt"
MAX_BYTES = 4 << 20


def source_files(root=SOURCE):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        out += [os.path.join(d, f) for f in files if f.endswith(".py")]
    return sorted(out, key=lambda p: os.path.relpath(p, root))


def build(directory, max_bytes=MAX_BYTES):
    """Writes directory/torch-py.txt (unless it is there with the same
    bytes) and returns {path, bytes, sha256, files, source, package}."""
    data = bytearray()
    used = 0
    for path in source_files():
        if len(data) >= max_bytes:
            break
        with open(path, "rb") as f:
            data += f.read()
        used += 1
    data = bytes(data[:max_bytes])
    if len(data) < max_bytes:
        raise RuntimeError(f"{SOURCE}: only {len(data)} bytes of Python sources "
                           f"(python3-torch missing?), need {max_bytes}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, NAME)
    try:
        with open(path, "rb") as f:
            same = f.read() == data
    except OSError:
        same = False
    if not same:
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3-torch"],
                             capture_output=True, text=True).stdout.strip()
    return {"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "files": used, "source": SOURCE, "package": f"python3-torch {version}"}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build(sys.argv[1]))
