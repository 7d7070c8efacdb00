#!/usr/bin/python3
"""PyTorch peer of bench/gpt_layer_bench.cc: the same GPT-2 block and head + loss shapes,
forward + backward, fp32 on the CPU, at 1 and 2 threads, printing the same table.

Install (Debian 12): `apt-get install python3-torch` (torch 1.13, linked to the system
OpenBLAS) and run it with the system interpreter, not a pyenv/venv python on PATH:

    /usr/bin/python3 bench/torch_gpt_layer.py [--reps 5] [--b 4] [--t 256] [--c 768]
                                              [--nh 12] [--v 50304] [--threads 1,2]

FLOPs are counted exactly as the C++ bench counts them (2*m*n*k per GEMM; see its header).

torch.set_num_threads(n) sets only torch's own (OpenMP) pool; OpenBLAS, which does torch's
sgemm, keeps its own pool (all cores by default), so a "1 thread" torch run would still
multiply on every core. The script therefore also calls openblas_set_num_threads(n) on the
OpenBLAS that torch loaded (found in /proc/self/maps) and says so in its first line.
"""

import argparse
import ctypes
import math
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    """GPT-2 block, as nanoGPT writes it (manual causal attention: torch 1.13 has no SDPA)."""

    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln_1 = torch.nn.LayerNorm(c)
        self.c_attn = torch.nn.Linear(c, 3 * c)
        self.attn_proj = torch.nn.Linear(c, c)
        self.ln_2 = torch.nn.LayerNorm(c)
        self.c_fc = torch.nn.Linear(c, 4 * c)
        self.mlp_proj = torch.nn.Linear(4 * c, c)

    def attn(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.nh, c // self.nh).transpose(1, 2)  # (B, NH, T, hd)
        k = k.view(b, t, self.nh, c // self.nh).transpose(1, 2)
        v = v.view(b, t, self.nh, c // self.nh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(mask[:t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.attn_proj(y)

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Head(torch.nn.Module):
    def __init__(self, c, v):
        super().__init__()
        self.ln_f = torch.nn.LayerNorm(c)
        self.w = torch.nn.Parameter(torch.randn(v, c) * 0.02)

    def forward(self, x, targets, normalizer):
        logits = self.ln_f(x) @ self.w.t()
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               reduction="sum")
        return loss / normalizer


def find_openblas():
    """The loaded OpenBLAS's openblas_set_num_threads, or None."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "blas" in path and path.startswith("/"):
                paths.add(path)
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).openblas_set_num_threads
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int]
        return path, fn
    return None, None


def set_threads(n, blas_set):
    torch.set_num_threads(n)
    if blas_set is not None:
        blas_set(n)


def time_fwd_bwd(fwd, x, reps):
    total, fwd_times = [], []
    for r in range(reps + 1):
        if x.grad is not None:
            x.grad = None
        t0 = time.perf_counter()
        out = fwd(x)
        t1 = time.perf_counter()
        if out.dim() == 0:
            out.backward()
        else:
            out.backward(torch.full_like(out, 0.01))
        t2 = time.perf_counter()
        if r > 0:
            total.append((t2 - t0) * 1e3)
            fwd_times.append((t1 - t0) * 1e3)
    total.sort()
    fwd_times.sort()
    return fwd_times[len(fwd_times) // 2], total[len(total) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--t", type=int, default=256)
    ap.add_argument("--c", type=int, default=768)
    ap.add_argument("--nh", type=int, default=12)
    ap.add_argument("--v", type=int, default=50304)
    ap.add_argument("--threads", default="1,2")
    a = ap.parse_args()
    threads = [int(s) for s in a.threads.split(",")]
    b, t, c, nh, v = a.b, a.t, a.c, a.nh, a.v

    n = b * t
    linear = 2.0 * n * c * (3 * c + c + 2 * 4 * c)
    attention = 2.0 * 2.0 * b * t * t * c
    block_flops = 3 * linear + 3 * attention
    head_flops = 3 * 2.0 * n * c * v

    torch.manual_seed(0)
    block = Block(c, nh)
    head = Head(c, v)
    mask = torch.tril(torch.ones(t, t)).view(1, 1, t, t)
    x = torch.randn(b, t, c, requires_grad=True)
    targets = torch.randint(0, v, (b, t))

    blas_path, blas_set = find_openblas()
    print(f"torch {torch.__version__} (openblas_set_num_threads from "
          f"{blas_path or 'NOT FOUND: BLAS threads not limited'}): "
          f"B={b} T={t} C={c} NH={nh} V={v}, median of {a.reps} (after 1 warm-up)")
    print(f"{'what':<22} {'threads':>7} {'fwd ms':>10} {'fwd+bwd ms':>10} {'GFLOP/s':>9}")
    for th in threads:
        set_threads(th, blas_set)
        fwd, ms = time_fwd_bwd(lambda inp: block(inp, mask), x, a.reps)
        print(f"{'block fwd+bwd':<22} {th:>7} {fwd:>10.1f} {ms:>10.1f} "
              f"{block_flops / (ms * 1e6):>9.1f}", flush=True)
    for th in threads:
        set_threads(th, blas_set)
        fwd, ms = time_fwd_bwd(lambda inp: head(inp, targets, n), x, a.reps)
        print(f"{'head+loss fwd+bwd':<22} {th:>7} {fwd:>10.1f} {ms:>10.1f} "
              f"{head_flops / (ms * 1e6):>9.1f}", flush=True)
    print(f"counted GFLOP: block {block_flops / 1e9:.2f} (attention {3 * attention / 1e9:.2f}), "
          f"head {head_flops / 1e9:.2f}")


if __name__ == "__main__":
    main()
