"""The control plane over TLS with client certificates (deploy/pki.sh): a
job trains with every component on TLS; a worker cannot register under
another worker's id or without a certificate; a client that does not
verify the server cannot talk to it; and a coordinator will not listen
beyond loopback without TLS unless told --insecure."""

import os
import subprocess
import unittest

import grpc

from lib import apapo_testlib as t

from proto.apapo.v1 import job_pb2, service_pb2, service_pb2_grpc, worker_pb2  # noqa: E402
from google.protobuf import text_format  # noqa: E402

JOB = t.short_job(name="tls", steps=100)


class TlsTest(unittest.TestCase):
    def setUp(self):
        self.pki = t.temp_dir("pki-")
        subprocess.run(["bash", os.path.join(t.ROOT, "deploy", "pki.sh"), self.pki,
                        "--worker=w-1", "--worker=w-2"],
                       check=True, capture_output=True, timeout=60)
        self.coordinator, self.port = t.start_coordinator(
            os.path.join(t.temp_dir("tls-"), "state.db"),
            extra=[f"--tls_cert={self.pki}/coordinator.pem",
                   f"--tls_key={self.pki}/coordinator.key",
                   f"--tls_ca={self.pki}/ca.pem", "--heartbeat_interval=500ms"])
        self.addCleanup(self.coordinator.stop)

    def pem(self, name):
        with open(os.path.join(self.pki, name), "rb") as f:
            return f.read()

    def tls_flags(self, worker=None):
        flags = [f"--tls_ca={self.pki}/ca.pem"]
        if worker:
            flags += [f"--tls_cert={self.pki}/worker-{worker}.pem",
                      f"--tls_key={self.pki}/worker-{worker}.key"]
        return flags

    def test_a_job_trains_with_every_component_on_tls(self):
        for w in ("w-1", "w-2"):
            p = t.start_worker(self.port, w, extra=self.tls_flags(w))
            self.addCleanup(p.stop)
        spec = os.path.join(t.temp_dir("tls-"), "job.textproto")
        with open(spec, "w") as f:
            f.write(JOB)
        ctl = [t.binary("cli", "apapoctl"), f"--coordinator=localhost:{self.port}",
               *self.tls_flags()]
        r = subprocess.run(ctl + ["submit", spec, "--watch"], capture_output=True,
                           text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("job-000001 succeeded", r.stdout)
        # Without the CA, apapoctl cannot verify the server: no answer.
        r = subprocess.run([t.binary("cli", "apapoctl"),
                            f"--coordinator=127.0.0.1:{self.port}", "list"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)  # unavailable

    def test_a_worker_registers_only_under_its_certificates_name(self):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        impostor = t.Process([t.binary("worker", "apapo-worker"),
                              f"--coordinator=127.0.0.1:{self.port}", "--id=w-2",
                              "--threads=1", *self.tls_flags("w-1")[:1],
                              f"--tls_cert={self.pki}/worker-w-1.pem",
                              f"--tls_key={self.pki}/worker-w-1.key"], env=env)
        self.addCleanup(impostor.stop)
        impostor.wait_for_line(r'the client certificate is for worker "w-1"; it cannot '
                               r'register as "w-2"', timeout=60)
        # A client that verifies the server but has no certificate of its
        # own may use the JobService, not pose as a worker.
        creds = grpc.ssl_channel_credentials(root_certificates=self.pem("ca.pem"))
        with grpc.secure_channel(f"localhost:{self.port}", creds) as channel:
            workers = service_pb2_grpc.WorkerServiceStub(channel)
            hello = worker_pb2.WorkerMessage()
            hello.register.worker_id = "w-1"
            stream = workers.Connect(iter([hello]), timeout=30)
            with self.assertRaises(grpc.RpcError) as e:
                list(stream)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn("must present its client certificate", e.exception.details())
            listed = workers.ListWorkers(service_pb2.ListWorkersRequest(), timeout=30)
            self.assertEqual(listed.total, 0)  # nobody got in
            jobs = service_pb2_grpc.JobServiceStub(channel)
            spec = text_format.Parse(JOB, job_pb2.JobSpec())
            job = jobs.SubmitJob(service_pb2.SubmitJobRequest(spec=spec), timeout=30).job
            self.assertEqual(job.state, job_pb2.JOB_STATE_QUEUED)
        # Plain text to a TLS port gets nowhere.
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            with self.assertRaises(grpc.RpcError) as e:
                service_pb2_grpc.JobServiceStub(channel).ListJobs(
                    service_pb2.ListJobsRequest(), timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)


TOKENS = """
# token                     role    user
reader-token-0123456789     read    dashboards
alice-token-0123456789      submit  alice
bob-token-01234567890       submit  bob
ops-token-012345678901      admin   ops
"""


class TokensTest(unittest.TestCase):
    """Bearer tokens with roles: reading, submitting and cancelling one's own
    jobs, and an admin who cancels anyone's."""

    def setUp(self):
        self.dir = t.temp_dir("tokens-")
        tokens = os.path.join(self.dir, "tokens")
        with open(tokens, "w") as f:
            f.write(TOKENS)
        for user, token in (("reader", "reader-token-0123456789"),
                            ("alice", "alice-token-0123456789"),
                            ("bob", "bob-token-01234567890"),
                            ("ops", "ops-token-012345678901")):
            with open(os.path.join(self.dir, user), "w") as f:
                f.write(token + "\n")
        self.coordinator, self.port = t.start_coordinator(
            os.path.join(self.dir, "state.db"), extra=[f"--tokens_file={tokens}"])
        self.addCleanup(self.coordinator.stop)
        self.spec = os.path.join(self.dir, "job.textproto")
        with open(self.spec, "w") as f:
            f.write(JOB)

    def ctl(self, user, *args):
        argv = [t.binary("cli", "apapoctl"), f"--coordinator=127.0.0.1:{self.port}"]
        if user:
            argv.append(f"--token_file={os.path.join(self.dir, user)}")
        return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=60)

    def test_roles_decide_who_reads_submits_and_cancels(self):
        r = self.ctl(None, "list")
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn("ListJobs needs a bearer token", r.stderr)
        self.assertIn("UNAUTHENTICATED", r.stderr)
        r = self.ctl("reader", "submit", self.spec)
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertIn("SubmitJob needs the submit role; dashboards has read", r.stderr)
        r = self.ctl("alice", "submit", self.spec)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "job-000001")
        r = self.ctl("reader", "get", "job-000001")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('owner: "alice"', r.stdout)
        r = self.ctl("bob", "cancel", "job-000001")
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertIn("job-000001 belongs to alice; only its owner or an admin", r.stderr)
        r = self.ctl("ops", "cancel", "job-000001")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.ctl("alice", "watch", "job-000001")  # the history, to its end
        self.assertIn("cancelled: apapoctl cancel (by ops)", r.stdout)
        # ListWorkers too needs a token; a wrong one is not enough.
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            workers = service_pb2_grpc.WorkerServiceStub(channel)
            for metadata in ((), (("authorization", "Bearer not-a-known-token-000"),)):
                with self.assertRaises(grpc.RpcError) as e:
                    workers.ListWorkers(service_pb2.ListWorkersRequest(), timeout=10,
                                        metadata=metadata)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            listed = workers.ListWorkers(
                service_pb2.ListWorkersRequest(), timeout=10,
                metadata=(("authorization", "Bearer reader-token-0123456789"),))
            self.assertEqual(listed.total, 0)


class ListenBeyondLoopbackTest(unittest.TestCase):
    def test_refused_without_tls_unless_insecure(self):
        coordinator = t.binary("coordinator", "apapo-coordinator")
        state = os.path.join(t.temp_dir("tls-"), "state.db")
        r = subprocess.run([coordinator, "--host=0.0.0.0", "--port=0", "--metrics_port=-1",
                            f"--state={state}"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("listening on 0.0.0.0 without TLS", r.stderr)
        self.assertIn("--insecure", r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)  # one line
        p = t.Process([coordinator, "--host=0.0.0.0", "--port=0", "--metrics_port=-1",
                       f"--state={state}", "--insecure"])
        try:
            p.wait_for_line(r"listening on port \d+")
        finally:
            p.stop()


if __name__ == "__main__":
    unittest.main()
