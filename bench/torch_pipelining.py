#!/usr/bin/env python3
"""torch.distributed.pipelining peer of Tandem's pipeline: bench/torch_pipeline.py's GPT-2 model,
shapes, seeds and data, trained for a few steps in one process (--single) or over P processes
pipelined by PyTorch 2.x's own torch.distributed.pipelining (one PipelineStage per rank;
Schedule1F1B, ScheduleGPipe, or with --schedule zb ScheduleInterleavedZeroBubble at one stage
per rank, i.e. ZB1P with the backward split into input and weight parts; gloo on 127.0.0.1),
fp32 on the CPU, one thread per process. bench/pipeline_bench.sh runs it with --torch2 PYTHON
next to Tandem and the hand-written peer.

    PYTHON bench/torch_pipelining.py --single   [shape flags]
    PYTHON bench/torch_pipelining.py --pipeline [--schedule 1f1b|gpipe|zb] [--stages 2]
        [--blocks-per-stage 2,2] [shape flags]
    shape flags: as bench/torch_pipeline.py (--layers 4 --d 768 --heads 12 --mb 4 --seq 256
                 --m 8 --vocab 50304 --steps 3 --seed 1234 --lr 3e-4)

Install: a PyPI torch 2.x whose schedules' step() takes pre-split micro-batches (arg_mbs=,
target_mbs=; tested with 2.15.0) in a virtual environment outside the repository, e.g.

    /usr/bin/python3 -m venv /tmp/torch2 && /tmp/torch2/bin/pip install torch numpy

(numpy only silences torch's warning) and run it with that interpreter (PYTHON =
/tmp/torch2/bin/python).

Threads: PyPI wheels carry their own BLAS (MKL for x86-64 wheels, OpenBLAS for some others)
and OpenMP. This script sets OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS to 1
before importing torch (in every process), then torch.set_num_threads(1) and
set_num_interop_threads(1), and reads the result back from torch.__config__.parallel_info():
the JSON line's "threads" (ATen, interop, OpenMP, MKL), and a warning on stderr if any is not 1.

Model (imported from bench/torch_pipeline.py / torch_gpt_layer.py, so that it is the same
code): embedding, N pre-LN blocks, final LayerNorm + untied head, every module seeded by
(seed, global index); data: bench/torch_pipeline.py's batch(). Each rank's PipelineStage
wraps its modules (the causal mask is a buffer of the wrapper); the last stage outputs the
logits and the schedule's loss_fn is the summed token cross-entropy / all tokens of the step
(Head.forward's arithmetic), with scale_grads=False, so a step's loss (the sum of the M
micro-batch losses) and gradients are those of bench/torch_pipeline.py. A step is
schedule.step() (M forwards + backwards) and AdamW on every stage's parameters; a gloo barrier
starts every step on every rank. The first step also runs the stages' shape inference.

Output, like bench/torch_pipeline.py: one line per step, then one JSON line (the last line):
  peer        torch-<version>-pipelining
  step_s      median step wall time (max over ranks) of the steps after the first (warm-up)
  busy_s      per rank, median time inside PipelineStage.forward_one_chunk +
              backward_one_chunk (+ backward_weight_one_chunk) + loss_fn per step (compute,
              plus the stage's own bookkeeping; no waiting); bubble: per rank 1 - busy / fb
              wall; bubble_sim: bench/pipeline_sim.py on the measured per-stage costs (its
              1f1b / gpipe orders are those torch's Schedule1F1B / ScheduleGPipe run at P = 2;
              null for zb)
  rss_mib     per rank, peak RSS; rss_init_mib: after building the stage and optimizer;
              rss_import_mib: right after `import torch` (the CUDA wheel's own share)
  losses      the loss of every step (from the last rank)
"""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before torch (and its BLAS / OpenMP) is loaded

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ under bench/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _rss_now_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


import torch  # noqa: E402

RSS_IMPORT_MIB = _rss_now_mib()

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torch_pipeline import (Embedding, batch, build_module, launch_ranks,  # noqa: E402
                            make_optimizer, peak_rss_mib, rss_now_mib, shape_dict, shape_text,
                            stage_ranges, summarize_pipeline)
