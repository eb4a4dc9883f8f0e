#!/usr/bin/python3
"""APapo runtime benchmark (issue 4, "Benchmark"): samples/s and test accuracy
of the `mlp` and `cnn` on Fashion-MNIST (batch 128) and of the byte-level
`transformer_lm` (batch 32 x 64 tokens, on a corpus built from python3-torch's
sources: corpus.py), APapo vs PyTorch peers, on this 2-core machine. Run from
the repository root after `bazel build //...`:

  /usr/bin/python3 bench/runtime/run.py            # full run (~35-45 min)
  /usr/bin/python3 bench/runtime/run.py --quick    # smoke test (~3 min)

Throughput: every row runs a fixed number of optimizer steps (warm-up + timed
steps), rows INTERLEAVED (A B C ... A B C ...) for --rounds rounds because this
machine's speed swings 2x within minutes; the report gives medians and ratios
to the single-process row of the same round. Accuracy: one full run
(--epochs) per row listed in --accuracy, while the time budget allows.
Every process is pinned to one core (taskset + OPENBLAS_NUM_THREADS=1 +
OMP_NUM_THREADS=1 + one LibTorch thread). Raw results go to
bench/runtime/results/<timestamp>.json (and latest.json); the table is printed.
The script stops by itself: every command has a timeout, and optional work is
skipped once --budget_s is spent.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.join(ROOT, "bazel-bin")
sys.path.insert(0, BIN)

import grpc  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from proto.apapo.v1 import job_pb2, metrics_pb2, plan_pb2, service_pb2, service_pb2_grpc  # noqa: E402

sys.path.insert(0, HERE)
import corpus  # noqa: E402

WORKER = os.path.join(BIN, "worker", "apapo-worker")
COORDINATOR = os.path.join(BIN, "coordinator", "apapo-coordinator")
PY = "/usr/bin/python3"
SPECS = {"mlp": os.path.join(ROOT, "worker/testdata/mlp_fashion_mnist.textproto"),
         "cnn": os.path.join(ROOT, "worker/testdata/cnn_fashion_mnist.textproto"),
         "transformer_lm": os.path.join(ROOT, "worker/testdata/transformer_lm_text.textproto")}
# Models whose spec reads spec.data.text: make_spec points it at the corpus
# (prepare_text), which the daemons must be allowed to read (Cluster).
TEXT_MODELS = ("transformer_lm",)
# The daemons' default --data_roots (worker/main.cc, coordinator/main.cc).
DEFAULT_DATA_ROOTS = ("/usr/share/datasets", "/var/lib/apapo")
FASHION_TRAIN_SAMPLES = 60000
ROWS = ["single", "auto", "auto_base", "auto_bf16", "async", "async_base", "async_bf16",
        "async_nowp", "async_local", "1f1b_flush", "gpipe", "replicas2", "ddp", "pipe"]
# Rows served by the build given as --baseline_bin (the code before a change),
# in the same rounds as their counterparts: "<row>_base" runs <row> there.
BASE_SUFFIX = "_base"
# ScheduleSpec fields (text format) merged into every row's schedule but
# single's (bench/cluster's --schedule), e.g. "max_staleness: 1".
SCHEDULE_EXTRA = ""
# The spec's seed in every row (bench/cluster's --seed); None: the spec's.
SEED = None
# A folder to write each job's GetPlanResponse in (--save_plans); "": none.
SAVE_PLANS = ""
# "<row>_bf16": <row> with activations and gradients sent in bfloat16;
# "<row>_sN" (after _bf16 if both): <row> with schedule.max_staleness N;
# "<row>_mN": with schedule.micro_batches N (e.g. auto_m1: the planner's
# choice on whole mini-batches); "<row>_onepass": the backward of every
# stage in one pass (schedule.split_backward false); "<row>_parts" and
# "<row>_after" (in its place): a replicated stage's all-reduce in parts
# during the backward, or one after it (schedule.allreduce_in_backward
# true or false; unset, the planner chooses).


def row_variant(row):
    """(base row, bf16?, max_staleness or None, checkpoint interval or None)
    of ROW[_bf16][_sN][_mN][_cN]."""
    return row_variant_all(row)[:4]


def row_variant_all(row):
    """row_variant's, then micro_batches (or None), then dense? (ROW_dense:
    ReLU outputs cross whole, zeros included: schedule.skip_zeros false),
    then the backward's variant: "onepass" (ROW_onepass, before _dense: the
    backward in one pass, schedule.split_backward false), "parts" or
    "after" (ROW_parts, ROW_after: schedule.allreduce_in_backward true or
    false), or None."""
    m = re.fullmatch(r"(.*?)(?:_(onepass|parts|after))?(_dense)?(_bf16)?(?:_s(\d+))?(?:_m(\d+))?"
                     r"(?:_c(\d+))?", row)
    number = lambda g: int(g) if g is not None else None  # noqa: E731
    return (m[1], bool(m[4]), number(m[5]), number(m[7]), number(m[6]), bool(m[3]), m[2])
# Rows that run through the product: a coordinator and two worker daemons;
# the job's measured profile goes to the planner, which picks the cut (and
# may split wide layers), replication and micro-batches for the schedule.
CLUSTER_ROWS = ("auto", "async", "async_nowp", "1f1b_flush", "gpipe", "replicas2",
                "auto_base", "async_base", "auto_bf16", "async_bf16")
LABELS = {
    "single": "single process, 1 core (apapo-worker --local=1)",
    "auto": "ours, planner's choice (coordinator + 2 daemons)",
    "auto_base": "ours before the change, planner's choice (--baseline_bin)",
    "auto_bf16": "ours, planner's choice, transfers in bfloat16",
    "async": "ours, async (coordinator, planned)",
    "async_bf16": "ours, async, transfers in bfloat16 (coordinator, planned)",
    "async_base": "ours before the change, async (--baseline_bin)",
    "async_nowp": "ours, async without weight prediction (coordinator)",
    "async_local": "ours, async, 2 stages, whole-layer cut (--local=2)",
    "1f1b_flush": "ours, 1f1b_flush (coordinator, planned)",
    "gpipe": "ours, gpipe (coordinator, planned)",
    "replicas2": "ours, 2 replicas (coordinator, data parallel)",
    "ddp": "PyTorch DDP, Gloo, 2 processes",
    "pipe": "PyTorch Pipe, 2 stages (1 process)",
}
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
           MKL_NUM_THREADS="1")
T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- specs
def prepare_text(models, workdir):
    """Builds the corpus into workdir/data (a data root of the daemons) when a
    model needs it; returns corpus.build's description or None."""
    if not any(m in TEXT_MODELS for m in models):
        return None
    info = corpus.build(os.path.join(workdir, "data"))
    log(f"corpus: {info['path']}, {info['bytes']} bytes from {info['files']} files of "
        f"{info['package']}, sha256 {info['sha256'][:16]}")
    return info


