"""The whole product on loopback: a coordinator, worker daemons and real
training jobs, driven through the gRPC API (Python client) and apapoctl."""

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import unittest
import urllib.request

import grpc

from lib import apapo_testlib as t
from lib.cluster import Cluster

from proto.apapo.v1 import job_pb2, service_pb2, service_pb2_grpc, worker_pb2  # noqa: E402
from google.protobuf import text_format  # noqa: E402


def spec(steps=300, workers=2):
    return text_format.Parse(t.short_job(steps=steps, workers=workers), job_pb2.JobSpec())


ENDED = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


class EndToEndTest(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(workers=2)

    def tearDown(self):
        self.cluster.close()

    def test_job_runs_to_success_with_plan_and_metrics(self):
        c = self.cluster
        job_id = c.submit(spec(steps=400))
        job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=600)
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        self.assertGreaterEqual(job.progress.step, 400)
        self.assertGreater(job.progress.samples_per_second, 0)
        plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
        self.assertGreaterEqual(len(plan.plan.stages), 1)
        self.assertTrue(plan.profile.nodes, "the plan comes from a measured profile")
        self.assertTrue(all(n.forward_seconds > 0 for n in plan.profile.nodes
                            if n.parameter_bytes > 0))
        placed = {r.worker_id for s in plan.plan.stages for r in s.placement}
        self.assertTrue(placed <= {"w-1", "w-2"}, placed)
        # The workers measured their link over Gloo, and the plan used the
        # measured figure rather than the 1 GB/s assumed without one.
        links = plan.cluster.links
        self.assertEqual({(l.from_worker, l.to_worker) for l in links},
                         {("w-1", "w-2"), ("w-2", "w-1")}, links)
        self.assertTrue(all(l.bandwidth_bytes_per_second > 0 and l.latency_seconds > 0
                            for l in links), links)
        planned = plan.cluster.levels[0].bandwidth_bytes_per_second
        self.assertEqual(planned, min(l.bandwidth_bytes_per_second for l in links))
        self.assertNotEqual(planned, 1e9)
        # The job checkpoints (the coordinator's default): each worker took
        # and wrote the whole state while profiling, into a scratch folder
        # of the job's checkpoint directory that is gone, and the plan
        # predicts the whole-run rate with a checkpoint's cost spread over
        # its interval.
        parameter_bytes = sum(n.parameter_bytes for n in plan.profile.nodes)
        self.assertEqual({m.worker_id for m in plan.cluster.checkpoints}, {"w-1", "w-2"})
        for m in plan.cluster.checkpoints:
            self.assertGreaterEqual(m.bytes, parameter_bytes, m)
            self.assertGreater(m.snapshot_seconds, 0, m)
            self.assertGreater(m.write_cpu_seconds, 0, m)
        prediction = plan.plan.prediction
        every = 100  # the coordinator's --checkpoint_every_steps default
        self.assertEqual(prediction.checkpoint_every_steps, every)
        self.assertGreater(prediction.checkpoint_seconds, 0)
        self.assertAlmostEqual(
            prediction.samples_per_second_with_checkpoints,
            prediction.samples_per_second * prediction.seconds_per_mini_batch /
            (prediction.seconds_per_mini_batch + prediction.checkpoint_seconds / every),
            delta=1e-6 * prediction.samples_per_second)
        root = os.path.join(c.dir, "checkpoints")
        folders = [e for e in os.listdir(root) if e.startswith(job_id + ".")]
        self.assertEqual(len(folders), 1, os.listdir(root))
        left = os.listdir(os.path.join(root, folders[0]))
        self.assertTrue(left, "the job wrote its checkpoints")
        self.assertEqual([e for e in left if not e.startswith("step-")], [])
        # Every placed rank, not only the last stage, fed the per-stage series:
        # busy seconds and the step-time histogram.
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
        for stage in plan.plan.stages:
            for rep in stage.placement:
                labels = f'job_id="{job_id}",stage="{stage.index}",worker="{rep.worker_id}"'
                busy = re.search(r'apapo_stage_time_seconds_total\{activity="busy",'
                                 + re.escape(labels) + r'\} ([0-9.e+-]+)', text)
                steps = re.search(r'apapo_stage_step_seconds_count\{' + re.escape(labels)
                                  + r'\} ([0-9]+)', text)
                self.assertTrue(busy and float(busy.group(1)) > 0, (labels, text[-2000:]))
                self.assertTrue(steps and int(steps.group(1)) > 0, (labels, text[-2000:]))
        states = c.worker_states()
        self.assertEqual(set(states.values()), {worker_pb2.WORKER_STATE_IDLE}, states)
        # apapoctl shows the same job and plan.
        ctl = t.binary("cli", "apapoctl")
        r = subprocess.run([ctl, f"--coordinator=127.0.0.1:{c.port}", "plan", job_id],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("predicted:", r.stdout)
        self.assertIn(f"predicted with a checkpoint every {every} steps", r.stdout)
        self.assertIn("the prediction with checkpoints)", r.stdout)
        self.assertIn("(slowest measured link)", r.stdout)
        self.assertIn("link w-1 -> w-2:", r.stdout)
        # Every stage's measured busy seconds per mini-batch beside its
        # prediction: each reported the 400 steps it ran.
        self.assertEqual({s.steps for s in job.progress.stages}, {400}, job.progress)
        self.assertIn("busy s/mb", r.stdout)
        for stage in plan.plan.stages:
            row = re.search(r"^%d .* ([0-9.]+)$" % stage.index, r.stdout, re.M)
            self.assertTrue(row and float(row.group(1)) > 0, r.stdout)
        r = subprocess.run([ctl, f"--coordinator=127.0.0.1:{c.port}", "watch", job_id],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"{job_id} succeeded", r.stdout)

    def test_the_plan_is_checked_against_the_run(self):
        """Once per attempt the coordinator measures steps 10-30 of every
        stage from their own counters and records the rate beside the
        plan's prediction, each placed worker's compute against the plan's,
        and (past 10%) the plan it would make on those figures; without
        schedule.replan_on_measurement it keeps the running one."""
        c = self.cluster
        s = spec(steps=500)
        # Wide enough that its stages report (every second) within the window.
        s.model.builtin.hyper_parameters["hidden"].i = 1024
        job, seen = c.run_to_end(c.submit(s))
        job_id = job.id
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        self.assertEqual(job.restarts, 0)
        plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30).plan
        placed = {r.worker_id for st in plan.stages for r in st.placement}
        checks = [e for e in seen if e.startswith("plan checked against the run: ")]
        self.assertEqual(len(checks), 1, seen)
        print("\n" + checks[0], flush=True)
        check = re.match(r"plan checked against the run: measured ([0-9.]+) samples/s "
                         r"over ([0-9]+) steps, predicted ([0-9.]+) \(([+-][0-9]+)%\); "
                         r"compute ([^;]*); (.*)$", checks[0])
        self.assertTrue(check, checks[0])
        self.assertGreaterEqual(int(check.group(2)), 20)
        self.assertAlmostEqual(float(check.group(3)), plan.prediction.samples_per_second,
                               delta=0.051)
        self.assertEqual(set(re.findall(r"x[0-9.]+ on (w-[0-9]+)", check.group(5))), placed)
        if abs(int(check.group(4))) <= 10:
            self.assertRegex(check.group(6), r"^within 10%; on these figures the running "
                                             r"plan simulates at [0-9.]+ samples/s$")
        else:
            self.assertRegex(check.group(6), r"^on these figures.*kept")
        # The same run measured two ways: the stages' accounted seconds over
        # the window, the last stage's steps over the whole run.
        self.assertLess(abs(float(check.group(1)) / job.progress.samples_per_second - 1),
                        0.5, (checks[0], job.progress.samples_per_second))

    def test_cancel_mid_run_frees_workers(self):
        c = self.cluster
        job_id = c.submit(spec(steps=1_000_000))
        c.watch_until(job_id, lambda m: m.job.progress.step > 0, timeout=300)
        # While it trains, every placed rank streams its counters (not only
        # the last stage at the end).
        plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
        placed = {r.worker_id for s in plan.plan.stages for r in s.placement}
        self.assertTrue(placed)
        c.watch_until(job_id, lambda m: m.job.state == job_pb2.JOB_STATE_RUNNING and
                      {s.worker_id for s in m.job.progress.stages
                       if s.busy_seconds > 0} >= placed, timeout=120)
        c.jobs.CancelJob(service_pb2.CancelJobRequest(job_id=job_id, reason="test"),
                         timeout=30)
        self.assertEqual(c.get(job_id).state, job_pb2.JOB_STATE_CANCELLED)
        # The workers are immediately reusable: a second job runs to the end.
        second = c.submit(spec(steps=50))
        job = c.watch_until(second, lambda m: m.job.state in ENDED, timeout=600)
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)

    def test_job_past_its_max_duration_is_stopped_and_fails_saying_why(self):
        c = self.cluster
        long_job = spec(steps=1_000_000)
        long_job.limits.max_duration.seconds = 20
        job_id = c.submit(long_job)
        job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=180)
        self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
        self.assertEqual(job.error_code, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        self.assertRegex(job.error, r"ran past spec\.limits\.max_duration \(20s\): "
                                    r"stopped after 2\d(\.\d)?s")
        # Its stages were stopped: both workers are free for the next job.
        states = c.worker_states()
        self.assertEqual(set(states.values()), {worker_pb2.WORKER_STATE_IDLE}, states)

    def test_worker_killed_mid_run_fails_job_naming_it_when_restarts_are_off(self):
        c = self.cluster
        s = spec(steps=1_000_000)
        s.fault_tolerance.max_restarts = 0  # on by default: see test_elastic
        # Two stages, so that w-2 is the job's: on a loaded machine the
        # planner may find this mlp best on one worker and release the other.
        s.schedule.stages = 2
        job_id = c.submit(s)
        c.watch_until(job_id, lambda m: m.job.progress.step > 0, timeout=300)
        c.workers["w-2"].proc.send_signal(signal.SIGKILL)
        job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=120)
        self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
        self.assertIn("w-2", job.error)
        self.assertIn("not restarted: spec.fault_tolerance.max_restarts (0) used up",
                      job.error)
        states = c.worker_states()
        self.assertEqual(states["w-1"], worker_pb2.WORKER_STATE_IDLE, states)
        self.assertEqual(states["w-2"], worker_pb2.WORKER_STATE_LOST, states)


