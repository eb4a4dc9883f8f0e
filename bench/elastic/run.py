#!/usr/bin/python3
"""APapo elastic-training benchmark: what a lost worker and the checkpoints
that make it survivable cost, on loopback, on this machine. Run from the
repository root after `bazel build //... //proto/apapo/v1:py_stubs`:

  /usr/bin/python3 bench/elastic/run.py                        # all three (~20 min)
  /usr/bin/python3 bench/elastic/run.py --faults=2 --rounds=1 --goodput_minutes=0

1. recovery: a 3-worker job (tests/test_elastic.py's spec(): the SHORT_JOB
   mlp, 784-64-64-10, checkpoints every 100 steps) per fault; a placed
   worker daemon is killed (SIGKILL) mid-run; timed from the kill to the
   first step trained after the resume, by the coordinator
   (JobRestart.seconds_lost, from when it saw the fault) and by this client
   (kill -> first WatchJob progress whose step exceeds resumed_step), with
   the detection time (kill -> RECOVERING) and the steps redone. The job is
   cancelled once it trains again; the victim comes back under a new id.
2. checkpoint cost: examples/mlp_fashion_mnist.textproto (14M parameters)
   on 2 workers for --ckpt_steps steps, checkpoints at the coordinator's
   default interval (every_steps unset: 100) vs effectively off
   (every_steps > the run), interleaved A B A B ... for --rounds rounds.
   Besides the throughput ratio (which this 2-core machine's noise swamps
   below a few %), each A run's own accounting from /metrics: the seconds
   the training loops spent handing snapshots to the writer plus the
   writer threads' CPU, as a share of the loops' time (an upper bound of
   the cost: the writes' CPU counts in full even where it ran on a core a
   waiting stage left free).
3. goodput: the spec() job on 3 workers, sized to last --goodput_minutes
   without faults, run (a) without faults and (b) with a placed worker
   killed every --kill_every_s and a replacement daemon started right after.

Writes bench/elastic/results/<UTC timestamp>.json with every raw figure and
prints a summary. Every process and temporary folder it starts is removed on
exit, on failure or on SIGTERM.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, TESTS)  # as tests/lib/run_python_tests.py does

from lib import apapo_testlib as t  # noqa: E402  (puts bazel-bin on sys.path)
from lib.cluster import Cluster  # noqa: E402
from test_elastic import spec as elastic_spec, stage_processes  # noqa: E402

from google.protobuf import text_format  # noqa: E402
from proto.apapo.v1 import job_pb2, service_pb2  # noqa: E402

BIG_MLP = os.path.join(ROOT, "examples", "mlp_fashion_mnist.textproto")
ENDED = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)
RUNNING = job_pb2.JOB_STATE_RUNNING
RECOVERING = job_pb2.JOB_STATE_RECOVERING
T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def ts(timestamp):
    return timestamp.seconds + timestamp.nanos * 1e-9


def state_name(s):
    return job_pb2.JobState.Name(s)


class Watch:
    """Follows WatchJob on a thread of its own and keeps every message with
    the client's wall-clock time of receipt, so that the main thread can
    wait on conditions over the job's history with deadlines."""

    def __init__(self, cluster, job_id):
        self.job_id = job_id
        self.records = []  # (receipt time.time(), WatchJobResponse)
        self.cond = threading.Condition()
        self.done = False
        self.error = None
        self.stream = cluster.jobs.WatchJob(service_pb2.WatchJobRequest(job_id=job_id))
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for m in self.stream:
                with self.cond:
                    self.records.append((time.time(), m))
                    self.cond.notify_all()
                if m.job.state in ENDED:
                    break
        except Exception as e:  # cancelled, or the coordinator went away
            self.error = repr(e)
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def wait(self, predicate, timeout, what, start=0):
        """The first (time, message) from index `start` on for which
        predicate(message) holds, waiting up to `timeout` s."""
        deadline = time.monotonic() + timeout
        i = start
        with self.cond:
            while True:
                while i < len(self.records):
                    if predicate(self.records[i][1]):
                        return i, self.records[i]
                    i += 1
                if self.done:
                    raise RuntimeError(f"{self.job_id}: watch ended ({self.error}) before {what}; "
                                       f"last: {self.last()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.job_id}: no {what} within {timeout}s; "
                                       f"last: {self.last()}")
                self.cond.wait(left)

    def last(self):
        if not self.records:
            return None
        j = self.records[-1][1].job
        return f"{state_name(j.state)} step {j.progress.step}"

    def events(self, since_wall=None):
        """[(seconds after since_wall by the event's own time, state, message)]."""
        out = []
        with self.cond:
            for _, m in self.records:
                if m.HasField("event"):
                    e = m.event
                    at = ts(e.time)
                    out.append({"t": round(at - since_wall, 3) if since_wall else at,
                                "state": state_name(e.state), "message": e.message})
        return out

    def close(self):
        self.stream.cancel()
        self.thread.join(10)


