"""Shared pieces of the PyTorch peers: the same networks, data, and
hyper-parameters as APapo's built-in `mlp` / `cnn` and the
worker/testdata specs (Debian's python3-torch, CPU only)."""

import gzip
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # worker/data.cc: training-set pixel mean / std
BATCH = 128
EVAL_BATCH = 1000


def pin_threads():
    """One compute thread: LibTorch's pool and OpenBLAS's own pool."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split):
    prefix = "train" if split == "train" else "t10k"
    x = _idx(os.path.join(FASHION_DIR, f"{prefix}-images-idx3-ubyte.gz"))
    y = _idx(os.path.join(FASHION_DIR, f"{prefix}-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - MEAN) / STD
    return x.unsqueeze(1).contiguous(), torch.from_numpy(y.astype(np.int64))


def mlp_layers():
    layers = [nn.Flatten()]
    width = 784
    for _ in range(4):
        layers += [nn.Linear(width, 2048), nn.ReLU()]
        width = 2048
    layers.append(nn.Linear(width, 10))
    return layers


def cnn_layers():
    # The PyTorch MNIST example network, as APapo's builtin `cnn`.
    return [nn.Conv2d(1, 32, 3, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128),
            nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10)]


def layers(model):
    return {"mlp": mlp_layers, "cnn": cnn_layers}[model]()


MLP_LR, MLP_WARMUP = 0.02, 100


def mlp_lr_factor(step, total_steps):
    """APapo's LearningRate (worker/optimizer.cc) over the base rate: linear
    warm-up, then cosine to 0 at the last of `total_steps` updates."""
    if step < MLP_WARMUP:
        return (step + 1) / MLP_WARMUP
    t = min(1.0, (step - MLP_WARMUP) / max(1, total_steps - MLP_WARMUP))
    return 0.5 * (1.0 + math.cos(math.pi * t))


def optimizer(model, params, total_steps):
    """worker/testdata specs: mlp SGD lr 0.02 momentum 0.9, 100 warm-up
    steps then cosine decay over the run's `total_steps`; cnn Adam lr 1e-3."""
    if model == "mlp":
        opt = torch.optim.SGD(params, lr=MLP_LR, momentum=0.9)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: mlp_lr_factor(step, total_steps))
        return opt, sched
    return torch.optim.Adam(params, lr=1e-3), None


def steps_for(n_train, epochs, max_steps):
    per_epoch = n_train // BATCH
    total = per_epoch * epochs
    return min(total, max_steps) if max_steps > 0 else total


def evaluate(forward, x, y):
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), EVAL_BATCH):
            out = forward(x[i:i + EVAL_BATCH])
            correct += int((out.argmax(1) == y[i:i + EVAL_BATCH]).sum())
    return correct / len(x)


class Timer:
    """samples/s over all training steps (as APapo's summary counts them:
    training time only, evaluation excluded) and over the steps after the
    warm-up."""

    def __init__(self, warmup):
        self.warmup = warmup
        self.t0 = None
        self.tw = None
        self.steps = 0

    def step_start(self):
        if self.t0 is None:
            self.t0 = time.perf_counter()

    def step_end(self):
        self.steps += 1
        if self.steps == self.warmup:
            self.tw = time.perf_counter()

    def result(self, samples_per_step):
        end = time.perf_counter()
        out = {"steps": self.steps,
               "samples_per_s": self.steps * samples_per_step / (end - self.t0),
               "train_s": end - self.t0}
        if self.tw is not None and self.steps > self.warmup:
            out["samples_per_s_after_warmup"] = (
                (self.steps - self.warmup) * samples_per_step / (end - self.tw))
        return out


def write(path, result):
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=2)
        os.replace(path + ".tmp", path)
    print(json.dumps(result))