class Cgroup:
    """A cgroup of this test process for `controller`, its limit files
    written as given (v1_files on cgroup v1's hierarchy of the controller,
    v2_files on v2's where the host runs v2 alone, in order); OSError where
    neither can be made. close() moves whatever is left to the parent and
    removes the group."""

    _ids = itertools.count(1)  # several groups in one test

    def __init__(self, controller, v1_files, v2_files):
        name = f"apapo-test-{os.getpid()}-{next(Cgroup._ids)}"
        v1 = f"/sys/fs/cgroup/{controller}"
        if os.path.exists(os.path.join(v1, next(iter(v1_files)))):
            self.parent, files = v1, v1_files
        else:
            self.parent, files = "/sys/fs/cgroup", v2_files
            with open(os.path.join(self.parent, "cgroup.controllers")) as f:
                if controller not in f.read().split():
                    raise OSError(f"no {controller} controller in cgroup v1 or v2")
        self.path = os.path.join(self.parent, name)
        os.mkdir(self.path)
        try:
            for file, value in files.items():
                self._write(file, value)
        except OSError:
            os.rmdir(self.path)
            raise

    def _write(self, name, value, path=None):
        with open(os.path.join(path or self.path, name), "w") as f:
            f.write(f"{value}\n")

    def close(self):
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            left = f.read().split()
        for pid in left:
            try:
                self._write("cgroup.procs", pid, self.parent)
            except OSError:
                pass  # ended meanwhile
        os.rmdir(self.path)


