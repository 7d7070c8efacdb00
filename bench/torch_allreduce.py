#!/usr/bin/python3
"""PyTorch peer of build/bin/bench_allreduce: torch.distributed.all_reduce (sum) of float32
tensors over gloo between R processes (default 2) on 127.0.0.1, one thread each.
bench/data_parallel_bench.sh --allreduce runs it next to Tandem's ring all-reduce.

    /usr/bin/python3 bench/torch_allreduce.py [--sizes-mib 16,64,256] [--repeats 5]
        [--warmup 1] [--world 2] [--timeout 600]

Works with Debian's torch 1.13 and a PyPI torch 2.x. Processes: R copies of this script
(subprocess, --rank-worker) that meet through a FileStore (init_method file://) in a temporary
directory; gloo is pinned to the loopback interface (GLOO_SOCKET_IFNAME=lo unless set).

Per size: a tensor of size / 4 floats per process, --warmup untimed all-reduces, then
--repeats timed ones, each started by a barrier and timed on every rank; a repeat's time is
the slowest rank's. The tensor is refilled (untimed) before every all-reduce and the result is
checked (every element must be the sum of the ranks' values).

Output: one JSON line per size (the format bench_allreduce prints, with more fields):
  bytes     the tensor's bytes (per process)
  seconds   median over the repeats
  gbps      algorithm bandwidth, bytes / seconds / 1e9 (for a ring, the bus bandwidth is
            gbps x 2 (R - 1) / R: the same at R = 2)
  times_s   every repeat's time
"""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before torch is loaded
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on loopback only

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.dont_write_bytecode = True

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

PEER = "torch-%s-gloo" % torch.__version__.split("+")[0]


def run_rank(a, rank):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + a.init_file, rank=rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=a.timeout))
    out = []
    expect = float(sum(r + 1 for r in range(a.world)))
    for mib in sizes(a):
        n = int(mib * 2**20) // 4
        x = torch.empty(n, dtype=torch.float32)
        times = []
        for i in range(a.warmup + a.repeats):
            x.fill_(float(rank + 1))
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            t = time.perf_counter() - t0
            if i >= a.warmup:
                times.append(t)
        ok = bool(x[0].item() == expect and x[-1].item() == expect and
                  bool((x == expect).all()))
        # The slowest rank's time per repeat.
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.append({"bytes": n * 4, "times_s": t.tolist(), "ok": ok})
        del x
    dist.barrier()
    dist.destroy_process_group()
    return out


def sizes(a):
    return [float(s) for s in a.sizes_mib.split(",") if s.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", default="16,64,256", help="comma-separated MiB per tensor")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--world", type=int, default=2, help="processes")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds: the gloo timeout and the bound on the whole run")
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--init-file", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.repeats < 1 or a.warmup < 0 or a.world < 2 or not sizes(a):
        ap.error("--repeats >= 1, --warmup >= 0, --world >= 2 and at least one size")
    if a.rank_worker:
        print(json.dumps(run_rank(a, a.rank)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="torch-allreduce-") as tmp:
        args = [sys.executable, os.path.abspath(__file__), "--rank-worker",
                "--init-file", os.path.join(tmp, "store"), "--sizes-mib", a.sizes_mib,
                "--repeats", str(a.repeats), "--warmup", str(a.warmup),
                "--world", str(a.world), "--timeout", str(a.timeout)]
        procs = [subprocess.Popen(args + ["--rank", str(r)], stdout=subprocess.PIPE, text=True)
                 for r in range(a.world)]
        outs, deadline = [], time.monotonic() + a.timeout
        try:
            for r, pr in enumerate(procs):
                try:
                    out, _ = pr.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    sys.exit(f"torch_allreduce.py: rank {r} did not finish within --timeout "
                             f"{a.timeout} s")
                if pr.returncode != 0:
                    sys.exit(f"torch_allreduce.py: rank {r} failed with exit status "
                             f"{pr.returncode}")
                outs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for pr in procs:
                if pr.poll() is None:
                    pr.kill()
                    pr.wait()
    print(f"# torch {torch.__version__} all_reduce (sum, float32) over gloo, {a.world} "
          f"processes on 127.0.0.1, {a.warmup} warm-up + {a.repeats} repeats per size, "
          f"median of the slowest rank's time", file=sys.stderr, flush=True)
    bad = False
    for i, rec in enumerate(outs[0]):
        med = statistics.median(rec["times_s"])
        ok = all(o[i]["ok"] for o in outs)
        bad = bad or not ok
        print(json.dumps({"bytes": rec["bytes"], "seconds": med, "gbps": rec["bytes"] / med / 1e9,
                          "times_s": rec["times_s"], "world": a.world, "peer": PEER,
                          "correct": ok}), flush=True)
    if bad:
        sys.exit("torch_allreduce.py: a result was wrong")


if __name__ == "__main__":
    main()
