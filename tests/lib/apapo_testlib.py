"""Helpers for APapo's multi-process tests: start real binaries on free
loopback ports and wait on conditions with deadlines (never sleeps)."""

import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "bazel-bin")
# Generated Python stubs (proto.apapo.v1.*, tests.proto.*) live under bazel-bin.
if BIN not in sys.path:
    sys.path.insert(0, BIN)


# A short job for multi-process tests: the 784-64-10 MLP on Debian's
# Fashion-MNIST, async pipeline, a few hundred steps.
SHORT_JOB = """
name: "%(name)s"
model { builtin { name: "mlp" hyper_parameters { key: "hidden" value { i: 64 } }
                  hyper_parameters { key: "layers" value { i: 2 } } } }
data { fashion_mnist {} batch_size: 64 }
optimizer { sgd { momentum: 0.9 } learning_rate: 0.05 }
schedule { kind: SCHEDULE_KIND_ASYNC micro_batches: 4 }
resources { workers: %(workers)d threads_per_worker: 1 }
limits { max_steps: %(steps)d }
seed: 3
"""


def short_job(name="e2e-short", steps=300, workers=2):
    """SHORT_JOB as text (a spec file's contents)."""
    return SHORT_JOB % {"name": name, "steps": steps, "workers": workers}


def binary(package, name):
    path = os.path.join(BIN, package, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is not built: run `bazel build //...`")
    return path


class Process:
    """A child process whose output lines can be awaited with a deadline.
    A reader thread collects stdout+stderr lines and signals a condition."""

    def __init__(self, argv, env=None):
        import threading
        self.argv = argv
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            text=True, bufsize=1)
        self.lines = []
        self.eof = False
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_for_line(self, pattern, timeout=60):
        """Returns the first match of `pattern` in the output so far or to
        come; fails at the deadline or when the process ends first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    m = regex.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                if self.eof:
                    raise RuntimeError(
                        f"{self.argv[0]} exited ({self.proc.wait()}) before printing "
                        f"{pattern!r}; output:\n" + "".join(self.lines[-30:]))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{self.argv[0]}: no line matching {pattern!r} within "
                        f"{timeout}s; output so far:\n" + "".join(self.lines[-30:]))
                self.cond.wait(left)

    def output(self):
        with self.cond:
            return "".join(self.lines)

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout)
        self.proc.stdout.close()
        return self.proc.returncode


def start_coordinator(state_path, extra=()):
    """Starts apapo-coordinator on free ports; returns (process, port)."""
    p = Process([binary("coordinator", "apapo-coordinator"), "--host=127.0.0.1",
                 "--port=0", "--metrics_port=0", f"--state={state_path}", *extra])
    m = p.wait_for_line(r"listening on port (\d+)")
    return p, int(m.group(1))


def temp_dir(prefix):
    base = os.environ.get("TEST_TMPDIR")
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def free_port():
    """A port free at this moment (for servers that cannot bind port 0 and
    report it, like the prometheus binary)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(coordinator_port, worker_id, extra=(), prefix=()):
    """Starts an apapo-worker daemon (under `prefix`, e.g. a taskset) and
    waits until it has registered."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    p = Process([*prefix, binary("worker", "apapo-worker"),
                 f"--coordinator=127.0.0.1:{coordinator_port}", f"--id={worker_id}",
                 "--threads=1", *extra], env=env)
    p.wait_for_line(rf"registered as {re.escape(worker_id)}")
    return p


def wait_until(predicate, timeout, what, interval=0.1):
    """Re-evaluates `predicate` until it returns a truthy value or the
    deadline passes (for conditions only observable by polling an API)."""
    import threading
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(interval)


def child_processes(parent_pids, flag):
    """Processes whose parent is one of `parent_pids` and whose command line
    has `flag` (a daemon's children: --run_assignment, --run_profile)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if flag in cmdline and ppid in parent_pids:
            found.append(int(entry))
    return found
