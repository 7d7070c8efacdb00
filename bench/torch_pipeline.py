#!/usr/bin/python3
"""Hand-written PyTorch peer of Tandem's pipeline: a GPT-2 model trained for a few steps in one
process (--single) or over P processes with a hand-written GPipe or 1F1B schedule over gloo
send/recv (--pipeline), fp32 on the CPU, one thread per process. bench/pipeline_bench.sh runs
it next to Tandem on the same shapes.

    /usr/bin/python3 bench/torch_pipeline.py --single   [shape flags]
    /usr/bin/python3 bench/torch_pipeline.py --pipeline [--schedule 1f1b|gpipe] [--stages 2]
        [--blocks-per-stage 2,2] [shape flags]
    shape flags: --layers 4 --d 768 --heads 12 --mb 4 --seq 256 --m 8 --vocab 50304
                 --steps 3 --seed 1234 --lr 3e-4

Install (Debian 12): `apt-get install python3-torch` (torch 1.13, system OpenBLAS); run it with
/usr/bin/python3. Each process calls torch.set_num_threads(1) and openblas_set_num_threads(1)
on the OpenBLAS torch loaded (see bench/torch_gpt_layer.py: torch's setting alone leaves
OpenBLAS's own pool on every core).

Model: token + position embedding, N pre-LN blocks (bench/torch_gpt_layer.py's Block), final
LayerNorm, an untied LM head and cross-entropy on every position; each of the N + 2 modules is
initialised from its own seed (seed, global index), like Tandem's per-layer seeding, so that
every partition (and --single) starts from the same weights. Data: uniform random tokens from
a generator seeded by (seed, step), identical in every process. The loss of a step is the sum
over micro-batches of (summed token cross-entropy / all tokens of the step), i.e. the mean
over the global batch, and a step is M forwards + backwards (gradient accumulation) then
AdamW (lr constant, weight decay 0) on every stage's parameters.

Pipeline: rank 0 holds the embedding and the first blocks, the last rank the last blocks and
the head (--blocks-per-stage, default an even split). Activations go forward and gradients
backward with dist.isend (so a send never blocks the sender) and dist.recv, tagged by
micro-batch and direction; schedules as common/schedule.cc builds them (GPipe: F0..F(M-1),
then B(M-1)..B0; 1F1B: min(P-1-r, M) warm-up forwards, then F/B pairs, then the remaining
backwards). A gloo barrier starts every step on every rank.

Output: one line per step, then one JSON line (the last line of stdout):
  step_s      median step wall time (max over ranks) of the steps after the first (warm-up)
  steps_s     every step's time; fb_s: the forward/backward part (before the optimizer)
  busy_s      per rank, median compute time per step (forwards + backwards, no waiting)
  bubble      per rank, median of 1 - busy / fb wall (the idle share of the step's pipeline
              part); bubble_sim: what bench/pipeline_sim.py predicts from the measured
              per-stage forward / backward costs (f_s, b_s)
  rss_mib     per rank, peak RSS (getrusage ru_maxrss); rss_init_mib: RSS after building the
              model and optimizer state, before the first step
  losses      the loss of every step (from the last rank)
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ under bench/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

from torch_gpt_layer import Block, Head, find_openblas  # noqa: E402
from pipeline_sim import schedule, simulate  # noqa: E402


class Embedding(torch.nn.Module):
    def __init__(self, v, t, c):
        super().__init__()
        self.wte = torch.nn.Parameter(torch.randn(v, c) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(t, c) * 0.01)

    def forward(self, idx):
        return self.wte[idx] + self.wpe[: idx.size(1)]


def build_module(a, index):
    """Global module `index`: 0 = embedding, 1..layers = blocks, layers + 1 = head."""
    torch.manual_seed(a.seed * 100003 + index)
    if index == 0:
        return Embedding(a.vocab, a.seq, a.d)
    if index == a.layers + 1:
        return Head(a.d, a.vocab)
    return Block(a.d, a.heads)


def stage_ranges(a):
    """Per stage, the [begin, end) of global module indices it holds."""
    if a.blocks_per_stage:
        counts = [int(x) for x in a.blocks_per_stage.split(",")]
    else:
        base, extra = divmod(a.layers, a.stages)
        counts = [base + (1 if s < extra else 0) for s in range(a.stages)]
    if len(counts) != a.stages or sum(counts) != a.layers or min(counts) < 0:
        sys.exit(f"--blocks-per-stage {counts} does not split {a.layers} blocks over "
                 f"{a.stages} stages")
    ranges, begin = [], 1
    for s, n in enumerate(counts):
        lo = 0 if s == 0 else begin
        hi = begin + n + (1 if s == a.stages - 1 else 0)
        ranges.append((lo, hi))
        begin += n
    return ranges


def batch(a, step):
    """The step's tokens: inputs and targets, (M, mb, seq) each."""
    g = torch.Generator().manual_seed(a.seed * 7919 + step)
    tok = torch.randint(0, a.vocab, (a.m, a.mb, a.seq + 1), generator=g)
    return tok[:, :, :-1].contiguous(), tok[:, :, 1:].contiguous()