class CpuQuota(Cgroup):
    """A cpu cgroup holding the processes put in it to `share` of one core,
    enforced in periods of 4 ms: every burst of compute longer than the
    quota is stretched, however idle the process is between bursts (busy
    loops on its core would not do that: the scheduler serves a process
    that sleeps between short bursts first). cgroup v1's cpu controller, or
    v2's where the host runs v2 alone; OSError where neither can be made.
    close() moves whatever is left to the parent and removes the group."""

    PERIOD_US = 4000

    def __init__(self, share):
        quota = int(self.PERIOD_US * share)
        super().__init__("cpu", {"cpu.cfs_period_us": self.PERIOD_US, "cpu.cfs_quota_us": quota},
                         {"cpu.max": f"{quota} {self.PERIOD_US}"})
        self._stop = threading.Event()
        self._thread = None
        self._hog = None

    def add(self, pid):
        """Moves process `pid`, all its threads, into the group (threads it
        starts later are born in it)."""
        self._write("cgroup.procs", pid)

    def spend_what_is_left(self):
        """Starts a busy loop at nice 19 in the group: it spends whatever of
        each period's quota the held processes leave, so they cannot save
        it up. A held process then gets at most the share of every period
        however short its bursts, or less (the loop may have spent a period's
        quota before the process wakes; it runs first once both are ready,
        at 68x the loop's weight): all it does, compute and communication
        alike, is slowed, as on a slower core. Without it a stage
        with little work (a re-plan's small share) uses less than the quota
        and runs at full speed, while its longer bursts are still cut, so
        a plan that keeps such a worker is measured on different terms than
        the check calibrated. Stopped by close()."""
        # PR_SET_PDEATHSIG (1): the loop dies with the test, killed or not.
        loop = ("import ctypes, os, sys\n"
                "ctypes.CDLL(None).prctl(1, 9)\n"
                "if os.getppid() != int(sys.argv[1]): sys.exit()\n"
                "os.nice(19)\n"
                "while True: pass\n")
        self._hog = subprocess.Popen([sys.executable, "-c", loop, str(os.getpid())])
        try:
            self.add(self._hog.pid)
        except OSError:
            self._hog.kill()
            self._hog.wait()
            self._hog = None
            raise

    def hold_stages(self, daemon_pid, flag="--run_assignment", most=None):
        """From now on, every stage process daemon `daemon_pid` runs (child
        with `flag` on its command line) is put in the group within 20 ms of
        its start, the first `most` of them if given (the daemon itself is
        not: its share of the quota would land as idle time, not compute)."""
        held = set()

        def run():
            while not self._stop.wait(0.02):
                if most is not None and len(held) >= most:
                    return
                for pid in children_with(daemon_pid, flag):
                    if pid not in held and (most is None or len(held) < most):
                        try:
                            self.add(pid)
                            held.add(pid)
                        except OSError:
                            pass  # ended meanwhile
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._hog is not None:
            self._hog.kill()
            self._hog.wait()
        super().close()


class MemoryLimit(Cgroup):
    """A memory cgroup limiting what the processes born in it hold to
    `limit` bytes (cgroup v1 or v2, as Cgroup)."""

    def __init__(self, limit):
        super().__init__("memory", {"memory.limit_in_bytes": limit}, {"memory.max": limit})


def share_of_parameters(plan, worker):
    """The share of the model's parameters `worker` trains, a replicated
    stage's counted once per copy over its copies (each copy trains them on
    that share of the samples). Parameters, not layers: a layer split into
    column parts counts each part as a layer of its own, so the same count
    of layers can be far less of the model (CI on a8cc23e counted the
    re-plan's fc2/7,fc2,relu2,fc3,loss on w-2, an eighth of fc2's weights,
    as 5 layers, as many as the first plan gave it)."""
    total = sum(st.parameter_bytes for st in plan.stages)
    return sum(st.parameter_bytes * sum(p.worker_id == worker for p in st.placement) /
               max(1, len(st.placement)) for st in plan.stages) / max(1, total)


def describe_stages(plan):
    """'input,fc1 on w-2, 0.0324 s; fc2,loss on w-1, 0.0286 s': each stage's
    layers, workers and predicted compute per micro-batch."""
    return "; ".join(f"{','.join(st.node_ids)} on "
                     f"{','.join(p.worker_id for p in st.placement)}, "
                     f"{st.compute_seconds:.4f} s" for st in plan.stages)


