"""Full-length accuracy checks on Fashion-MNIST (3 epochs each; the slowest
tests of the suite, ~15-20 minutes on 2 cores):

- the README's main command (`deploy/demo.sh`, coordinator + two worker
  daemons, the planner's choice for the mlp) with --epochs=3, run as a new
  user runs it: in a fresh `git clone` of this tree's HEAD whose Bazel output
  base has never built anything (the Bazel disk cache tests/run.sh shares,
  $APAPO_BAZEL_DISK_CACHE, keeps that build short). The job succeeds, the planner ran it as an async pipeline on 2 stages, and its
  test accuracy is within 0.5 point of single-process training of the same
  model and settings (which the demo also runs), as the runtime issue asks;
- the `cnn` with the async schedule on 2 stages (`apapo-worker --local=2`) reaches
  >= 89% test accuracy in 3 epochs.

Both figures are printed, so the CI log states them."""

import json
import os
import subprocess
import tempfile
import unittest

from lib.apapo_testlib import ROOT, binary

ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


class AccuracyTest(unittest.TestCase):

    def test_main_command_three_epochs_matches_single_process(self):
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "demo.json")
            log = os.path.join(tmp, "demo.log")
            clone = os.path.join(tmp, "clone")
            subprocess.run(["git", "clone", "--quiet", ROOT, clone], check=True,
                           timeout=300)
            cache = os.environ.get("APAPO_BAZEL_DISK_CACHE")
            if cache:
                with open(os.path.join(clone, ".bazelrc.user"), "w") as f:
                    f.write(f"build --disk_cache={cache}\n")
            try:
                with open(log, "w") as out:
                    rc = subprocess.run(
                        ["bash", "deploy/demo.sh", "examples/mlp_fashion_mnist.textproto",
                         "--epochs=3"],
                        cwd=clone, env=dict(ENV, APAPO_DEMO_RESULT=result),
                        stdout=out, stderr=subprocess.STDOUT, timeout=2400).returncode
            finally:
                # The clone's output base goes with the clone (expunging also
                # stops the clone's Bazel server).
                subprocess.run(["bazel", "clean", "--expunge"], cwd=clone,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=300)
            with open(log) as f:
                text = f.read()
            self.assertEqual(rc, 0, text[-3000:])
            self.assertNotIn("Traceback", text, text[-3000:])
            with open(result) as f:
                r = json.load(f)
        print(f"\nmain command, mlp, 3 epochs: APapo {100 * r['apapo_accuracy']:.2f}% at "
              f"{r['apapo_samples_per_s']:.0f} samples/s; single process "
              f"{100 * r['single_accuracy']:.2f}% at {r['single_samples_per_s']:.0f} samples/s",
              flush=True)
        # The planner's choice for this model: an async pipeline of 2 stages.
        self.assertRegex(r["plan"], r"2 stage\(s\) on 2 worker\(s\), schedule async",
                         r["plan"])
        # The runtime issue's bound. Measured with the example's settings
        # (--local=2, seeds 1-3): -0.21, -0.12, 0.00 point with weight
        # prediction (the async default); -0.43 and -0.54 without it.
        self.assertGreaterEqual(r["apapo_accuracy"], r["single_accuracy"] - 0.005,
                                f"async {r['apapo_accuracy']} vs single {r['single_accuracy']}")

    def test_cnn_async_two_stages_reaches_89_percent(self):
        spec = os.path.join(ROOT, "worker", "testdata", "cnn_fashion_mnist.textproto")
        with tempfile.TemporaryDirectory() as tmp:
            summary = os.path.join(tmp, "cnn.json")
            p = subprocess.run(
                [binary("worker", "apapo-worker"), "--local=2", f"--spec={spec}",
                 f"--summary={summary}", "--threads=1"],
                cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, timeout=2400)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:])
            with open(summary) as f:
                s = json.load(f)
        print(f"\ncnn, async, 2 stages, 3 epochs: {100 * s['final_test_accuracy']:.2f}% at "
              f"{s['samples_per_s']:.0f} samples/s, max staleness {s.get('max_staleness')}",
              flush=True)
        self.assertTrue(s["plan"].startswith("async, 2 stage(s)"), s["plan"])
        self.assertGreaterEqual(s["final_test_accuracy"], 0.89)


if __name__ == "__main__":
    unittest.main()
