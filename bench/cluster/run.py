#!/usr/bin/python3
"""Bandwidth-bound benchmark (issue 12): the mlp, the cnn and the
transformer_lm trained across two emulated hosts (deploy/cluster-lab.sh) whose link is shaped to each of
--links in turn, ours against one process and PyTorch DDP over the same
link, with the planner's prediction beside every measured run.

  /usr/bin/python3 bench/cluster/run.py          # after `bazel build //...`, as root
  /usr/bin/python3 bench/cluster/run.py --links=unshaped,1gbit --models=mlp --rounds=1
  /usr/bin/python3 bench/cluster/run.py --models=transformer_lm --links=unshaped,100mbit
  /usr/bin/python3 bench/cluster/run.py --layout=2x2 --rows=single,auto,async,replicas4,ddp

transformer_lm trains on a corpus built at start (bench/runtime/corpus.py)
into the run's folder, which the daemons get as a data root.

Layout (--layout=2x1, the default): host 1 (198.18.0.1) runs the
coordinator, worker w-1 on core 0 and DDP's rank 0; host 2 (198.18.0.2)
runs w-2 on core 1 and rank 1. Nothing crosses loopback between them.
--layout=2x2: two workers per host (w-1, w-2 on host 1, w-3, w-4 on host 2;
each host's two on cores 0 and 1, so every core runs two workers, one of
each host), DDP on four ranks placed alike: fast inside a host (its own
address, not shaped), the shaped link between them. The link is shaped on the two veth ends
that feed the hosts (tc tbf, both directions); "unshaped" removes the
shaping (a bare veth pair through a bridge).

Rows (per model and link; `single` once per round, it uses no link):
  single     apapo-worker --local=1 on one core (bench/runtime's row)
  auto       ours, the planner's choice on the profile measured for this job
  async      ours, async 2-stage pipeline forced (planned cut)
  1f1b_flush ours, the synchronous 1F1B schedule (a flush per mini-batch)
  gpipe      and GPipe's, each on 2 stages with 4 micro-batches of 32
  replicas2  ours, data parallelism forced (1 stage x 2 replicas;
             replicasN: N replicas, e.g. replicas4 with --layout=2x2)
  stagesN    ours, async on N stages of one replica each (stages4 with
             --layout=2x2: all four workers busy, two to a core)
  ddp        PyTorch DDP, Gloo, rank per host
  ROW_onepass any of ours (auto_onepass) with every stage's backward in one
             pass, input gradients sent after the weight gradients
             (schedule.split_backward false)
  ROW_parts  any of ours (replicas2_parts) with a replicated stage's
             all-reduce in parts during the backward; ROW_after: one
             all-reduce after it (schedule.allreduce_in_backward true,
             false; unset, the planner's choice)
  ROW_dense  any of ours (auto_dense, auto_dense_bf16) with ReLU outputs
             crossing whole, zeros included (schedule.skip_zeros false)
  ROW_bf16   any of ours (auto_bf16, async_bf16, ...) with activations and
             gradients crossing the link in bfloat16 (transfer_precision)
  ROW_sN     any of ours (auto_s3, auto_bf16_s3) with schedule.max_staleness N
  ROW_mN     any of ours with schedule.micro_batches N (auto_m1: the
             planner's choice on whole mini-batches; after _sN, before _cN)
Rounds are interleaved (links, and rows within a link, reversed every
other round) because this machine's speed drifts; the table gives medians
and per-round ratios. Every ours row reports the plan's predicted samples/s
and the error (predicted / measured - 1), and beside it `sim err`: the
running plan simulated on the compute the run itself measured (the
coordinator's plan check) against the rate of the same window, the cost
model's own error with this machine's drift taken out.

The script runs as root: it brings the lab up (prefix "apb"), re-runs itself
inside host 1, and takes the lab down at the end, also on failure or
SIGTERM (every process in the hosts is killed with them). Where namespaces
are not allowed it prints why and exits 3. Results: results/<time>.json.
After the table it prints the goals, round by round: `auto` against the
best other row of its round (peers and ours forced; "same layout" where
`auto` ran that row's stages, replicas and micro-batches), how many predictions
were within 10% (raw, and on the run's own compute), and the mlp's `auto`
at 1 Gbit/s and below against its unshaped `auto` (goal 0.9) and DDP
(goal 3x). `--summarize=FILE` prints the table and the goals of a saved
results file (no lab, no root).
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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "runtime"))
import run as rt  # noqa: E402  (bench/runtime/run.py: processes, specs, Cluster)
from google.protobuf import text_format  # noqa: E402
from proto.apapo.v1 import job_pb2  # noqa: E402

LAB = os.path.join(ROOT, "deploy", "cluster-lab.sh")
PREFIX = "apb"
HOST = ("198.18.0.1", "198.18.0.2")
ROWS = ["single", "auto", "async", "1f1b_flush", "gpipe", "replicas2", "ddp"]
LINKS = ["unshaped", "10gbit", "1gbit", "100mbit"]
LAYOUTS = {"2x1": 1, "2x2": 2}  # workers per host, on two hosts


def is_ours(row):
    row = rt.row_variant(row)[0]
    return row in ("auto", "async", "1f1b_flush", "gpipe") or numbered(row, "replicas") or \
        numbered(row, "stages")


def numbered(row, prefix):
    """Whether `row` is `prefix` and a number (replicas4, stages4)."""
    return row.startswith(prefix) and row[len(prefix):].isdigit()


def on_host(i):
    """argv prefix running a command on emulated host i (1-based)."""
    return ("ip", "netns", "exec", f"{PREFIX}-h{i}")


def unavailable():
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc)"
    if not shutil.which("ip") or not shutil.which("tc") or not shutil.which("nsenter"):
        return "needs iproute2 (ip, tc) and util-linux (nsenter)"
    r = subprocess.run(["ip", "netns", "add", f"{PREFIX}probe"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return "network namespaces refused here: " + r.stderr.strip()
    subprocess.run(["ip", "netns", "delete", f"{PREFIX}probe"], capture_output=True)
    return None


def outer(argv):
    """Root namespace: the lab up, this script inside host 1, the lab down."""
    reason = unavailable()
    if reason:
        print(f"bench/cluster: cannot run here: {reason}", file=sys.stderr)
        return 3

    def lab(*args):
        subprocess.run(["bash", LAB, *args, f"--prefix={PREFIX}"], check=True, timeout=120)

    child = None

    def stop(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")
    signal.signal(signal.SIGTERM, stop)
    # One rack: both hosts on one bridge; the rate set here is replaced per link.
    lab("up", "--hosts=2", "--racks=1", "--rack-rate=10gbit")
    try:
        root_ns = f"/proc/{os.getpid()}/ns/net"
        child = subprocess.Popen([*on_host(1), rt.PY, os.path.abspath(__file__),
                                  f"--root_netns={root_ns}", *argv])
        return child.wait()
    finally:
        if child and child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        lab("down")


class Link:
    """Shapes the link between the two hosts: tbf on each host's veth end in
    the root namespace (what enters a host) and on each host's eth0 (what
    leaves it), or nothing for "unshaped"."""

    def __init__(self, root_netns):
        self.root = ("nsenter", f"--net={root_netns}")

    def set(self, rate):
        for i in (1, 2):
            for prefix, dev in ((self.root, f"{PREFIX}v{i}"), (on_host(i), "eth0")):
                subprocess.run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)
                if rate != "unshaped":
                    subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root",
                                    "tbf", "rate", rate, "burst", burst(rate), "latency", "50ms"],
                                   check=True, capture_output=True)


def burst(rate):
    """The token bucket the lab gives a link of this rate (2 ms of it, within
    16-256 KB): deploy/cluster-lab.sh keeps the rule."""
    return subprocess.run(["bash", LAB, "burst", rate], check=True, capture_output=True,
                          text=True).stdout.strip()


def measured_link(r):
    """The slowest link this job's profiling measured, MB/s."""
    links = [l["bytes_per_s"] for l in r.get("links", []) if l["bytes_per_s"] > 0]
    return min(links) / 1e6 if links else None


