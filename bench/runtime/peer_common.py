"""Shared pieces of the PyTorch peers: the same networks, data, and
hyper-parameters as APapo's built-in `mlp` / `cnn` / `transformer_lm` and
the worker/testdata specs (Debian's python3-torch, CPU only). The mlp and
cnn settings are written out here; the transformer_lm ones are read from
the job spec the run trains (`Task`'s `spec_path`), so they cannot drift."""

import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

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


class Embedding(nn.Module):
    """LAYER_KIND_EMBEDDING with max_positions (worker/model_builder.cc):
    token embedding plus a learned position table, both initialised
    U(-0.02 sqrt 3, 0.02 sqrt 3) (worker/layer_kinds.cc)."""

    def __init__(self, vocab, d, positions):
        super().__init__()
        bound = 0.02 * math.sqrt(3.0)
        self.weight = nn.Parameter(torch.empty(vocab, d).uniform_(-bound, bound))
        self.position = nn.Parameter(torch.empty(positions, d).uniform_(-bound, bound))

    def forward(self, x):
        return F.embedding(x, self.weight) + self.position[:x.size(1)]


class TransformerBlock(nn.Module):
    """LAYER_KIND_TRANSFORMER_BLOCK (worker/model_builder.cc): pre-norm GPT
    block, x + proj(causal attention(ln1(x))); x + fc2(gelu(fc1(ln2(x)))),
    exact GELU, no dropout (the built-in graph sets none); Linear layers
    with PyTorch's default init, which is ours (U(+-1/sqrt(fan_in)))."""

    def __init__(self, d, heads, mlp_ratio):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, mlp_ratio * d)
        self.fc2 = nn.Linear(mlp_ratio * d, d)

    def forward(self, x):
        b, t, d = x.shape
        dh = d // self.heads
        q, k, v = (z.view(b, t, self.heads, dh).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).chunk(3, -1))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
        x = x + self.proj(torch.matmul(att, v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


VOCAB = 256  # byte tokens (worker/data.cc TextDataset)


def transformer_lm_layers(hp):
    """BuiltinGraph "transformer_lm" (worker/model_graph.cc): embed, blocks,
    ln_f, head; `hp` holds the spec's hyper-parameters and context."""
    d = hp["d_model"]
    return ([Embedding(VOCAB, d, hp["context"])]
            + [TransformerBlock(d, hp["heads"], hp["mlp_ratio"]) for _ in range(hp["layers"])]
            + [nn.LayerNorm(d), nn.Linear(d, VOCAB)])


def layers(model, hp=None):
    if model == "transformer_lm":
        return transformer_lm_layers(hp)
    return {"mlp": mlp_layers, "cnn": cnn_layers}[model]()


MLP_LR, MLP_WARMUP = 0.02, 100


def lr_factor(step, total_steps, warmup, cosine=True):
    """APapo's LearningRate (worker/optimizer.cc) over the base rate: linear
    warm-up, then cosine to 0 at the last of `total_steps` updates (or
    constant)."""
    if step < warmup:
        return (step + 1) / warmup
    if not cosine:
        return 1.0
    t = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * t))


def mlp_lr_factor(step, total_steps):
    return lr_factor(step, total_steps, MLP_WARMUP)


def optimizer(model, params, total_steps):
    """worker/testdata specs: mlp SGD lr 0.02 momentum 0.9, 100 warm-up
    steps then cosine decay over the run's `total_steps`; cnn Adam lr 1e-3."""
    if model == "mlp":
        opt = torch.optim.SGD(params, lr=MLP_LR, momentum=0.9)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: mlp_lr_factor(step, total_steps))
        return opt, sched
    return torch.optim.Adam(params, lr=1e-3), None


def read_spec(path):
    """The JobSpec textproto at `path` (Python stubs from bazel-bin)."""
    sys.path.insert(0, os.path.join(ROOT, "bazel-bin"))
    from google.protobuf import text_format
    from proto.apapo.v1 import job_pb2
    with open(path) as f:
        return text_format.Parse(f.read(), job_pb2.JobSpec())


def spec_optimizer(spec, params, total_steps):
    """spec.optimizer as torch.optim: Adam (L2 weight decay added to the
    gradient, as ours) or SGD, with the spec's warm-up and decay."""
    o = spec.optimizer
    if o.HasField("adam"):
        a = o.adam
        opt = torch.optim.Adam(
            params, lr=o.learning_rate, weight_decay=o.weight_decay,
            betas=(a.beta1 if a.HasField("beta1") else 0.9,
                   a.beta2 if a.HasField("beta2") else 0.999),
            eps=a.epsilon if a.HasField("epsilon") else 1e-8)
    else:
        opt = torch.optim.SGD(params, lr=o.learning_rate, momentum=o.sgd.momentum,
                              nesterov=o.sgd.nesterov, weight_decay=o.weight_decay)
    s = o.lr_schedule
    if s.decay not in (s.DECAY_UNSPECIFIED, s.DECAY_NONE, s.DECAY_COSINE):
        raise ValueError("peer: only constant and cosine learning-rate decay are mirrored")
    if s.warmup_steps == 0 and s.decay != s.DECAY_COSINE:
        return opt, None
    cosine = s.decay == s.DECAY_COSINE
    return opt, torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, total_steps, s.warmup_steps, cosine))