class ReplanOnMeasurementTest(unittest.TestCase):
    def test_a_worker_slowed_after_profiling_gets_less_work_after_a_restart(self):
        """Once training starts, w-2's stage processes are held to a quarter
        of a core by a cpu cgroup, whatever of it they leave spent by a busy
        loop: w-2 profiled at full speed and trains at a quarter of it or
        less (its compute has read 2.7x to 10x its profile, 5x to 13x
        w-1's). The check measures its compute over the
        plan's above w-1's figure, the plan made on those
        figures gives it less of the model (or none) and simulates above
        the running one, and with
        schedule.replan_on_measurement the job restarts on it after its
        next checkpoint. The restarted attempt, under the same limit, is
        measured faster than the first; the job trains to the end and
        succeeds, the plan's notes say what it was planned on, and nothing
        is left running."""
        try:
            quota = CpuQuota(0.25)
        except OSError as e:
            self.skipTest(f"needs a cpu cgroup to slow w-2 after profiling: {e}")
        c = Cluster(workers=2, coordinator_flags=("--growth_min_remaining=2s",))
        try:
            # Wide layers: each micro-batch's forward and backward computes
            # for longer than the quota's 4 ms period, so the slowdown lands
            # in the compute the check measures more than in the waits
            # around it.
            s = spec(steps=400)
            s.model.builtin.hyper_parameters["hidden"].i = 2048
            s.schedule.replan_on_measurement = True
            s.checkpoint.every_steps = 50
            job_id = c.submit(s)
            daemons = {w: c.workers[w].proc.pid for w in ("w-1", "w-2")}
            quota.spend_what_is_left()
            quota.hold_stages(daemons["w-2"])

            def checks_until(n):
                """The job's check events (WatchJob replays its events from
                the first) once there are n, or the job ended."""
                seen, events = [], []

                def checked(m):
                    if m.HasField("event"):
                        events.append(m.event.message)
                        if m.event.message.startswith("plan checked against the run"):
                            seen.append(m.event.message)
                    return len(seen) >= n or m.job.state in ENDED
                job = c.watch_until(job_id, checked, timeout=300)
                # Said, not an IndexError below (CI once ended without one).
                self.assertGreaterEqual(
                    len(seen), min(n, 1),
                    f"no plan check before the job ended: {job.state}, events: {events}")
                return seen
            checks = checks_until(1)
            plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30).plan
            print("\n" + checks[0] + "\nthe first plan: " + describe_stages(plan), flush=True)
            self.assertEqual(len(checks), 1)
            factors = dict((w, float(x)) for x, w in
                           re.findall(r"x([0-9.]+) on (w-[0-9]+)", checks[0]))
            # The check puts the slowdown on w-2, not on w-1. Against w-1's
            # factor: both were profiled side by side, and a load that slowed
            # both profiles shows in both. How far apart the two read depends
            # on how busy the machine is: 9 runs here read w-2 at 5.8x to 8.0x
            # of w-1, two CI runs 5.1x and 12.8x, one beside a busy loop 2.1x
            # (and CI read 1.8x before the quota's rest was spent). That the
            # gap is big enough to act on is asserted by the restart itself
            # below.
            self.assertGreater(factors.get("w-2", 0), 1.25 * factors.get("w-1", 1.0),
                               checks[0])
            self.assertRegex(checks[0], r"restarting on it after the checkpoint of step "
                                        r"[0-9]+$")
            first_share = share_of_parameters(plan, "w-2")
            first_plan = describe_stages(plan)
            checks = checks_until(2)
            self.assertEqual(len(checks), 2, checks)
            print(checks[1], flush=True)
            rate = [float(re.match(r"plan checked against the run: measured ([0-9.]+) ",
                                   x).group(1)) for x in checks]
            self.assertGreater(rate[1], 1.05 * rate[0], checks)
            self.assertNotIn("restarting", checks[1])  # once per job
            job, events = c.run_to_end(job_id, timeout=600)
            self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
            self.assertGreaterEqual(job.progress.step, 400)
            self.assertEqual(job.restarts, 1, "\n".join(events))
            self.assertTrue(job.restart_history[0].cause.startswith(
                "re-planned on the run's measurement: predicted "), job.restart_history[0])
            self.assertGreater(job.restart_history[0].resumed_step, 0)
            plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30).plan
            print("the re-plan: " + describe_stages(plan), flush=True)
            self.assertTrue(any(n.startswith("planned on what the run measured: ")
                                for n in plan.notes), list(plan.notes))
            # The slowed worker runs less of the model than it did (or none).
            self.assertLess(share_of_parameters(plan, "w-2"), first_share,
                            f"{describe_stages(plan)} after {first_plan}")
            # Nothing of either attempt is left running.
            t.wait_until(lambda: not t.child_processes(set(daemons.values()),
                                                       "--run_assignment"), 60,
                         "the stage processes to end")
            t.wait_until(lambda: set(c.worker_states().values()) ==
                         {worker_pb2.WORKER_STATE_IDLE}, 60, "both workers idle")
        finally:
            c.close()
            quota.close()