def summarize(results, models, links, rows):
    table = {}
    for model in models:
        rounds = results["rounds"].get(model, [])
        single = [r["single"]["samples_per_s"] for r in rounds
                  if "samples_per_s" in r.get("single", {})]
        table[model] = {"single": {"samples_per_s": single,
                                   "median": statistics.median(single) if single else None}}
        for link in links:
            t = table[model][link] = {}
            for row in rows:
                if row == "single":
                    continue
                base = rt.row_variant(row)[0]
                runs = [(r, r.get(link, {}).get(row, {})) for r in rounds]
                ok = [(r, x) for r, x in runs if "samples_per_s" in x]
                sps = [x["samples_per_s"] for _, x in ok]

                def ratio(other_link, other_row):
                    out = []
                    for r, x in ok:
                        o = (r.get("single") if other_row == "single"
                             else r.get(other_link, {}).get(other_row, {}))
                        if o and o.get("samples_per_s"):
                            out.append(x["samples_per_s"] / o["samples_per_s"])
                    return out
                errs = [x["predicted_samples_per_s"] / x["samples_per_s"] - 1 for _, x in ok
                        if x.get("predicted_samples_per_s")]
                cell = {
                    "samples_per_s": sps,
                    "median": statistics.median(sps) if sps else None,
                    "x_single": ratio(None, "single"),
                    "x_ddp": ratio(link, "ddp"),
                    "x_unshaped": ratio("unshaped", row) if link != "unshaped" else [],
                    # A ROW_bf16 / ROW_sN row against ROW's unshaped rate.
                    "x_unshaped_base": ratio("unshaped", base) if base != row else [],
                    "prediction_error": errs,
                    "model_error": [e for e in (model_error(x) for _, x in ok) if e is not None],
                    "plans": [x.get("plan") for _, x in ok],
                    "link_mb_per_s": [measured_link(x) for _, x in ok],
                    "failures": [x.get("error") for _, x in runs if x and "error" in x],
                }
                for k in ("x_single", "x_ddp", "x_unshaped", "x_unshaped_base",
                          "prediction_error", "model_error"):
                    cell["median_" + k] = statistics.median(cell[k]) if cell[k] else None
                t[row] = cell
    return table


