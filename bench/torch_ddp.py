#!/usr/bin/python3
"""PyTorch DistributedDataParallel peer of Tandem's data parallelism (pipeline.replicas): the
GPT of bench/torch_pipeline.py (imported, not copied), trained for a few steps either by R
processes under DDP over gloo on 127.0.0.1 (--ddp, the default) or by one process without DDP
on the same global batch (--single), fp32 on the CPU, one thread per process.
bench/data_parallel_bench.sh runs it next to Tandem's replicas: 1 and replicas: 2 jobs.

    /usr/bin/python3 bench/torch_ddp.py [--ddp | --single] [--replicas 2] [shape flags]
        [--bucket-mb 25] [--grad-as-bucket-view] [--timeout 1800]
    shape flags: --n-layer 4 --n-head 12 --d-model 768 --seq-len 256 --vocab 256
                 --mb 4 --m 4 --steps 3 --seed 1234 --lr 3e-4
                 (bench/torch_pipeline.py's spellings --layers --heads --d --seq work too)

Works with Debian's torch 1.13 (/usr/bin/python3) and with a PyPI torch 2.x (e.g.
/tmp/torch2/bin/python). OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS are set to
1 before torch is imported, then every process calls torch.set_num_threads(1) and pins the
OpenBLAS it loaded (bench/torch_pipeline.py's set_one_thread); the JSON line's "threads" is
what torch.__config__.parallel_info() then reports.

Batch: the global batch of a step is R x M micro-batches of mb sequences (Tandem's
replicas x micro_batches x micro_batch_size), the tokens of bench/torch_pipeline.py's batch()
for M' = R x M, so that --single here trains exactly what `torch_pipeline.py --single --m R*M`
trains. DDP rank r (replica r) takes micro-batches [r M, (r + 1) M), its r-th consecutive
share, as Tandem's replica r does. A replica's loss is the sum over its micro-batches of
(summed token cross-entropy / its M x mb x seq tokens); DDP averages the gradients over the R
replicas, so the update is that of the mean over the global batch, as in --single (whose
normalizer is all R x M x mb x seq tokens). The step's loss printed is the mean of the
replicas' losses (all-reduced), i.e. the global mean, which --single reproduces.

A DDP step: a gloo barrier, then M forward + backward passes with gradient accumulation, the
first M - 1 under model.no_sync() (no communication) and the last one synchronising (DDP's
bucketed all-reduce, overlapped with that backward), then AdamW (lr constant, weight decay 0)
and zero_grad. Processes: R copies of this script (subprocess, --rank-worker), rendezvous
through a FileStore (init_method file://) in a temporary directory; gloo is pinned to the
loopback interface (GLOO_SOCKET_IFNAME=lo unless set).

Output: one line per step, then one JSON line (the last line of stdout):
  peer          torch-<version>-ddp
  mode          "ddp" (R processes) or "single" (one process, the same global batch)
  step_s        median step wall time (max over ranks) of the steps after the first (warm-up)
  steps_s, fb_s every step's time and its forward/backward part (before the optimizer)
  tokens_per_s  global batch tokens (R x M x mb x seq) / step_s
  mb_nosync_s   DDP: median time of a no_sync micro-batch (forward + backward, no
                communication); mb_sync_s: median time of the last, synchronising one;
                reduce_exposed_s: their difference, the share of DDP's all-reduce the step
                waits for (an estimate)
  grad_bytes    bytes of the gradients each replica all-reduces per step (fp32 parameters)
  rss_mib       per process, peak RSS
  losses        the loss of every step
"""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before torch (and its BLAS / OpenMP) is loaded
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on loopback only

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ under bench/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from torch_pipeline import (Embedding, batch, build_module, make_optimizer,  # noqa: E402
                            peak_rss_mib, set_one_thread, shape_dict)
from torch_gpt_layer import Head  # noqa: E402

PEER = "torch-%s-ddp" % torch.__version__.split("+")[0]


# ----------------------------------------------------------------------------- model

class GPT(torch.nn.Module):
    """bench/torch_pipeline.py's modules 0 .. layers + 1 (embedding, blocks, head + loss), each
    seeded by (seed, global index) there; forward returns the loss / normalizer."""

    def __init__(self, a):
        super().__init__()
        self.mods = torch.nn.ModuleList([build_module(a, i) for i in range(a.layers + 2)])
        # Not a buffer: DDP would broadcast it before every forward.
        self.mask = torch.tril(torch.ones(a.seq, a.seq)).view(1, 1, a.seq, a.seq)

    def forward(self, idx, targets, normalizer):
        h = idx
        for mod in self.mods:
            if isinstance(mod, Embedding):
                h = mod(h)
            elif isinstance(mod, Head):
                h = mod(h, targets, normalizer)
            else:
                h = mod(h, self.mask)
        return h