class RemeasureTest(unittest.TestCase):
    def slowed_first_profiles(self, shares):
        """(cluster, spec): two workers, the first profiling process of each
        worker in `shares` held to its share of a core by a cpu cgroup of its
        own (skips where none can be made), and a 60-step job of wide
        layers: each pass computes for longer than the quota's 4 ms period,
        so the quota stretches the compute itself. The test's cleanups close
        the cluster, then the groups, also when it fails."""
        held = []
        for worker, share in shares.items():
            try:
                quota = CpuQuota(share)
            except OSError as e:
                self.skipTest(f"needs a cpu cgroup to slow {worker} while it profiles: {e}")
            self.addCleanup(quota.close)
            held.append((worker, quota))
        c = Cluster(workers=2)
        self.addCleanup(c.close)  # cleanups run last in, first out: before the groups'
        for worker, quota in held:
            quota.hold_stages(c.workers[worker].proc.pid, flag="--run_profile", most=1)
        s = spec(steps=60)
        s.model.builtin.hyper_parameters["hidden"].i = 2048
        return c, s

    def test_a_worker_slowed_while_profiling_is_profiled_again_and_planned_at_speed(self):
        """w-2's first profiling process is held to a quarter of a core by a
        cpu cgroup (a slow spell on its host); its second is not. The
        coordinator sees w-2 compute far below w-1, profiles it once more,
        keeps the faster profile, and plans the job with w-2 at about w-1's
        speed; the job trains to the end, and nothing is left running or
        in the group."""
        c, s = self.slowed_first_profiles({"w-2": 0.25})
        job, events = c.run_to_end(c.submit(s))
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        text = "\n".join(events)
        print("\n" + "\n".join(e for e in events if "profil" in e and "w-2" in e),
              flush=True)
        first = re.search(r"w-2 computed at ([0-9.]+)x the fastest worker's speed: "
                          r"profiling it once more, alone", text)
        self.assertIsNotNone(first, text)
        self.assertLess(float(first.group(1)), 0.8)
        again = re.search(r"w-2 profiled again: ([0-9.]+)x the time of its first "
                          r"profile; the second is kept", text)
        self.assertIsNotNone(again, text)
        # w-1 was not slowed: its first profile is not questioned against
        # the first round. Measured against w-2's quiet second profile it may
        # read just under the 0.8x threshold on this noisy machine (0.78x
        # once in CI), and is then profiled alone once, as designed: only
        # that form, near w-1's own speed, and only once.
        self.assertNotRegex(text, r"w-1 computed at [0-9.]+x the fastest worker's speed")
        for m in re.finditer(r"w-1 computed at ([0-9.]+)x the speed of w-2, which was "
                             r"profiled alone", text):
            self.assertGreater(float(m.group(1)), 0.6, text)
        self.assertLessEqual(text.count("w-1 profiled again"), 1, text)
        plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job.id), timeout=30)
        speeds = {w.worker_id: w.relative_speed for w in plan.cluster.workers}
        print(f"planned speeds: {speeds}", flush=True)
        # Far above the quota's quarter: at w-1's speed give or take this
        # machine's noise (identical workers read 0.8-1.2 of each other,
        # and once 0.7955 here), and at least twice the first reading.
        self.assertGreater(speeds.get("w-2", 0), 0.6, speeds)
        self.assertGreater(speeds.get("w-2", 0), 2 * float(first.group(1)), speeds)
        # The link test ran once, in the first round, and its figures stand.
        self.assertEqual({(l.from_worker, l.to_worker) for l in plan.cluster.links},
                         {("w-1", "w-2"), ("w-2", "w-1")})
        self.assert_nothing_left(c)

    def test_a_worker_fastest_alone_has_the_others_profiled_alone_too(self):
        """A slow spell over the whole first round: w-1's first profiling
        process is held to half a core, w-2's to a quarter (the least a
        4 ms period allows). w-2 reads at about half w-1's speed and is
        profiled again, alone and at full speed, so w-1's crowded first
        profile now reads at about half of it: w-1 is profiled alone too,
        and the job is planned on the two quiet profiles, the workers at
        about one speed (on the first round's w-1 against w-2's second, it
        would plan w-1 at 0.5x). Nobody is profiled a third time; the job
        trains to the end and nothing is left running or in either group."""
        c, s = self.slowed_first_profiles({"w-1": 0.5, "w-2": 0.25})
        job, events = c.run_to_end(c.submit(s))
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        text = "\n".join(events)
        print("\n" + "\n".join(e for e in events if "profil" in e), flush=True)
        self.assertRegex(text, r"w-2 computed at [0-9.]+x the fastest worker's speed: "
                               r"profiling it once more, alone")
        self.assertRegex(text, r"w-1 computed at [0-9.]+x the speed of w-2, which was "
                               r"profiled alone: profiling it once more, alone")
        for w in ("w-1", "w-2"):
            self.assertRegex(text, w + r" profiled again: [0-9.]+x the time of its "
                                       r"first profile; the second is kept")
            self.assertEqual(text.count(w + " profiled again"), 1, text)
        plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job.id), timeout=30)
        speeds = {w.worker_id: w.relative_speed for w in plan.cluster.workers}
        print(f"planned speeds: {speeds}", flush=True)
        # Identical workers, both measured alone: within this machine's
        # noise of each other (0.8-1.2, once 0.7955), far from the 0.5
        # of the first round's w-1 against w-2's second.
        self.assertGreater(speeds.get("w-2", 0), 0.6, speeds)
        self.assertLess(speeds.get("w-2", 0), 1 / 0.6, speeds)
        self.assert_nothing_left(c)

    def assert_nothing_left(self, c):
        """No profiling or stage process of any daemon runs, and every
        worker is idle (waits with a deadline)."""
        t.wait_until(lambda: not t.child_processes(
            {w.proc.pid for w in c.workers.values()}, "--run_"),
            60, "the profiling and stage processes to end")
        t.wait_until(lambda: set(c.worker_states().values()) ==
                     {worker_pb2.WORKER_STATE_IDLE}, 60, "the workers idle")

    def test_a_second_profile_killed_leaves_the_first_and_the_job_trains(self):
        """As above, and w-2's second profiling process is killed with
        SIGKILL (what the OOM killer sends) as soon as it starts: the job
        is not failed for it. Its first profile stands (w-2 planned slow or
        left out), the job trains to the end, and nothing is left running."""
        c, s = self.slowed_first_profiles({"w-2": 0.25})
        daemon = c.workers["w-2"].proc.pid
        job_id = c.submit(s)
        first = t.wait_until(lambda: children_with(daemon, "--run_profile"), 120,
                             "w-2's first profiling process", interval=0.01)
        second = t.wait_until(
            lambda: [p for p in children_with(daemon, "--run_profile") if p not in first],
            180, "w-2's second profiling process", interval=0.01)
        for pid in second:
            os.kill(pid, signal.SIGKILL)
        job, events = c.run_to_end(job_id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        text = "\n".join(events)
        self.assertRegex(text, r"w-2's second profile failed \(.*killed by signal 9.*\); "
                               r"its first is kept")
        plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
        speeds = {w.worker_id: w.relative_speed for w in plan.cluster.workers}
        print(f"\nplanned speeds: {speeds}", flush=True)
        self.assertLess(speeds.get("w-2", 0), 0.8, speeds)
        self.assertIsNone(c.workers["w-2"].proc.poll())
        self.assert_nothing_left(c)


class WorkerHostTest(unittest.TestCase):
    def test_worker_whose_host_is_not_its_own_fails_the_job_naming_it(self):
        # w-2 advertises an address it cannot bind: its link test refuses at
        # once and the job fails naming it, instead of hanging the peers.
        c = Cluster(workers=1)
        try:
            c.workers["w-2"] = t.start_worker(c.port, "w-2",
                                              extra=["--host=no-such-host.invalid",
                                                     c.data_roots])
            job_id = c.submit(spec(steps=50))
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=300)
            self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
            self.assertIn("worker w-2", job.error)
            self.assertIn("host 'no-such-host.invalid'", job.error)
            states = c.worker_states()
            self.assertEqual(set(states.values()), {worker_pb2.WORKER_STATE_IDLE}, states)
        finally:
            c.close()