def load_text(path, context, test_fraction):
    """worker/data.cc LoadText / TextDataset: bytes are tokens; the first
    int(n (1 - test_fraction)) bytes train; sample i of a part starting at
    `begin` is bytes [begin + i c, begin + i c + c), its targets the same
    window one byte later; (part length - 1) // c samples."""
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    cut = int(len(data) * (1 - test_fraction))

    def part(begin, end):
        n = max(0, (end - begin - 1) // context)
        x = data[begin:begin + n * context].reshape(n, context)
        y = data[begin + 1:begin + n * context + 1].reshape(n, context)
        return (torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))
    return part(0, cut), part(cut, len(data))


class Task:
    """What a peer trains: the network's layers, data, batch and optimizer.
    mlp / cnn: as above (Fashion-MNIST, batch 128); transformer_lm: all of
    it from the JobSpec at `spec_path` (model hyper-parameters, text file,
    context, test fraction, batch, optimizer)."""

    def __init__(self, model, spec_path=""):
        self.model = model
        self.spec = None
        self.hp = None
        self.batch = BATCH
        self.eval_batch = EVAL_BATCH
        if model == "transformer_lm":
            if not spec_path:
                raise ValueError("transformer_lm needs --spec (its JobSpec textproto)")
            self.spec = read_spec(spec_path)
            hp = {k: v.i for k, v in self.spec.model.builtin.hyper_parameters.items()}
            t = self.spec.data.text
            self.hp = {"d_model": hp.get("d_model", 128), "layers": hp.get("layers", 2),
                       "heads": hp.get("heads", 4), "mlp_ratio": hp.get("mlp_ratio", 4),
                       "context": t.context}
            self.batch = self.spec.data.batch_size
            self.eval_batch = self.spec.data.eval_batch_size or self.batch
            self._text = load_text(t.path, t.context,
                                   t.test_fraction if t.HasField("test_fraction") else 0.1)

    def layers(self):
        return layers(self.model, self.hp)

    def train_data(self):
        return self._text[0] if self.hp else load("train")

    def test_data(self):
        return self._text[1] if self.hp else load("test")

    def optimizer(self, params, total_steps):
        if self.spec is not None:
            return spec_optimizer(self.spec, params, total_steps)
        return optimizer(self.model, params, total_steps)

    def steps(self, n_train, epochs, max_steps):
        return steps_for(n_train, epochs, max_steps, self.batch)


def loss_fn(out, y):
    """Mean cross-entropy over every prediction (worker/model_builder.cc:
    logits [B, C] or [B, T, C])."""
    return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))


def parameter_count(module):
    return sum(p.numel() for p in module.parameters())


def loss_stats(losses):
    """First, mean (what APapo's summary reports as final_loss: the mean over
    the epoch's steps), mean of the last 50 (its progress lines' loss), and
    every 10th step's loss."""
    if not losses:
        return {}
    return {"first_loss": losses[0], "mean_loss": sum(losses) / len(losses),
            "last50_loss": sum(losses[-50:]) / len(losses[-50:]),
            "loss_trace": [[i + 1, losses[i]] for i in range(0, len(losses), 10)]}


def steps_for(n_train, epochs, max_steps, batch=BATCH):
    per_epoch = n_train // batch
    total = per_epoch * epochs
    return min(total, max_steps) if max_steps > 0 else total


def evaluate(forward, x, y, batch=EVAL_BATCH):
    """Share of correct predictions: per sample, or per token for a
    language model (worker/model_builder.cc CountCorrect)."""
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = forward(x[i:i + batch])
            correct += int((out.argmax(-1) == y[i:i + batch]).sum())
    return correct / y.numel()


class Timer:
    """samples/s over the training steps after the first `warmup` (as
    APapo's final figure counts them: worker/stage_observer.h,
    SteadySamplesPerSecond, leaves out a run's first 10 steps), and over all
    steps ("samples_per_s_whole"). Training time only, evaluation excluded.
    A run of no more than `warmup` steps is counted whole."""

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
        whole = self.steps * samples_per_step / (end - self.t0)
        out = {"steps": self.steps, "samples_per_s": whole,
               "samples_per_s_whole": whole, "train_s": end - self.t0}
        if self.tw is not None and self.steps > self.warmup:
            out["samples_per_s"] = (
                (self.steps - self.warmup) * samples_per_step / (end - self.tw))
        return out


def write(path, result):
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=2)
        os.replace(path + ".tmp", path)
    print(json.dumps(result))
