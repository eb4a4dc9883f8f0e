#!/usr/bin/python3
"""Per-thread CPU and voluntary context switches of a coordinator under a fleet.

Starts COORDINATOR (--port=0, no metrics, in-memory state, 1 s heartbeats),
runs bazel-bin/bench/fleet/fleet_bench against it (no job), waits --settle
seconds for the fleet to register and heartbeat, then samples
/proc/PID/task/*/{stat,status} over --window seconds and prints, per thread
that ran, its CPU (% of one core) and voluntary switches, and the totals per
heartbeat. With --perf, also `perf stat` of the switches and the
epoll_wait/recvmsg/sendmsg/futex syscalls over the same window (the
tracepoints add CPU: read the CPU figures of a run without it).

  bench/fleet/experiments/thread_switches.py /tmp/base/apapo-coordinator
  bench/fleet/experiments/thread_switches.py bazel-bin/coordinator/apapo-coordinator --perf

Standard library only; every process it starts is killed on exit.
"""

import argparse
import os
import re
import resource
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
FLEET_BENCH = os.path.join(ROOT, "bazel-bin/bench/fleet/fleet_bench")
HZ = os.sysconf("SC_CLK_TCK")


def raise_nofile():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def snapshot(pid):
    """{tid: (name, cpu ticks, voluntary switches)} of every thread of pid."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except FileNotFoundError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        switches = int(re.search(r"voluntary_ctxt_switches:\s+(\d+)",
                                 status).group(1))
        threads[tid] = (name, ticks, switches)
    return threads


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("coordinator")
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--workers_per_channel", type=int, default=1)
    parser.add_argument("--settle", type=float, default=8)
    parser.add_argument("--window", type=float, default=10)
    parser.add_argument("--perf", action="store_true")
    args = parser.parse_args()

    children = []
    try:
        coord = subprocess.Popen(
            [args.coordinator, "--port=0", "--metrics_port=-1",
             "--heartbeat_interval=1s", "--state=:memory:"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            preexec_fn=raise_nofile, start_new_session=True)
        children.append(coord)
        port = None
        for line in coord.stdout:
            m = re.search(r"listening on port (\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            sys.exit("thread_switches.py: the coordinator did not serve")
        bench = subprocess.Popen(
            [FLEET_BENCH, f"--target=127.0.0.1:{port}",
             f"--coordinator_pid={coord.pid}", f"--workers={args.workers}",
             "--job_workers=0",
             f"--workers_per_channel={args.workers_per_channel}",
             f"--window={int(args.settle + args.window + 30)}s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=raise_nofile, start_new_session=True)
        children.append(bench)
        time.sleep(args.settle)  # registration, first heartbeats

        perf = None
        if args.perf:
            events = ["context-switches"] + [
                "syscalls:sys_enter_" + s
                for s in ("epoll_wait", "recvmsg", "sendmsg", "futex")]
            perf = subprocess.Popen(
                ["perf", "stat", "-e", ",".join(events), "-p", str(coord.pid),
                 "--", "sleep", str(args.window)],
                stderr=subprocess.PIPE, text=True)
            children.append(perf)
        before, t0 = snapshot(coord.pid), time.time()
        time.sleep(args.window)
        after, t1 = snapshot(coord.pid), time.time()
        heartbeats = args.workers * (t1 - t0)  # 1 Hz each

        with open("/proc/loadavg") as f:
            print("load average", " ".join(f.read().split()[:3]))
        total_ticks = total_switches = 0
        for tid in sorted(after, key=int):
            if tid not in before:
                continue
            name, ticks, switches = after[tid]
            ticks -= before[tid][1]
            switches -= before[tid][2]
            total_ticks += ticks
            total_switches += switches
            if ticks or switches > 5 * args.window:
                print(f"  {tid:>8} {name:<16} CPU {100.0 * ticks / HZ / (t1 - t0):5.1f}%"
                      f"  voluntary switches {switches}")
        print(f"total: CPU {100.0 * total_ticks / HZ / (t1 - t0):.1f}% of one core, "
              f"{total_switches / heartbeats:.2f} voluntary switches per heartbeat")
        if perf is not None:
            out = perf.communicate()[1]
            for line in out.splitlines():
                m = re.match(r"\s*([\d,]+)\s+(\S+)", line)
                if m and ("sys_enter" in m.group(2) or "switches" in m.group(2)):
                    n = int(m.group(1).replace(",", ""))
                    print(f"  {m.group(2):<32} {n / heartbeats:.2f} per heartbeat")
    finally:
        for p in reversed(children):
            if p.poll() is None:
                p.kill()  # perf stops its counting, the others their work
                p.wait()

if __name__ == "__main__":
    main()
