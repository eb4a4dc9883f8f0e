#!/usr/bin/python3
"""What overlapping a cut's transfers with the compute beside it would buy
(bench/cluster/README.md, 2026-12-07 20:47): the mlp's two stages around its
100 Mbit/s cut (stage 0: fc1, fc2; stage 1: fc3, fc4, fc5 and the loss),
one process per emulated host, PyTorch over Gloo, stage 0 keeping 2
mini-batches in flight (the async schedule's default depth, one update of
staleness), SGD updates on both.

--chunks=1 is the runtime's way: fc2's whole output crosses once computed,
and the gradients of it once stage 1 has them all. --chunks=K computes fc2
in K column parts and sends each as it is done; stage 1 takes each into
fc3's product as it arrives (a sum over fc3's input columns), and sends
the gradient of fc2's output in K column parts, which stage 0 takes into
fc2's weight and input gradients as they arrive. The same products and
bytes either way; only the order differs.

What crosses is --payload of each part's float32 bytes (default 0.535: the
nonzero values and the mask of a ReLU output, as the runtime sends them
with the zeros skipped); the receiver computes on a tensor of its own, so
the numbers are timing only, not training.

  /usr/bin/python3 bench/cluster/overlap_probe.py --links=unshaped,100mbit --chunks=1,4 --rounds=3

Runs as root after `bazel build //...` (it shapes the link with
bench/cluster/run.py's Link, so it brings up that bench's lab, prefix
"apb": not beside a run of it) and takes the lab down at the end, also on
failure. Prints samples/s per link and chunk count and each round's ratios;
writes nothing.
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = 29533


def cluster_bench():
    """bench/cluster/run.py (its lab, Link, on_host), loaded under its own
    name: it imports bench/runtime/run.py as `run`."""
    spec = importlib.util.spec_from_file_location("cluster_run", os.path.join(HERE, "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_pair(cluster, args, chunks):
    procs = []
    for rank in (0, 1):
        cmd = [*cluster.on_host(rank + 1), "taskset", "-c", str(rank),
               sys.executable, os.path.abspath(__file__), f"--rank={rank}", f"--chunks={chunks}",
               f"--steps={args.steps}", f"--warmup={args.warmup}", f"--payload={args.payload}"]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"a stage failed ({p.returncode}): {out}")
        outs.append(out)
    return float(outs[0].strip().split()[-1])


def stage(args):
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(args.rank)
    rank, k = args.rank, args.chunks
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    store = dist.TCPStore("198.18.0.1", PORT, 2, rank == 0,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    rows, width, lr = 128, 2048, 1e-4
    cols = width // k
    wire = max(1, int(args.payload * rows * cols))  # float32 values a part carries

    def linear(n_in, n_out):
        return torch.randn(n_out, n_in) / n_in ** 0.5, torch.zeros(n_out)

    # Stand-ins for what arrives (the payload's values are not used).
    arrived = torch.rand(rows, width) - 0.5

    def post_recvs(i, first_tag):
        bufs = [torch.empty(wire) for _ in range(k)]
        return bufs, [dist.irecv(b, 1 - rank, tag=2 * k * i + first_tag + c)
                      for c, b in enumerate(bufs)]

    if rank == 0:
        w1, b1 = linear(784, width)
        w2, b2 = linear(width, width)
        x = torch.randn(rows, 784)
        stash, sends, grads = {}, [], {}

        def forward(i):
            h1 = torch.relu(torch.addmm(b1, x, w1.t()))
            parts = []
            for c in range(k):
                s = slice(c * cols, (c + 1) * cols)
                y = torch.relu(torch.addmm(b2[s], h1, w2[s].t()))
                parts.append(y)
                sends.append(dist.isend(y.reshape(-1)[:wire].contiguous(), 1, tag=2 * k * i + c))
            stash[i] = (h1, parts)
            grads[i] = post_recvs(i, k)  # posted ahead: they land while stage 0 computes

        def backward(i):
            h1, parts = stash.pop(i)
            _, works = grads.pop(i)
            gw2 = torch.empty_like(w2)
            gh1 = torch.zeros(rows, width)
            for c in range(k):
                works[c].wait()
                s = slice(c * cols, (c + 1) * cols)
                g = arrived[:, s] * (parts[c] > 0)  # the received part, masked
                torch.mm(g.t(), h1, out=gw2[s])
                gh1.addmm_(g, w2[s])
            gh1 *= h1 > 0
            w2.sub_(gw2, alpha=lr)
            w1.sub_(gh1.t() @ x, alpha=lr)
            while sends and sends[0].is_completed():
                sends.pop(0)

        total = args.warmup + args.steps
        forward(0)
        forward(1)
        for i in range(total):
            if i == args.warmup:
                start = time.perf_counter()
            backward(i)
            if i + 2 < total:
                forward(i + 2)
        elapsed = time.perf_counter() - start
        for w in sends:
            w.wait()
        dist.barrier()
        print(f"samples/s {rows * args.steps / elapsed:.1f}")
    else:
        w3, b3 = linear(width, width)
        w4, b4 = linear(width, width)
        w5, b5 = linear(width, 10)
        labels = torch.randint(0, 10, (rows,))
        acts = {0: post_recvs(0, 0), 1: post_recvs(1, 0)}
        sends = []
        total = args.warmup + args.steps
        for i in range(total):
            _, works = acts.pop(i)
            if i + 2 < total:
                acts[i + 2] = post_recvs(i + 2, 0)
            y = torch.zeros(rows, width).add_(b3)
            ins = []
            for c in range(k):
                works[c].wait()
                s = slice(c * cols, (c + 1) * cols)
                part = arrived[:, s].relu()  # the received part
                ins.append(part)
                y.addmm_(part, w3[:, s].t())
            ws = [w4.requires_grad_(), w5.requires_grad_()]
            pre3 = y.requires_grad_()
            h3 = torch.relu(pre3)
            h4 = torch.relu(torch.addmm(b4, h3, w4.t()))
            loss = torch.nn.functional.cross_entropy(torch.addmm(b5, h4, w5.t()), labels)
            g3, g4, g5 = torch.autograd.grad(loss, [pre3, w4, w5])
            # The gradient of fc2's output, part by part, sent as computed;
            # fc3's weight gradient after the sends.
            for c in range(k):
                s = slice(c * cols, (c + 1) * cols)
                gx = g3 @ w3[:, s]
                sends.append(dist.isend(gx.reshape(-1)[:wire].contiguous(), 0,
                                        tag=2 * k * i + k + c))
            with torch.no_grad():
                gw3 = torch.cat([g3.t() @ p for p in ins], dim=1)
                w3.sub_(gw3, alpha=lr)
                for w, g in zip(ws, (g4, g5)):
                    w.requires_grad_(False)
                    w.sub_(g, alpha=lr)
            while sends and sends[0].is_completed():
                sends.pop(0)
        for w in sends:
            w.wait()
        dist.barrier()
        print("samples/s 0")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--links", default="unshaped,100mbit")
    ap.add_argument("--chunks", default="1,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--payload", type=float, default=0.535)
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank >= 0:
        args.chunks = int(args.chunks)
        return stage(args)
    cluster = cluster_bench()
    reason = cluster.unavailable()
    if reason:
        print(f"overlap_probe: cannot run here: {reason}", file=sys.stderr)
        return 3
    links = args.links.split(",")
    chunk_counts = [int(c) for c in args.chunks.split(",")]
    lab = ["bash", cluster.LAB]
    subprocess.run([*lab, "up", "--hosts=2", "--racks=1", "--rack-rate=10gbit",
                    f"--prefix={cluster.PREFIX}"], check=True, stdout=subprocess.DEVNULL)
    link = cluster.Link(f"/proc/{os.getpid()}/ns/net")
    results = {}
    try:
        for r in range(args.rounds):
            order = [(l, c) for l in links for c in chunk_counts]
            if r % 2:
                order.reverse()
            for rate, c in order:
                link.set(rate)
                sps = run_pair(cluster, args, c)
                results.setdefault((rate, c), []).append(sps)
                print(f"round {r + 1} {rate:9s} chunks {c}: {sps:8.1f} samples/s", flush=True)
    finally:
        subprocess.run([*lab, "down", f"--prefix={cluster.PREFIX}"], stdout=subprocess.DEVNULL)
    base = (links[0], chunk_counts[0])
    for key, vals in results.items():
        ratios = [v / b for v, b in zip(vals, results[base])]
        print(f"{key[0]:9s} chunks {key[1]}: " + ", ".join(f"{v:.0f}" for v in vals) +
              f"  x {base[0]} chunks {base[1]}: " + ", ".join(f"{x:.2f}" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