def set_one_thread():
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    path, blas_set = find_openblas()
    if blas_set is not None:
        blas_set(1)
    return path


def rss_now_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_optimizer(a, modules):
    params = [p for mod in modules for p in mod.parameters()]
    return torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


# --checkpoint: every module's forward under torch.utils.checkpoint (non-reentrant), which
# keeps each module's input and re-runs its forward inside the backward: the per-layer
# recomputation Tandem's pipeline.recompute: full does.
CHECKPOINT = False


def call(mod, *args):
    if CHECKPOINT:
        return torch.utils.checkpoint.checkpoint(mod, *args, use_reentrant=False)
    return mod(*args)


def run_stage(mods, h, mask, targets, normalizer):
    """Forward through a stage's modules; returns the activation, or the loss on the last."""
    for mod in mods:
        if isinstance(mod, Embedding):
            h = call(mod, h)
        elif isinstance(mod, Head):
            h = call(mod, h, targets, normalizer)
        else:
            h = call(mod, h, mask)
    return h


# ----------------------------------------------------------------------------- single process

def run_single(a):
    blas = set_one_thread()
    mods = [build_module(a, i) for i in range(a.layers + 2)]
    opt = make_optimizer(a, mods)
    mask = torch.tril(torch.ones(a.seq, a.seq)).view(1, 1, a.seq, a.seq)
    normalizer = a.m * a.mb * a.seq
    rss_init = rss_now_mib()
    print(f"# torch {torch.__version__} single process, 1 thread (openblas: {blas}); "
          f"{shape_text(a)}", flush=True)
    steps, fbs, losses = [], [], []
    for step in range(a.steps):
        idx, tgt = batch(a, step)
        t0 = time.perf_counter()
        loss_sum = 0.0
        for i in range(a.m):
            loss = run_stage(mods, idx[i], mask, tgt[i], normalizer)
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
        "peer": "torch-%s-handwritten" % torch.__version__.split("+")[0],
        "mode": "single",
        "schedule": None,
        "stages": 1,
        "shape": shape_dict(a),
        "step_s": statistics.median(measured),
        "steps_s": steps,
        "fb_s": fbs,
        "busy_s": [statistics.median(fbs[1:] or fbs)],
        "bubble": [0.0],
        "rss_mib": [peak_rss_mib()],
        "rss_init_mib": [rss_init],
        "losses": losses,
    }


# ----------------------------------------------------------------------------- pipeline rank

