"""The measured timeline (issue 12): a 2-stage job's stages record a window
of op spans and send them to the coordinator; `apapoctl trace` writes them
as Chrome trace JSON beside the simulator's timeline of the same plan."""

import json
import os
import subprocess
import unittest

import grpc

from lib import apapo_testlib as t
from lib.cluster import Cluster

from proto.apapo.v1 import job_pb2, service_pb2, service_pb2_grpc  # noqa: E402
from google.protobuf import text_format  # noqa: E402

ENDED = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


def two_stage_spec(steps=60):
    s = text_format.Parse(t.short_job(name="trace", steps=steps, workers=2),
                          job_pb2.JobSpec())
    # Wide enough that the planner pipelines it over both workers rather than
    # replicating one stage (no send/recv then).
    s.model.builtin.hyper_parameters["hidden"].i = 1024
    s.model.builtin.hyper_parameters["layers"].i = 4
    s.schedule.stages = 2
    s.schedule.replicas = 1
    return s


class TraceTest(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(workers=2)
        self.addCleanup(self.cluster.close)

    def ctl(self, *args):
        argv = [t.binary("cli", "apapoctl"), f"--coordinator=127.0.0.1:{self.cluster.port}"]
        return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=60)

    def test_two_stage_job_trace_next_to_simulated(self):
        c = self.cluster
        job_id = c.submit(two_stage_spec())
        job = c.watch_until(job_id, lambda m: m.job.state in ENDED, timeout=600)
        self.assertEqual(job.state, job_pb2.JOB_STATE_SUCCEEDED, job.error)
        plan = c.jobs.GetPlan(service_pb2.GetPlanRequest(job_id=job_id), timeout=30)
        self.assertEqual(len(plan.plan.stages), 2, plan.plan)
        out = os.path.join(c.dir, "trace.json")
        r = self.ctl("trace", job_id, f"--out={out}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 measured stage replica(s)", r.stdout)
        with open(out) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        names = {e["pid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
        labels = {e["pid"]: e["args"]["labels"] for e in events
                  if e["ph"] == "M" and e["name"] == "process_labels"}
        spans = {}
        for e in events:
            if e["ph"] != "X":
                continue
            for field in ("ph", "ts", "dur", "pid", "tid", "name"):
                self.assertIn(field, e)
            self.assertGreaterEqual(e["dur"], 0)
            spans.setdefault((e["pid"], e["tid"]), []).append(e)
        measured = sorted(p for p, l in labels.items() if l == "measured")
        simulated = sorted(p for p, l in labels.items() if l == "simulated")
        self.assertEqual(len(measured), 2, names)
        self.assertEqual(len(simulated), 2, names)
        self.assertTrue(any(names[p].startswith("stage 0 ") for p in measured), names)
        self.assertTrue(any(names[p].startswith("stage 1 ") for p in measured), names)
        self.assertTrue(all(names[p].startswith("simulated stage") for p in simulated))
        for pid in measured:
            kinds = {e["name"] for (p, _), es in spans.items() if p == pid for e in es}
            for kind in ("forward", "backward", "optimizer"):
                self.assertIn(kind, kinds, names[pid])
            # Stage 0 sends activations and waits for gradients; stage 1
            # waits for activations and sends gradients.
            self.assertIn("send", kinds, names[pid])
            self.assertIn("recv", kinds, names[pid])
            # Aligned: each stage's window starts at 0.
            self.assertEqual(min(e["ts"] for (p, _), es in spans.items() if p == pid
                                 for e in es), 0)
        for pid in simulated:
            kinds = {e["name"] for (p, _), es in spans.items() if p == pid for e in es}
            self.assertTrue({"forward", "backward", "optimizer"} <= kinds, kinds)
        # Within a thread, spans do not overlap (ts/dur in microseconds,
        # printed to the nanosecond).
        for key, es in spans.items():
            es.sort(key=lambda e: e["ts"])
            for a, b in zip(es, es[1:]):
                self.assertLessEqual(a["ts"] + a["dur"], b["ts"] + 1e-3,
                                     (names.get(key[0]), a, b))
        trace_out = os.path.join(os.environ.get("TRACE_ARTIFACTS", c.dir), "trace-e2e.json")
        if trace_out != out:
            with open(trace_out, "w") as f:
                json.dump(trace, f)

    def test_refusals(self):
        r = self.ctl("trace", "job-999999")
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("NOT_FOUND", r.stderr)
        with self.assertRaises(grpc.RpcError) as e:
            self.cluster.jobs.GetTrace(service_pb2.GetTraceRequest(), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("job_id", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.cluster.jobs.GetTrace(
                service_pb2.GetTraceRequest(job_id="job-000001", simulated_steps=-1),
                timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("simulated_steps", e.exception.details())


class TraceTokensTest(unittest.TestCase):
    """GetTrace needs a token (read role suffices) when tokens are on."""

    def test_needs_a_token_read_suffices(self):
        d = t.temp_dir("trace-tokens-")
        tokens = os.path.join(d, "tokens")
        with open(tokens, "w") as f:
            f.write("reader-token-0123456789 read dashboards\n")
        coordinator, port = t.start_coordinator(
            os.path.join(d, "state.db"), extra=[f"--tokens_file={tokens}"])
        self.addCleanup(coordinator.stop)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            jobs = service_pb2_grpc.JobServiceStub(channel)
            with self.assertRaises(grpc.RpcError) as e:
                jobs.GetTrace(service_pb2.GetTraceRequest(job_id="job-000001"), timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            with self.assertRaises(grpc.RpcError) as e:
                jobs.GetTrace(service_pb2.GetTraceRequest(job_id="job-000001"), timeout=10,
                              metadata=(("authorization", "Bearer reader-token-0123456789"),))
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)


if __name__ == "__main__":
    unittest.main()
