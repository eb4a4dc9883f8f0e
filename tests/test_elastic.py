"""Elastic jobs, caused for real: a worker daemon killed (SIGKILL) or stopped
(SIGSTOP) mid-run, and too few workers left. The coordinator stops the
surviving stages, re-plans on the workers still there and resumes from the
newest checkpoint (keyed by layer, so it loads into the new plan); what the
user sees is asserted through the API, apapoctl and /metrics, and that no
stage process is left behind."""

import collections
import glob
import hashlib
import os
import re
import signal
import subprocess
import unittest
import urllib.request

from lib import apapo_testlib as t
from lib.cluster import Cluster

from proto.apapo.v1 import job_pb2  # noqa: E402
from google.protobuf import text_format  # noqa: E402

ENDED = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)
EVERY = 100  # steps between checkpoints
STEPS = 4700  # 5 epochs of Fashion-MNIST at 64 samples a step (a settled accuracy)
WORKERS = 3  # daemons of ElasticJobTest's cluster; the plan may use fewer
# ElasticJobTest's jobs and their references train in 2 stages, so that
# both run the same plans (see assert_accuracy_as_uninterrupted).
STAGES = 2


def spec(steps, workers, stages=0, replicas=0, **fault_tolerance):
    s = text_format.Parse(t.short_job(name="elastic", steps=steps, workers=workers),
                          job_pb2.JobSpec())
    s.schedule.stages = stages
    s.schedule.replicas = replicas
    s.checkpoint.every_steps = EVERY
    # A decaying rate, so that the final accuracy is a settled figure that
    # two runs can be compared by, not a point on a noisy plateau.
    s.optimizer.lr_schedule.warmup_steps = 50
    s.optimizer.lr_schedule.decay = job_pb2.LearningRateSchedule.DECAY_COSINE
    for key, value in fault_tolerance.items():
        if key == "replacement_wait_s":
            s.fault_tolerance.replacement_wait.seconds = value
        else:
            setattr(s.fault_tolerance, key, value)
    return s


def stage_processes(daemon_pids):
    """Stage child processes (apapo-worker --run_assignment) of these daemons."""
    return t.child_processes(daemon_pids, "--run_assignment")


# Of spec(STEPS, workers, STAGES, replicas) trained without a fault, by
# (workers, replicas), once per run: (test accuracy, plan_shape, digests of
# its final checkpoint).
_reference = {}


def plan_shape(plan):
    """What fixes a plan's arithmetic: its cuts, replicas, splits, schedule,
    micro-batches, in-flight bound and precision; not which worker runs
    what."""
    return (plan.schedule, plan.micro_batches, plan.in_flight, plan.transfer_precision,
            tuple((x.node_id, x.parts) for x in plan.splits),
            tuple((tuple(s.node_ids), len(s.placement)) for s in plan.stages))


# A job run with a fault: the job as it ended, the worker faulted, the
# workers it was placed on and the shape of the plan it started on.
Faulted = collections.namedtuple("Faulted", "job victim placed shape_before")


