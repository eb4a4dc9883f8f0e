"""Peer: torch.distributed.pipeline.sync.Pipe (GPipe) with 2 stages on CPU.

Pipe needs the RPC framework initialised (world of one). On CPU both
partitions live on the same device, and Pipe keeps ONE worker thread per
device, so the two stages do not run concurrently: the process owns both
cores (run.py starts it under `taskset -c 0,1`) but computes with 1
LibTorch/OpenBLAS thread, i.e. 2 threads in total (the main thread and
Pipe's CPU worker thread).
  python3 peer_pipe.py --model=mlp --max_steps=320 --summary=out.json
Micro-batches (chunks) = 4, like APapo's specs; the split point is chosen
to balance the multiply-adds (mlp: after fc2+ReLU, 5.8M | 8.4M;
cnn: after conv2+ReLU, the best contiguous cut; transformer_lm: after
half the blocks, the embedding on one side and ln_f + head on the other;
its settings come from --spec, as in peer_ddp.py)."""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

pc.pin_threads()
import torch  # noqa: E402
import torch.distributed.rpc as rpc  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.pipeline.sync import Pipe  # noqa: E402

# Index of the first layer of stage 2 in pc.layers(model).
SPLIT = {"mlp": 5, "cnn": 4}


def split_at(task):
    if task.model == "transformer_lm":
        return 1 + task.hp["layers"] // 2  # after the embedding and half the blocks
    return SPLIT[task.model]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max_steps", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--no_eval", action="store_true")
    ap.add_argument("--spec", default="", help="JobSpec textproto (transformer_lm)")
    ap.add_argument("--summary", default="")
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    init = "file://" + tempfile.mktemp(prefix="peer-pipe-rpc-")
    rpc.init_rpc("worker", rank=0, world_size=1,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                     init_method=init, num_worker_threads=2))
    task = pc.Task(a.model, a.spec)
    torch.manual_seed(1)
    ls = task.layers()
    k = split_at(task)
    model = Pipe(nn.Sequential(nn.Sequential(*ls[:k]), nn.Sequential(*ls[k:])),
                 chunks=a.chunks, checkpoint="never")
    x, y = task.train_data()
    total = task.steps(len(x), a.epochs, a.max_steps)
    opt, sched = task.optimizer(model.parameters(), total)
    per_epoch = len(x) // task.batch
    timer = pc.Timer(a.warmup)
    g = torch.Generator().manual_seed(1)
    step = 0
    losses = []
    model.train()
    while step < total:
        order = torch.randperm(len(x), generator=g)
        for b in range(per_epoch):
            if step >= total:
                break
            timer.step_start()
            idx = order[b * task.batch:(b + 1) * task.batch]
            opt.zero_grad()
            out = model(x[idx]).local_value()
            loss = pc.loss_fn(out, y[idx])
            loss.backward()
            opt.step()
            if sched:
                sched.step()
            timer.step_end()
            losses.append(loss.item())
            step += 1
    res = timer.result(task.batch)
    res.update(peer="pipe", model=a.model, chunks=a.chunks, final_loss=float(loss),
               parameters=pc.parameter_count(model))
    res.update(pc.loss_stats(losses))
    if not a.no_eval:
        model.eval()
        tx, ty = task.test_data()
        res["final_test_accuracy"] = pc.evaluate(
            lambda t: model(t).local_value(), tx, ty, task.eval_batch)
    pc.write(a.summary, res)
    rpc.shutdown()


if __name__ == "__main__":
    main()
