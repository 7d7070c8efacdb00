#!/usr/bin/env python3
"""Sweeps three learning rates as three Tandem jobs and prints a comparison table.

    pip install ./python                       # the client (tandem-client), from the checkout
    export TANDEM_COORDINATOR=127.0.0.1:7070   # and TANDEM_TLS_CA etc. with TLS, as for the CLI
    python3 examples/lr_sweep.py               # --lrs 1e-3,3e-3,1e-2 --steps 60

The jobs are submitted at once and queue for the workers (each takes a gang of 2); the script
follows them in turn and prints, per learning rate, the final training loss, the best
validation loss, the time per step and how the job ended. The model is a small GPT on
synthetic bytes, so it runs on any cluster of two CPU workers without data files; for a real
comparison point data.path at a text file the workers hold (see examples/quickstart.yaml).
"""

import argparse
import copy
import sys

import tandem


def base_spec(preset: str, steps: int) -> dict:
    return {
        "name": "lr-sweep",
        "steps": steps,
        "model": {"preset": preset},
        "pipeline": {"stages": 2, "micro_batch_size": 4, "micro_batches": 4,
                     "partition": "uniform"},
        "optimizer": {"name": "adamw", "warmup_steps": max(1, steps // 10),
                      "lr_schedule": "cosine"},
        "eval": {"every": max(1, steps // 3), "micro_batches": 2},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lrs", default="1e-3,3e-3,1e-2",
                        help="comma-separated learning rates (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=60, help="steps per job (default: 60)")
    parser.add_argument("--preset", default="gpt2-tiny",
                        help="model.preset (default: gpt2-tiny; llama-tiny also runs on bytes)")
    parser.add_argument("--coordinator", default=None,
                        help="HOST:PORT (default: $TANDEM_COORDINATOR, else 127.0.0.1:7070)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds to wait for each job (default: 1800)")
    args = parser.parse_args()
    lrs = [float(x) for x in args.lrs.split(",") if x.strip()]

    client = tandem.Client(args.coordinator)
    jobs = []
    for lr in lrs:
        spec = copy.deepcopy(base_spec(args.preset, args.steps))
        spec["name"] = "lr-sweep-%g" % lr
        spec["optimizer"]["lr"] = lr
        jobs.append((lr, client.submit(spec)))
        print("submitted %s: lr %g" % (jobs[-1][1].id, lr), file=sys.stderr)

    rows = []
    for lr, job in jobs:
        status = job.wait(timeout=args.timeout, raise_on_failure=False)
        history = job.history()
        val = [s.val_loss for s in history if s.val_loss is not None]
        ms = 1000 * sum(s.step_seconds for s in history) / len(history) if history else float("nan")
        rows.append((job.id, lr, status.last_loss, min(val) if val else None, ms, status.state))

    print("%-10s %8s %11s %14s %9s  %s" % ("JOB", "LR", "FINAL LOSS", "BEST VAL LOSS", "MS/STEP",
                                          "STATE"))
    for job_id, lr, loss, val, ms, state in rows:
        print("%-10s %8g %11s %14s %9.1f  %s" % (
            job_id, lr, "%.4f" % loss if loss is not None else "-",
            "%.4f" % val if val is not None else "-", ms, state))
    done = [r for r in rows if r[5] == "SUCCEEDED" and r[3] is not None]
    if done:
        best = min(done, key=lambda r: r[3])
        print("\nbest: lr %g (%s), validation loss %.4f" % (best[1], best[0], best[3]))
    return 0 if all(r[5] == "SUCCEEDED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