# What issue 12 asks of these rounds: the planned mlp keeps >= 0.9 of its
# unshaped rate and beats DDP by >= 3x at 1 Gbit/s and below; ours planned
# is never below the best peer; every prediction is within 10%.
GOAL_X_UNSHAPED = 0.9
GOAL_X_DDP = 3.0
GOAL_PREDICTION_ERROR = 0.10


CHECK_RE = re.compile(r"plan checked against the run: measured ([0-9.]+) samples/s .*"
                      r"on these figures the running plan simulates at ([0-9.]+) samples/s")


def model_error(x):
    """The cost model's own error on a row: the running plan simulated on
    the compute the run measured (the coordinator's plan check, every job
    after its first steps) against the rate measured over the same window.
    What the raw prediction error has beyond it is this machine's compute
    drifting from what the job's profile measured. None without a check."""
    for check in x.get("plan_checks") or []:
        m = CHECK_RE.search(check)
        if m and float(m.group(1)) > 0:
            return float(m.group(2)) / float(m.group(1)) - 1
    return None


LAYOUT_RE = re.compile(r"(\d+) stage\(s\) x (\[[\d, ]*\]) replica\(s\), m=(\d+)")


def layout(row, x):
    """A row's stages, replicas per stage and micro-batches, from its plan;
    one process is one stage of one replica. None where unknown."""
    if row == "single":
        return ("1", "[1]")
    m = LAYOUT_RE.search(x.get("plan") or "")
    if not m:
        return None
    return m.groups() if m.group(2) != "[1]" else m.groups()[:2]


