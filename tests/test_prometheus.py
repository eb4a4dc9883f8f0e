"""A real Prometheus server (Debian's `prometheus`) scrapes the coordinator's
/metrics endpoint; promtool checks the exposition format; every rule of
deploy/prometheus/apapo-rules.yml is evaluated by that Prometheus against the
live coordinator, and the alerts fire on the faults they are for, caused for
real (a worker killed, the job it trained failed, a job left queued)."""

import json
import os
import signal
import subprocess
import unittest
import urllib.parse
import urllib.request

import yaml

from lib import apapo_testlib as t
from lib.cluster import Cluster

from proto.apapo.v1 import job_pb2  # noqa: E402
from google.protobuf import text_format  # noqa: E402

RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy",
                     "prometheus", "apapo-rules.yml")
ENDED = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


class Prometheus:
    """Debian's prometheus scraping the cluster's coordinator every second,
    evaluating `rule_files` every second."""

    def __init__(self, cluster, rule_files=()):
        cfg = os.path.join(cluster.dir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    f"rule_files: {json.dumps([os.path.abspath(r) for r in rule_files])}\n"
                    "scrape_configs:\n"
                    "  - job_name: apapo\n"
                    f"    static_configs: [{{targets: ['127.0.0.1:{cluster.metrics_port}']}}]\n")
        self.web = t.free_port()
        self.proc = t.Process(["prometheus", f"--config.file={cfg}",
                               f"--storage.tsdb.path={os.path.join(cluster.dir, 'tsdb')}",
                               f"--web.listen-address=127.0.0.1:{self.web}"])
        self.proc.wait_for_line(r"Server is ready to receive web requests")

    def query(self, expr):
        """The instant vector `expr` evaluates to now (an error for an invalid
        expression)."""
        url = f"http://127.0.0.1:{self.web}/api/v1/query?query={urllib.parse.quote(expr)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def alerts(self, name, state):
        return self.query(f'ALERTS{{alertname="{name}",alertstate="{state}"}}')

    def stop(self):
        self.proc.stop()


class PrometheusTest(unittest.TestCase):
    def test_real_prometheus_scrapes_the_coordinator(self):
        c = Cluster(workers=0)
        prom = None
        try:
            prom = Prometheus(c)
            up = t.wait_until(lambda: [s for s in prom.query('up{job="apapo"}')
                                       if s["value"][1] == "1"], 60, "target up")
            self.assertTrue(up)
            jobs = t.wait_until(lambda: prom.query("apapo_jobs"), 30, "apapo_jobs series")
            states = {s["metric"]["state"] for s in jobs}
            self.assertTrue({"queued", "running", "succeeded", "failed"} <= states, states)
            self.assertTrue(prom.query("apapo_workers"))
            # Counters exist at 0 before their first event, so that increase()
            # sees the first one.
            finished = prom.query("apapo_jobs_finished_total")
            self.assertEqual({s["metric"]["state"]: s["value"][1] for s in finished},
                             {"succeeded": "0", "failed": "0", "cancelled": "0"})
            # promtool agrees with the exposition format.
            with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics",
                                        timeout=10) as r:
                text = r.read()
            check = subprocess.run(["promtool", "check", "metrics"], input=text,
                                   capture_output=True, timeout=60)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        finally:
            if prom:
                prom.stop()
            c.close()

    def test_every_rule_holds_against_a_live_coordinator(self):
        with open(RULES) as f:
            rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
        names = {r.get("alert") or r.get("record") for r in rules}
        self.assertEqual(names, {"ApapoWorkersLost", "ApapoJobsFailing",
                                 "ApapoJobsQueuedNoWorkers", "apapo:stage_busy_ratio"},
                         "a rule was added: give it a live check here")
        c = Cluster(workers=1)
        prom = None
        try:
            prom = Prometheus(c, rule_files=[RULES])
            # Every expression is valid and evaluates against the live series.
            for r in rules:
                prom.query(r["expr"])
            self.assertFalse(prom.query('ALERTS'), "no alert before any fault")
            s = text_format.Parse(t.short_job(name="rules", steps=1_000_000, workers=1),
                                  job_pb2.JobSpec())
            s.fault_tolerance.max_restarts = 0
            job_id = c.submit(s)
            c.watch_until(job_id, lambda m: m.job.state == job_pb2.JOB_STATE_RUNNING and
                          m.job.progress.step > 0, timeout=300)
            # The recording rule: the busy share of the training stage, 0..1.
            busy = t.wait_until(lambda: prom.query(
                f'apapo:stage_busy_ratio{{job_id="{job_id}"}}'), 60, "apapo:stage_busy_ratio")
            self.assertTrue(all(0 < float(b["value"][1]) <= 1 for b in busy), busy)
            self.assertEqual(busy[0]["metric"]["worker"], "w-1")
            # A worker killed: it is lost and its job fails (restarts off).
            c.workers["w-1"].proc.send_signal(signal.SIGKILL)
            job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=120)
            self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
            lost = t.wait_until(lambda: prom.alerts("ApapoWorkersLost", "firing"), 60,
                                "ApapoWorkersLost firing")
            self.assertEqual(lost[0]["metric"]["severity"], "warning")
            t.wait_until(lambda: prom.alerts("ApapoJobsFailing", "firing"), 60,
                         "ApapoJobsFailing firing")
            # A job with no idle worker to run on: the queue alert is pending
            # (it fires after its 10 minutes).
            queued = c.submit(text_format.Parse(t.short_job(name="waits", workers=1),
                                                job_pb2.JobSpec()))
            t.wait_until(lambda: prom.alerts("ApapoJobsQueuedNoWorkers", "pending"), 60,
                         "ApapoJobsQueuedNoWorkers pending")
            self.assertEqual(c.get(queued).state, job_pb2.JOB_STATE_QUEUED)
        finally:
            if prom:
                prom.stop()
            c.close()


if __name__ == "__main__":
    unittest.main()
