"""The coordinator's gRPC API from an independent client: Debian's
python3-grpcio with stubs generated from proto/ (not our C++ client)."""

import os
import subprocess
import unittest

import grpc

from lib import apapo_testlib as t  # also puts bazel-bin on sys.path

from proto.apapo.v1 import job_pb2, service_pb2, service_pb2_grpc  # noqa: E402
from tests.proto import health_pb2, health_pb2_grpc  # noqa: E402
from tests.proto import reflection_pb2, reflection_pb2_grpc  # noqa: E402
from google.protobuf import text_format  # noqa: E402

EXAMPLE = os.path.join(t.ROOT, "examples", "mlp_fashion_mnist.textproto")


def example_spec():
    with open(EXAMPLE) as f:
        return text_format.Parse(f.read(), job_pb2.JobSpec())


class CoordinatorApiTest(unittest.TestCase):
    def setUp(self):
        self.dir = t.temp_dir("coord-api-")
        self.state = os.path.join(self.dir, "state.db")
        self.proc, self.port = t.start_coordinator(self.state)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.jobs = service_pb2_grpc.JobServiceStub(self.channel)

    def tearDown(self):
        self.channel.close()
        self.assertEqual(self.proc.stop(), 0, self.proc.output())

    def test_health_serving_overall_and_per_service(self):
        health = health_pb2_grpc.HealthStub(self.channel)
        for service in ("", "apapo.v1.JobService", "apapo.v1.WorkerService"):
            r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING, service)
        with self.assertRaises(grpc.RpcError) as e:
            health.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_reflection_lists_services_and_serves_descriptors(self):
        stub = reflection_pb2_grpc.ServerReflectionStub(self.channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="apapo.v1.JobService"),
        ]
        responses = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
        names = {s.name for s in responses[0].list_services_response.service}
        self.assertIn("apapo.v1.JobService", names)
        self.assertIn("apapo.v1.WorkerService", names)
        self.assertIn("grpc.health.v1.Health", names)
        files = responses[1].file_descriptor_response.file_descriptor_proto
        self.assertTrue(files, responses[1])
        from google.protobuf import descriptor_pb2
        fd = descriptor_pb2.FileDescriptorProto.FromString(files[0])
        self.assertEqual(fd.package, "apapo.v1")
        self.assertIn("JobService", [s.name for s in fd.service])

    def test_invalid_spec_is_invalid_argument_with_field_path(self):
        spec = example_spec()
        spec.schedule.micro_batches = 0
        with self.assertRaises(grpc.RpcError) as e:
            self.jobs.SubmitJob(service_pb2.SubmitJobRequest(spec=spec), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.schedule.micro_batches: must be >= 1, got 0",
                      e.exception.details())

    def test_a_batch_no_worker_holds_is_refused_at_submit_with_its_size(self):
        spec = example_spec()
        spec.data.batch_size = 2_000_000_000
        with self.assertRaises(grpc.RpcError) as e:
            self.jobs.SubmitJob(service_pb2.SubmitJobRequest(spec=spec), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.data.batch_size: must be <= 1048576, got 2000000000",
                      e.exception.details())
        self.assertIn("is 5.7 TiB of input alone", e.exception.details())
        self.assertNotIn("\n", e.exception.details())  # one line, no backtrace

    def test_oversized_specs_are_refused_and_listing_keeps_working(self):
        # Over the spec cap (1 MiB): INVALID_ARGUMENT naming the spec and
        # its size. Over the message limit every client agrees on (4 MiB,
        # gRPC's default): refused by the transport. Neither is stored, so
        # list and get keep working for everyone.
        spec = example_spec()
        spec.labels["blob"] = "x" * (2 << 20)
        with self.assertRaises(grpc.RpcError) as e:
            self.jobs.SubmitJob(service_pb2.SubmitJobRequest(spec=spec), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec: 2.0 MiB serialized, at most 1 MiB", e.exception.details())
        spec.labels["blob"] = "x" * (5 << 20)
        with self.assertRaises(grpc.RpcError) as e:
            self.jobs.SubmitJob(service_pb2.SubmitJobRequest(spec=spec), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        # The largest spec accepted still comes back in list replies.
        spec.labels["blob"] = "x" * (1000 << 10)
        job = self.jobs.SubmitJob(service_pb2.SubmitJobRequest(spec=spec), timeout=10).job
        listed = self.jobs.ListJobs(service_pb2.ListJobsRequest(), timeout=10)
        self.assertIn(job.id, [j.id for j in listed.jobs])
        self.jobs.CancelJob(service_pb2.CancelJobRequest(job_id=job.id, reason="test"),
                            timeout=10)

    def test_submit_get_watch_cancel_and_history_survives_restart(self):
        job = self.jobs.SubmitJob(
            service_pb2.SubmitJobRequest(spec=example_spec()), timeout=10).job
        self.assertEqual(job.state, job_pb2.JOB_STATE_QUEUED)
        got = self.jobs.GetJob(service_pb2.GetJobRequest(job_id=job.id), timeout=10)
        self.assertEqual(got.spec.name, "mlp-fashion-mnist")
        self.jobs.CancelJob(service_pb2.CancelJobRequest(job_id=job.id, reason="test"),
                            timeout=10)
        stream = self.jobs.WatchJob(service_pb2.WatchJobRequest(job_id=job.id), timeout=30)
        messages = list(stream)
        self.assertFalse(messages[0].HasField("event"))
        events = [m.event.message for m in messages[1:]]
        self.assertEqual(events[0], "submitted")
        self.assertEqual(events[-1], "cancelled: test")
        self.assertEqual(messages[-1].job.state, job_pb2.JOB_STATE_CANCELLED)

        # Restart the coordinator on the same state database.
        self.channel.close()
        self.assertEqual(self.proc.stop(), 0)
        self.proc, self.port = t.start_coordinator(self.state)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.jobs = service_pb2_grpc.JobServiceStub(self.channel)
        listed = self.jobs.ListJobs(service_pb2.ListJobsRequest(), timeout=10).jobs
        self.assertEqual([j.id for j in listed], [job.id])
        self.assertEqual(listed[0].state, job_pb2.JOB_STATE_CANCELLED)
        replay = list(self.jobs.WatchJob(
            service_pb2.WatchJobRequest(job_id=job.id, after_sequence=1), timeout=30))
        replayed = [m.event for m in replay if m.HasField("event")]
        self.assertEqual([e.sequence for e in replayed],
                         list(range(2, len(events) + 1)))
        self.assertEqual(replayed[-1].message, "cancelled: test")


class BinariesTest(unittest.TestCase):
    """Each binary answers --help and refuses bad flags with exit code 2."""

    def test_coordinator_help_and_bad_port(self):
        exe = t.binary("coordinator", "apapo-coordinator")
        r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
        self.assertIn("--port", r.stdout + r.stderr)
        r = subprocess.run([exe, "--port=70000", "--state=:memory:"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--port must be in 0..65535", r.stderr)
        for bad in ("1.5", "-0.1", "nan"):
            r = subprocess.run([exe, "--port=0", "--state=:memory:",
                                f"--remeasure_below_speed={bad}"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("--remeasure_below_speed must be in 0..1", r.stderr)

    def test_coordinator_unwritable_state_is_a_clear_error(self):
        exe = t.binary("coordinator", "apapo-coordinator")
        r = subprocess.run([exe, "--port=0", "--state=/nonexistent/dir/x.db"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot open state database /nonexistent/dir/x.db", r.stderr)

    def test_apapoctl_unreachable_and_bad_file(self):
        exe = t.binary("cli", "apapoctl")
        # A port that was free a moment ago: nothing listens there.
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        r = subprocess.run([exe, f"--coordinator=127.0.0.1:{port}", "--timeout=5s", "list"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        r = subprocess.run([exe, "submit", "/nonexistent.textproto"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read job spec /nonexistent.textproto", r.stderr)


if __name__ == "__main__":
    unittest.main()