def goals(results, links, rows):
    """The goals above, measured per round (no medians: a round's rows ran
    minutes apart, rounds did not). `auto` against the best other row of
    its round, model and link: the peers (one process, DDP, Pipe) and ours
    forced (replicasN, async, stagesN, ...), since a plan the planner chose
    that runs slower than one it rejected is a cost-model bug; variants of
    auto (auto_bf16, auto_m1) are other jobs, not alternatives. Where
    `auto` ran the best row's own layout (its stages, replicas and
    micro-batches; one worker against one process), a ratio below 1 is two
    runs of one plan, not a plan rejected: `same_layout` says so."""
    out = {"auto_vs_best_other": [], "predictions": {"rows": 0, "within": 0, "misses": []},
           "model": {"rows": 0, "within": 0, "misses": []}, "mlp_slow_links": []}
    for model, rounds in results["rounds"].items():
        for i, r in enumerate(rounds):
            for link in links:
                cells = r.get(link, {})
                for row in rows:
                    x = cells.get(row, {})
                    pred, sps = x.get("predicted_samples_per_s"), x.get("samples_per_s")
                    # Raw, and on the run's own compute (model_error).
                    for key, err in (("predictions", pred / sps - 1 if pred and sps else None),
                                     ("model", model_error(x))):
                        if err is None:
                            continue
                        out[key]["rows"] += 1
                        if abs(err) <= GOAL_PREDICTION_ERROR:
                            out[key]["within"] += 1
                        else:
                            out[key]["misses"].append(
                                {"model": model, "link": link, "row": row, "round": i + 1,
                                 "error": err})
                auto = cells.get("auto", {}).get("samples_per_s")
                if not auto:
                    continue
                others = {row: cells.get(row, {}).get("samples_per_s") for row in rows
                          if row != "single" and rt.row_variant(row)[0] != "auto"}
                others["single"] = r.get("single", {}).get("samples_per_s")
                others = {k: v for k, v in others.items() if v}
                if others:
                    best = max(others, key=others.get)
                    mine = layout("auto", cells.get("auto", {}))
                    theirs = layout(best, cells.get(best, {}) if best != "single" else {})
                    out["auto_vs_best_other"].append(
                        {"model": model, "link": link, "round": i + 1, "best": best,
                         "ratio": auto / others[best],
                         "same_layout": mine is not None and mine == theirs})
                if model == "mlp" and link != "unshaped" and rate_bits(link) <= 1e9:
                    unshaped = r.get("unshaped", {}).get("auto", {}).get("samples_per_s")
                    ddp = cells.get("ddp", {}).get("samples_per_s")
                    out["mlp_slow_links"].append(
                        {"link": link, "round": i + 1,
                         "x_unshaped": auto / unshaped if unshaped else None,
                         "x_ddp": auto / ddp if ddp else None})
    return out


def goals_text(g):
    """goals() as the lines the bench prints after its table."""
    lines = ["\ngoals:"]
    vs = g["auto_vs_best_other"]
    if vs:
        below = [v for v in vs if v["ratio"] < 1]
        same = [v for v in below if v.get("same_layout")]
        lines.append(
            f"  auto against the best other row of its round: {len(vs) - len(below)} of "
            f"{len(vs)} at or above it"
            + ("; below: " + ", ".join(
                f"{v['model']} {v['link']} round {v['round']} {v['ratio']:.2f}x {v['best']}"
                + (" (same layout)" if v.get("same_layout") else "")
                for v in below) if below else "")
            + (f"; {len(same)} of those {len(below)} ran the row's own layout (two runs of "
               f"one plan: this machine's noise, not a plan rejected)" if same else ""))
    for key, label in (("predictions", "predictions within"),
                       ("model", "on the run's own compute (the plan check's simulation), "
                                 "within")):
        p = g.get(key, {})
        if p.get("rows"):
            lines.append(
                f"  {label} {GOAL_PREDICTION_ERROR:.0%}: {p['within']} of {p['rows']} rows"
                + ("; misses: " + ", ".join(
                    f"{m['model']} {m['link']} {m['row']} round {m['round']} {m['error']:+.0%}"
                    for m in p["misses"]) if p["misses"] else ""))
    for m in g["mlp_slow_links"]:
        def f(v, goal):
            return "-" if v is None else f"{v:.2f}" + (" (goal met)" if v >= goal else
                                                         f" (goal {goal:g})")
        lines.append(f"  mlp {m['link']} round {m['round']}: auto x unshaped auto "
                     f"{f(m['x_unshaped'], GOAL_X_UNSHAPED)}, x DDP {f(m['x_ddp'], GOAL_X_DDP)}")
    return "\n".join(lines) if len(lines) > 1 else ""


def summarize_file(path):
    """--summarize: the table and goals of a saved results file, printed."""
    try:
        with open(path) as f:
            results = json.load(f)
        args = results["args"]
        links, rows = args["links"].split(","), args["rows"].split(",")
        models = list(results["rounds"])
    except (OSError, ValueError, KeyError, AttributeError) as e:
        sys.exit(f"--summarize: {path}: not a results file of this bench ({e})")
    print_table(summarize(results, models, links, rows), links, rows)
    print(goals_text(goals(results, links, rows)), flush=True)
    return 0


