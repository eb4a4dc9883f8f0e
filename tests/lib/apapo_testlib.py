"""Helpers for APapo's multi-process tests: start real binaries on free
loopback ports and wait on conditions with deadlines (never sleeps)."""

import os
import re
import select
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "bazel-bin")
# Generated Python stubs (proto.apapo.v1.*, tests.proto.*) live under bazel-bin.
if BIN not in sys.path:
    sys.path.insert(0, BIN)


def binary(package, name):
    path = os.path.join(BIN, package, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is not built: run `bazel build //...`")
    return path


class Process:
    """A child process whose stdout lines can be awaited with a deadline."""

    def __init__(self, argv, env=None):
        self.argv = argv
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            text=True, bufsize=1)
        self.lines = []

    def wait_for_line(self, pattern, timeout=60):
        """Returns the first match of `pattern` in the output, reading lines
        as they come; fails at the deadline or if the process exits."""
        regex = re.compile(pattern)
        for line in self.lines:
            m = regex.search(line)
            if m:
                return m
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self.argv[0]}: no line matching {pattern!r} within {timeout}s; "
                    f"output so far:\n" + "".join(self.lines[-30:]))
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(
                    f"{self.argv[0]} exited ({self.proc.wait()}) before printing "
                    f"{pattern!r}; output:\n" + "".join(self.lines[-30:]))
            self.lines.append(line)
            m = regex.search(line)
            if m:
                return m

    def output(self):
        return "".join(self.lines)

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rest = self.proc.stdout.read()
        if rest:
            self.lines.append(rest)
        self.proc.stdout.close()
        return self.proc.returncode


def start_coordinator(state_path, extra=()):
    """Starts apapo-coordinator on a free port; returns (process, port)."""
    p = Process([binary("coordinator", "apapo-coordinator"), "--host=127.0.0.1",
                 "--port=0", f"--state={state_path}", *extra])
    m = p.wait_for_line(r"listening on port (\d+)")
    return p, int(m.group(1))


def temp_dir(prefix):
    base = os.environ.get("TEST_TMPDIR")
    return tempfile.mkdtemp(prefix=prefix, dir=base)
