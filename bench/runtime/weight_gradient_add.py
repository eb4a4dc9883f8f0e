#!/usr/bin/python3
"""A Linear's weight gradient added into a mini-batch's: autograd's way
against the split backward's (worker/stage_executor.cc, pass 2).

Autograd computes a micro-batch's weight gradient g^T x as a fresh product
(BLAS zeroes the output first) and the executor then adds it into the
earlier micro-batches' sum; the split backward's pass 2 computes it into
the sum itself (addmm_, beta = 1). Both give the same floats (checked
here as well). One core, interleaved rounds, medians; the ratio is what
to quote (this host's speed swings 2x within minutes).

  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/runtime/weight_gradient_add.py
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402


def timed(fn, reps):
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--shapes", default="2048x2048,2048x784",
                    help="out x in of the weights, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, OPENBLAS_NUM_THREADS="
          f"{os.environ['OPENBLAS_NUM_THREADS']}, {args.rounds} rounds x {args.reps}")
    print(f"{'weight':>10} {'rows':>5} {'mm+add_ ms':>11} {'addmm_ ms':>10} "
          f"{'ratio':>6} {'same':>5}")
    for shape in args.shapes.split(","):
        out_f, in_f = (int(v) for v in shape.split("x"))
        for rows in args.rows:
            g = torch.randn(rows, out_f)
            x = torch.randn(rows, in_f)
            acc = torch.randn(out_f, in_f)
            # The same floats: an earlier sum plus this micro-batch's product.
            same = torch.equal(acc.clone().add_(g.t().mm(x)),
                               acc.clone().addmm_(g.t(), x))
            separate, fused = [], []
            for _ in range(args.rounds):
                separate.append(timed(lambda: acc.add_(g.t().mm(x)), args.reps))
                fused.append(timed(lambda: acc.addmm_(g.t(), x), args.reps))
            a, b = statistics.median(separate), statistics.median(fused)
            print(f"{shape:>10} {rows:>5} {1e3 * a:>11.2f} {1e3 * b:>10.2f} "
                  f"{a / b:>6.2f} {str(same):>5}")


if __name__ == "__main__":
    main()
