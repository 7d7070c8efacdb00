#!/usr/bin/env python3
"""Tests of scripts/check_losses.py: the checks gpu-check.sh runs on what it trains."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "check_losses.py")


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def job(losses, state="SUCCEEDED", skipped=(), **extra):
    # The shape `tandem status JOB -o json` prints: proto field names, int64 as strings,
    # non-finite doubles as "NaN" / "Infinity".
    history = []
    for i, loss in enumerate(losses):
        h = {"step": str(i), "loss": loss if isinstance(loss, str) else float(loss),
             "skipped": i in skipped, "has_val_loss": False, "val_loss": 0}
        history.append(h)
    doc = {"id": "job-7", "state": state, "reason": "", "history": history,
           "skipped_steps": str(len(skipped))}
    doc.update(extra)
    return doc


class CheckLossesTest(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def check_job(self, doc):
        return run("job", self.write(json.dumps(doc)))

    def test_a_falling_finite_run_passes(self):
        rc, out = self.check_job(job([5.5, 5.1, 4.8, 4.0, 3.1, 2.9, 2.7]))
        self.assertEqual(rc, 0, out)
        self.assertIn("loss 5.1333 -> 2.9000", out)

    def test_a_nan_loss_fails_naming_the_step(self):
        rc, out = self.check_job(job([5.5, 5.1, "NaN", 4.0, 3.1, 2.9]))
        self.assertEqual(rc, 1, out)
        self.assertIn("step 3 has loss nan", out)

    def test_a_skipped_step_fails_even_when_the_job_succeeded(self):
        rc, out = self.check_job(job([5.5, 5.1, 4.8, 4.0, 3.1, 2.9], skipped=(4,)))
        self.assertEqual(rc, 1, out)
        self.assertIn("skipped", out)

    def test_a_loss_that_does_not_fall_fails(self):
        rc, out = self.check_job(job([5.5, 5.5, 5.6, 5.6, 5.7, 5.8]))
        self.assertEqual(rc, 1, out)
        self.assertIn("did not fall", out)

    def test_a_failed_job_fails(self):
        rc, out = self.check_job(job([5.5, 5.1], state="FAILED", reason="stage 1: lost"))
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED", out)

    def test_a_non_finite_validation_loss_fails(self):
        doc = job([5.5, 5.1, 4.8, 4.0, 3.1, 2.9])
        doc["history"][5].update(has_val_loss=True, val_loss="Infinity")
        rc, out = self.check_job(doc)
        self.assertEqual(rc, 1, out)
        self.assertIn("validation loss", out)

    def test_a_bench_log_near_the_expected_loss_passes(self):
        log = self.write(" step     loss     norm\n    0  10.9500   1.2\n    1  10.8700   0.9  (warm-up)\n"
                         "    2  10.8400   0.8\nRESULT impl=tandem tokens_per_s=1\n")
        rc, out = run("bench", log, "--expect", "10.826", "--tol", "0.25")
        self.assertEqual(rc, 0, out)
        self.assertIn("3 steps", out)

    def test_a_bench_log_with_nan_or_far_off_fails(self):
        rc, out = run("bench", self.write("    0  10.95 1\n    1     nan 1\n"), "--expect", "10.8")
        self.assertEqual(rc, 1, out)
        self.assertIn("step 1 has loss nan", out)
        rc, out = run("bench", self.write("    0  10.95 1\n    1   7.20 1\n"), "--expect", "10.8")
        self.assertEqual(rc, 1, out)
        self.assertIn("not within", out)

    def test_bad_input_is_a_usage_error(self):
        self.assertEqual(run("bench", "x")[0], 2)
        self.assertEqual(run("job", "/nonexistent/status.json")[0], 2)
        self.assertEqual(run("job", self.write("{not json"))[0], 2)


if __name__ == "__main__":
    unittest.main()