def train_samples(model, text):
    """Samples in one training epoch, to estimate run times."""
    if model not in TEXT_MODELS:
        return FASHION_TRAIN_SAMPLES
    t = text_format.Parse(open(SPECS[model]).read(), job_pb2.JobSpec()).data.text
    frac = t.test_fraction if t.HasField("test_fraction") else 0.1
    return (int(text["bytes"] * (1 - frac)) - 1) // t.context


def make_spec(model, row, max_steps, epochs, workdir, text_path="", workers=2):
    spec = text_format.Parse(open(SPECS[model]).read(), job_pb2.JobSpec())
    if model in TEXT_MODELS:
        if not text_path:
            raise ValueError(f"{model} needs the corpus (prepare_text)")
        spec.data.text.path = text_path
    spec.limits.epochs = epochs
    spec.limits.max_steps = max_steps
    spec.resources.workers = workers
    spec.resources.threads_per_worker = 1
    row = row[:-len(BASE_SUFFIX)] if row.endswith(BASE_SUFFIX) else row
    name = row
    row, bf16, staleness, checkpoint_every, micro_batches, dense, backward = row_variant_all(row)
    s = spec.schedule
    s.Clear()
    if bf16:
        s.transfer_precision = plan_pb2.TRANSFER_PRECISION_BFLOAT16
    if dense:
        s.skip_zeros = False
    if backward == "onepass":
        s.split_backward = False
    elif backward in ("parts", "after"):
        s.allreduce_in_backward = backward == "parts"
    if staleness is not None:
        s.max_staleness = staleness
    if checkpoint_every is not None:
        spec.checkpoint.every_steps = checkpoint_every
    if row == "single":
        # Plain training of the whole mini-batch in one process.
        s.kind, s.stages, s.micro_batches = plan_pb2.SCHEDULE_KIND_GPIPE, 1, 1
        spec.resources.workers = 1
    elif row == "auto":
        pass  # UNSPECIFIED: the planner picks schedule, stages and replicas
    elif row in ("async", "1f1b_flush", "gpipe"):
        # Async: micro-batches unset, i.e. 1 (later iterations fill the
        # pipeline).
        # The flush schedules get m=4 (32-sample micro-batches) as in earlier
        # runs: their default 4 x stages = 8 makes 16-row GEMMs, slower here.
        s.kind = {"async": plan_pb2.SCHEDULE_KIND_ASYNC,
                  "1f1b_flush": plan_pb2.SCHEDULE_KIND_1F1B_FLUSH,
                  "gpipe": plan_pb2.SCHEDULE_KIND_GPIPE}[row]
        s.stages = 2
        if row != "async":
            s.micro_batches = 4
    elif row == "async_nowp":
        # The async row with plain weight stashing: what prediction costs.
        s.kind, s.stages = plan_pb2.SCHEDULE_KIND_ASYNC, 2
        s.weight_prediction = False
    elif row == "async_local":
        # --local's forced layout: the contiguous, compute-balanced whole-layer cut.
        s.kind, s.stages = plan_pb2.SCHEDULE_KIND_ASYNC, 2
    elif row.startswith("stages") and row[len("stages"):].isdigit():
        # stagesN: the async pipeline on N stages of one replica each (on
        # N workers, whatever they share: bench/cluster's 2x2 layout).
        s.kind = plan_pb2.SCHEDULE_KIND_ASYNC
        s.stages, s.replicas = int(row[len("stages"):]), 1
    elif row.startswith("replicas"):
        # replicasN: one stage on N replicas, each taking one micro-batch
        # of the mini-batch (replicas2: 64 samples of the 128).
        s.kind = plan_pb2.SCHEDULE_KIND_DATA_PARALLEL
        s.stages, s.replicas = 1, int(row[len("replicas"):])
    if micro_batches is not None and row != "single":
        s.micro_batches = micro_batches
    if row != "single" and SCHEDULE_EXTRA:
        text_format.Merge(SCHEDULE_EXTRA, s)
    if SEED is not None:
        spec.seed = SEED
    spec.name = f"bench-{model}-{name}"
    path = os.path.join(workdir, f"{model}-{name}-{max_steps}.textproto")
    with open(path, "w") as f:
        f.write(text_format.MessageToString(spec))
    return spec, path