class ElasticJobTest(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(workers=WORKERS)
        self.stopped = []

    def tearDown(self):
        for p in self.stopped:
            p.proc.send_signal(signal.SIGCONT)
        self.cluster.close()

    def placed(self, job_id):
        from proto.apapo.v1 import service_pb2
        plan = self.cluster.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
        return sorted({r.worker_id for s in plan.plan.stages for r in s.placement}), plan

    def run_with_fault(self, fault, replicas=0):
        """Trains STEPS on 3 workers in STAGES stages of `replicas` (0: the
        planner's choice), causes `fault(process)` to a placed worker once
        a checkpoint exists, and returns the Faulted run."""
        c = self.cluster
        job_id = c.submit(spec(steps=STEPS, workers=WORKERS, stages=STAGES, replicas=replicas))
        c.watch_until(job_id, lambda m: m.job.state == job_pb2.JOB_STATE_RUNNING and
                      m.job.progress.step > STEPS // 3, timeout=300)
        placed, before = self.placed(job_id)
        victim = placed[-1]
        fault(c.workers[victim])
        job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=600)
        return Faulted(job, victim, placed, plan_shape(before.plan))

    def assert_restarted_once(self, run):
        job, victim, placed = run.job, run.victim, run.placed
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        self.assertEqual(job.restarts, 1)
        r = job.restart_history[0]
        self.assertIn(victim, r.lost_workers)
        self.assertIn(f"worker {victim}", r.cause)
        self.assertEqual(r.workers_before, len(placed))
        # Re-planned on the survivors: at most the cluster's workers less the
        # lost one. (Not fewer than before: when the plan left a worker idle,
        # it may stand in.)
        self.assertLessEqual(r.workers_after, WORKERS - len(r.lost_workers))
        self.assertNotIn(victim, job.worker_ids)
        # Resumed from a checkpoint, not from the start (step_at_fault is the
        # newest step reported, up to a second behind the stages); and it
        # trained on to the end.
        self.assertGreaterEqual(r.resumed_step, EVERY)
        self.assertEqual(r.resumed_step % EVERY, 0)
        self.assertLess(r.resumed_step, STEPS)
        self.assertGreaterEqual(r.step_at_fault, EVERY)
        self.assertGreater(r.seconds_lost, 0)
        self.assertGreaterEqual(job.progress.step, STEPS)
        # Nothing of the job still runs on the survivors.
        pids = {w.proc.pid for w in self.cluster.workers.values()}
        t.wait_until(lambda: not stage_processes(pids), 30, "stage processes to end")

    def final_checkpoint(self, job_id):
        """sha256 of each stage's weights and optimizer state at step STEPS."""
        d = glob.glob(os.path.join(self.cluster.dir, "checkpoints", f"{job_id}.*",
                                   f"step-{STEPS}"))
        self.assertEqual(len(d), 1, f"{job_id}: step-{STEPS} checkpoint")
        files = sorted(glob.glob(os.path.join(d[0], "stage-*.data")))
        self.assertTrue(files, d[0])
        digests = {}
        for f in files:
            with open(f, "rb") as data:
                digests[os.path.basename(f)] = hashlib.sha256(data.read()).hexdigest()
        return digests

    def assert_accuracy_as_uninterrupted(self, run, what, replicas=0, same_plan=False):
        """Within 0.5 point of the same spec trained without a fault, on the
        plan the job started on and on the plan it resumed on: each run
        once, on 3 and on 2 workers (the faulted one is replaced for them).
        The accuracy of an async pipeline depends on its plan (its depth
        above all, then its replicas). Left to itself, the planner took 2
        or 3 stages on 3 workers as profiling happened to measure: a job
        stopped on 3 stages and resumed on 2 ended at 87.82%, and in the
        next CI run a stopped job ended at 87.96% against references that
        settled at 88.49% and above. Job and references are pinned to 2
        stages (the planner still cuts, replicates and places), a job that
        trained on both plans lands between the two, and nothing is lost as
        long as it is no further than 0.5 point outside them. With
        `same_plan`, the job must also end bit-exact where the uninterrupted
        run on its plan ended (see below)."""
        c = self.cluster
        keys = [(WORKERS, replicas), (WORKERS - 1, replicas)]
        for key in keys:
            if key in _reference:
                continue
            if "w-4" not in c.workers:
                c.add_worker("w-4")
            ref_id = c.submit(spec(steps=STEPS, workers=key[0], stages=STAGES, replicas=replicas))
            ref = c.watch_until(ref_id, lambda m: m.job.state in ENDED, timeout=600)
            self.assertEqual(ref.state, job_pb2.JOB_STATE_SUCCEEDED, ref.error)
            self.assertEqual(ref.restarts, 0)
            _reference[key] = (ref.progress.test_accuracy,
                               plan_shape(self.placed(ref_id)[1].plan),
                               self.final_checkpoint(ref_id))
        refs = [_reference[key][0] for key in keys]
        job = run.job
        r = job.restart_history[0]
        self.assertEqual((r.stages_before, r.stages_after), (STAGES, STAGES))
        accuracy = job.progress.test_accuracy
        print(f"\nelastic: {what}; {r.stages_before} -> {r.stages_after} stage(s), "
              f"resumed from step {r.resumed_step}, {r.seconds_lost:.1f} s lost; accuracy "
              f"{100 * accuracy:.2f}% vs {100 * refs[0]:.2f}% ({WORKERS} workers) and "
              f"{100 * refs[1]:.2f}% ({WORKERS - 1}) uninterrupted", flush=True)
        self.assertGreaterEqual(accuracy, min(refs) - 0.005, what)
        self.assertLessEqual(accuracy, max(refs) + 0.005, what)
        if not same_plan:
            return
        # Resumed on the plan it started on (the idle worker stood in), the
        # job did the arithmetic of an uninterrupted run on that plan: the
        # checkpoint held everything training reads on, the schedule fixes
        # which weights each micro-batch sees, and weight prediction is
        # recomputed from the checkpoint to the bit. So it ends bit-exact,
        # weights and optimizer state, where that run ended. (Before the
        # lazy prediction matched the fused one, jobs drifted in the last
        # bits from the first step after the resume and ended 0.00-0.09
        # point off; one resumed without its momentum ended 0.20 below,
        # inside the band above.) Only when the re-plan cut differently
        # from the references (profiling noise) is there no exact twin.
        shape = plan_shape(self.placed(job.id)[1].plan)
        twins = [(acc, digests) for acc, ref_shape, digests in
                 (_reference[key] for key in keys)
                 if shape == run.shape_before == ref_shape]
        print(f"elastic: {what}: {len(twins)} uninterrupted run(s) on its plan", flush=True)
        for acc, digests in twins:
            self.assertEqual(accuracy, acc, f"{what}: resumed on its own plan")
            self.assertEqual(self.final_checkpoint(job.id), digests,
                             f"{what}: step {STEPS} differs from the uninterrupted run's")

    def test_worker_killed_mid_run_is_replanned_on_the_survivors(self):
        run = self.run_with_fault(lambda p: p.proc.send_signal(signal.SIGKILL))
        job, victim, placed = run.job, run.victim, run.placed
        self.assert_restarted_once(run)
        self.assertIn("lost", job.restart_history[0].cause)
        self.assert_accuracy_as_uninterrupted(run, f"killed {victim}")
        c = self.cluster
        # What the user sees: apapoctl get, and the restart on /metrics.
        ctl = t.binary("cli", "apapoctl")
        r = subprocess.run([ctl, f"--coordinator=127.0.0.1:{c.port}", "get", job.id],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("restarts: 1", r.stdout)
        self.assertRegex(r.stdout, rf"# restart 1: worker {victim} lost: .*; "
                                   rf"\d -> \d stage\(s\), {len(placed)} -> \d worker\(s\); "
                                   r"resumed from step \d+ \(fault at step \d+\), "
                                   r"[0-9.]+ s lost")
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics",
                                    timeout=10) as m:
            text = m.read().decode()
        self.assertRegex(text, r"(?m)^apapo_job_restarts_total 1$")
        self.assertRegex(text, r"(?m)^apapo_job_recovery_seconds_count 1$")

    def test_stopped_worker_is_found_silent_and_replanned_around(self):
        def stop(p):
            p.proc.send_signal(signal.SIGSTOP)
            self.stopped.append(p)
        # One replica a stage: the plan leaves one worker idle, which
        # stands in for the stopped one, and the job resumes on the plan it
        # started on (the killed worker's job above may change plans).
        run = self.run_with_fault(stop, replicas=1)
        self.assert_restarted_once(run)
        self.assertIn("heartbeat", run.job.restart_history[0].cause)
        self.assert_accuracy_as_uninterrupted(run, f"stopped {run.victim}", replicas=1,
                                              same_plan=True)


class CoordinatorRestartTest(unittest.TestCase):
    def test_training_goes_on_while_the_coordinator_is_killed_and_restarted(self):
        c = Cluster(workers=2)
        try:
            job_id = c.submit(spec(steps=1500, workers=2))
            c.watch_until(job_id, lambda m: m.job.state == job_pb2.JOB_STATE_RUNNING and
                          m.job.progress.step > 50, timeout=300)
            daemons = {w.proc.pid for w in c.workers.values()}
            placed = {r.worker_id for r in c.get(job_id).progress.stages}
            t.wait_until(lambda: len(stage_processes(daemons)) >= 1, 30, "stage processes")
            before = sorted(stage_processes(daemons))
            step_before = c.get(job_id).progress.step
            c.restart_coordinator()
            # The daemons register again with the stages they train; the
            # coordinator adopts them: the same processes, never stopped.
            c.watch_until(job_id, lambda m: "adopted: all" in m.event.message, timeout=120)
            self.assertEqual(sorted(stage_processes(daemons)), before)
            job = c.get(job_id)
            self.assertEqual(job.state, job_pb2.JOB_STATE_RUNNING)
            # Progress goes on from where it was, not from an old save.
            c.watch_until(job_id, lambda m: m.job.progress.step >= step_before, timeout=120)
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=600)
            self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
            self.assertEqual(job.restarts, 0)
            self.assertGreaterEqual(job.progress.step, 1500)
            self.assertTrue(job.progress.HasField("test_accuracy"))
            self.assertTrue(placed)
            t.wait_until(lambda: not stage_processes(daemons), 30, "stage processes to end")
        finally:
            c.close()


