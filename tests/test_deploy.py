"""The deployment files are valid and refer to what the binaries provide."""

import json
import os
import re
import shutil
import subprocess
import unittest

import yaml

from lib import apapo_testlib as t

DEPLOY = os.path.join(t.ROOT, "deploy")
METRICS_SOURCE = os.path.join(t.ROOT, "coordinator", "metrics.cc")


def exported_metric_names():
    with open(METRICS_SOURCE) as f:
        return set(re.findall(r'"(apapo_[a-z_]+)"', f.read()))


def names_in(expr):
    names = set(re.findall(r"\b(apapo_[a-z_]+?)(?:_bucket|_count|_sum)?\b", expr))
    return {n for n in names if not n.startswith("apapo:")}


class DeployTest(unittest.TestCase):
    def test_prometheus_config_and_rules_pass_promtool(self):
        # `test rules` runs the alerts on series where they must fire (a
        # lost worker, a failed job) and where they must not.
        for args in (["check", "config", "prometheus/prometheus.yml"],
                     ["check", "rules", "prometheus/apapo-rules.yml"],
                     ["test", "rules", "prometheus/apapo-rules.test.yml"]):
            r = subprocess.run(["promtool", *args], cwd=DEPLOY, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_dashboard_and_rules_use_only_exported_metrics(self):
        exported = exported_metric_names()
        self.assertIn("apapo_jobs", exported)
        with open(os.path.join(DEPLOY, "grafana", "apapo-dashboard.json")) as f:
            dashboard = json.load(f)
        exprs = [target["expr"] for p in dashboard["panels"] for target in p["targets"]]
        with open(os.path.join(DEPLOY, "prometheus", "apapo-rules.yml")) as f:
            rules = yaml.safe_load(f)
        exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
        self.assertGreater(len(exprs), 10)
        for expr in exprs:
            unknown = names_in(expr) - exported
            self.assertFalse(unknown, f"{expr!r} uses metrics nobody exports: {unknown}")

    def test_kubernetes_manifests_parse_and_use_real_flags(self):
        with open(os.path.join(DEPLOY, "kubernetes", "apapo.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        kinds = sorted(d["kind"] for d in docs)
        self.assertEqual(kinds, ["Deployment", "PersistentVolumeClaim",
                                 "PersistentVolumeClaim", "Service", "Service",
                                 "StatefulSet"])
        # Every worker pod mounts the one checkpoint volume all of them share,
        # at the coordinator's default --checkpoint_root.
        claims = {d["metadata"]["name"]: d for d in docs
                  if d["kind"] == "PersistentVolumeClaim"}
        self.assertEqual(claims["apapo-checkpoints"]["spec"]["accessModes"], ["ReadWriteMany"])
        worker = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
        volume = next(v for v in worker["volumes"] if v.get("persistentVolumeClaim"))
        self.assertEqual(volume["persistentVolumeClaim"]["claimName"], "apapo-checkpoints")
        mounts = {m["name"]: m["mountPath"] for m in worker["containers"][0]["volumeMounts"]}
        self.assertEqual(mounts[volume["name"]], "/var/lib/apapo/checkpoints")
        for d in docs:
            if d["kind"] in ("Deployment", "StatefulSet"):
                for c in d["spec"]["template"]["spec"]["containers"]:
                    self.assert_flags_exist(c["args"][0], c["args"][1:])
                    # Unprivileged, read-only root, no capabilities.
                    sc = c.get("securityContext", {})
                    self.assertTrue(sc.get("runAsNonRoot"), c["name"])
                    self.assertFalse(sc.get("allowPrivilegeEscalation", True), c["name"])
                    self.assertTrue(sc.get("readOnlyRootFilesystem"), c["name"])
                    self.assertEqual(sc.get("capabilities", {}).get("drop"), ["ALL"])

    def test_kubernetes_manifests_pin_the_image_build_sh_makes(self):
        # Not :latest: the tag deploy/image/build.sh gives, run as the user
        # its Containerfile sets (tests/test_image.py builds and runs it).
        tag = subprocess.run(["bash", os.path.join(DEPLOY, "image", "build.sh"), "--print-tag"],
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        self.assertRegex(tag, r"^localhost/apapo:\d+\.\d+\.\d+$")
        with open(os.path.join(DEPLOY, "image", "Containerfile")) as f:
            user = re.search(r"^USER (\d+):(\d+)$", f.read(), re.M)
        uid, gid = int(user.group(1)), int(user.group(2))
        self.assertNotEqual(uid, 0)
        with open(os.path.join(DEPLOY, "kubernetes", "apapo.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        containers = [c for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                      for c in d["spec"]["template"]["spec"]["containers"]]
        self.assertEqual(len(containers), 2)
        for c in containers:
            self.assertEqual(c["image"], tag, c["name"])
            self.assertEqual(c["securityContext"]["runAsUser"], uid, c["name"])
            self.assertEqual(c["securityContext"]["runAsGroup"], gid, c["name"])

    def test_systemd_units_use_real_flags(self):
        for unit in ("apapo-coordinator.service", "apapo-worker@.service"):
            with open(os.path.join(DEPLOY, "systemd", unit)) as f:
                text = f.read()
            self.assertIn("[Service]", text)
            exec_line = re.search(r"^ExecStart=(\S+)(.*)$", text, re.M)
            self.assertTrue(exec_line, unit)
            binary = os.path.basename(exec_line.group(1))
            self.assert_flags_exist(binary, exec_line.group(2).split())

    def test_systemd_units_are_confined(self):
        # Rated as `systemd-analyze security` rates an installed unit (0 is
        # best, 10 worst; both units were 8.3-8.4 "EXPOSED" before).
        analyze = shutil.which("systemd-analyze")
        if not analyze:
            self.skipTest("systemd-analyze is not installed")
        tmp = t.temp_dir("units-")
        for unit, installed in (("apapo-coordinator.service", "apapo-coordinator.service"),
                                ("apapo-worker@.service", "apapo-worker@1.service")):
            path = os.path.join(tmp, installed)
            shutil.copy(os.path.join(DEPLOY, "systemd", unit), path)
            r = subprocess.run([analyze, "security", "--offline=yes", path],
                               capture_output=True, text=True, timeout=60)
            m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
            self.assertTrue(m, r.stdout + r.stderr)
            self.assertLess(float(m.group(1)), 2.0, f"{unit}: {m.group(0)}")

    def assert_flags_exist(self, binary, args):
        package = {"apapo-coordinator": "coordinator", "apapo-worker": "worker"}[binary]
        r = subprocess.run([t.binary(package, binary), "--helpfull"],
                           capture_output=True, text=True, timeout=60)
        known = set(re.findall(r"--([a-z_]+)", r.stdout + r.stderr))
        for arg in args:
            flag = re.match(r"--([a-z_]+)", arg)
            self.assertTrue(flag, f"{binary}: unexpected argument {arg}")
            self.assertIn(flag.group(1), known, f"{binary} has no flag --{flag.group(1)}")


if __name__ == "__main__":
    unittest.main()
