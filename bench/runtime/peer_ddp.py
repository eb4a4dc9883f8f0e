"""Peer: PyTorch DistributedDataParallel over Gloo, one process per core.

Launched once per rank by run.py (each under `taskset -c RANK`):
  RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P \
    python3 peer_ddp.py --model=mlp --max_steps=320 --summary=out.json
Global batch 128 (64 per rank), the same network, optimizer and data as
APapo's spec; rank 0 evaluates on the test set at the end and writes the
summary. transformer_lm takes everything from the spec the run trains:
  ... peer_ddp.py --model=transformer_lm --spec=lm.textproto --max_steps=80
(global batch = the spec's batch_size, split over the ranks)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

pc.pin_threads()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max_steps", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--no_eval", action="store_true")
    ap.add_argument("--spec", default="", help="JobSpec textproto (transformer_lm)")
    ap.add_argument("--summary", default="")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    task = pc.Task(a.model, a.spec)
    torch.manual_seed(1)
    net = nn.Sequential(*task.layers())
    ddp = nn.parallel.DistributedDataParallel(net)
    x, y = task.train_data()
    total = task.steps(len(x), a.epochs, a.max_steps)
    opt, sched = task.optimizer(ddp.parameters(), total)
    per_epoch = len(x) // task.batch
    local = task.batch // world
    timer = pc.Timer(a.warmup)
    g = torch.Generator().manual_seed(1)
    step = 0
    losses = []  # this rank's; averaged over the ranks after training
    net.train()
    while step < total:
        order = torch.randperm(len(x), generator=g)
        for b in range(per_epoch):
            if step >= total:
                break
            timer.step_start()
            idx = order[b * task.batch + rank * local:b * task.batch + (rank + 1) * local]
            opt.zero_grad()
            loss = pc.loss_fn(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
            if sched:
                sched.step()
            timer.step_end()
            losses.append(loss.item())
            step += 1
    res = timer.result(task.batch)  # samples of the global batch per step
    res.update(peer="ddp_gloo", model=a.model, world=world,
               final_loss=float(loss), parameters=pc.parameter_count(net))
    # The global batch's loss per step: the mean of the ranks' (equal shares).
    mean = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean)
    res.update(pc.loss_stats((mean / world).tolist()))
    dist.barrier()
    if rank == 0:
        if not a.no_eval:
            net.eval()
            tx, ty = task.test_data()
            res["final_test_accuracy"] = pc.evaluate(net, tx, ty, task.eval_batch)
        pc.write(a.summary, res)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
