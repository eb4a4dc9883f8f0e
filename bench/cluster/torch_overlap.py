#!/usr/bin/python3
"""Does starting a data-parallel all-reduce during the backward pay on
this host? PyTorch alone, no APapo: two processes on loopback (Gloo), each
pinned to one core, train the cnn's layers (bench/cluster's cnn shape, 32
rows a step) and all-reduce the gradients either once after the backward
(`after`) or one all-reduce per layer started from the gradient hooks as
each layer's gradients are ready (`hooks`, as DDP's buckets and APapo's
parts do). Prints the median backward, the wait after it and their sum per
step for each, interleaved over --rounds.

  /usr/bin/python3 bench/cluster/torch_overlap.py --rounds=2

On loopback the all-reduce is the cores' own work: the hooks move it into
the backward, where it costs the compute about as much as it saves
(bench/cluster/README.md, 2026-12-07 07:42-07:51).
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time


def worker(rank, port, mode, steps):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10))
    x = torch.randn(32, 3, 32, 32)
    y = torch.randint(0, 10, (32,))
    works = []
    ready = {}
    layers = [m for m in net if list(m.parameters())]

    def hook_for(layer, i, count):
        def hook(grad):
            got = ready.setdefault(layer, {})
            got[i] = grad
            if mode == "hooks" and len(got) == count:
                flat = torch.cat([got[j].reshape(-1) for j in range(count)])
                works.append(dist.all_reduce(flat, async_op=True))
            return grad
        return hook

    for layer in layers:
        params = list(layer.parameters())
        for i, p in enumerate(params):
            p.register_hook(hook_for(layer, i, len(params)))
    rows = []
    for step in range(steps + 10):
        works.clear()
        ready.clear()
        net.zero_grad(set_to_none=True)
        dist.barrier()
        loss = nn.functional.cross_entropy(net(x), y)
        start = time.perf_counter()
        loss.backward()
        backward = time.perf_counter() - start
        if mode == "after":
            flat = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
            dist.all_reduce(flat)
        for w in works:
            w.wait()
        total = time.perf_counter() - start
        if step >= 10:
            rows.append((backward, total - backward))
    dist.destroy_process_group()
    b = statistics.median(r[0] for r in rows) * 1e3
    w = statistics.median(r[1] for r in rows) * 1e3
    print(f"{mode} rank {rank}: backward {b:.1f} ms, wait {w:.1f} ms, sum {b + w:.1f} ms",
          flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(int(a.worker[0]), int(a.worker[1]), a.worker[2], a.steps)
        return 0
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    for r in range(a.rounds):
        for mode in (("after", "hooks") if r % 2 == 0 else ("hooks", "after")):
            port = str(free_port())
            procs = [subprocess.Popen([sys.executable, __file__, "--steps", str(a.steps),
                                       "--worker", str(rank), port, mode], env=env)
                     for rank in range(2)]
            try:
                codes = [p.wait(timeout=300) for p in procs]
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            if any(codes):
                print(f"{mode}: a process failed ({codes})", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