# ---------------------------------------------------------------- processes
def pin_children(parent_pid, stop):
    """`--local=N` forks one stage process per rank (from one thread each):
    pins the k-th stage process seen, and all its threads, to core k % 2.
    (Builds before the one stage runner passed --rank=r: then core r.)"""
    pinned = {}
    order = []
    deadline = time.time() + 15
    while not stop.is_set() and time.time() < deadline:
        kids = []
        try:
            for tid in os.listdir(f"/proc/{parent_pid}/task"):
                kids += open(f"/proc/{parent_pid}/task/{tid}/children").read().split()
        except OSError:
            return
        for pid in kids:
            try:
                argv = open(f"/proc/{pid}/cmdline").read().split("\0")
            except OSError:
                continue
            rank = next((int(a[7:]) for a in argv if a.startswith("--rank=")), None)
            if rank is None and any(a.startswith("--run_assignment=") for a in argv):
                if pid not in order:
                    order.append(pid)
                rank = order.index(pid)
            if rank is None:
                continue
            n = pinned.get(pid, 0)
            # Re-applied a few times to catch threads started in between.
            if n < 4:
                subprocess.run(["taskset", "-a", "-p", "-c", str(rank % 2), pid],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                pinned[pid] = n + 1
        time.sleep(0.5 if pinned else 0.05)


def run_cmd(argv, timeout, log_path, pin=False, env=ENV):
    with open(log_path, "w") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                             cwd=ROOT, start_new_session=True)
        stop = threading.Event()
        th = None
        if pin:
            th = threading.Thread(target=pin_children, args=(p.pid, stop), daemon=True)
            th.start()
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # our own process group only
            p.wait()
            rc = "timeout"
        stop.set()
        if th:
            th.join()
    return rc


def tail(path, n=5):
    try:
        return "".join(open(path).readlines()[-n:])
    except OSError:
        return ""


def losses_in_log(path):
    """(step, loss) of an `apapo-worker --local` log's progress lines (loss:
    the mean over the last 50 micro-batches)."""
    try:
        text = open(path).read()
    except OSError:
        return []
    return [[int(m.group(1)), float(m.group(2))]
            for m in re.finditer(r"\[apapo\] epoch \d+ step (\d+)/\d+ loss ([0-9.eE+-]+)", text)]


def run_local(model, row, max_steps, epochs, workdir, timeout, text_path=""):
    spec, path = make_spec(model, row, max_steps, epochs, workdir, text_path)
    tag = f"{model}-{row}-{max_steps}-{time.time():.0f}"
    summary = os.path.join(workdir, tag + ".json")
    n = spec.resources.workers
    argv = ["taskset", "-c", "0" if n == 1 else "0,1", WORKER, f"--local={n}",
            f"--spec={path}", f"--summary={summary}", "--threads=1"]
    rc = run_cmd(argv, timeout, os.path.join(workdir, tag + ".log"), pin=n > 1)
    if rc != 0:
        return {"error": f"exit {rc}: {tail(os.path.join(workdir, tag + '.log'))}"}
    s = json.load(open(summary))
    return {"samples_per_s": s["samples_per_s"],
            "final_test_accuracy": s.get("final_test_accuracy"),
            # The mean training loss over the (last) epoch's steps.
            "final_loss": s.get("final_loss"),
            "loss_trace": losses_in_log(os.path.join(workdir, tag + ".log")),
            "steps": s.get("steps"), "plan": s.get("plan"),
            "max_staleness": s.get("max_staleness"),
            "comm_hidden_share": s.get("comm_hidden_share"),
            "stages": s.get("stages"), "wall_s": s.get("wall_s")}