def born_in(group_path):
    """A command prefix that starts its command in the cgroup at
    `group_path` (its cgroup.procs), so that all it starts is born there."""
    return ("sh", "-c", f'echo $$ > {group_path}/cgroup.procs && exec "$@"', "sh")


def children_with(daemon_pid, flag):
    """Child processes of the daemon whose command line has `flag`."""
    return t.child_processes({daemon_pid}, flag)


class ProfilingCrashTest(unittest.TestCase):
    def test_a_profiling_process_killed_fails_the_job_not_the_daemon(self):
        # Model code never runs in the daemon: the model is built and timed in
        # a child. SIGKILL it (what the OOM killer sends) while it profiles.
        c = Cluster(workers=1)
        try:
            s = spec(steps=50, workers=1)
            # Wide layers, so that profiling lasts long enough to be caught.
            s.model.builtin.hyper_parameters["hidden"].i = 2048
            s.model.builtin.hyper_parameters["layers"].i = 6
            daemon = c.workers["w-1"].proc.pid
            job_id = c.submit(s)
            children = t.wait_until(lambda: children_with(daemon, "--run_profile"), 120,
                                    "the profiling process", interval=0.01)
            self.assertFalse(children_with(daemon, "--run_assignment"))
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=120)
            self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
            self.assertRegex(job.error, r"^worker w-1: profiling " + re.escape(job_id) +
                             r": the profiling process was killed by signal 9 \(SIGKILL\)")
            # The daemon lives on, registered once and idle, and trains the
            # next job.
            self.assertIsNone(c.workers["w-1"].proc.poll())
            self.assertEqual(c.worker_states(), {"w-1": worker_pb2.WORKER_STATE_IDLE})
            second = c.submit(spec(steps=30, workers=1))
            job = c.watch_until(second, lambda m: m.job.state in ENDED, timeout=300)
            self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
            self.assertEqual(c.workers["w-1"].proc.pid, daemon)
            t.wait_until(lambda: not children_with(daemon, "--run_"), 30,
                         "child processes to end")
        finally:
            c.close()


class ConcurrentJobsTest(unittest.TestCase):
    def test_two_jobs_run_at_once_on_disjoint_workers(self):
        c = Cluster(workers=4)
        try:
            # A long job holds two workers; a second job runs to the end on the
            # other two while the first is still training.
            long_job = c.submit(spec(steps=1_000_000))
            c.watch_until(long_job, lambda m: m.job.progress.step > 0, timeout=300)
            short_job = c.submit(spec(steps=60))
            done = c.watch_until(short_job, lambda m: m.job.state in ENDED, timeout=600)
            self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.error)
            running = c.get(long_job)
            self.assertEqual(running.state, job_pb2.JOB_STATE_RUNNING)
            self.assertFalse(set(done.worker_ids) & set(running.worker_ids),
                             [list(done.worker_ids), list(running.worker_ids)])
            c.jobs.CancelJob(service_pb2.CancelJobRequest(job_id=long_job), timeout=30)
        finally:
            c.close()


class SharedCoresTest(unittest.TestCase):
    """Two daemons pinned to one core (as two containers on one CPU would
    be) say so when they register, and a job on them is planned knowing
    it: each profiled at half its speed alone, all of them busy weighed
    against one."""

    def test_daemons_on_one_core_report_it_and_are_planned_as_one_core(self):
        c = Cluster(workers=0)
        try:
            cpu = min(os.sched_getaffinity(0))
            for w in ("w-1", "w-2"):
                c.add_worker(w, prefix=("taskset", "-c", str(cpu)))
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
            listed = c.workers_stub.ListWorkers(service_pb2.ListWorkersRequest(), timeout=30)
            self.assertEqual({(w.info.core_set, w.info.core_set_size) for w in listed.workers},
                             {(f"{boot}/{cpu}", 1)})
            job, seen = c.run_to_end(c.submit(spec(steps=60)))
            job_id = job.id
            self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
            events = "\n".join(seen)
            self.assertRegex(events, r"w-[12] shares 1 core\(s\) with 1 of the job's "
                                     r"workers at 1 thread\(s\) each: its profile is "
                                     r"scaled to 0\.50")
            plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
            print("\nshared cores: " + "; ".join(n for n in plan.plan.notes
                                                   if "share cores" in n), flush=True)
            self.assertTrue(any("workers share cores" in n and "on 2, " in n and
                                "on 1 worker(s)" in n for n in plan.plan.notes),
                            list(plan.plan.notes))
            for w in plan.cluster.workers:
                self.assertEqual((w.core_set, w.core_set_size, w.threads),
                                 (f"{boot}/{cpu}", 1, 1))
        finally:
            c.close()


