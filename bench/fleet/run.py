#!/usr/bin/python3
"""Runs the fleet benchmark against a real apapo-coordinator.

Builds the coordinator and fleet_bench, then for each fleet size starts a
fresh coordinator (free port, in-memory state, --heartbeat_interval=1s),
runs fleet_bench against it, and stops it. Writes every figure to
bench/fleet/results/<timestamp>.json and prints a table. Every process it
starts is killed on exit, failures and Ctrl-C included.

  bench/fleet/run.py                      # 1,000 workers + a 64-worker job,
                                          # then 10,000 workers
  bench/fleet/run.py --sizes=1000:64      # WORKERS:JOB_WORKERS, comma-separated
  bench/fleet/run.py --skip-build --window=20

Standard library only. See bench/fleet/README.md for what each figure means.
"""

import argparse
import datetime
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COORDINATOR = os.path.join(ROOT, "bazel-bin/coordinator/apapo-coordinator")
FLEET_BENCH = os.path.join(ROOT, "bazel-bin/bench/fleet/fleet_bench")
RESULTS = os.path.join(ROOT, "bench/fleet/results")

# Processes started by this script (Popen), killed by cleanup().
_children = []


def raise_nofile():
    """In the child, before exec: as many open files as the hard limit allows."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start(argv, **kwargs):
    # A session of its own, so that its whole group can be signalled.
    p = subprocess.Popen(argv, preexec_fn=raise_nofile, start_new_session=True,
                         **kwargs)
    _children.append(p)
    return p


def stop(p, grace=10.0):
    """SIGTERM to the child's group, SIGKILL after `grace` seconds."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    if p in _children:
        _children.remove(p)


def cleanup():
    for p in list(_children):
        stop(p, grace=5.0)


def on_signal(signum, _frame):
    # Unwinds through the finally blocks, which stop the children.
    raise SystemExit(128 + signum)


def build(bazel):
    argv = [bazel, "build", "--jobs=2", "//coordinator:apapo-coordinator",
            "//bench/fleet:fleet_bench"]
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, cwd=ROOT, check=True)


def start_coordinator(log_path, timeout, binary=COORDINATOR, flags=()):
    """Starts a coordinator on free ports; returns (process, grpc port)."""
    log = open(log_path, "wb")
    p = start([binary, "--host=127.0.0.1", "--port=0", "--metrics_port=0",
               "--heartbeat_interval=1s", "--state=:memory:"] + list(flags),
              stdout=subprocess.PIPE, stderr=log, cwd=ROOT)
    log.close()  # the child holds its own descriptor
    # The port is in the first line ("apapo-coordinator listening on port N").
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    line = b""
    while b"\n" not in line:
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(timeout=left):
            raise RuntimeError("coordinator did not report its port in %.0f s "
                               "(log: %s)" % (timeout, log_path))
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            raise RuntimeError("coordinator exited with %s before serving (log: %s)"
                               % (p.wait(), log_path))
        line += chunk
    sel.close()
    first = line.split(b"\n")[0].decode()
    if "listening on port" not in first:
        raise RuntimeError("unexpected coordinator output: %r" % first)
    return p, int(first.split("listening on port")[1].split()[0])


def run_size(name, workers, job_workers, per_channel, args, log_dir,
             binary=COORDINATOR, flags=()):
    log_path = os.path.join(log_dir, "coordinator-%s.log" % name.replace(" ", "-"))
    coordinator, port = start_coordinator(log_path, timeout=60, binary=binary,
                                          flags=flags)
    try:
        argv = [FLEET_BENCH, "--target=127.0.0.1:%d" % port,
                "--coordinator_pid=%d" % coordinator.pid,
                "--workers=%d" % workers, "--job_workers=%d" % job_workers,
                "--workers_per_channel=%d" % per_channel,
                "--window=%ds" % args.window]
        print("\n+", " ".join(argv), flush=True)
        bench = start(argv, stdout=subprocess.PIPE, cwd=ROOT)
        try:
            out, _ = bench.communicate(timeout=args.timeout)
        finally:
            stop(bench)
        out = out.decode()
        lines = out.rstrip("\n").split("\n")
        result = None
        if lines and lines[-1].startswith("{"):
            result = json.loads(lines[-1])
            lines = lines[:-1]
        print("\n".join(lines), flush=True)
        alive = coordinator.poll() is None
        return {"name": name, "argv": argv, "coordinator_flags": list(flags),
                "exit_code": bench.returncode,
                "coordinator_survived": alive, "coordinator_log": log_path,
                "result": result}
    finally:
        stop(coordinator)