def run_peer(model, row, max_steps, epochs, workdir, timeout, warmup,
             ranks=((0, "127.0.0.1", ()), (1, "127.0.0.1", ())), extra_env=None,
             text_path=""):
    """PyTorch DDP over Gloo (`ranks`: core, address, argv prefix that runs
    on its host, rank 0's address the rendezvous) or Pipe (one process).
    A text model's peer reads the spec ours trains (hyper-parameters, data,
    batch, optimizer)."""
    tag = f"{model}-{row}-{max_steps}-{time.time():.0f}"
    summary = os.path.join(workdir, tag + ".json")
    common = [f"--model={model}", f"--epochs={epochs}", f"--max_steps={max_steps}",
              f"--warmup={warmup}", f"--summary={summary}"]
    if model in TEXT_MODELS:
        _, spec_path = make_spec(model, row, max_steps, epochs, workdir, text_path)
        common.append(f"--spec={spec_path}")
    t = time.time()
    if row == "pipe":
        rc = run_cmd(["taskset", "-c", "0,1", PY, os.path.join(HERE, "peer_pipe.py")]
                     + common, timeout, os.path.join(workdir, tag + ".log"))
        rcs = [rc]
    else:
        port = 29500 + int(time.time() * 1000) % 400
        procs, rcs = [], []
        for r, (core, _, prefix) in enumerate(ranks):
            env = dict(ENV, RANK=str(r), WORLD_SIZE=str(len(ranks)),
                       MASTER_ADDR=ranks[0][1], MASTER_PORT=str(port), **(extra_env or {}))
            out = open(os.path.join(workdir, f"{tag}.rank{r}.log"), "w")
            procs.append((subprocess.Popen(
                [*prefix, "taskset", "-c", str(core), PY,
                 os.path.join(HERE, "peer_ddp.py")] + common,
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                start_new_session=True), out))
        for p, out in procs:
            try:
                rcs.append(p.wait(timeout=max(1, timeout - (time.time() - t))))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                rcs.append("timeout")
            out.close()
    if any(rc != 0 for rc in rcs):
        return {"error": f"exit {rcs}: {tail(os.path.join(workdir, tag + '.rank0.log' if row == 'ddp' else tag + '.log'))}"}
    s = json.load(open(summary))
    s["wall_s"] = time.time() - t
    return s


# Where the workers of a Cluster run: (worker id, core, host address, argv
# prefix that runs a command on that host). The default: two daemons on
# this host's loopback, as deploy/demo.sh starts them.
LOOPBACK_WORKERS = (("w-1", 0, "127.0.0.1", ()), ("w-2", 1, "127.0.0.1", ()))