def placed_workers(cluster, job_id):
    plan = cluster.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
    return sorted({r.worker_id for s in plan.plan.stages for r in s.placement})


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Bench:
    def __init__(self, args):
        self.a = args
        self.clusters = []
        self.orphans = set()  # stage processes of killed daemons, killed on exit
        self.next_id = 100

    # ------------------------------------------------------------ helpers
    def cluster(self, workers):
        c = Cluster(workers=workers)
        self.clusters.append(c)
        return c

    def close(self, c):
        try:
            c.close()
        finally:
            shutil.rmtree(c.dir, ignore_errors=True)
            if c in self.clusters:
                self.clusters.remove(c)

    def close_all(self):
        for c in list(self.clusters):
            try:
                self.close(c)
            except Exception as e:
                log(f"closing a cluster: {e!r}")
        for pid in self.orphans:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def kill(self, c, worker_id):
        """kill -9 of a worker daemon; returns (kill wall time, its stage pids)."""
        p = c.workers.pop(worker_id)
        stages = stage_processes({p.proc.pid})
        at = time.time()
        p.proc.send_signal(signal.SIGKILL)
        p.stop()
        self.orphans.update(stages)
        return at, stages

    def new_worker(self, c):
        self.next_id += 1
        wid = f"w-{self.next_id}"
        c.add_worker(wid)
        return wid

    # ------------------------------------------------------------ 1. recovery
    def recovery(self, results):
        a = self.a
        c = self.cluster(3)
        out = results["recovery"] = {"spec": "tests/test_elastic.py spec(): SHORT_JOB mlp "
                                     "784-64-64-10, batch 64, async, checkpoint every 100 steps",
                                     "steps": a.rec_steps, "faults": []}
        try:
            for i in range(a.faults):
                s = elastic_spec(steps=a.rec_steps, workers=3)
                s.name = f"bench-recovery-{i + 1}"
                job_id = c.submit(s)
                w = Watch(c, job_id)
                try:
                    # Kill points spread over the checkpoint interval, so the
                    # steps redone are not always the same.
                    kill_step = a.kill_step + (i * 37) % 100
                    _, (t_run, _) = w.wait(lambda m: m.job.state == RUNNING and
                                           m.job.progress.step >= kill_step, 300,
                                           f"step {kill_step}")
                    victim = placed_workers(c, job_id)[-1]
                    idx = len(w.records)
                    killed_at, stages = self.kill(c, victim)
                    i_rec, (t_rec, m_rec) = w.wait(lambda m: m.job.state == RECOVERING, 120,
                                                   "RECOVERING", start=idx)
                    _, (t_again, m_again) = w.wait(
                        lambda m: m.job.restart_history and
                        m.job.restart_history[-1].seconds_lost > 0 and
                        m.job.progress.step > m.job.restart_history[-1].resumed_step and
                        m.job.state == RUNNING, 300, "a step after the resume", start=idx)
                    r = m_again.job.restart_history[-1]
                    # The first progress update of the new attempt: after the
                    # job runs again, the first whose progress differs from the
                    # old attempt's last (which the job shows until then).
                    stale = m_rec.job.progress
                    i_back, _ = w.wait(lambda m: m.job.state == RUNNING, 1, "RUNNING again",
                                       start=i_rec)
                    _, (t_step, m_step) = w.wait(
                        lambda m: not m.HasField("event") and m.job.progress != stale and
                        m.job.progress.step > r.resumed_step, 60, "a new progress update",
                        start=i_back)
                    with w.cond:
                        trace = [[round(tm - killed_at, 3), state_name(m.job.state),
                                  m.job.progress.step,
                                  m.event.message if m.HasField("event") else None]
                                 for tm, m in w.records[idx - 2:]][:60]
                    orphaned = [p for p in stages if alive(p)]
                    f = {
                        "job": job_id, "victim": victim, "kill_step": kill_step,
                        "coordinator_seconds_lost": r.seconds_lost,
                        "client_kill_to_first_step_s": t_step - killed_at,
                        "client_kill_to_training_again_event_s": t_again - killed_at,
                        "detection_s": t_rec - killed_at,
                        "fault_seen_by_coordinator_after_kill_s": ts(r.time) - killed_at,
                        "resumed_step": r.resumed_step, "step_at_fault": r.step_at_fault,
                        "steps_redone": r.step_at_fault - r.resumed_step,
                        "first_step_seen": m_step.job.progress.step,
                        "stages_before": r.stages_before, "stages_after": r.stages_after,
                        "workers_before": r.workers_before, "workers_after": r.workers_after,
                        "cause": r.cause,
                        "victim_stage_pids": stages,
                        "victim_stage_pids_alive_after_recovery": orphaned,
                        "events_after_kill": [e for e in w.events(killed_at) if e["t"] > -1],
                        "run_to_kill_s": killed_at - t_run,
                        "client_trace": trace,
                    }
                    out["faults"].append(f)
                    log(f"fault {i + 1}: killed {victim} at step {kill_step}: detected "
                        f"{f['detection_s']:.2f}s, coordinator seconds_lost "
                        f"{r.seconds_lost:.2f}s, client kill->first step "
                        f"{f['client_kill_to_first_step_s']:.2f}s, resumed {r.resumed_step} "
                        f"(fault at {r.step_at_fault}), {r.stages_before}->{r.stages_after} "
                        f"stages; victim stages alive: {orphaned}")
                    c.jobs.CancelJob(service_pb2.CancelJobRequest(job_id=job_id), timeout=30)
                    w.wait(lambda m: m.job.state in ENDED, 120, "the end")
                finally:
                    w.close()
                pids = {p.proc.pid for p in c.workers.values()}
                t.wait_until(lambda: not stage_processes(pids), 60, "stage processes to end")
                self.new_worker(c)  # back to 3 idle workers
        finally:
            self.close(c)

    # ------------------------------------------------------------ 2. checkpoint cost
    def big_spec(self, every_steps, name):
        s = text_format.Parse(open(BIG_MLP).read(), job_pb2.JobSpec())
        s.name = name
        s.limits.ClearField("epochs")
        s.limits.max_steps = self.a.ckpt_steps
        if every_steps:
            s.checkpoint.every_steps = every_steps
        return s

    def checkpoint_accounting(self, c, job_id):
        """The job's stage time by activity and checkpoint-write CPU, summed
        over its stage replicas, from the coordinator's /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics",
                                    timeout=30) as m:
            text = m.read().decode()
        out = {"busy": 0.0, "idle": 0.0, "comm": 0.0, "checkpoint": 0.0, "write_cpu": 0.0}
        for line in text.splitlines():
            if f'job_id="{job_id}"' not in line or line.startswith("#"):
                continue
            value = float(line.rsplit(" ", 1)[1])
            if line.startswith("apapo_stage_checkpoint_write_cpu_seconds_total{"):
                out["write_cpu"] += value
            elif line.startswith("apapo_stage_time_seconds_total{"):
                for act in ("busy", "idle", "comm", "checkpoint"):
                    if f'activity="{act}"' in line:
                        out[act] += value
        loop = out["busy"] + out["idle"] + out["comm"] + out["checkpoint"]
        out["cost_upper_bound"] = ((out["checkpoint"] + out["write_cpu"]) / loop
                                   if loop > 0 else None)
        return out

    def throughput_run(self, c, s):
        job_id = c.submit(s)
        w = Watch(c, job_id)
        try:
            t_submit = time.time()
            _, (t_end, m_end) = w.wait(lambda m: m.job.state in ENDED, self.a.run_timeout_s,
                                       "the end")
        finally:
            w.close()
        job = m_end.job
        batch = s.data.batch_size
        # Steady window: progress updates from step >= warm-up to the last
        # one before the final step (the end's own checkpoint and evaluation
        # are outside it).
        prog = [(tm, m.job.progress.step) for tm, m in w.records
                if m.job.state == RUNNING and not m.HasField("event")]
        warm = self.a.warmup_steps
        win = [(tm, st) for tm, st in prog if warm <= st < s.limits.max_steps]
        rate = None
        if len(win) >= 2 and win[-1][1] > win[0][1]:
            rate = (win[-1][1] - win[0][1]) * batch / (win[-1][0] - win[0][0])
        start = ts(job.start_time) if job.HasField("start_time") else None
        end = ts(job.end_time) if job.HasField("end_time") else t_end
        return {
            "job": job_id, "state": state_name(job.state), "error": job.error,
            "steps": job.progress.step,
            "window_samples_per_s": rate,
            "window_steps": [win[0][1], win[-1][1]] if win else None,
            "window_s": win[-1][0] - win[0][0] if len(win) >= 2 else None,
            "final_progress_samples_per_s": job.progress.samples_per_second,
            "start_to_end_samples_per_s": (job.progress.step * batch / (end - start)
                                           if start else None),
            "submit_to_end_s": t_end - t_submit,
            "test_accuracy": (job.progress.test_accuracy
                              if job.progress.HasField("test_accuracy") else None),
            "restarts": job.restarts,
            "plan_workers": list(job.worker_ids),
            "accounting": self.checkpoint_accounting(c, job_id),
        }

    def checkpoint_cost(self, results):
        a = self.a
        c = self.cluster(2)
        out = results["checkpoint_cost"] = {
            "spec": "examples/mlp_fashion_mnist.textproto, limits.max_steps=%d" % a.ckpt_steps,
            "A": "checkpoint.every_steps unset (coordinator default 100)",
            "B": f"checkpoint.every_steps={10 * a.ckpt_steps} (never within the run)",
            "rounds": []}
        try:
            for rnd in range(a.rounds):
                this = {}
                order = ("A", "B") if rnd % 2 == 0 else ("B", "A")
                for arm in order:
                    s = self.big_spec(0 if arm == "A" else 10 * a.ckpt_steps,
                                      f"bench-ckpt-{arm}-{rnd + 1}")
                    r = self.throughput_run(c, s)
                    this[arm] = r
                    acc = r["accounting"]
                    log(f"checkpoint round {rnd + 1} {arm}: {r['state']} window "
                        f"{r['window_samples_per_s'] or 0:.0f} samples/s, start->end "
                        f"{r['start_to_end_samples_per_s'] or 0:.0f}, final progress "
                        f"{r['final_progress_samples_per_s']:.0f} ({r['submit_to_end_s']:.0f}s); "
                        f"checkpoint {acc['checkpoint']:.2f} s + write CPU "
                        f"{acc['write_cpu']:.2f} s of {acc['busy'] + acc['idle'] + acc['comm'] + acc['checkpoint']:.0f} s "
                        f"in the loops = {100 * (acc['cost_upper_bound'] or 0):.2f}%")
                for key in ("window_samples_per_s", "start_to_end_samples_per_s"):
                    if this["A"].get(key) and this["B"].get(key):
                        this[f"ratio_{key}"] = this["A"][key] / this["B"][key]
                out["rounds"].append(this)
                self.save(results)
        finally:
            self.close(c)

    # ------------------------------------------------------------ 3. goodput
    def goodput_run(self, c, steps, kill, out_list):
        s = elastic_spec(steps=steps, workers=3, max_restarts=20)
        s.name = "bench-goodput-" + ("faults" if kill else "clean")
        t_submit = time.time()
        job_id = c.submit(s)
        w = Watch(c, job_id)
        kills = []
        try:
            while True:
                try:
                    timeout = (t_submit + self.a.kill_every_s * (len(kills) + 1) - time.time()
                               if kill else self.a.run_timeout_s * 4)
                    _, (t_end, m_end) = w.wait(lambda m: m.job.state in ENDED,
                                               max(timeout, 0.01), "the end")
                    break
                except TimeoutError:
                    if not kill:
                        raise
                job = c.get(job_id)
                if job.state != RUNNING:
                    # Not training now (still recovering): kill at the next period.
                    kills.append({"skipped_state": state_name(job.state),
                                  "at_s": time.time() - t_submit})
                    continue
                victim = placed_workers(c, job_id)[-1]
                killed_at, _ = self.kill(c, victim)
                replacement = self.new_worker(c)
                kills.append({"victim": victim, "replacement": replacement,
                              "at_s": killed_at - t_submit, "step": job.progress.step})
                log(f"goodput: killed {victim} at {killed_at - t_submit:.0f}s (step "
                    f"{job.progress.step}), started {replacement}")
        finally:
            w.close()
        job = m_end.job
        wall = t_end - t_submit
        r = {"job": job_id, "state": state_name(job.state), "error": job.error,
             "steps": job.progress.step, "batch": s.data.batch_size,
             "submit_to_end_s": wall,
             "useful_samples_per_s": job.progress.step * s.data.batch_size / wall,
             "test_accuracy": (job.progress.test_accuracy
                               if job.progress.HasField("test_accuracy") else None),
             "restarts": job.restarts, "kills": kills,
             "restart_history": [{"cause": x.cause, "resumed_step": x.resumed_step,
                                  "step_at_fault": x.step_at_fault,
                                  "seconds_lost": x.seconds_lost,
                                  "stages": [x.stages_before, x.stages_after],
                                  "workers": [x.workers_before, x.workers_after]}
                                 for x in job.restart_history],
             "events": w.events(t_submit)}
        out_list.append(r)
        log(f"goodput {'with faults' if kill else 'clean'}: {r['state']} {r['steps']} steps "
            f"in {wall:.0f}s = {r['useful_samples_per_s']:.0f} samples/s, accuracy "
            f"{100 * (r['test_accuracy'] or 0):.2f}%, {job.restarts} restart(s)")
        return r

    def goodput(self, results):
        a = self.a
        rate = None
        faults = results.get("recovery", {}).get("faults", [])
        c = self.cluster(3)
        out = results["goodput"] = {"spec": "tests/test_elastic.py spec(), 3 workers, "
                                    "fault_tolerance.max_restarts=20", "runs": []}
        try:
            # Size the job from a short calibration run on this cluster.
            cal = elastic_spec(steps=a.calibrate_steps, workers=3)
            cal.name = "bench-goodput-calibrate"
            w = Watch(c, c.submit(cal))
            t_sub = time.time()
            try:
                _, (t_end, _) = w.wait(lambda m: m.job.state in ENDED, 600, "the end")
            finally:
                w.close()
            # Steady steps/s from its progress updates, plus its start-up
            # (submit to the first step): the job's length is start-up +
            # steps / rate.
            prog = [(tm, m.job.progress.step) for tm, m in w.records
                    if m.job.state == RUNNING and m.job.progress.step > 0]
            startup = prog[0][0] - t_sub
            rate = (prog[-1][1] - prog[0][1]) / (prog[-1][0] - prog[0][0])
            steps = max(500, int(rate * (a.goodput_minutes * 60 - startup)) // 100 * 100)
            out["calibration_startup_s"] = startup
            out.update(calibration_steps_per_s=rate, steps=steps, recovery_faults=len(faults))
            log(f"goodput: calibration {rate:.1f} steps/s steady, start-up {startup:.0f}s: {steps} steps")
            self.goodput_run(c, steps, False, out["runs"])
            self.save(results)
            self.goodput_run(c, steps, True, out["runs"])
            clean, faulty = out["runs"]
            out["ratio_useful_samples_per_s"] = (faulty["useful_samples_per_s"] /
                                                 clean["useful_samples_per_s"])
        finally:
            self.close(c)

    # ------------------------------------------------------------ output
    def save(self, results):
        results["elapsed_s"] = time.time() - T0
        results["summary"] = summarize(results)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, self.path)


def med(xs):
    xs = [x for x in xs if x is not None]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} \
        if xs else None


def summarize(r):
    s = {}
    f = r.get("recovery", {}).get("faults", [])
    if f:
        for key in ("coordinator_seconds_lost", "client_kill_to_first_step_s",
                    "client_kill_to_training_again_event_s", "detection_s", "steps_redone"):
            s[f"recovery_{key}"] = med([x[key] for x in f])
    rounds = r.get("checkpoint_cost", {}).get("rounds", [])
    if rounds:
        for key in ("window_samples_per_s", "start_to_end_samples_per_s"):
            s[f"ckpt_ratio_{key}"] = med([x.get(f"ratio_{key}") for x in rounds])
            for arm in ("A", "B"):
                s[f"ckpt_{arm}_{key}"] = med([x[arm].get(key) for x in rounds if arm in x])
        s["ckpt_A_cost_upper_bound"] = med([x["A"]["accounting"]["cost_upper_bound"]
                                            for x in rounds
                                            if "A" in x and "accounting" in x["A"]])
    g = r.get("goodput", {})
    if "ratio_useful_samples_per_s" in g:
        s["goodput_ratio"] = g["ratio_useful_samples_per_s"]
        s["goodput_accuracy"] = [x["test_accuracy"] for x in g["runs"]]
    return s


def machine():
    out = {"nproc": os.cpu_count(), "loadavg_before": open("/proc/loadavg").read().split()[:3]}
    try:
        out["commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return out


def _terminate(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")  # runs the cleanup in main


def main():
    signal.signal(signal.SIGTERM, _terminate)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="recovery,checkpoint,goodput")
    ap.add_argument("--faults", type=int, default=5, help="recovery: faults (one job each)")
    ap.add_argument("--rec_steps", type=int, default=2800, help="recovery: steps of each job")
    ap.add_argument("--kill_step", type=int, default=450,
                    help="recovery: kill once the job passed this step (+0..99, per fault)")
    ap.add_argument("--rounds", type=int, default=3, help="checkpoint cost: A/B rounds")
    ap.add_argument("--ckpt_steps", type=int, default=150,
                    help="checkpoint cost: steps of each big-mlp run")
    ap.add_argument("--warmup_steps", type=int, default=20,
                    help="checkpoint cost: the window starts at this step")
    ap.add_argument("--goodput_minutes", type=float, default=4.5,
                    help="goodput: the fault-free job's target length (0: skip)")
    ap.add_argument("--kill_every_s", type=float, default=120)
    ap.add_argument("--calibrate_steps", type=int, default=600)
    ap.add_argument("--run_timeout_s", type=float, default=600)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    parts = a.parts.split(",")
    if a.goodput_minutes <= 0 and "goodput" in parts:
        parts.remove("goodput")
    os.makedirs(a.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    b = Bench(a)
    b.path = os.path.join(a.out, f"{stamp}.json")
    results = {"started_utc": stamp, "machine": machine(), "args": vars(a),
               "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])}
    try:
        if "recovery" in parts:
            b.recovery(results)
            b.save(results)
        if "checkpoint" in parts:
            b.checkpoint_cost(results)
            b.save(results)
        if "goodput" in parts:
            b.goodput(results)
    except BaseException as e:
        results["error"] = repr(e)
        raise
    finally:
        b.close_all()
        results["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
        b.save(results)
        print(json.dumps(results["summary"], indent=1))
        log(f"results: {b.path}")


if __name__ == "__main__":
    main()
