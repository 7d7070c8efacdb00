#!/usr/bin/python3
"""Helper of bench/pipeline_bench.sh: turns `tandem status JOB -o json` into one result line,
and a file of result lines (Tandem's and bench/torch_pipeline.py's) into the benchmark's
tables, a markdown summary and one JSON summary line.

    pipeline_report.py tandem STATUS.json --section S --label L   -> one JSON line
    pipeline_report.py tag --section S --label L < torch.json      -> the same line, tagged
    pipeline_report.py summary RESULTS.jsonl                       -> tables, markdown, JSON

Tandem figures come from tandem.v1.Job (proto/tandem/v1/coordinator.proto): per step,
StepSummary.step_seconds (coordinator wall time of the step, RunStep + ApplyStep: the same
span as the torch peer's step, forward/backward + optimizer), max_worker_exec_seconds (the
slowest worker's RunStep execution), busy_seconds (per rank, time in compute actions),
bubble_measured (1 - sum(busy) / (P x max exec)), bubble_predicted (the simulator on the
program with that step's measured per-stage action costs, transfers at the plan's price: free
without a profiled link),
rank_peak_activation_bytes (per rank; peak_activation_bytes is their max), loss. The first
step is a warm-up and is left out of every median. The torch peer's bubble is defined the
same way (1 - busy / wall per rank, its busy time being its timed forwards and backwards).
"""

import argparse
import json
import os
import re
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ under bench/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipeline_sim import simulate  # noqa: E402


def med(xs):
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def tandem_record(path, section, label):
    with open(path) as f:
        job = json.load(f)
    spec = job.get("spec", {})
    model, pipe = spec.get("model", {}), spec.get("pipeline", {})
    hist = job.get("history", [])
    measured = hist[1:] if len(hist) > 1 else hist
    stages = int(pipe.get("stages", 1))
    profiled = any(h.get("busy_seconds") for h in measured)
    stages_run = min((len(h["busy_seconds"]) for h in measured if h.get("busy_seconds")),
                     default=0)
    return {
        "section": section,
        "label": label,
        "peer": "tandem",
        "job": job.get("id"),
        "state": job.get("state"),
        "reason": job.get("reason", ""),
        "mode": "single" if stages == 1 else "pipeline",
        "schedule": pipe.get("schedule") if stages > 1 else None,
        "recompute": pipe.get("recompute", "none"),
        "budget_mb": int(pipe.get("memory_budget_mb", 0)),
        "stages": stages,
        "stage_layers": [[int(s.get("layer_begin", 0)), int(s.get("layer_end", 0))]
                         for s in job.get("stages", [])],
        "shape": {"layers": int(model.get("n_layer", 0)), "d": int(model.get("d_model", 0)),
                  "heads": int(model.get("n_head", 0)), "mb": int(pipe.get("micro_batch_size", 0)),
                  "seq": int(model.get("seq_len", 0)), "m": int(pipe.get("micro_batches", 0)),
                  "vocab": int(model.get("vocab_size", 0)), "steps": int(spec.get("steps", 0))},
        "step_s": med(float(h.get("step_seconds", 0)) for h in measured),
        "steps_s": [float(h.get("step_seconds", 0)) for h in hist],
        "exec_s": med(float(h.get("max_worker_exec_seconds", 0)) for h in measured),
        "overhead_s": med(float(h.get("coordinator_overhead_seconds", 0)) for h in measured),
        "peak_activation_bytes": max([int(h.get("peak_activation_bytes", 0)) for h in hist] or [0]),
        "bytes_sent": med(int(h.get("bytes_sent", 0)) for h in measured),
        "bubble_ideal": float(job.get("bubble_fraction_ideal", 0)),
        # Absent (None) from builds whose StepSummary has no step profile.
        "bubble_measured": med(float(h["bubble_measured"]) for h in measured
                               if h.get("busy_seconds")) if profiled else None,
        "bubble_predicted": med(float(h["bubble_predicted"]) for h in measured
                                if h.get("busy_seconds")) if profiled else None,
        "busy_s": [med(float(h["busy_seconds"][r]) for h in measured if h.get("busy_seconds"))
                   for r in range(stages_run)] if profiled else None,
        "rank_peak_activation_bytes": [
            max(int(h["rank_peak_activation_bytes"][r]) for h in hist
                if len(h.get("rank_peak_activation_bytes", [])) > r)
            for r in range(len(hist[-1].get("rank_peak_activation_bytes", [])) if hist else 0)]
            or None,
        "losses": [float(h.get("loss", 0)) for h in hist],
        # Per stage: the plan's bytes (static + the schedule's peak activations + messages, from
        # the layer profile; 0 without one) and the measured peak (StepSummary.stage_peak_bytes).
        "stage_predicted_bytes": [int(s.get("predicted_bytes", 0)) for s in job.get("stages", [])],
        "stage_peak_bytes": [
            max(int(h["stage_peak_bytes"][s]) for h in hist
                if len(h.get("stage_peak_bytes", [])) > s)
            for s in range(len(hist[-1].get("stage_peak_bytes", [])) if hist else 0)],
        "recompute_stages": [s.get("stage", i) for i, s in enumerate(job.get("stages", []))
                             if "R" in s.get("actions", "")],
        # Per stage, the micro-batches its program recomputes (its R actions).
        "recomputed": [len(re.findall(r"\d+R\d+", s.get("actions", "")))
                       for s in job.get("stages", [])],
    }