class Cluster:
    """A coordinator and worker daemons, each worker pinned to its core: by
    default w-1 on core 0 and w-2 on core 1 on loopback, as deploy/demo.sh
    starts them; bench/cluster/run.py places them on emulated hosts
    (`workers`, the coordinator on `host`, which must be this process's)."""

    def __init__(self, workdir, bin_dir=BIN, name="cluster", workers=LOOPBACK_WORKERS,
                 host="127.0.0.1", extra_flags=(), text_path=""):
        self.procs = []
        self.text_path = text_path
        self.workers = len(workers)
        # The run's folder (the corpus, each cluster's checkpoints) joins the
        # default data roots of the coordinator (checked at submit) and of
        # the workers (on their disk). Checkpoints go there too: the default
        # --checkpoint_root, /var/lib/apapo/checkpoints, exists only where
        # deploy/ installed the daemons; elsewhere a job fails when it
        # writes its first checkpoint (its parent is outside the roots).
        roots = [f"--data_roots={','.join(DEFAULT_DATA_ROOTS + (workdir,))}"]
        self.workdir = os.path.join(workdir, name)
        os.makedirs(self.workdir, exist_ok=True)
        workdir = self.workdir
        clog = os.path.join(workdir, "coordinator.log")
        self.procs.append(self._start(
            [os.path.join(bin_dir, "coordinator", "apapo-coordinator"),
             f"--host={host}", "--port=0", "--metrics_port=0",
             f"--state={os.path.join(workdir, 'coordinator.db')}", *roots,
             f"--checkpoint_root={os.path.join(workdir, 'checkpoints')}", *extra_flags],
            clog))
        self.port = int(self._wait(clog, r"listening on port (\d+)"))
        for worker_id, core, address, prefix in workers:
            wlog = os.path.join(workdir, f"{worker_id}.log")
            self.procs.append(self._start(
                [*prefix, "taskset", "-c", str(core),
                 os.path.join(bin_dir, "worker", "apapo-worker"),
                 f"--coordinator={host}:{self.port}", f"--host={address}",
                 f"--id={worker_id}", "--threads=1", *roots], wlog))
            self._wait(wlog, r"registered as (\S+)")
        self.channel = grpc.insecure_channel(f"{host}:{self.port}")
        self.jobs = service_pb2_grpc.JobServiceStub(self.channel)

    def _start(self, argv, path):
        out = open(path, "w")
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=ENV,
                                cwd=ROOT, start_new_session=True)

    def _wait(self, path, pattern, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, open(path).read())
            if m:
                return m.group(1)
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {pattern!r} in {path}: {tail(path)}")

    def events(self, job_id):
        """The job's events so far (WatchJob replays them from the first)."""
        out = []
        try:
            for m in self.jobs.WatchJob(service_pb2.WatchJobRequest(job_id=job_id),
                                        timeout=10):
                if m.HasField("event"):
                    out.append(m.event.message)
        except grpc.RpcError:
            pass  # the deadline: a job still running streams on
        return out

    def run(self, model, row, max_steps, epochs, timeout):
        spec, _ = make_spec(model, row, max_steps, epochs, self.workdir, self.text_path,
                            workers=self.workers)
        # One checkpoint, after the last step (outside the training time),
        # as --local rows and the peers take none: a coordinator's default
        # (every 100 steps) drains and refills the pipeline and shares the
        # cores with its background write (bench/cluster/README.md; its
        # cost: bench/elastic/README.md). Rows ROW_cN checkpoint every N
        # steps and are compared with the prediction that counts them.
        checkpoints = spec.checkpoint.every_steps > 0
        if not checkpoints:
            spec.checkpoint.every_steps = max_steps
        t = time.time()
        job_id = self.jobs.SubmitJob(service_pb2.SubmitJobRequest(spec=spec),
                                     timeout=30).job.id
        ended = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED,
                 job_pb2.JOB_STATE_CANCELLED)
        job = None
        while time.time() - t < timeout:
            job = self.jobs.GetJob(service_pb2.GetJobRequest(job_id=job_id), timeout=30)
            if job.state in ended:
                break
            time.sleep(0.5)
        else:
            self.jobs.CancelJob(service_pb2.CancelJobRequest(job_id=job_id), timeout=30)
            return {"error": f"{job_id} timed out after {timeout}s"}
        if job.state != job_pb2.JOB_STATE_SUCCEEDED:
            return {"error": f"{job_id}: {job_pb2.JobState.Name(job.state)}: {job.error}"}
        # The coordinator's checks of the plan against the run (and what it
        # did on them: a re-plan restarts the job).
        events = self.events(job_id)
        checks = [e for e in events if e.startswith("plan checked")]
        res = {"job_id": job_id, "samples_per_s": job.progress.samples_per_second,
               "plan_checks": checks, "restarts": job.restarts,
               # Workers profiled a second time (measured slow the first).
               "reprofiled": [e for e in events if " computed at " in e
                              or " profiled again: " in e],
               "final_test_accuracy": (job.progress.test_accuracy
                                       if job.progress.HasField("test_accuracy") else None),
               "steps": job.progress.step, "max_staleness": job.progress.max_staleness,
               # At the end: the mean training loss over the last epoch's steps.
               "final_loss": job.progress.loss,
               "wall_s": time.time() - t,
               "stages": [{"stage": s.stage, "worker": s.worker_id,
                           "busy_s": s.busy_seconds, "idle_s": s.idle_seconds,
                           "comm_s": s.comm_seconds, "steps": s.steps}
                          for s in job.progress.stages]}
        try:
            plan = self.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
            p = plan.plan
            if SAVE_PLANS:
                # What the plan was made on, to plan again offline
                # (bazel-bin/cli/apapo-replan): the spec, the measured
                # profile and cluster; and the plan.
                base = os.path.join(SAVE_PLANS, f"{job_id}-{int(t)}")
                res["saved_plan"] = base
                for suffix, message in (("spec", job.spec), ("profile", plan.profile),
                                        ("cluster", plan.cluster), ("plan", p)):
                    with open(f"{base}.{suffix}.pb", "wb") as f:
                        f.write(message.SerializeToString())
            res["plan"] = (f"{plan_pb2.ScheduleKind.Name(p.schedule)}, "
                           f"{len(p.stages)} stage(s) x "
                           f"{[s.replicas for s in p.stages]} replica(s), "
                           f"m={p.micro_batches}, predicted "
                           f"{p.prediction.samples_per_second:.0f} samples/s"
                           + "".join(f", split {x.node_id}/{x.parts}" for x in p.splits)
                           + "".join(f", stage {s.index} depth {s.in_flight_depth}"
                                     for s in p.stages if s.in_flight_depth))
            res["plan_notes"] = list(p.notes)
            res["speeds"] = {w.worker_id: round(w.relative_speed, 3)
                             for w in plan.cluster.workers}
            res["profile_source"] = plan.profile.source
            # float32 parameters, as the profile counts them
            res["parameters"] = sum(n.parameter_bytes for n in plan.profile.nodes) // 4
            res["plan_alternatives"] = dict(p.prediction.alternatives_samples_per_second)
            res["predicted_samples_per_s"] = p.prediction.samples_per_second
            res["checkpoint_seconds"] = p.prediction.checkpoint_seconds
            if checkpoints:
                res["predicted_steady_samples_per_s"] = p.prediction.samples_per_second
                res["predicted_samples_per_s"] = (
                    p.prediction.samples_per_second_with_checkpoints)
            res["checkpoints"] = [{"worker": c.worker_id, "bytes": c.bytes,
                                   "snapshot_s": c.snapshot_seconds,
                                   "write_cpu_s": c.write_cpu_seconds,
                                   "write_s": c.write_seconds}
                                  for c in plan.cluster.checkpoints]
            res["plan_kind"] = plan_pb2.ScheduleKind.Name(p.schedule)
            res["plan_shape"] = [s.replicas for s in p.stages]
            # Each stage's predicted seconds per mini-batch, beside its
            # measured busy_s / steps above (apapoctl plan's busy s/mb).
            res["stage_predictions"] = [{"stage": s.index, "compute_s": s.compute_seconds,
                                         "allreduce_s": s.allreduce_seconds}
                                        for s in p.stages]
            res["links"] = [{"from": l.from_worker, "to": l.to_worker,
                             "bytes_per_s": l.bandwidth_bytes_per_second,
                             "cpu_ns_per_byte": l.cpu_seconds_per_byte * 1e9,
                             "burst_bytes": l.burst_bytes}
                            for l in plan.cluster.links]
            res["allreduces"] = [{"ranks": a.ranks, "bytes": a.bytes,
                                  "seconds": a.seconds,
                                  "cpu_seconds": a.cpu_seconds,
                                  "compute_lost_seconds": a.compute_lost_seconds,
                                  "seconds_beside_compute": a.seconds_beside_compute,
                                  "seconds_after_compute": a.seconds_after_compute,
                                  "worker_ids": list(a.worker_ids)}
                                 for a in plan.cluster.allreduces]
        except grpc.RpcError as e:
            res["plan"] = f"GetPlan failed: {e.code()}"
        # The measured timeline of each stage (the job's trace window, steps
        # 10-15 by default) beside the simulator's: span kind, micro-batch,
        # start and duration in ms, each on its stage's clock.
        try:
            trace = self.jobs.GetTrace(service_pb2.GetTraceRequest(job_id=job_id), timeout=30)

            def spans(t):
                return [(metrics_pb2.SpanKind.Name(x.kind).removeprefix("SPAN_KIND_").lower(),
                         x.micro_batch, round(x.start_ns / 1e6, 3),
                         round(x.duration_ns / 1e6, 3)) for x in t.spans]
            res["trace"] = {
                "measured": [{"stage": t.stage, "replica": t.replica, "worker": t.worker_id,
                              "steps": [t.first_step, t.end_step], "spans": spans(t)}
                             for t in trace.stages],
                "simulated": [{"stage": t.stage, "replica": t.replica, "spans": spans(t)}
                              for t in trace.simulated]}
        except grpc.RpcError as e:
            res["trace"] = f"GetTrace failed: {e.code()}"
        return res

    def close(self):
        try:
            self.channel.close()
        except Exception:  # noqa: BLE001
            pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


