#!/usr/bin/env python3
"""Checks that a training run's numbers are right, not only that it ended.

A step whose gradient is not finite is skipped, not failed, so "SUCCEEDED" alone lets a run of
NaNs pass. scripts/gpu-check.sh runs this on everything it trains:

  check_losses.py job STATUS.json
      `tandem status JOB -o json`: the job SUCCEEDED, no step was skipped, every loss (and
      validation loss) is finite, and the loss fell: the mean of the last three steps is below
      the mean of the first three.
  check_losses.py bench LOG --expect X [--tol T]
      a benchmark's step table (bench_gpu_gpt, bench/torch_gpt_gpu.py: rows "STEP LOSS ..."):
      every loss finite, and the last within T (default 0.25) of X. On uniform random tokens a
      model cannot beat the entropy, so the loss stays near ln(vocab) rather than falling: the
      expected value is that, and a wrong kernel shows as a loss far from it.

Prints one line saying what was checked; exits 0 when it holds, 1 when it does not (naming the
step), 2 on bad input.
"""
import json
import math
import re
import sys


def fail(msg):
    print(f"check_losses: FAIL: {msg}")
    return 1


def check_job(path):
    try:
        with open(path) as f:
            job = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check_losses: cannot read {path}: {e}", file=sys.stderr)
        return 2
    name = job.get("id", path)
    state = job.get("state", "")
    if state != "SUCCEEDED":
        return fail(f"{name}: state {state or 'unknown'}, not SUCCEEDED ({job.get('reason', '')})")
    history = job.get("history", [])
    if not history:
        return fail(f"{name}: no steps in the history")
    skipped = int(job.get("skipped_steps", 0))
    if skipped:
        return fail(f"{name}: {skipped} step(s) skipped for a non-finite gradient")
    losses = []
    for h in history:
        step = int(h.get("step", 0))
        loss = float(h.get("loss", "nan"))
        if h.get("skipped"):
            return fail(f"{name}: step {step + 1} was skipped (non-finite gradient)")
        if not math.isfinite(loss):
            return fail(f"{name}: step {step + 1} has loss {loss}")
        if h.get("has_val_loss") and not math.isfinite(float(h.get("val_loss", "nan"))):
            return fail(f"{name}: step {step + 1} has validation loss {h.get('val_loss')}")
        losses.append(loss)
    k = min(3, len(losses) // 2)
    if k == 0:
        return fail(f"{name}: {len(losses)} step(s) is too few to see the loss fall")
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if not last < first:
        return fail(f"{name}: the loss did not fall: first {k} steps {first:.4f}, last {k} {last:.4f}")
    print(f"check_losses: {name}: SUCCEEDED, {len(losses)} steps, none skipped, all finite, "
          f"loss {first:.4f} -> {last:.4f}")
    return 0


ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s")


def check_bench(path, expect, tol):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        print(f"check_losses: cannot read {path}: {e}", file=sys.stderr)
        return 2
    losses = []
    for line in lines:
        m = ROW.match(line)
        if not m:
            continue
        try:
            loss = float(m.group(2))
        except ValueError:
            continue
        if not math.isfinite(loss):
            return fail(f"{path}: step {m.group(1)} has loss {loss}")
        losses.append(loss)
    if not losses:
        return fail(f"{path}: no step rows")
    if abs(losses[-1] - expect) > tol:
        return fail(f"{path}: last loss {losses[-1]:.4f} is not within {tol} of {expect:.4f}")
    print(f"check_losses: {path}: {len(losses)} steps, all finite, last loss {losses[-1]:.4f} "
          f"(expected {expect:.4f} +- {tol})")
    return 0


def main(argv):
    usage = "usage: check_losses.py job STATUS.json | bench LOG --expect X [--tol T]"
    if len(argv) >= 2 and argv[0] == "job" and len(argv) == 2:
        return check_job(argv[1])
    if len(argv) >= 2 and argv[0] == "bench":
        args = argv[2:]
        opts = dict(zip(args[::2], args[1::2]))
        if len(args) % 2 or "--expect" not in opts or set(opts) - {"--expect", "--tol"}:
            print(usage, file=sys.stderr)
            return 2
        try:
            return check_bench(argv[1], float(opts["--expect"]), float(opts.get("--tol", 0.25)))
        except ValueError:
            print(usage, file=sys.stderr)
            return 2
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