from torch_gpt_layer import Head  # noqa: E402

PEER = "torch-%s-pipelining" % torch.__version__.split("+")[0]


# ----------------------------------------------------------------------------- threads

def set_one_thread():
    """Pins torch to one thread; returns what parallel_info() then reports."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    info = torch.__config__.parallel_info()
    threads = {}
    for key, pat in (("aten", r"at::get_num_threads\(\) : (\d+)"),
                     ("interop", r"at::get_num_interop_threads\(\) : (\d+)"),
                     ("omp", r"omp_get_max_threads\(\) : (\d+)"),
                     ("mkl", r"mkl_get_max_threads\(\) : (\d+)")):
        m = re.search(pat, info)
        if m:
            threads[key] = int(m.group(1))
    blas = "mkl" if "mkl_get_max_threads" in info else (
        "openblas" if "openblas" in torch.__config__.show().lower() else "unknown")
    threads["blas"] = blas
    bad = {k: v for k, v in threads.items() if isinstance(v, int) and v != 1}
    if bad:
        print(f"torch_pipelining.py: WARNING: not one thread: {bad}\n{info}", file=sys.stderr)
    return threads


def threads_text(t):
    return ", ".join(f"{k} {v}" for k, v in t.items())


# ----------------------------------------------------------------------------- model

class StageModule(torch.nn.Module):
    """A rank's modules [lo, hi) of the global list; the last one outputs the logits."""

    def __init__(self, a, lo, hi):
        super().__init__()
        self.mods = torch.nn.ModuleList([build_module(a, i) for i in range(lo, hi)])
        self.register_buffer("mask", torch.tril(torch.ones(a.seq, a.seq)).view(
            1, 1, a.seq, a.seq), persistent=False)

    def forward(self, h):
        for mod in self.mods:
            if isinstance(mod, Embedding):
                h = mod(h)
            elif isinstance(mod, Head):
                h = mod.ln_f(h) @ mod.w.t()  # Head.forward's logits; the loss is loss_fn
            else:
                h = mod(h, self.mask)
        return h


def make_loss_fn(a):
    normalizer = a.m * a.mb * a.seq

    def loss_fn(logits, targets):  # Head.forward's loss
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               reduction="sum") / normalizer
    return loss_fn


# ----------------------------------------------------------------------------- single process

def run_single(a):
    threads = set_one_thread()
    model = StageModule(a, 0, a.layers + 2)
    loss_fn = make_loss_fn(a)
    opt = make_optimizer(a, [model])
    rss_init = rss_now_mib()
    print(f"# torch {torch.__version__} single process ({threads_text(threads)}); "
          f"{shape_text(a)}", flush=True)
    steps, fbs, losses = [], [], []
    for step in range(a.steps):
        idx, tgt = batch(a, step)
        t0 = time.perf_counter()
        loss_sum = 0.0
        for i in range(a.m):
            loss = loss_fn(model(idx[i]), tgt[i])
            loss.backward()
            loss_sum += loss.item()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t2 = time.perf_counter()
        steps.append(t2 - t0)
        fbs.append(t1 - t0)
        losses.append(loss_sum)
        print(f"step {step} loss {loss_sum:.6f} time {t2 - t0:.3f} s "
              f"(fwd+bwd {t1 - t0:.3f} s)", flush=True)
    measured = steps[1:] or steps
    return {
        "peer": PEER,
        "mode": "single",
        "schedule": None,
        "stages": 1,
        "shape": shape_dict(a),
        "threads": threads,
        "step_s": statistics.median(measured),
        "steps_s": steps,
        "fb_s": fbs,
        "busy_s": [statistics.median(fbs[1:] or fbs)],
        "bubble": [0.0],
        "rss_mib": [peak_rss_mib()],
        "rss_init_mib": [rss_init],
        "rss_import_mib": [RSS_IMPORT_MIB],
        "losses": losses,
    }


# ----------------------------------------------------------------------------- pipeline rank

def timed(fn, acc, key):
    def wrapper(*args, **kwargs):
        c0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] += time.perf_counter() - c0
    return wrapper