def run_rank(a, rank):
    blas = set_one_thread()
    p = a.stages
    first, last = rank == 0, rank == p - 1
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                            world_size=p)
    lo, hi = stage_ranges(a)[rank]
    mods = [build_module(a, i) for i in range(lo, hi)]
    opt = make_optimizer(a, mods)
    mask = torch.tril(torch.ones(a.seq, a.seq)).view(1, 1, a.seq, a.seq)
    normalizer = a.m * a.mb * a.seq
    ops = schedule(a.schedule, p, a.m)[rank]
    rss_init = rss_now_mib()
    recs = []
    for step in range(a.steps):
        idx, tgt = batch(a, step)
        saved = {}
        pending = []  # (work, tensor kept alive until the send completes)
        busy_f = busy_b = 0.0
        loss_sum = 0.0
        dist.barrier()
        t0 = time.perf_counter()
        for kind, i in ops:
            if kind == "F":
                if first:
                    x, h = None, idx[i]
                else:
                    x = torch.empty(a.mb, a.seq, a.d)
                    dist.recv(x, src=rank - 1, tag=2 * i)
                    x.requires_grad_(True)
                    h = x
                c0 = time.perf_counter()
                out = run_stage(mods, h, mask, tgt[i] if last else None, normalizer)
                if last:
                    loss_sum += out.item()
                busy_f += time.perf_counter() - c0
                if not last:
                    act = out.detach()
                    pending.append((dist.isend(act, dst=rank + 1, tag=2 * i), act))
                saved[i] = (x, out)
            else:
                x, out = saved.pop(i)
                if last:
                    c0 = time.perf_counter()
                    out.backward()
                else:
                    g = torch.empty_like(out)
                    dist.recv(g, src=rank + 1, tag=2 * i + 1)
                    c0 = time.perf_counter()
                    out.backward(g)
                busy_b += time.perf_counter() - c0
                del out
                if not first:
                    gx = x.grad
                    pending.append((dist.isend(gx, dst=rank - 1, tag=2 * i + 1), gx))
                    x.grad = None
                del x
            pending = [(w, t) for (w, t) in pending if not w.is_completed()]
        for w, _ in pending:
            w.wait()
        pending = []
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t2 = time.perf_counter()
        recs.append({"step_s": t2 - t0, "fb_s": t1 - t0, "busy_f": busy_f, "busy_b": busy_b,
                     "loss": loss_sum if last else None})
        if last:  # progress, to stderr (the parent prints the per-step table at the end)
            print(f"  rank {rank} step {step}: {t2 - t0:.3f} s", file=sys.stderr, flush=True)
    result = {"rank": rank, "steps": recs, "rss_mib": peak_rss_mib(), "rss_init_mib": rss_init,
              "modules": [lo, hi], "blas": blas}
    dist.barrier()
    dist.destroy_process_group()
    return result


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(a, script):
    """Runs `script --rank-worker` once per rank with a's flags; returns their JSON results."""
    port = free_port()
    args = [sys.executable, os.path.abspath(script), "--rank-worker"]
    for k, v in vars(a).items():
        if k in ("single", "pipeline", "rank_worker", "rank", "port") or v is None:
            continue
        if isinstance(v, bool):  # a store_true flag
            if v:
                args.append("--" + k.replace("_", "-"))
            continue
        args += ["--" + k.replace("_", "-"), str(v)]
    procs = [subprocess.Popen(args + ["--rank", str(r), "--port", str(port)],
                              stdout=subprocess.PIPE, text=True) for r in range(a.stages)]
    outs = []
    for r, pr in enumerate(procs):
        out, _ = pr.communicate()
        if pr.returncode != 0:
            sys.exit(f"rank {r} failed with exit status {pr.returncode}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(outs, key=lambda o: o["rank"])


def summarize_pipeline(a, ranks, peer, header, simulated=True):
    """Prints `header` and a line per step from the ranks' records; returns the result record.
    With `simulated` False (a schedule bench/pipeline_sim.py does not know) no bubble is
    simulated."""
    print(header, flush=True)
    steps, fbs, losses, bubbles = [], [], [], []
    for s in range(a.steps):
        rec = [o["steps"][s] for o in ranks]
        st = max(x["step_s"] for x in rec)
        fb = max(x["fb_s"] for x in rec)
        bub = [1.0 - (x["busy_f"] + x["busy_b"]) / fb for x in rec]
        steps.append(st)
        fbs.append(fb)
        bubbles.append(bub)
        losses.append(rec[-1]["loss"])
        print(f"step {s} loss {rec[-1]['loss']:.6f} time {st:.3f} s (fwd+bwd {fb:.3f} s; "
              f"busy {', '.join('%.3f' % (x['busy_f'] + x['busy_b']) for x in rec)} s; "
              f"bubble {', '.join('%.3f' % b for b in bub)})", flush=True)
    keep = slice(1, None) if a.steps > 1 else slice(None)
    med = lambda xs: statistics.median(xs[keep])  # noqa: E731
    per_rank = lambda key: [med([o["steps"][s][key] for s in range(a.steps)])  # noqa: E731
                            for o in ranks]
    f_cost = [x / a.m for x in per_rank("busy_f")]
    b_cost = [x / a.m for x in per_rank("busy_b")]
    sim = simulate(a.schedule, a.m, f_cost, b_cost) if simulated else {
        "bubble": None, "bubble_mean": None,
        "bubble_ideal": (a.stages - 1) / (a.m + a.stages - 1)}
    bubble = [statistics.median([bubbles[s][r] for s in range(a.steps)][keep])
              for r in range(a.stages)]
    return {
        "peer": peer,
        "mode": "pipeline",
        "schedule": a.schedule,
        "stages": a.stages,
        "modules_per_rank": [o["modules"] for o in ranks],
        "shape": shape_dict(a),
        "step_s": med(steps),
        "steps_s": steps,
        "fb_s": fbs,
        "busy_s": [f + b for f, b in zip(per_rank("busy_f"), per_rank("busy_b"))],
        "f_s": f_cost,
        "b_s": b_cost,
        "bubble": bubble,
        "bubble_mean": sum(bubble) / len(bubble),
        "bubble_sim": sim["bubble"],
        "bubble_sim_mean": sim["bubble_mean"],
        "bubble_ideal": sim["bubble_ideal"],
        "rss_mib": [o["rss_mib"] for o in ranks],
        "rss_init_mib": [o["rss_init_mib"] for o in ranks],
        "losses": losses,
    }


def run_pipeline(a):
    ranks = launch_ranks(a, __file__)
    header = (f"# torch {torch.__version__} {a.stages}-stage {a.schedule} pipeline, gloo, 1 "
              f"thread per rank (openblas: {ranks[0]['blas']}); modules per rank "
              f"{[o['modules'] for o in ranks]}; {shape_text(a)}")
    return summarize_pipeline(a, ranks, "torch-%s-handwritten" % torch.__version__.split("+")[0],
                              header)


def shape_dict(a):
    return {"layers": a.layers, "d": a.d, "heads": a.heads, "mb": a.mb, "seq": a.seq, "m": a.m,
            "vocab": a.vocab, "steps": a.steps, "seed": a.seed}


def shape_text(a):
    return (f"layers {a.layers} d {a.d} heads {a.heads} mb {a.mb} seq {a.seq} M {a.m} "
            f"vocab {a.vocab}, {a.steps} steps (first one is warm-up)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--single", action="store_true", help="one process, all layers")
    mode.add_argument("--pipeline", action="store_true", help="--stages processes (default)")
    mode.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
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
    ap.add_argument("--checkpoint", action="store_true",
                    help="recompute every module in its backward (torch.utils.checkpoint)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    global CHECKPOINT
    CHECKPOINT = a.checkpoint
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
        print(json.dumps(run_pipeline(a)), flush=True)


if __name__ == "__main__":
    main()