def threads_info():
    """What torch's parallel_info() reports after set_one_thread (torch 2.x lists MKL too)."""
    info = torch.__config__.parallel_info()
    out = {}
    for key, pat in (("aten", r"at::get_num_threads\(\) : (\d+)"),
                     ("interop", r"at::get_num_interop_threads\(\) : (\d+)"),
                     ("omp", r"omp_get_max_threads\(\) : (\d+)"),
                     ("mkl", r"mkl_get_max_threads\(\) : (\d+)")):
        m = re.search(pat, info)
        if m:
            out[key] = int(m.group(1))
    bad = {k: v for k, v in out.items() if v != 1}
    if bad:
        print(f"torch_ddp.py: WARNING: not one thread: {bad}", file=sys.stderr)
    return out


def global_batch(a, step):
    """The step's R x M micro-batches: bench/torch_pipeline.py's batch() for M' = R x M."""
    g = copy.copy(a)
    g.m = a.replicas * a.m
    return batch(g, step)


def grad_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


# ----------------------------------------------------------------------------- one process

def run_single(a):
    blas = set_one_thread()
    threads = threads_info()
    model = GPT(a)
    opt = make_optimizer(a, [model])
    n_mb = a.replicas * a.m
    normalizer = n_mb * a.mb * a.seq
    print(f"# torch {torch.__version__} single process, no DDP, the global batch of "
          f"{a.replicas} replicas ({n_mb} micro-batches), 1 thread (openblas: {blas}); "
          f"{shape_text(a)}", flush=True)
    steps, fbs, losses = [], [], []
    for step in range(a.steps):
        idx, tgt = global_batch(a, step)
        t0 = time.perf_counter()
        loss_sum = 0.0
        for i in range(n_mb):
            loss = model(idx[i], tgt[i], normalizer)
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
    return result(a, "single", 1, steps, fbs, losses, grad_bytes(model), [peak_rss_mib()],
                  [threads])


# ----------------------------------------------------------------------------- DDP rank

def run_rank(a, rank):
    blas = set_one_thread()
    threads = threads_info()
    dist.init_process_group("gloo", init_method="file://" + a.init_file, rank=rank,
                            world_size=a.replicas,
                            timeout=datetime.timedelta(seconds=a.timeout))
    model = GPT(a)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, broadcast_buffers=False, bucket_cap_mb=a.bucket_mb,
        gradient_as_bucket_view=a.grad_as_bucket_view)
    opt = make_optimizer(a, [model])
    normalizer = a.m * a.mb * a.seq
    lo = rank * a.m
    recs = []
    for step in range(a.steps):
        idx, tgt = global_batch(a, step)
        mb_times = []
        loss_sum = 0.0
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(a.m):
            c0 = time.perf_counter()
            ctx = ddp.no_sync() if i < a.m - 1 else contextlib.nullcontext()
            with ctx:
                loss = ddp(idx[lo + i], tgt[lo + i], normalizer)
                loss.backward()
            loss_sum += loss.item()
            mb_times.append(time.perf_counter() - c0)
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t2 = time.perf_counter()
        recs.append({"step_s": t2 - t0, "fb_s": t1 - t0, "mb_s": mb_times, "loss": loss_sum})
        if rank == 0:  # progress, to stderr (the parent prints the per-step lines at the end)
            print(f"  rank {rank} step {step}: {t2 - t0:.3f} s", file=sys.stderr, flush=True)
    # The global loss of every step: the mean of the replicas' losses.
    losses = torch.tensor([r["loss"] for r in recs], dtype=torch.float64)
    dist.all_reduce(losses)
    losses /= a.replicas
    out = {"rank": rank, "steps": recs, "losses": losses.tolist(), "rss_mib": peak_rss_mib(),
           "grad_bytes": grad_bytes(model), "threads": threads, "blas": blas}
    dist.barrier()
    dist.destroy_process_group()
    return out


def launch(a):
    """Runs R copies of this script (--rank-worker); returns their JSON results, by rank."""
    with tempfile.TemporaryDirectory(prefix="torch-ddp-") as tmp:
        args = [sys.executable, os.path.abspath(__file__), "--rank-worker",
                "--init-file", os.path.join(tmp, "store")]
        for k, v in vars(a).items():
            if k in ("single", "ddp", "rank_worker", "rank", "init_file") or v is None:
                continue
            if isinstance(v, bool):
                if v:
                    args.append("--" + k.replace("_", "-"))
                continue
            args += ["--" + k.replace("_", "-"), str(v)]
        procs = [subprocess.Popen(args + ["--rank", str(r)], stdout=subprocess.PIPE, text=True)
                 for r in range(a.replicas)]
        outs, deadline = [], time.monotonic() + a.timeout
        try:
            for r, pr in enumerate(procs):
                try:
                    out, _ = pr.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    sys.exit(f"torch_ddp.py: rank {r} did not finish within --timeout "
                             f"{a.timeout} s")
                if pr.returncode != 0:
                    sys.exit(f"torch_ddp.py: rank {r} failed with exit status {pr.returncode}")
                outs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for pr in procs:
                if pr.poll() is None:
                    pr.kill()
                    pr.wait()
    return sorted(outs, key=lambda o: o["rank"])


