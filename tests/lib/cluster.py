"""A coordinator plus worker daemons on loopback, for end-to-end tests."""

import os

import grpc

from lib import apapo_testlib as t

from proto.apapo.v1 import job_pb2, service_pb2, service_pb2_grpc  # noqa: E402


ENDED = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


class Cluster:
    def __init__(self, workers=2, coordinator_flags=()):
        self.dir = t.temp_dir("e2e-")
        self.state = os.path.join(self.dir, "state.db")
        # Specs may name files under Debian's datasets and this cluster's
        # own folder (TorchScript models, text, checkpoints of a test).
        self.data_roots = f"--data_roots=/usr/share/datasets,{self.dir}"
        self.coordinator_flags = ["--heartbeat_interval=500ms", "--transfer_timeout=20s",
                                  self.data_roots,
                                  f"--checkpoint_root={self.dir}/checkpoints",
                                  *coordinator_flags]
        self.coordinator, self.port = t.start_coordinator(
            self.state, extra=self.coordinator_flags)
        m = self.coordinator.wait_for_line(r"metrics on port (\d+)")
        self.metrics_port = int(m.group(1))
        self.channel = None
        self.connect()
        self.workers = {}
        for i in range(workers):
            self.add_worker(f"w-{i + 1}")

    def restart_coordinator(self):
        """kill -9 of the coordinator, then a new one on the same state and
        port (clients and workers reconnect to it)."""
        self.coordinator.proc.kill()
        self.coordinator.stop()
        self.coordinator, port = t.start_coordinator(
            self.state, extra=[*self.coordinator_flags, f"--port={self.port}"])
        assert port == self.port, (port, self.port)
        m = self.coordinator.wait_for_line(r"metrics on port (\d+)")
        self.metrics_port = int(m.group(1))
        self.connect()

    def connect(self):
        """A new channel to the coordinator (the old one's connection died
        with a killed coordinator)."""
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.jobs = service_pb2_grpc.JobServiceStub(self.channel)
        self.workers_stub = service_pb2_grpc.WorkerServiceStub(self.channel)

    def add_worker(self, worker_id, prefix=(), extra=()):
        self.workers[worker_id] = t.start_worker(self.port, worker_id,
                                                 extra=[self.data_roots, *extra], prefix=prefix)

    def submit(self, s):
        return self.jobs.SubmitJob(service_pb2.SubmitJobRequest(spec=s), timeout=30).job.id

    def get(self, job_id):
        return self.jobs.GetJob(service_pb2.GetJobRequest(job_id=job_id), timeout=30)

    def watch_until(self, job_id, predicate, timeout):
        """Follows WatchJob until predicate(message) holds (a message has the
        job now and, for events, the event); returns the job then."""
        stream = self.jobs.WatchJob(service_pb2.WatchJobRequest(job_id=job_id),
                                    timeout=timeout)
        try:
            for message in stream:
                if predicate(message):
                    return message.job
        finally:
            stream.cancel()
        raise AssertionError(f"{job_id} ended without the awaited condition: "
                             f"{self.get(job_id)}")

    def run_to_end(self, job_id, timeout=600):
        """Follows the job until it ends; returns it and its events' messages
        (WatchJob replays them from the first)."""
        events = []

        def ended(m):
            if m.HasField("event"):
                events.append(m.event.message)
            return m.job.state in ENDED
        return self.watch_until(job_id, ended, timeout), events

    def worker_states(self):
        r = self.workers_stub.ListWorkers(service_pb2.ListWorkersRequest(), timeout=30)
        return {w.info.worker_id: w.state for w in r.workers}

    def close(self):
        self.channel.close()
        for w in self.workers.values():
            w.stop()
        return self.coordinator.stop()