def stage0(r):
    """Stage 0's peak live activation bytes (the max over stages on builds without per rank)."""
    return (r.get("rank_peak_activation_bytes") or [r["peak_activation_bytes"]])[0]


def find(recs, section, **kw):
    for r in recs:
        if r.get("section") == section and all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def fmt(x, spec=".3f"):
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    return format(x, spec)


def loss_diff(a, b):
    if not a or not b:
        return None
    n = min(len(a["losses"]), len(b["losses"]))
    return max(abs(x - y) for x, y in zip(a["losses"][:n], b["losses"][:n]))


def summary(path):
    recs = [json.loads(line) for line in open(path) if line.strip()]
    out = {"speedup": None, "bubble": [], "memory": None, "recompute": None}
    md = []

    # ------------------------------------------------------------------ speed-up
    t1 = find(recs, "speedup", peer="tandem", stages=1)
    t2 = find(recs, "speedup", peer="tandem", mode="pipeline", schedule="1f1b")
    tz = find(recs, "speedup", peer="tandem", mode="pipeline", schedule="zb_h1")
    # The hand-written peer (bench/torch_pipeline.py) and, with --torch2, the
    # torch.distributed.pipelining peer (bench/torch_pipelining.py, peer "torch-V-pipelining").
    pipelining = lambda r: r["peer"].endswith("-pipelining")  # noqa: E731
    handwritten = lambda r: r["peer"] != "tandem" and not pipelining(r)  # noqa: E731
    p1 = next((r for r in recs if r.get("section") == "speedup" and handwritten(r)
               and r["mode"] == "single"), None)
    p2 = next((r for r in recs if r.get("section") == "speedup" and handwritten(r)
               and r["mode"] == "pipeline"), None)
    q1 = next((r for r in recs if r.get("section") == "speedup" and pipelining(r)
               and r["mode"] == "single"), None)
    q2 = next((r for r in recs if r.get("section") == "speedup" and pipelining(r)
               and r["mode"] == "pipeline"), None)
    if t1 or t2 or p1 or p2 or q1 or q2:
        shape = (t2 or t1 or p2 or p1 or q2 or q1)["shape"]
        m, p = shape["m"], (t2 or p2 or q2 or {"stages": 2})["stages"]
        bound = p * m / (m + p - 1)
        su_t = t1["step_s"] / t2["step_s"] if t1 and t2 else None
        su_p = p1["step_s"] / p2["step_s"] if p1 and p2 else None
        ratio = t2["step_s"] / p2["step_s"] if t2 and p2 else None
        su_q = q1["step_s"] / q2["step_s"] if q1 and q2 else None
        ratio_q = t2["step_s"] / q2["step_s"] if t2 and q2 else None
        qver = (q1 or q2)["peer"][len("torch-"):-len("-pipelining")] if q1 or q2 else None
        # The bound once the measured stage imbalance is counted (torch's per-stage costs).
        bound_imb = None
        if p2 and p2.get("f_s"):
            sim = simulate(p2["schedule"], m, p2["f_s"], p2["b_s"])
            bound_imb = sum(sim["busy"]) / sim["step"]
        print("== Pipeline speed-up: %s ==" % ", ".join(f"{k} {v}" for k, v in shape.items()))
        su_z = t1["step_s"] / tz["step_s"] if t1 and tz else None
        rows = [("Tandem, 1 worker", t1, None), (f"Tandem, {p} workers 1f1b", t2, su_t),
                (f"Tandem, {p} workers zb_h1", tz, su_z),
                ("PyTorch 1.13, 1 process", p1, None),
                (f"PyTorch 1.13, {p} processes 1f1b", p2, su_p)]
        if q1 or q2:
            qsched = (q2 or {}).get("schedule") or "1f1b"
            rows += [(f"PyTorch {qver} pipelining, 1 process", q1, None),
                     (f"PyTorch {qver} pipelining, {p} processes {qsched}", q2, su_q)]
        w = max([34] + [len(name) + 1 for name, _, _ in rows])
        print(f"{'run':<{w}} {'step s':>8} {'exec s':>8} {'speed-up':>9}  loss[0..]")
        md.append("| run | step s | speed-up |")
        md.append("|---|---|---|")
        for name, r, su in rows:
            if r is None:
                print(f"{name:<{w}} {'(not run)':>8}")
                continue
            print(f"{name:<{w}} {fmt(r['step_s']):>8} {fmt(r.get('exec_s')):>8} "
                  f"{fmt(su, '.2f') + 'x' if su else '':>9}  "
                  f"{', '.join('%.4f' % x for x in r['losses'][:4])}")
            md.append(f"| {name} | {fmt(r['step_s'])} | {fmt(su, '.2f') + 'x' if su else ''} |")
        print(f"ideal bound P(1 - (P-1)/(M+P-1)) = {bound:.2f}x"
              + (f"; with the torch peer's measured stage costs "
                 f"(f {', '.join('%.3f' % x for x in p2['f_s'])} s, "
                 f"b {', '.join('%.3f' % x for x in p2['b_s'])} s per micro-batch) "
                 f"the 1f1b bound is {bound_imb:.2f}x" if bound_imb else ""))
        if su_t is not None:
            print(f"target: Tandem P{p} speed-up >= 1.75x: {su_t:.2f}x "
                  f"{'PASS' if su_t >= 1.75 else 'FAIL'}")
        if ratio is not None:
            print(f"target: Tandem P{p} step <= 0.95 x PyTorch P{p} step: {ratio:.2f} "
                  f"{'PASS' if ratio <= 0.95 else 'FAIL'}")
        if ratio_q is not None:
            print(f"target: Tandem P{p} step <= 0.95 x PyTorch {qver} pipelining P{p} step: "
                  f"{ratio_q:.2f} {'PASS' if ratio_q <= 0.95 else 'FAIL'}")
        for r in (t2, tz):
            if r and r.get("bubble_measured") is not None:
                print(f"Tandem P{p} {r['schedule']} bubble: measured {r['bubble_measured']:.3f}, "
                      f"predicted from its measured costs {r['bubble_predicted']:.3f}; busy per "
                      f"rank {', '.join('%.3f' % x for x in r['busy_s'])} s")
        if p2 and p2.get("bubble"):
            print(f"PyTorch P{p} bubble per rank: measured "
                  f"{', '.join('%.3f' % x for x in p2['bubble'])}, simulated from its costs "
                  f"{', '.join('%.3f' % x for x in p2['bubble_sim'])}; peak RSS "
                  f"{', '.join('%.0f' % x for x in p2['rss_mib'])} MiB")
        if q2 and q2.get("bubble"):
            print(f"PyTorch {qver} pipelining P{p} bubble per rank: measured "
                  f"{', '.join('%.3f' % x for x in q2['bubble'])}, simulated from its costs "
                  f"{', '.join('%.3f' % x for x in q2['bubble_sim'])}; peak RSS "
                  f"{', '.join('%.0f' % x for x in q2['rss_mib'])} MiB (of which "
                  f"{', '.join('%.0f' % x for x in q2.get('rss_import_mib', []))} MiB "
                  f"after `import torch`)")
        for a, b, what in ((t1, t2, "Tandem P1 vs P2"), (p1, p2, "PyTorch P1 vs P2"),
                           (q1, q2, f"PyTorch {qver} pipelining P1 vs P2"),
                           (q1, p1, f"PyTorch {qver} pipelining P1 vs PyTorch 1.13 P1")):
            d = loss_diff(a, b)
            if d is not None:
                print(f"loss agreement {what}: max |diff| {d:.2e}")
        md.append(f"\nTandem P{p} / PyTorch P{p}: {fmt(ratio, '.2f')}; ideal bound {bound:.2f}x"
                  + (f", bound with measured stage costs {bound_imb:.2f}x" if bound_imb else ""))
        if q1 or q2:
            md.append(f"Tandem P{p} / PyTorch {qver} pipelining P{p}: {fmt(ratio_q, '.2f')}")
        out["speedup"] = {"shape": shape, "tandem_p1_s": t1 and t1["step_s"],
                          "tandem_p2_s": t2 and t2["step_s"],
                          "tandem_p2_zb_h1_s": tz and tz["step_s"], "tandem_zb_h1_speedup": su_z,
                          "torch_p1_s": p1 and p1["step_s"],
                          "torch_p2_s": p2 and p2["step_s"], "tandem_speedup": su_t,
                          "torch_speedup": su_p, "tandem_over_torch_p2": ratio,
                          "bound_ideal": bound, "bound_measured_costs": bound_imb,
                          "torch_p2_rss_mib": p2 and p2["rss_mib"]}
        if q1 or q2:
            out["speedup"].update({"pipelining_peer": (q1 or q2)["peer"],
                                   "pipelining_p1_s": q1 and q1["step_s"],
                                   "pipelining_p2_s": q2 and q2["step_s"],
                                   "pipelining_speedup": su_q,
                                   "tandem_over_pipelining_p2": ratio_q,
                                   "pipelining_p2_rss_mib": q2 and q2["rss_mib"]})
        print()

    # ------------------------------------------------------------------ bubble
    brecs = [r for r in recs if r.get("section") == "bubble"]
    ms = sorted({r["shape"]["m"] for r in brecs})
    if ms:
        shape = brecs[0]["shape"]
        print("== Bubble, P=2 1f1b: %s ==" % ", ".join(
            f"{k} {v}" for k, v in shape.items() if k != "m"))
        print("measured = 1 - sum(busy) / (P x step wall), predicted = the simulator on the "
              "measured per-stage costs; target |measured - predicted| <= 0.03")
        print(f"{'M':>3} {'ideal':>6} | {'Tandem meas':>11} {'pred':>6} {'|d|':>6} {'':>4} | "
              f"{'torch meas':>10} {'pred':>6} {'|d|':>6} {'':>4}")
        md.append("\n| M | ideal | Tandem measured | Tandem predicted | torch measured "
                  "| torch predicted |")
        md.append("|---|---|---|---|---|---|")
        verdict = lambda d: "" if d is None else ("PASS" if d <= 0.03 else "FAIL")  # noqa: E731
        for m in ms:
            t = next((r for r in brecs if r["peer"] == "tandem" and r["stages"] > 1
                      and r["shape"]["m"] == m), None)
            c = next((r for r in brecs if r["peer"] != "tandem" and r["shape"]["m"] == m), None)
            ideal = 1 / (m + 1)
            tm = t and t.get("bubble_measured")
            tp = t and t.get("bubble_predicted")
            cm = c["bubble_mean"] if c else None
            cp = c["bubble_sim_mean"] if c else None
            dt = abs(tm - tp) if tm is not None and tp is not None else None
            dc = abs(cm - cp) if cm is not None else None
            print(f"{m:>3} {ideal:>6.3f} | {fmt(tm):>11} {fmt(tp):>6} {fmt(dt):>6} "
                  f"{verdict(dt):>4} | {fmt(cm):>10} {fmt(cp):>6} {fmt(dc):>6} {verdict(dc):>4}")
            md.append(f"| {m} | {ideal:.3f} | {fmt(tm)} | {fmt(tp)} | {fmt(cm)} | {fmt(cp)} |")
            out["bubble"].append({"m": m, "ideal": ideal, "tandem_measured": tm,
                                  "tandem_predicted": tp, "torch_measured": cm,
                                  "torch_predicted": cp,
                                  "tandem_busy_s": t and t.get("busy_s"),
                                  "tandem_step_s": t and t["step_s"]})
        if any(r["peer"] == "tandem" and r["stages"] > 1 and r.get("bubble_measured") is None
               for r in brecs):
            print("(n/a: this build's StepSummary has no busy_seconds / bubble_measured)")
        print()

    # ------------------------------------------------------------------ schedules
    srecs = [r for r in recs if r.get("section") == "schedules" and r["peer"] == "tandem"]
    if srecs:
        shape = srecs[0]["shape"]
        print("== Every schedule, P=2: %s ==" % ", ".join(f"{k} {v}" for k, v in shape.items()))
        print(f"{'schedule':<17} {'step s':>8} {'meas':>6} {'pred':>6} {'|d|':>6} {'':>4} "
              f"{'stage 0 peak MiB':>16}")
        md.append("\n| schedule | step s | bubble measured | predicted | stage 0 peak MiB |")
        md.append("|---|---|---|---|---|")
        rows = []
        for r in srecs:
            tm, tp = r.get("bubble_measured"), r.get("bubble_predicted")
            d = abs(tm - tp) if tm is not None and tp is not None else None
            ok = "" if d is None else ("PASS" if d <= 0.03 else "FAIL")
            peak = stage0(r) / 2**20
            print(f"{r['schedule']:<17} {fmt(r['step_s']):>8} {fmt(tm):>6} {fmt(tp):>6} "
                  f"{fmt(d):>6} {ok:>4} {peak:>16.1f}")
            md.append(f"| {r['schedule']} | {fmt(r['step_s'])} | {fmt(tm)} | {fmt(tp)} | "
                      f"{peak:.1f} |")
            rows.append({"schedule": r["schedule"], "step_s": r["step_s"],
                         "bubble_measured": tm, "bubble_predicted": tp,
                         "stage0_bytes": stage0(r)})
        out["schedules"] = rows
        print()

    # ------------------------------------------------------------------ memory
    mem = [r for r in recs if r.get("section") == "memory"]
    if mem:
        print("== Memory ==")
        tg = next((r for r in mem if r["peer"] == "tandem" and r["schedule"] == "gpipe"), None)
        tf = next((r for r in mem if r["peer"] == "tandem" and r["schedule"] == "1f1b"), None)
        tzm = next((r for r in mem if r["peer"] == "tandem" and r["schedule"] == "zb_h1"), None)
        res = {}
        if tg or tf:
            shape = (tg or tf)["shape"]
            m = shape["m"]
            print("Tandem peak live activation bytes (StepSummary.rank_peak_activation_bytes[0]; "
                  "the max over stages where a build lacks it): %s" % ", ".join(
                      f"{k} {v}" for k, v in shape.items()))
            per_mb = stage0(tg) / m if tg else None
            for r in (tg, tf, tzm):
                if r:
                    worth = stage0(r) / per_mb if per_mb else None
                    print(f"  {r['schedule']:<6} M={m}: stage 0 {stage0(r) / 2**20:9.1f} MiB"
                          + (f"  = {worth:.2f} micro-batches' worth (gpipe's / M = one)"
                             if worth else "")
                          + "; per rank " + ", ".join(
                              "%.1f" % (b / 2**20) for b in r["rank_peak_activation_bytes"]
                              or [r["peak_activation_bytes"]]) + " MiB")
            res["tandem"] = {"shape": shape,
                             "gpipe_stage0_bytes": tg and stage0(tg),
                             "1f1b_stage0_bytes": tf and stage0(tf),
                             "gpipe_rank_bytes": tg and tg["rank_peak_activation_bytes"],
                             "1f1b_rank_bytes": tf and tf["rank_peak_activation_bytes"],
                             "zb_h1_stage0_bytes": tzm and stage0(tzm),
                             "1f1b_micro_batches_worth":
                                 stage0(tf) / per_mb if tf and per_mb else None}
            md.append(f"\nTandem stage 0 peak activations at M={m}: gpipe "
                      f"{fmt(tg and stage0(tg) / 2**20, '.1f')} MiB, 1f1b "
                      f"{fmt(tf and stage0(tf) / 2**20, '.1f')} MiB")
        for r in mem:
            if r["peer"] == "tandem":
                continue
            print(f"PyTorch {r['schedule']:<6} M={r['shape']['m']}: peak RSS per rank "
                  f"{', '.join('%.0f' % x for x in r['rss_mib'])} MiB (after init "
                  f"{', '.join('%.0f' % x for x in r['rss_init_mib'])} MiB)")
            res[f"torch_{r['schedule']}_rss_mib"] = r["rss_mib"]
            res[f"torch_{r['schedule']}_rss_init_mib"] = r["rss_init_mib"]
            md.append(f"PyTorch {r['schedule']} M={r['shape']['m']}: RSS "
                      f"{', '.join('%.0f' % x for x in r['rss_mib'])} MiB")
        out["memory"] = res
        print()

    # ------------------------------------------------------------------ recompute
    plain = find(recs, "recompute", peer="tandem", recompute="none")
    full = find(recs, "recompute", peer="tandem", recompute="full")
    if plain and full:
        print("== Activation recomputation ==")
        shape = plain["shape"]
        print("Tandem P=2 1f1b, pipeline.recompute none vs full: %s" % ", ".join(
            f"{k} {v}" for k, v in shape.items()))
        for r in (plain, full):
            print(f"  {r['recompute']:<4}: stage 0 peak {stage0(r) / 2**20:8.1f} MiB; per rank "
                  + ", ".join("%.1f" % (b / 2**20) for b in r["rank_peak_activation_bytes"]
                              or [r["peak_activation_bytes"]])
                  + f" MiB; step {fmt(r['step_s'])} s (exec {fmt(r['exec_s'])} s)")
        mem_ratio = stage0(full) / stage0(plain) if stage0(plain) else None
        time_ratio = full["step_s"] / plain["step_s"] if plain["step_s"] else None
        diff = loss_diff(plain, full)
        print(f"  stage 0 peak full / none = {fmt(mem_ratio)}; step time full / none = "
              f"{fmt(time_ratio)}; largest loss difference {fmt(diff, '.3g')}")
        out["recompute"] = {"shape": shape, "none_stage0_bytes": stage0(plain),
                            "full_stage0_bytes": stage0(full),
                            "none_step_s": plain["step_s"], "full_step_s": full["step_s"],
                            "memory_ratio": mem_ratio, "step_time_ratio": time_ratio,
                            "max_loss_diff": diff}
        md.append(f"\nRecomputation (P=2 1f1b M={shape['m']}): stage 0 peak "
                  f"{stage0(plain) / 2**20:.1f} -> {stage0(full) / 2**20:.1f} MiB "
                  f"({fmt(mem_ratio)}x), step {fmt(plain['step_s'])} -> {fmt(full['step_s'])} s "
                  f"({fmt(time_ratio)}x)")
        idle = find(recs, "recompute", label="recompute-p2-1f1b-full-idle")
        if idle:
            idle_ratio = idle["step_s"] / plain["step_s"] if plain["step_s"] else None
            share = ((idle_ratio - 1) / (time_ratio - 1)
                     if idle_ratio and time_ratio and time_ratio > 1 else None)
            print(f"  full, R's placed within memory_budget_mb {idle.get('budget_mb')} "
                  f"(micro-batches recomputed per stage {idle['recomputed']}, plain "
                  f"{full['recomputed']}): stage 0 peak {stage0(idle) / 2**20:.1f} MiB; step "
                  f"{fmt(idle['step_s'])} s ({fmt(idle_ratio)}x of none; its overhead "
                  f"{fmt(share)} of plain recomputation's); largest loss difference "
                  f"{fmt(loss_diff(plain, idle), '.3g')}")
            out["recompute"].update({"idle_stage0_bytes": stage0(idle),
                                     "idle_step_s": idle["step_s"],
                                     "idle_step_time_ratio": idle_ratio,
                                     "idle_overhead_share": share})
            md.append(f"R's in idle slots: {stage0(idle) / 2**20:.1f} MiB, step "
                      f"{fmt(idle['step_s'])} s ({fmt(idle_ratio)}x)")
        auto = find(recs, "recompute", label="recompute-p2-1f1b-auto")
        if auto:
            auto_ratio = auto["step_s"] / plain["step_s"] if plain["step_s"] else None
            print(f"  auto (memory_budget_mb {auto.get('budget_mb')}): recomputes stage(s) "
                  f"{auto['recompute_stages']}; stage 0 peak {stage0(auto) / 2**20:.1f} MiB; step "
                  f"{fmt(auto['step_s'])} s ({fmt(auto_ratio)}x of none); largest loss "
                  f"difference {fmt(loss_diff(plain, auto), '.3g')}")
            out["recompute"].update({"auto_stage0_bytes": stage0(auto),
                                     "auto_step_s": auto["step_s"],
                                     "auto_step_time_ratio": auto_ratio,
                                     "auto_recompute_stages": auto["recompute_stages"]})
        # A budget is a bound: every stage's measured peak of the jobs that set one.
        for r in [x for x in recs if x["section"] == "recompute" and x.get("budget_mb")]:
            meas = r.get("stage_peak_bytes") or []
            if meas:
                print(f"  {r['label']}: measured peak per stage " + ", ".join(
                    "%.1f" % (m / 2**20) for m in meas) + f" MiB, budget {r['budget_mb']} MiB: "
                    + ("within" if max(meas) <= int(r["budget_mb"]) << 20 else "OVER"))
        # The plan's bytes per stage against the measured peaks, on every Tandem job above.
        worst = 0.0
        for r in [x for x in recs if x["section"] == "recompute" and x["peer"] == "tandem"]:
            pred, meas = r.get("stage_predicted_bytes") or [], r.get("stage_peak_bytes") or []
            if not pred or not any(pred) or len(pred) != len(meas):
                print(f"  {r['label']}: no predicted bytes (no layer profile)")
                continue
            offs = [p / m - 1 if m else 0.0 for p, m in zip(pred, meas)]
            worst = max([worst] + [abs(o) for o in offs])
            print(f"  {r['label']}: predicted / measured MiB per stage " + ", ".join(
                f"{p / 2**20:.1f} / {m / 2**20:.1f} ({o:+.1%})"
                for p, m, o in zip(pred, meas, offs)))
        out["recompute"]["memory_prediction_worst_off"] = worst
        print(f"  memory predicted vs measured: largest off {worst:.1%} (target 10%)")
        tnone = find(recs, "recompute", label="recompute-torch-none")
        tckpt = find(recs, "recompute", label="recompute-torch-checkpoint")
        if tnone and tckpt:
            tratio = tckpt["step_s"] / tnone["step_s"] if tnone["step_s"] else None
            versus = ((time_ratio - 1) / (tratio - 1)
                      if time_ratio and tratio and tratio > 1 else None)
            print(f"  PyTorch pipeline: step {fmt(tnone['step_s'])} s, with torch.utils.checkpoint "
                  f"{fmt(tckpt['step_s'])} s ({fmt(tratio)}x); peak RSS per rank "
                  f"{', '.join('%.0f' % x for x in tnone['rss_mib'])} -> "
                  f"{', '.join('%.0f' % x for x in tckpt['rss_mib'])} MiB")
            print(f"  recomputation overhead, Tandem / PyTorch = {fmt(versus)}")
            out["recompute"].update({"torch_none_step_s": tnone["step_s"],
                                     "torch_checkpoint_step_s": tckpt["step_s"],
                                     "torch_step_time_ratio": tratio,
                                     "overhead_vs_torch": versus})
            md.append(f"PyTorch checkpoint: step {fmt(tnone['step_s'])} -> "
                      f"{fmt(tckpt['step_s'])} s ({fmt(tratio)}x); overhead Tandem / PyTorch "
                      f"{fmt(versus)}")
        print()

    print("== Markdown ==")
    print("\n".join(md))
    print()
    print(json.dumps({"pipeline_bench": out}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tandem")
    t.add_argument("status_json")
    t.add_argument("--section", required=True)
    t.add_argument("--label", required=True)
    g = sub.add_parser("tag")
    g.add_argument("--section", required=True)
    g.add_argument("--label", required=True)
    s = sub.add_parser("summary")
    s.add_argument("results")
    a = ap.parse_args()
    if a.cmd == "tandem":
        print(json.dumps(tandem_record(a.status_json, a.section, a.label)))
    elif a.cmd == "tag":
        rec = json.loads(sys.stdin.read().strip().splitlines()[-1])
        rec["section"], rec["label"] = a.section, a.label
        print(json.dumps(rec))
    else:
        summary(a.results)


if __name__ == "__main__":
    main()