def run_ddp(a):
    ranks = launch(a)
    print(f"# torch {torch.__version__} DistributedDataParallel, {a.replicas} processes, gloo "
          f"on 127.0.0.1, bucket {a.bucket_mb} MiB, 1 thread each (openblas: "
          f"{ranks[0]['blas']}); {a.m} micro-batches per replica, no_sync for all but the "
          f"last; {shape_text(a)}", flush=True)
    steps, fbs, nosync, sync = [], [], [], []
    losses = ranks[0]["losses"]
    for s in range(a.steps):
        rec = [o["steps"][s] for o in ranks]
        steps.append(max(x["step_s"] for x in rec))
        fbs.append(max(x["fb_s"] for x in rec))
        mbs = [x["mb_s"] for x in rec]
        # Per step: the slowest rank's median no_sync micro-batch and its last (sync) one.
        nosync.append(max(statistics.median(m[:-1]) for m in mbs) if a.m > 1 else None)
        sync.append(max(m[-1] for m in mbs))
        print(f"step {s} loss {losses[s]:.6f} time {steps[-1]:.3f} s (fwd+bwd {fbs[-1]:.3f} s; "
              f"last micro-batch {sync[-1]:.3f} s"
              + (f", no_sync ones {nosync[-1]:.3f} s)" if nosync[-1] is not None else ")"),
              flush=True)
    res = result(a, "ddp", a.replicas, steps, fbs, losses, ranks[0]["grad_bytes"],
                 [o["rss_mib"] for o in ranks], [o["threads"] for o in ranks])
    keep = slice(1, None) if a.steps > 1 else slice(None)
    res["bucket_mb"] = a.bucket_mb
    res["mb_sync_s"] = statistics.median(sync[keep])
    if a.m > 1:
        res["mb_nosync_s"] = statistics.median(nosync[keep])
        res["reduce_exposed_s"] = res["mb_sync_s"] - res["mb_nosync_s"]
    else:
        res["mb_nosync_s"] = res["reduce_exposed_s"] = None
    return res


# ----------------------------------------------------------------------------- output

def result(a, mode, procs, steps, fbs, losses, gbytes, rss, threads):
    keep = slice(1, None) if a.steps > 1 else slice(None)
    step_s = statistics.median(steps[keep])
    tokens = a.replicas * a.m * a.mb * a.seq
    shape = shape_dict(a)
    shape.update({"replicas": a.replicas, "global_batch": a.replicas * a.m * a.mb})
    return {
        "peer": PEER,
        "mode": mode,
        "procs": procs,
        "replicas": a.replicas,
        "shape": shape,
        "step_s": step_s,
        "steps_s": steps,
        "fb_s": fbs,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s,
        "grad_bytes": gbytes,
        "rss_mib": rss,
        "threads": threads,
        "losses": losses,
    }


def shape_text(a):
    return (f"layers {a.layers} d {a.d} heads {a.heads} mb {a.mb} seq {a.seq} M {a.m} per "
            f"replica x {a.replicas} replicas, vocab {a.vocab}, {a.steps} steps (first one is "
            f"warm-up)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--ddp", action="store_true", help="--replicas processes under DDP "
                      "(default)")
    mode.add_argument("--single", action="store_true",
                      help="one process, no DDP, the same global batch")
    mode.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--replicas", type=int, default=2,
                    help="R: DDP processes; the global batch is R x M x mb sequences")
    ap.add_argument("--layers", "--n-layer", dest="layers", type=int, default=4)
    ap.add_argument("--d", "--d-model", dest="d", type=int, default=768)
    ap.add_argument("--heads", "--n-head", dest="heads", type=int, default=12)
    ap.add_argument("--seq", "--seq-len", dest="seq", type=int, default=256)
    ap.add_argument("--vocab", "--vocab-size", dest="vocab", type=int, default=256)
    ap.add_argument("--mb", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--m", type=int, default=4, help="micro-batches per replica per step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--bucket-mb", type=float, default=25.0,
                    help="DDP's bucket_cap_mb (its default 25)")
    ap.add_argument("--grad-as-bucket-view", action="store_true",
                    help="DDP gradient_as_bucket_view=True (default False, as DDP's)")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds: the gloo timeout and the bound on the whole DDP run")
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--init-file", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.d % a.heads:
        ap.error("--d-model must be a multiple of --n-head")
    if a.replicas < 1 or a.m < 1 or a.steps < 1:
        ap.error("--replicas, --m and --steps must be >= 1")
    if a.rank_worker:
        print(json.dumps(run_rank(a, a.rank)), flush=True)
    elif a.single:
        print(json.dumps(run_single(a)), flush=True)
    else:
        if a.replicas < 2:
            ap.error("--ddp needs --replicas >= 2 (use --single for one process)")
        print(json.dumps(run_ddp(a)), flush=True)


if __name__ == "__main__":
    main()