def run_rank(a, rank):
    from torch.distributed import pipelining as pp

    threads = set_one_thread()
    p = a.stages
    first, last = rank == 0, rank == p - 1
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                            world_size=p)
    lo, hi = stage_ranges(a)[rank]
    model = StageModule(a, lo, hi)
    opt = make_optimizer(a, [model])
    stage = pp.PipelineStage(model, rank, p, torch.device("cpu"))
    acc = {"f": 0.0, "b": 0.0}
    stage.forward_one_chunk = timed(stage.forward_one_chunk, acc, "f")
    stage.backward_one_chunk = timed(stage.backward_one_chunk, acc, "b")
    stage.backward_weight_one_chunk = timed(stage.backward_weight_one_chunk, acc, "b")
    loss_fn = timed(make_loss_fn(a), acc, "f")
    if a.schedule == "zb":  # ZB1P (input / weight backward split), one stage per rank
        sched = pp.ScheduleInterleavedZeroBubble([stage], a.m, loss_fn=loss_fn,
                                                 scale_grads=False)
    else:
        sched_cls = {"1f1b": pp.Schedule1F1B, "gpipe": pp.ScheduleGPipe}[a.schedule]
        sched = sched_cls(stage, a.m, loss_fn=loss_fn, scale_grads=False)
    rss_init = rss_now_mib()
    recs = []
    for step in range(a.steps):
        idx, tgt = batch(a, step)
        kw = {}
        if first:
            kw["arg_mbs"] = [(idx[i],) for i in range(a.m)]
        if last:
            kw["target_mbs"] = [tgt[i] for i in range(a.m)]
        losses = [] if last else None
        acc["f"] = acc["b"] = 0.0
        dist.barrier()
        t0 = time.perf_counter()
        sched.step(losses=losses, return_outputs=False, **kw)
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t2 = time.perf_counter()
        loss_sum = sum(x.item() for x in losses) if last else None
        recs.append({"step_s": t2 - t0, "fb_s": t1 - t0, "busy_f": acc["f"],
                     "busy_b": acc["b"], "loss": loss_sum})
        if last:
            print(f"  rank {rank} step {step}: {t2 - t0:.3f} s", file=sys.stderr, flush=True)
    result = {"rank": rank, "steps": recs, "rss_mib": peak_rss_mib(), "rss_init_mib": rss_init,
              "rss_import_mib": RSS_IMPORT_MIB, "modules": [lo, hi], "threads": threads}
    dist.barrier()
    dist.destroy_process_group()
    return result


def run_pipeline(a):
    ranks = launch_ranks(a, __file__)
    header = (f"# torch {torch.__version__} torch.distributed.pipelining {a.stages}-stage "
              f"{a.schedule}, gloo (threads: "
              f"{'; '.join(f'rank {r}: ' + threads_text(o['threads']) for r, o in enumerate(ranks))}); "
              f"modules per rank {[o['modules'] for o in ranks]}; {shape_text(a)}")
    # bench/pipeline_sim.py knows 1f1b and gpipe; none for zb.
    result = summarize_pipeline(a, ranks, PEER, header, simulated=a.schedule != "zb")
    result["threads"] = [o["threads"] for o in ranks]
    result["rss_import_mib"] = [o["rss_import_mib"] for o in ranks]
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--single", action="store_true", help="one process, all layers")
    mode.add_argument("--pipeline", action="store_true", help="--stages processes (default)")
    mode.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe", "zb"],
                    help="Schedule1F1B, ScheduleGPipe or ScheduleInterleavedZeroBubble")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--blocks-per-stage", default=None,
                    help="blocks held by each stage, e.g. 2,2 (default: an even split)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--mb", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--m", type=int, default=8, help="micro-batches per step")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.d % a.heads:
        ap.error("--d must be a multiple of --heads")
    if a.rank_worker:
        print(json.dumps(run_rank(a, a.rank)), flush=True)
        return
    if a.single:
        print(json.dumps(run_single(a)), flush=True)
    else:
        if a.stages < 2:
            ap.error("--pipeline needs --stages >= 2 (use --single for one process)")
        if a.schedule == "1f1b" and a.m < a.stages:
            ap.error("Schedule1F1B needs --m >= --stages")
        print(json.dumps(run_pipeline(a)), flush=True)


if __name__ == "__main__":
    main()