class GrowTest(unittest.TestCase):
    def test_an_idle_worker_joins_a_running_job_below_its_max_workers(self):
        c = Cluster(workers=1, coordinator_flags=["--growth_min_remaining=5s",
                                                  "--growth_check_every=1s"])
        try:
            s = spec(steps=1200, workers=1, max_workers=2)
            # Wide enough layers that a second worker is predicted to pay.
            s.model.builtin.hyper_parameters["hidden"].i = 1024
            s.model.builtin.hyper_parameters["layers"].i = 4
            job_id = c.submit(s)
            c.watch_until(job_id, lambda m: m.job.state == job_pb2.JOB_STATE_RUNNING and
                          m.job.progress.step > 0, timeout=300)
            c.add_worker("w-2")
            # The planner predicts a gain worth a restart: w-2 is reserved
            # and taken in at the next checkpoint.
            c.watch_until(job_id, lambda m: re.match(
                r"w-2 idle: the planner predicts \d+\.\d\dx the samples/s with it "
                r"\(1\.20x needed\); taking it in after the checkpoint of step \d+",
                m.event.message), timeout=120)
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=600)
            self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
            self.assertEqual(job.restarts, 1)
            r = job.restart_history[0]
            self.assertRegex(r.cause, r"^w-2 joined: predicted \d+\.\d\dx the samples/s$")
            self.assertEqual((r.workers_before, r.workers_after), (1, 2))
            self.assertGreater(r.resumed_step, 0)
            self.assertEqual(r.resumed_step % EVERY, 0)
            self.assertEqual(sorted(job.worker_ids), ["w-1", "w-2"])
            self.assertGreaterEqual(job.progress.step, 1200)
        finally:
            c.close()


class TooFewWorkersTest(unittest.TestCase):
    def test_job_waits_for_capacity_then_fails_saying_why(self):
        c = Cluster(workers=2)
        try:
            # Two stages: the job holds both workers (on a loaded machine the
            # planner may find the mlp best on one and release the other,
            # which then is an idle worker the wait names).
            job_id = c.submit(spec(steps=1_000_000, workers=2, stages=2, min_workers=2,
                                   replacement_wait_s=3))
            c.watch_until(job_id, lambda m: m.job.progress.step > 0, timeout=300)
            c.workers["w-2"].proc.send_signal(signal.SIGKILL)
            waited = c.watch_until(job_id, lambda m: "waiting for capacity" in
                                   m.event.message, timeout=120)
            self.assertEqual(waited.state, job_pb2.JOB_STATE_RECOVERING)
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=120)
            self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
            self.assertRegex(job.error, r"worker w-2 lost: .*; only 1 worker\(s\) left: "
                                        r"w-1 and no idle matching worker came within "
                                        r"spec\.fault_tolerance\.replacement_wait \(3s\); "
                                        r"min_workers is 2")
            pids = {w.proc.pid for w in c.workers.values()}
            t.wait_until(lambda: not stage_processes(pids), 30, "stage processes to end")
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()