# ---------------------------------------------------------------- driver
def blas():
    try:
        return os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    except OSError:
        return "unknown"


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_at_start": os.getloadavg()}


def summarize(results, models, rows):
    table = {}
    for model in models:
        rounds = results["throughput"].get(model, [])
        table[model] = {}
        for row in rows:
            sps = [r[row]["samples_per_s"] for r in rounds
                   if "samples_per_s" in r.get(row, {})]
            ratios = [r[row]["samples_per_s"] / r["single"]["samples_per_s"]
                      for r in rounds if "samples_per_s" in r.get(row, {})
                      and "samples_per_s" in r.get("single", {})]
            ddp = [r[row]["samples_per_s"] / r["ddp"]["samples_per_s"]
                   for r in rounds if "samples_per_s" in r.get(row, {})
                   and "samples_per_s" in r.get("ddp", {})]
            # A row served by both builds: after / before, per round.
            base = row + BASE_SUFFIX
            vs_base = [r[row]["samples_per_s"] / r[base]["samples_per_s"]
                       for r in rounds if "samples_per_s" in r.get(row, {})
                       and "samples_per_s" in r.get(base, {})]
            acc = results["accuracy"].get(model, {}).get(row, {})
            table[model][row] = {
                "median_samples_per_s": statistics.median(sps) if sps else None,
                "samples_per_s": sps,
                "median_ratio_vs_single": statistics.median(ratios) if ratios else None,
                "ratios_vs_single": ratios,
                "median_ratio_vs_ddp": statistics.median(ddp) if ddp else None,
                "ratios_vs_ddp": ddp,
                "median_ratio_vs_baseline": statistics.median(vs_base) if vs_base else None,
                "ratios_vs_baseline": vs_base,
                "accuracy": acc.get("final_test_accuracy"),
                "accuracy_epochs": acc.get("epochs"),
                "plan": next((r[row].get("plan") for r in rounds
                              if r.get(row, {}).get("plan")), None),
            }
    return table


