"""A real Prometheus server (Debian's `prometheus`) scrapes the coordinator's
/metrics endpoint; promtool checks the exposition format."""

import json
import os
import subprocess
import unittest
import urllib.parse
import urllib.request

from lib import apapo_testlib as t
from lib.cluster import Cluster


class PrometheusTest(unittest.TestCase):
    def test_real_prometheus_scrapes_the_coordinator(self):
        c = Cluster(workers=0)
        prom = None
        try:
            cfg = os.path.join(c.dir, "prometheus.yml")
            with open(cfg, "w") as f:
                f.write("global: {scrape_interval: 1s}\n"
                        "scrape_configs:\n"
                        "  - job_name: apapo\n"
                        f"    static_configs: [{{targets: ['127.0.0.1:{c.metrics_port}']}}]\n")
            web = t.free_port()
            prom = t.Process(["prometheus", f"--config.file={cfg}",
                              f"--storage.tsdb.path={os.path.join(c.dir, 'tsdb')}",
                              f"--web.listen-address=127.0.0.1:{web}"])
            prom.wait_for_line(r"Server is ready to receive web requests")

            def query(expr):
                url = f"http://127.0.0.1:{web}/api/v1/query?query={urllib.parse.quote(expr)}"
                with urllib.request.urlopen(url, timeout=10) as r:
                    return json.load(r)["data"]["result"]

            up = t.wait_until(lambda: [s for s in query('up{job="apapo"}')
                                       if s["value"][1] == "1"], 60, "target up")
            self.assertTrue(up)
            jobs = t.wait_until(lambda: query("apapo_jobs"), 30, "apapo_jobs series")
            states = {s["metric"]["state"] for s in jobs}
            self.assertTrue({"queued", "running", "succeeded", "failed"} <= states, states)
            self.assertTrue(query("apapo_workers"))
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


if __name__ == "__main__":
    unittest.main()