class CgroupLimitTest(unittest.TestCase):
    """Daemons born in cgroups that limit them, as a container's limits do:
    no affinity mask or /proc/meminfo shows those."""

    def beside_one_in(self, make_group, worker_id):
        """(cluster, WorkerInfo by worker id as registered): w-1, and
        `worker_id` born in the cgroup make_group() makes (skips where none
        can be made). The test's cleanups close the cluster, then the
        group."""
        try:
            group = make_group()
        except OSError as e:
            self.skipTest(f"needs a cgroup to limit {worker_id}: {e}")
        self.addCleanup(group.close)
        c = Cluster(workers=1)
        self.addCleanup(c.close)  # before the group's (last in, first out)
        c.add_worker(worker_id, prefix=born_in(group.path))
        listed = c.workers_stub.ListWorkers(service_pb2.ListWorkersRequest(), timeout=30)
        return c, {w.info.worker_id: w.info for w in listed.workers}

    def test_daemons_under_a_cpu_limit_compute_and_are_planned_within_it(self):
        """Two daemons, each in a cpu cgroup of its own that allows one
        core's time (both see this machine's every CPU), started without
        --threads. Each registers the limit and one core; a job asking 2
        threads a worker profiles and trains with 1 on each, and is planned
        so: the two one-core workers fill the machine's 2 CPUs without
        crowding them, so their profiles stand as measured."""
        groups = {}
        for w in ("w-1", "w-2"):
            try:
                groups[w] = CpuQuota(1.0)
            except OSError as e:
                self.skipTest(f"needs a cpu cgroup to limit the daemons: {e}")
            self.addCleanup(groups[w].close)
        c = Cluster(workers=0)
        self.addCleanup(c.close)  # before the groups' (last in, first out)
        for w, group in groups.items():
            c.add_worker(w, prefix=born_in(group.path), extra=["--threads=0"])  # the default
        listed = c.workers_stub.ListWorkers(service_pb2.ListWorkersRequest(), timeout=30)
        self.assertEqual({(w.info.worker_id, w.info.cores, round(w.info.cpu_quota, 3))
                          for w in listed.workers}, {("w-1", 1, 1.0), ("w-2", 1, 1.0)})
        ctl = subprocess.run([t.binary("cli", "apapoctl"), f"--coordinator=127.0.0.1:{c.port}",
                              "workers"], capture_output=True, text=True, timeout=60)
        self.assertEqual(ctl.returncode, 0, ctl.stderr)
        self.assertRegex(ctl.stdout, r"w-1 +127\.0\.0\.1 +idle +1 +1\.00 ")

        s = spec(steps=60)
        s.resources.threads_per_worker = 2
        job_id = c.submit(s)
        # The first process a daemon starts for the job (profiling) gets the
        # threads its stages compute with, in its environment.
        daemon = c.workers["w-2"].proc.pid

        def child_threads():
            for pid in children_with(daemon, "--run_"):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                except OSError:
                    continue  # ended meanwhile
                if b"OPENBLAS_NUM_THREADS" in env:
                    return env[b"OPENBLAS_NUM_THREADS"].decode()
            return None
        self.assertEqual(t.wait_until(child_threads, 120, "w-2's first child process",
                                      interval=0.01), "1")
        job, events = c.run_to_end(job_id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        text = "\n".join(events)
        self.assertNotIn("shares 2 core(s)", text)
        plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
        self.assertEqual({(w.worker_id, w.threads) for w in plan.cluster.workers},
                         {("w-1", 1), ("w-2", 1)})
        self.assertFalse(any("share cores" in n for n in plan.plan.notes),
                         list(plan.plan.notes))

    def test_a_daemon_limited_to_half_a_core_is_planned_at_its_own_speed(self):
        """w-2 is born in a cpu cgroup allowing half a core (a container
        limited to 0.5 CPU: a permanently slower worker), w-1 is not. w-2
        registers the limit, profiles at about half w-1's speed (twice: it
        is slow alone too), and the job is planned with each worker at its
        own speed: w-1 gets the larger part of the model, so both stages
        compute for about as long per mini-batch. At their mean speed the
        DP would split the model evenly and w-2's half would take about
        twice w-1's. The job trains to the end and nothing is left."""
        c, info = self.beside_one_in(lambda: CpuQuota(0.5), "w-2")
        self.assertEqual({w: round(i.cpu_quota, 3) for w, i in info.items()},
                         {"w-1": 0.0, "w-2": 0.5})
        s = spec(steps=100)
        s.model.builtin.hyper_parameters["hidden"].i = 2048
        job, events = c.run_to_end(c.submit(s))
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        got = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job.id), timeout=30)
        speeds = {w.worker_id: w.relative_speed for w in got.cluster.workers}
        print(f"\nplanned speeds: {speeds}\n{describe_stages(got.plan)}\n" +
              "\n".join(n for n in got.plan.notes if "speed" in n or "split" in n) + "\n" +
              "\n".join(e for e in events if e.startswith("plan checked")), flush=True)
        # A half-core worker, give or take this machine's noise.
        self.assertLess(speeds["w-2"], 0.75 * speeds["w-1"], speeds)
        # Each worker at its own speed in the DP, or a column split that
        # balances the stages as well at the mean speed (the faster worker
        # then takes the heavier stage): CI on 131c417 took fc2 in 2 parts,
        # predicted 922 against 844 samples/s, with no per-worker note. Or,
        # where a layer boundary already balances them, the mean-speed plan
        # with the faster worker placed on the heavier stage: a run here on
        # 49f4120 read w-2 at 0.39x, where the cut after relu1 leaves it
        # fc1's 28% of the weights, so the per-worker DP found the same cut
        # (no note) and nothing was split.
        heavier = max(got.plan.stages, key=lambda st: st.parameter_bytes)
        self.assertTrue(any("workers planned each at its own speed" in n
                            for n in got.plan.notes) or len(got.plan.splits) > 0 or
                        [p.worker_id for p in heavier.placement] == ["w-1"],
                        list(got.plan.notes))
        compute = {p.worker_id: st.compute_seconds for st in got.plan.stages
                   for p in st.placement}
        self.assertEqual(set(compute), {"w-1", "w-2"}, describe_stages(got.plan))
        # The half-core worker never takes what the mean speed would give it
        # (an even half, about twice w-1's). It may bind by up to one part of
        # a split layer: CI on f4ec7b9 planned fc2 in 4 parts, w-2 at
        # 0.0436 s against w-1's 0.0376 s (1.16x), the DP's best at that
        # granularity.
        self.assertLess(compute["w-2"], 1.5 * compute["w-1"], describe_stages(got.plan))
        # And the stages are balanced, unless the plan says why not: near
        # 0.4x, whole layers leave w-2 idle a third of the time, and moving
        # one part of fc2 to it costs about as much as it saves (2c419bb's CI
        # read 0.415x and planned 0.0292 s against 0.0547 s; this test's
        # profile from another run, planned with w-2 at 0.415x, predicted fc2
        # in 8 parts at 1366 samples/s against 1365 whole).
        self.assertTrue(max(compute.values()) / min(compute.values()) < 1.5 or
                        any(n.startswith("layers kept whole: the best column split weighed")
                            for n in got.plan.notes),
                        describe_stages(got.plan) + "\n" + "\n".join(got.plan.notes))
        self.assertGreater(share_of_parameters(got.plan, "w-1"),
                           share_of_parameters(got.plan, "w-2"),
                           describe_stages(got.plan))
        t.wait_until(lambda: not t.child_processes(
            {w.proc.pid for w in c.workers.values()}, "--run_"),
            60, "the profiling and stage processes to end")

    def test_a_daemon_under_a_memory_limit_registers_what_it_may_hold(self):
        """A daemon born in a memory cgroup of 1 GiB (a container's memory
        limit; this host's free memory is many times that) registers at
        most the limit, which the planner takes as its per-worker memory;
        one beside it, outside the group, registers the host's."""
        _, info = self.beside_one_in(lambda: MemoryLimit(1 << 30), "w-limited")
        memory = {w: i.memory_bytes for w, i in info.items()}
        print(f"\nregistered memory: {memory}", flush=True)
        self.assertGreater(memory["w-limited"], 0)
        self.assertLessEqual(memory["w-limited"], 1 << 30)
        self.assertGreater(memory["w-1"], 2 << 30)