def print_table(table):
    lines = []
    for model, rows in table.items():
        lines.append(f"\n{model}:")
        lines.append(f"  {'row':58}{'samples/s':>10}{'x single':>10}{'x DDP':>8}"
                     f"{'x before':>10}{'accuracy':>10}   per-round samples/s")

        def fmt(v):
            return f"{v:.2f}" if v else "-"
        for row, t in rows.items():
            sps = f"{t['median_samples_per_s']:.0f}" if t["median_samples_per_s"] else "-"
            acc = f"{100 * t['accuracy']:.2f}%" if t["accuracy"] is not None else "-"
            rounds = ", ".join(f"{v:.0f}" for v in t["samples_per_s"])
            base = (" (" + ", ".join(f"{v:.2f}" for v in t["ratios_vs_baseline"]) + ")"
                    if t["ratios_vs_baseline"] else "")
            lines.append(f"  {LABELS[row]:58}{sps:>10}{fmt(t['median_ratio_vs_single']):>10}"
                         f"{fmt(t['median_ratio_vs_ddp']):>8}"
                         f"{fmt(t['median_ratio_vs_baseline']):>10}{acc:>10}   {rounds}{base}")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def loss_note(r):
    """The run's losses and parameter count, where it reported them: first
    and last of the progress trace (ours: the mean of the last 50
    micro-batches at each print; peers: every 10th step), and the mean over
    the run's steps (what ours reports as final_loss)."""
    parts = []
    trace = r.get("loss_trace") or []
    if trace:
        parts.append(f"loss {trace[0][1]:.3f} (step {trace[0][0]}) -> "
                     f"{trace[-1][1]:.3f} (step {trace[-1][0]})")
    mean = r.get("mean_loss", r.get("final_loss"))
    if mean:
        parts.append(f"mean loss {mean:.3f}")
    if r.get("parameters"):
        parts.append(f"{r['parameters']} parameters")
    return ("  [" + ", ".join(parts) + "]") if parts else ""