def ran(cell):
    """Whether a table cell's row ran (--rounds=0 leaves every cell empty)."""
    return bool(cell and (cell["samples_per_s"] or cell["failures"]))


def print_table(table, links, rows):
    lines = []
    for model, t in table.items():
        s = t["single"]
        if not s["samples_per_s"] and not any(
                ran(c) for link in links for c in t.get(link, {}).values()):
            continue  # no rounds (--rounds=0: accuracy runs only)
        lines.append(f"\n{model}: single process, 1 core: "
                     + ", ".join(f"{v:.0f}" for v in s["samples_per_s"]) + " samples/s")
        lines.append(f"  {'link':9}{'row':10}{'samples/s':>10}{'x single':>9}{'x DDP':>7}"
                     f"{'x unshaped':>11}{'pred err':>9}{'sim err':>8}{'link MB/s':>10}"
                     "  plan (first round)")
        for link in links:
            for row in rows:
                c = t.get(link, {}).get(row)
                if not ran(c):
                    continue  # not run: no row, not a failure

                def f(v, pct=False):
                    if v is None:
                        return "-"
                    return f"{100 * v:+.0f}%" if pct else f"{v:.2f}"
                mb = [v for v in c["link_mb_per_s"] if v]
                sps = "%.0f" % c["median"] if c["median"] else "FAILED"
                mbs = "%.0f" % statistics.median(mb) if mb else "-"
                plan = (c["plans"][0] or "") if c["plans"] else "; ".join(c["failures"])[:120]
                lines.append(
                    f"  {link:9}{row:10}{sps:>10}"
                    f"{f(c['median_x_single']):>9}{f(c['median_x_ddp']):>7}"
                    f"{f(c['median_x_unshaped']):>11}{f(c['median_prediction_error'], True):>9}"
                    f"{f(c.get('median_model_error'), True):>8}{mbs:>10}  {plan}")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def inner(a):
    models = a.models.split(",")
    unknown = [m for m in models if m not in rt.SPECS]
    if unknown:
        sys.exit(f"--models: unknown {unknown} (known: {', '.join(rt.SPECS)})")
    timed_steps = {"mlp": a.mlp_steps, "cnn": a.cnn_steps, "transformer_lm": a.lm_steps}
    links = a.links.split(",")
    rows = a.rows.split(",")
    bad_rows = [r for r in rows if r not in ROWS and not numbered(r, "replicas") and not
                numbered(r, "stages") and not (rt.row_variant(r)[0] != r and is_ours(r))]
    if bad_rows:
        sys.exit(f"--rows: unknown {bad_rows} (known: {', '.join(ROWS)}, replicasN, stagesN; "
                 f"ours as ROW_onepass (backward in one pass), ROW_parts/ROW_after (the "
                 f"all-reduce in the backward or after it), ROW_dense (zeros cross too), "
                 f"ROW_bf16 (transfers in bfloat16), "
                 f"ROW_sN (max_staleness N), "
                 f"ROW_cN (a checkpoint every N steps))")
    try:
        text_format.Merge(a.schedule, job_pb2.ScheduleSpec())
    except text_format.ParseError as e:
        sys.exit(f"--schedule: {e}")
    rt.SCHEDULE_EXTRA = a.schedule
    if a.save_plans:
        os.makedirs(a.save_plans, exist_ok=True)
        rt.SAVE_PLANS = os.path.abspath(a.save_plans)
    if a.seed is not None:
        if a.seed < 0:
            sys.exit(f"--seed: {a.seed} is negative")
        rt.SEED = a.seed
    accuracy = [tuple(item.split(":")) for item in filter(None, a.accuracy.split(","))]
    bad_acc = [":".join(x) for x in accuracy
               if len(x) != 3 or x[0] not in rt.SPECS or not is_ours(x[2])
               or (x[1] != "unshaped" and not x[1].endswith("bit"))]
    if bad_acc:
        sys.exit(f"--accuracy: {bad_acc} is not MODEL:LINK:ROW with one of our rows")
    if a.layout not in LAYOUTS:
        sys.exit(f"--layout: {a.layout!r} is not one of {', '.join(LAYOUTS)}")
    per_host = LAYOUTS[a.layout]
    bad = [l for l in links if l != "unshaped" and not l.endswith("bit")]
    if bad:
        sys.exit(f"--links: {bad} is not 'unshaped' or a tc rate like 1gbit")
    link = Link(a.root_netns)
    workdir = tempfile.mkdtemp(prefix="apapo-bench-cluster-")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(a.out, exist_ok=True)
    out_path = os.path.join(a.out, f"{stamp}.json")
    results = {"started": stamp, "machine": rt.machine(), "blas": rt.blas(),
               "args": vars(a), "workdir": workdir, "rounds": {m: [] for m in models}}
    try:
        results["commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    except OSError:
        pass

    def save():
        results["table"] = summarize(results, models, links, rows)
        results["goals"] = goals(results, links, rows)
        results["elapsed_s"] = time.time() - rt.T0
        with open(out_path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(out_path + ".tmp", out_path)

    # (worker id, core, address, argv prefix): host by host, core by core.
    workers = tuple((f"w-{h * per_host + c + 1}", (h + c) % 2, HOST[h],
                     on_host(h + 1) if h else ())
                    for h in range(2) for c in range(per_host))
    cluster = None
    try:
        # The corpus also for a transformer_lm only in --accuracy.
        text = rt.prepare_text(models + [m for m, _, _ in accuracy], workdir)
        results["corpus"] = text
        text_path = text["path"] if text else ""
        if any(is_ours(r) for r in rows) or accuracy:
            # --insecure: the lab's hosts are namespaces of this machine only.
            cluster = rt.Cluster(workdir, workers=workers, host=HOST[0],
                                 extra_flags=("--insecure",), text_path=text_path)
            rt.log(f"coordinator on {HOST[0]}:{cluster.port}; " + ", ".join(
                f"{w} on host {HOST.index(h) + 1} (core {c})" for w, c, h, _ in workers))
        ranks = tuple((core, address, prefix) for _, core, address, prefix in workers)
        for rnd in range(a.rounds):
            for model in models:
                full = a.warmup + timed_steps[model]
                this = {}
                if "single" in rows:
                    this["single"] = rt.run_local(model, "single", full, 1, workdir,
                                                  a.run_timeout_s, text_path)
                    rt.log(f"round {rnd + 1} {model} single: "
                           f"{this['single'].get('samples_per_s', 0):.0f} samples/s")
                for l in (links if rnd % 2 == 0 else links[::-1]):
                    link.set(l)
                    this[l] = {}
                    for row in (rows if rnd % 2 == 0 else rows[::-1]):
                        if row == "single":
                            continue
                        # On slow links, where an all-reduce takes seconds,
                        # data parallelism gets a short run: the peer's DDP
                        # --dp_warmup + --dp_steps, ours --warmup +
                        # --dp_ours_steps. Ours reports its rate from step
                        # kRateWarmupSteps (10) on, and a run of 20 steps or
                        # fewer reports it over every step, warm-up included
                        # (replicasN at 1 Gbit/s ran 12 steps and read 0.75x
                        # its steady rate), so its run stays above 20.
                        slow = l != "unshaped" and rate_bits(l) <= 1e9
                        short = slow and row == "ddp"
                        steps = (a.dp_warmup + a.dp_steps) if short else full
                        if slow and row.startswith("replicas"):
                            steps = min(full, a.warmup + a.dp_ours_steps)
                        warm = a.dp_warmup if short else a.warmup
                        t = time.time()
                        if is_ours(row):
                            r = cluster.run(model, row, steps, 1, a.run_timeout_s)
                        else:
                            r = rt.run_peer(model, row, steps, 1, workdir, a.run_timeout_s,
                                            warm, ranks=ranks,
                                            extra_env={"GLOO_SOCKET_IFNAME": "eth0"},
                                            text_path=text_path)
                        r["steps_run"] = steps
                        this[l][row] = r
                        pred = r.get("predicted_samples_per_s")
                        rt.log(f"round {rnd + 1} {model} {l:8} {row:9} "
                               + (f"{r['samples_per_s']:7.1f} samples/s"
                                  + (f", predicted {pred:.0f} ({pred / r['samples_per_s'] - 1:+.0%})"
                                     if pred else "")
                                  + (f", link {measured_link(r):.0f} MB/s" if measured_link(r) else "")
                                  + (f"  [{r.get('plan')}]" if r.get("plan") else "")
                                  if "samples_per_s" in r else f"FAILED {r.get('error', '')[:300]}")
                               + f"  ({time.time() - t:.0f}s)" + rt.loss_note(r))
                results["rounds"][model].append(this)
                save()
        # Accuracy: full runs of --epochs, one per item, after the rounds.
        results["accuracy"] = []
        for model, l, row in accuracy:
            link.set(l)
            t = time.time()
            r = cluster.run(model, row, 0, a.epochs, a.run_timeout_s * 3)
            r.update(model=model, link=l, row=row, epochs=a.epochs)
            results["accuracy"].append(r)
            acc = r.get("final_test_accuracy")
            rt.log(f"accuracy {model} {l} {row}: "
                   + (f"{100 * acc:.2f}% after {a.epochs} epochs at "
                      f"{r['samples_per_s']:.0f} samples/s  [{r.get('plan')}]"
                      if acc is not None else f"FAILED {r.get('error', '')[:300]}")
                   + f"  ({time.time() - t:.0f}s)")
            save()
    finally:
        if cluster:
            cluster.close()
        save()
        # The daemons' checkpoints and data there run to gigabytes a run;
        # the results JSON holds what the run measured.
        if not a.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    results["table_text"] = print_table(results["table"], links, rows)
    results["goals_text"] = goals_text(results["goals"])
    print(results["goals_text"], flush=True)
    save()
    rt.log(f"results: {out_path}")
    return 0


def rate_bits(rate):
    for suffix, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1)):
        if rate.endswith(suffix):
            return float(rate[:-len(suffix)]) * scale
    raise ValueError(rate)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", default=",".join(LINKS))
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--layout", default="2x1",
                    help="2x1: one worker per host; 2x2: two per host (fast inside a "
                         "host, the shaped link between)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--mlp_steps", type=int, default=100)
    ap.add_argument("--cnn_steps", type=int, default=30)
    ap.add_argument("--lm_steps", type=int, default=60,
                    help="timed steps per transformer_lm run (batch 32)")
    ap.add_argument("--dp_warmup", type=int, default=2,
                    help="warm-up steps of the DDP row at <= 1 Gbit/s, "
                         "where one step takes seconds")
    ap.add_argument("--dp_steps", type=int, default=10)
    ap.add_argument("--dp_ours_steps", type=int, default=15,
                    help="timed steps of ours forced to data parallelism "
                         "(replicasN) at <= 1 Gbit/s, after --warmup; their "
                         "sum must exceed 20 (ours counts its rate from step 10 "
                         "only in longer runs)")
    ap.add_argument("--run_timeout_s", type=float, default=600)
    ap.add_argument("--accuracy", default="",
                    help="MODEL:LINK:ROW,... after the rounds, one full run of each of "
                         "ours for --epochs on that link, its final test accuracy "
                         "reported (e.g. mlp:100mbit:auto,mlp:100mbit:auto_bf16)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs of --accuracy runs")
    ap.add_argument("--seed", type=int, default=None,
                    help="spec.seed of every run (initial weights, shuffling); "
                         "unset: each model's spec's (1)")
    ap.add_argument("--schedule", default="",
                    help="ScheduleSpec fields in text format set in every job of ours, "
                         "e.g. \"max_staleness: 1\"")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--save_plans", default="", metavar="DIR",
                    help="write what each job of ours was planned on to DIR/JOB-TIME."
                         "{spec,profile,cluster}.pb and its plan to DIR/JOB-TIME.plan.pb "
                         "(binary protos), to plan again with bazel-bin/cli/apapo-replan")
    ap.add_argument("--keep_workdir", action="store_true",
                    help="keep the run's folder (logs, checkpoints) instead of removing it")
    ap.add_argument("--summarize", default="", metavar="RESULTS_JSON",
                    help="print the table and the goals of a saved results file "
                         "(no lab, no root) and exit")
    ap.add_argument("--root_netns", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.summarize:
        return summarize_file(a.summarize)
    if a.warmup + a.dp_ours_steps <= 20:
        ap.error("--warmup + --dp_ours_steps must exceed 20: ours reports its "
                 "rate after its first 10 steps only in runs longer than 20")
    if not a.root_netns:
        return outer(sys.argv[1:])
    for path in (rt.WORKER, rt.COORDINATOR):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} missing: run `bazel build //...` first")
    signal.signal(signal.SIGTERM, rt._terminate)
    return inner(a)


if __name__ == "__main__":
    sys.exit(main())