class TorchScriptJobTest(unittest.TestCase):
    def test_scripted_sequential_trains_through_the_coordinator(self):
        c = Cluster(workers=2)
        try:
            path = os.path.join(c.dir, "mlp.pt")
            subprocess.run(
                ["/usr/bin/python3", "-c",
                 "import torch, torch.nn as nn, sys\n"
                 "torch.manual_seed(0)\n"
                 "m = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(),"
                 " nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))\n"
                 "torch.jit.script(m).save(sys.argv[1])", path],
                check=True, timeout=120)
            s = spec(steps=200)
            s.model.Clear()
            s.model.torchscript.path = path
            s.model.torchscript.input_shape.extend([1, 28, 28])
            job_id = c.submit(s)
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=600)
            self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
            plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
            nodes = [n for st in plan.plan.stages for n in st.node_ids]
            self.assertIn("child1", nodes)
            self.assertGreater(job.progress.test_accuracy, 0.5)
        finally:
            c.close()


class ConfinedPathsTest(unittest.TestCase):
    """A spec may name files only under the data roots: refused at submit
    when it says so itself, refused by the worker when only the disk shows
    it (a symlink out of the roots)."""

    def test_paths_outside_the_data_roots_are_refused_at_submit_and_on_the_worker(self):
        c = Cluster(workers=2)
        try:
            s = spec(steps=50)
            s.data.Clear()
            s.data.text.path = "/etc/passwd"
            s.data.text.context = 16
            s.data.batch_size = 64
            with self.assertRaises(grpc.RpcError) as e:
                c.submit(s)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("spec.data.text.path: /etc/passwd is outside the data roots",
                          e.exception.details())
            s = spec(steps=50)
            s.checkpoint.directory = c.dir + "/../../tmp/escape"
            with self.assertRaises(grpc.RpcError) as e:
                c.submit(s)
            self.assertIn("spec.checkpoint.directory: must not contain \"..\"",
                          e.exception.details())

            # Lexically inside the roots, but a symlink to /etc/passwd.
            link = os.path.join(c.dir, "corpus.txt")
            os.symlink("/etc/passwd", link)
            s = spec(steps=50)
            s.data.Clear()
            s.data.text.path = link
            s.data.text.context = 16
            s.data.batch_size = 64
            job_id = c.submit(s)
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=120)
            self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
            self.assertIn(f"spec.data.text.path: {link} resolves to /etc/passwd", job.error)
            self.assertEqual(job.error_code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
            # Nothing ran: both workers are free.
            states = c.worker_states()
            self.assertEqual(set(states.values()), {worker_pb2.WORKER_STATE_IDLE}, states)
        finally:
            c.close()


class QueueingTest(unittest.TestCase):
    def test_job_waits_for_workers_then_runs(self):
        c = Cluster(workers=1)
        try:
            job_id = c.submit(spec(steps=50))
            job = c.watch_until(
                job_id, lambda m: "needs 2 idle worker(s), 1 available" in m.event.message,
                timeout=60)
            self.assertEqual(job.state, job_pb2.JOB_STATE_QUEUED)
            c.add_worker("w-late")
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=600)
            self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
            self.assertIn("w-late", job.worker_ids)
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()