def _terminate(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")  # runs the cleanup below


def main():
    signal.signal(signal.SIGTERM, _terminate)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--mlp_steps", type=int, default=200,
                    help="timed steps per mlp throughput run (after --warmup)")
    ap.add_argument("--cnn_steps", type=int, default=60)
    ap.add_argument("--lm_steps", type=int, default=100,
                    help="timed steps per transformer_lm throughput run (batch 32)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs of accuracy runs")
    ap.add_argument("--accuracy", default="mlp:single,mlp:async,cnn:auto",
                    help="model:row accuracy runs, in order, while the budget lasts")
    ap.add_argument("--budget_s", type=float, default=2700,
                    help="skip remaining accuracy runs that would end after this")
    ap.add_argument("--run_timeout_s", type=float, default=900)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 round, 10 steps, no accuracy runs")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--keep_workdir", action="store_true",
                    help="keep the run's folder (logs, checkpoints) instead of removing it")
    ap.add_argument("--baseline_bin", default="",
                    help="bazel-bin of a build of the code before a change (e.g. a git "
                         "worktree of the old commit): rows <row>_base run there")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.warmup, a.mlp_steps, a.cnn_steps, a.lm_steps, a.accuracy = (
            1, 2, 8, 4, 8, "")
    models = a.models.split(",")
    unknown = [m for m in models if m not in SPECS]
    if unknown:
        sys.exit(f"--models: unknown {unknown} (known: {', '.join(SPECS)})")
    timed_steps = {"mlp": a.mlp_steps, "cnn": a.cnn_steps, "transformer_lm": a.lm_steps}
    rows = [r for r in ROWS if r in a.rows.split(",")]
    base_rows = [r for r in rows if r.endswith(BASE_SUFFIX)]
    if base_rows and not a.baseline_bin:
        sys.exit(f"rows {base_rows} need --baseline_bin")
    for path in (WORKER, COORDINATOR):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} missing: run `bazel build //...` first")
    os.makedirs(a.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="apapo-bench-")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = {"started": stamp, "blas": blas(), "machine": machine(),
               "args": vars(a), "workdir": workdir,
               "throughput": {m: [] for m in models}, "accuracy": {m: {} for m in models}}
    out_path = os.path.join(a.out, f"{stamp}.json")

    def save():
        results["table"] = summarize(results, models, rows)
        results["elapsed_s"] = time.time() - T0
        for p in (out_path, os.path.join(a.out, "latest.json")):
            with open(p + ".tmp", "w") as f:
                json.dump(results, f, indent=1)
            os.replace(p + ".tmp", p)

    cluster = None
    baseline = None
    try:
        text = prepare_text(models, workdir)
        results["corpus"] = text
        text_path = text["path"] if text else ""
        if any((r in rows or f":{r}" in a.accuracy) and not r.endswith(BASE_SUFFIX)
               for r in CLUSTER_ROWS):
            cluster = Cluster(workdir, text_path=text_path)
            log(f"coordinator on port {cluster.port}, workers w-1 (core 0), w-2 (core 1)")
        if base_rows:
            baseline = Cluster(workdir, a.baseline_bin, "baseline", text_path=text_path)
            log(f"baseline ({a.baseline_bin}): coordinator on port {baseline.port}")

        def one(model, row, max_steps, epochs, timeout):
            if row.endswith(BASE_SUFFIX):
                return baseline.run(model, row, max_steps, epochs, timeout)
            if row in CLUSTER_ROWS:
                return cluster.run(model, row, max_steps, epochs, timeout)
            if row in ("ddp", "pipe"):
                return run_peer(model, row, max_steps, epochs, workdir, timeout, a.warmup,
                                text_path=text_path)
            return run_local(model, row, max_steps, epochs, workdir, timeout, text_path)

        # Throughput: interleaved rounds; within a round, models alternate too.
        for rnd in range(a.rounds):
            for model in models:
                steps = a.warmup + timed_steps[model]
                this = {}
                order = rows if rnd % 2 == 0 else rows[::-1]
                for row in order:
                    t = time.time()
                    r = one(model, row, steps, 1, a.run_timeout_s)
                    r["round"] = rnd
                    this[row] = r
                    log(f"round {rnd + 1} {model:3} {row:10} "
                        + (f"{r['samples_per_s']:8.1f} samples/s" if "samples_per_s" in r
                           else f"FAILED {r.get('error', '')[:300]}")
                        + f"  ({time.time() - t:.0f}s)" + loss_note(r))
                results["throughput"][model].append(this)
                save()
        # Accuracy: full runs, one per row, while the budget lasts.
        for item in filter(None, a.accuracy.split(",")):
            model, row = item.split(":")
            if model not in models:
                continue
            # Estimate from this run's throughput of the row.
            sps = [r[row]["samples_per_s"] for r in results["throughput"][model]
                   if "samples_per_s" in r.get(row, {})]
            est = ((train_samples(model, text) * a.epochs / statistics.median(sps) + 60)
                   if sps else 600)
            left = a.budget_s - (time.time() - T0)
            if est > left:
                log(f"skipping accuracy {model}/{row}: needs ~{est:.0f}s, {left:.0f}s left")
                results["accuracy"][model][row] = {"skipped": f"~{est:.0f}s needed"}
                continue
            log(f"accuracy {model}/{row}: {a.epochs} epochs (~{est:.0f}s)")
            r = one(model, row, 0, a.epochs, min(a.run_timeout_s * 3, left))
            r["epochs"] = a.epochs
            results["accuracy"][model][row] = r
            log(f"accuracy {model}/{row}: "
                + (f"{100 * r['final_test_accuracy']:.2f}% at {r['samples_per_s']:.0f} samples/s"
                   if r.get("final_test_accuracy") is not None else f"FAILED {r}"))
            save()
    finally:
        for c in (cluster, baseline):
            if c:
                c.close()
        save()
        # The daemons' checkpoints and data there run to gigabytes a run;
        # the results JSON holds what the run measured.
        if not a.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    results["table_text"] = print_table(results["table"])
    save()
    log(f"results: {out_path}")


if __name__ == "__main__":
    main()
