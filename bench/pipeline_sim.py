#!/usr/bin/python3
"""A small timed simulator of the GPipe and 1F1B pipeline schedules, for the pipeline
benchmark (bench/pipeline_bench.sh, bench/torch_pipeline.py).

It mirrors the semantics of Tandem's SimulateProgram (common/schedule_check.h) for the two
plain schedules, so that a bubble predicted from *measured* per-stage costs can be printed
next to a measured one without a C++ build: every rank runs its compute actions in order; a
forward of stage s on micro-batch i starts when the rank is free and stage s-1's forward of i
has ended (+ transfer); a backward of stage s starts when the rank is free and stage s+1's
backward of i has ended (+ transfer). Sends never block. The action orders are those of
common/schedule.cc: GPipe runs F0..F(M-1) then B(M-1)..B0; 1F1B warms up with
min(P-1-r, M) forwards, then alternates F, B, then drains the backwards.

    /usr/bin/python3 bench/pipeline_sim.py --schedule 1f1b --m 8 --f 1,1 --b 2,2 [--xfer 0]

prints one JSON line: step time, per-rank busy and bubble, mean bubble, the ideal
(P-1)/(M+P-1) and the peak number of live micro-batches per rank. --f/--b take one cost per
stage (seconds or any unit); a single value applies to every stage of --stages.
"""

import argparse
import json


def schedule(name, num_stages, m):
    """Per rank, the list of ("F"|"B", micro_batch) in execution order."""
    prog = []
    for r in range(num_stages):
        ops = []
        if name == "gpipe":
            ops += [("F", i) for i in range(m)]
            ops += [("B", i) for i in reversed(range(m))]
        elif name == "1f1b":
            if m < num_stages:
                raise ValueError(f"1f1b needs M >= P (M={m}, P={num_stages})")
            warmup = min(num_stages - r - 1, m)
            nf = nb = 0
            for _ in range(warmup):
                ops.append(("F", nf))
                nf += 1
            while nf < m:
                ops.append(("F", nf))
                nf += 1
                ops.append(("B", nb))
                nb += 1
            while nb < m:
                ops.append(("B", nb))
                nb += 1
        else:
            raise ValueError(f"unknown schedule {name!r}; expected 1f1b or gpipe")
        prog.append(ops)
    return prog


def simulate(name, m, fwd, bwd, xfer=0.0):
    """fwd, bwd: per-stage costs (lists of equal length P). Returns a dict."""
    p = len(fwd)
    prog = schedule(name, p, m)
    end = {}  # (kind, stage, mb) -> end time
    free = [0.0] * p
    busy = [0.0] * p
    pos = [0] * p
    live = [0] * p
    peak_live = [0] * p
    remaining = sum(len(ops) for ops in prog)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(prog[r]):
                kind, i = prog[r][pos[r]]
                if kind == "F":
                    dep = ("F", r - 1, i) if r > 0 else None
                else:
                    dep = ("B", r + 1, i) if r < p - 1 else ("F", r, i)
                if dep is not None and dep not in end:
                    break
                ready = 0.0
                if dep is not None:
                    ready = end[dep] + (xfer if dep[1] != r else 0.0)
                cost = fwd[r] if kind == "F" else bwd[r]
                start = max(free[r], ready)
                free[r] = start + cost
                busy[r] += cost
                end[(kind, r, i)] = free[r]
                live[r] += 1 if kind == "F" else -1
                peak_live[r] = max(peak_live[r], live[r])
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("deadlock in the simulated schedule")
    step = max(free)
    bubble = [1.0 - b / step for b in busy]
    return {
        "schedule": name,
        "stages": p,
        "m": m,
        "step": step,
        "busy": busy,
        "bubble": bubble,
        "bubble_mean": sum(bubble) / p,
        "bubble_ideal": (p - 1) / (m + p - 1),
        "peak_live_micro_batches": peak_live,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--f", default="1", help="forward cost per stage, comma-separated")
    ap.add_argument("--b", default="2", help="backward cost per stage, comma-separated")
    ap.add_argument("--xfer", type=float, default=0.0, help="transfer latency per message")
    a = ap.parse_args()
    f = [float(x) for x in a.f.split(",")]
    b = [float(x) for x in a.b.split(",")]
    if len(f) == 1:
        f = f * a.stages
    if len(b) == 1:
        b = b * a.stages
    if len(f) != len(b):
        ap.error("--f and --b need the same number of stages")
    print(json.dumps(simulate(a.schedule, a.m, f, b, a.xfer)))


if __name__ == "__main__":
    main()