def git(*argv):
    try:
        return subprocess.run(["git"] + list(argv), cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


# (json key, column title, format) of the summary table.
SUMMARY = [
    ("registered", "registered", "%d"),
    ("register_all_s", "register all (s)", "%.2f"),
    ("register_p99_ms", "register p99 (ms)", "%.0f"),
    ("window_coordinator_cpu_percent", "coord CPU (% core)", "%.1f"),
    ("coordinator_cpu_s_per_1000_heartbeats", "CPU-s / 1k hb", "%.4f"),
    ("lost_workers", "lost (window)", "%d"),
    ("lost_workers_end", "lost (end)", "%d"),
    ("list_first_page_ms", "List page (ms)", "%.1f"),
    ("list_all_pages_ms", "List all (ms)", "%.1f"),
    ("submit_to_profiled_s", "submit->profiled (s)", "%.3f"),
    ("profiled_to_assigned_s", "->assigned (s)", "%.3f"),
    ("assigned_to_started_s", "->started (s)", "%.3f"),
    ("job_state", "job", "%s"),
    ("max_timer_lateness_ms", "sim lateness (ms)", "%.0f"),
]


def summary(runs):
    names = [r["name"] for r in runs]
    width = max(len(t) for _, t, _ in SUMMARY)
    cell = max([14] + [len(n) for n in names])
    out = ["%-*s  %s" % (width, "", "  ".join("%*s" % (cell, n) for n in names))]
    for key, title, fmt in SUMMARY:
        cells = []
        for r in runs:
            v = (r["result"] or {}).get(key)
            if isinstance(v, str):
                v = v.replace("JOB_STATE_", "")
            if v is None or v == "" or (isinstance(v, (int, float)) and v < 0):
                cells.append("%*s" % (cell, "-"))
            else:
                cells.append("%*s" % (cell, fmt % v))
        out.append("%-*s  %s" % (width, title, "  ".join(cells)))
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000:64:1,10000:0:1",
                        help="WORKERS:JOB_WORKERS[:WORKERS_PER_CONNECTION], "
                        "comma-separated (1 per connection, as real daemons "
                        "connect, is the default)")
    parser.add_argument("--baseline_coordinator", default="",
                        help="an apapo-coordinator binary of an older build: "
                        "each size also runs against it, right after ours")
    parser.add_argument("--baseline_max_workers", type=int, default=1000,
                        help="sizes above this skip the baseline and the "
                        "unpaced and unslotted runs")
    parser.add_argument("--compare_unpaced", action="store_true",
                        help="each size also runs against the same coordinator "
                        "with --pace_idle_reads=false, right after ours")
    parser.add_argument("--compare_unslotted", action="store_true",
                        help="each size also runs against the same coordinator "
                        "with --heartbeat_slots=0 (every worker heartbeats "
                        "from its own registration), right after ours")
    parser.add_argument("--compare", action="append", default=[],
                        metavar="FLAGS",
                        help="each size also runs against the same coordinator "
                        "with these flags (space-separated), named by them; "
                        "repeatable")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat every size (and its comparisons) this "
                        "many times, interleaved")
    parser.add_argument("--window", type=int, default=10,
                        help="heartbeat window, seconds")
    parser.add_argument("--timeout", type=float, default=900,
                        help="limit of one fleet_bench run, seconds")
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--bazel", default="bazel")
    args = parser.parse_args()
    sizes = []
    for part in args.sizes.split(","):
        fields = part.split(":")
        sizes.append((int(fields[0]), int(fields[1]) if len(fields) > 1 else 0,
                      int(fields[2]) if len(fields) > 2 else 1))

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = os.path.join(RESULTS, "logs-" + stamp)
    report = {
        "timestamp": stamp,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "heartbeat_interval_s": 1.0,
        "runs": [],
    }
    status = 0
    try:
        if not args.skip_build:
            build(args.bazel)
        os.makedirs(log_dir, exist_ok=True)
        for workers, job_workers, per_channel in sizes:
            for r in range(args.rounds):
                name = "%d" % workers + ("+job%d" % job_workers if job_workers else "")
                if per_channel != 1:
                    name += "x%dpc" % per_channel
                if args.rounds > 1:
                    name += " r%d" % (r + 1)
                run = run_size(name, workers, job_workers, per_channel, args, log_dir)
                report["runs"].append(run)
                if run["exit_code"] != 0 or not run["coordinator_survived"]:
                    status = 1
                if workers > args.baseline_max_workers:
                    continue
                # (suffix, binary, flags, judged): an older build is
                # measured, not judged: its failures do not fail this run.
                others = []
                if args.compare_unpaced:
                    others.append((" unpaced", COORDINATOR,
                                   ["--pace_idle_reads=false"], True))
                if args.compare_unslotted:
                    others.append((" unslotted", COORDINATOR,
                                   ["--heartbeat_slots=0"], True))
                for flags in args.compare:
                    others.append((" " + flags, COORDINATOR, flags.split(), True))
                if args.baseline_coordinator:
                    others.append((" before", args.baseline_coordinator, [], False))
                for suffix, binary, flags, judged in others:
                    run = run_size(name + suffix, workers, job_workers,
                                   per_channel, args, log_dir, binary=binary,
                                   flags=flags)
                    report["runs"].append(run)
                    if judged and (run["exit_code"] != 0 or
                                   not run["coordinator_survived"]):
                        status = 1
    except subprocess.CalledProcessError as e:
        print("run.py: %s failed with %d" % (e.cmd, e.returncode), file=sys.stderr)
        status = 1
    except subprocess.TimeoutExpired as e:
        print("run.py: %s ran past %.0f s" % (e.cmd, e.timeout), file=sys.stderr)
        status = 1
    except RuntimeError as e:
        print("run.py: %s" % e, file=sys.stderr)
        status = 1
    finally:
        cleanup()
    if report["runs"]:
        os.makedirs(RESULTS, exist_ok=True)
        path = os.path.join(RESULTS, stamp + ".json")
        with open(path, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
            f.write("\n")
        print("\n" + summary(report["runs"]))
        print("\nwrote %s" % os.path.relpath(path, ROOT))
    return status


if __name__ == "__main__":
    sys.exit(main())
