#!/usr/bin/python3
"""PyTorch peer of bench/llama_layer_bench.cc: the same Llama block and head + loss shapes,
forward + backward, fp32 on the CPU, at 1 and 2 threads, printing the same table.

Written from the published equations, not from transformers: RMSNorm (Zhang & Sennrich
2019), rotary positions in Hugging Face's rotate_half convention (Su et al. 2021),
grouped-query causal attention (Ainslie et al. 2023; query head h reads kv head
h // (NH / KV)), the SwiGLU MLP (Shazeer 2020), no biases.

    /usr/bin/python3 bench/torch_llama_layer.py [--reps 5] [--b 4] [--t 256] [--c 768]
        [--nh 12] [--kv 4] [--h 2048] [--v 49152] [--threads 1,2] [--phases 1]
        [--head 0] [--attn auto|manual|sdpa]

Debian 12's python3-torch (1.13, linked to the system OpenBLAS) has no
F.scaled_dot_product_attention: there (and with --attn manual) k and v are repeated to NH
heads with repeat_interleave and the attention is the explicit masked softmax. Where SDPA
exists (torch >= 2.0) --attn auto uses it with is_causal=True, and with enable_gqa=True
where that argument exists (torch >= 2.5) instead of repeating k and v.

FLOPs are counted exactly as the C++ bench counts them (2*m*n*k per GEMM; see its header).
--phases 1 also times the attention core (rotated q, k, v -> merged heads), the seven
linears and the elementwise ops (RMSNorm, RoPE, SwiGLU, the residual adds) alone, as the C++
bench does. --head 0 skips the head + loss rows (as the C++ bench's --head 0).

torch.set_num_threads(n) sets only torch's own pool; an OpenBLAS that torch loaded keeps its
own (all cores by default), so the script also calls openblas_set_num_threads(n) on it (found
in /proc/self/maps) and says so in its first line. A torch built on MKL follows
torch.set_num_threads.

Run it under the same OPENBLAS_CORETYPE as the C++ bench, if any (see its header).
"""

import argparse
import ctypes
import math
import time

import torch
import torch.nn.functional as F


def rms_norm(x, g, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rope_tables(t, hd, theta):
    """(T, hd) cos and sin, each half repeated, in float32 as HF's LlamaRotaryEmbedding."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angle = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)  # (T, hd/2)
    emb = torch.cat((angle, angle), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def sdpa_has_gqa():
    if not has_sdpa():
        return False
    q = torch.zeros(1, 2, 1, 2)
    try:
        F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True)
    except TypeError:
        return False
    return True


class Attention:
    """Causal GQA on (B, NH, T, hd) q and (B, KV, T, hd) k, v -> (B, T, NH * hd)."""

    def __init__(self, t, nh, kv, mode):
        self.group = nh // kv
        self.mode = mode  # "manual", "sdpa" (repeat k, v) or "sdpa-gqa"
        self.mask = torch.tril(torch.ones(t, t, dtype=torch.bool))

    def __call__(self, q, k, v):
        b, nh, t, hd = q.shape
        if self.mode == "sdpa-gqa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k = k.repeat_interleave(self.group, dim=1)
            v = v.repeat_interleave(self.group, dim=1)
            if self.mode == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
                att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
                y = F.softmax(att, dim=-1) @ v
        return y.transpose(1, 2).contiguous().view(b, t, nh * hd)


class Block(torch.nn.Module):
    """x1 = x + o(attn(RoPE(q(rms_1 x)), RoPE(k(rms_1 x)), v(rms_1 x)));
    out = x1 + down(silu(gate(rms_2 x1)) * up(rms_2 x1))."""

    def __init__(self, c, nh, kv, h, t, attention, eps=1e-5, theta=10000.0):
        super().__init__()
        self.nh, self.kv, self.hd, self.eps = nh, kv, c // nh, eps
        self.rms_1 = torch.nn.Parameter(torch.ones(c))
        self.q_proj = torch.nn.Linear(c, c, bias=False)
        self.k_proj = torch.nn.Linear(c, kv * self.hd, bias=False)
        self.v_proj = torch.nn.Linear(c, kv * self.hd, bias=False)
        self.o_proj = torch.nn.Linear(c, c, bias=False)
        self.rms_2 = torch.nn.Parameter(torch.ones(c))
        self.gate_proj = torch.nn.Linear(c, h, bias=False)
        self.up_proj = torch.nn.Linear(c, h, bias=False)
        self.down_proj = torch.nn.Linear(h, c, bias=False)
        self.cos, self.sin = rope_tables(t, self.hd, theta)
        self.attention = attention

    def rope(self, x):  # (B, NHX, T, hd)
        t = x.size(2)
        return x * self.cos[:t] + rotate_half(x) * self.sin[:t]

    def attn(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        return self.o_proj(self.attention(self.rope(q), self.rope(k), v))

    def forward(self, x):
        x = x + self.attn(rms_norm(x, self.rms_1, self.eps))
        xn = rms_norm(x, self.rms_2, self.eps)
        return x + self.down_proj(F.silu(self.gate_proj(xn)) * self.up_proj(xn))


class Head(torch.nn.Module):
    def __init__(self, c, v, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.norm = torch.nn.Parameter(torch.ones(c))
        self.w = torch.nn.Parameter(torch.randn(v, c) * 0.02)

    def forward(self, x, targets, normalizer):
        logits = rms_norm(x, self.norm, self.eps) @ self.w.t()
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               reduction="sum")
        return loss / normalizer


def find_openblas():
    """The loaded OpenBLAS (path and kernel set) and its openblas_set_num_threads, or None."""
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
        try:
            core = ctypes.CDLL(path).openblas_get_corename
            core.restype = ctypes.c_char_p
            path = f"{path}, {core().decode()} kernels"
        except AttributeError:
            pass
        return path, fn
    return None, None


def set_threads(n, blas_set):
    torch.set_num_threads(n)
    if blas_set is not None:
        blas_set(n)


def time_pair(fwd, bwd, reps, leaves):
    """Medians of (forward, forward + backward) ms over reps after one warm-up; the leaves'
    gradients start fresh each time (the parameters' accumulate, as in the C++ layers)."""
    total, fwd_times = [], []
    for r in range(reps + 1):
        for leaf in leaves:
            leaf.grad = None
        t0 = time.perf_counter()
        out = fwd()
        t1 = time.perf_counter()
        bwd(out)
        t2 = time.perf_counter()
        del out
        if r > 0:
            total.append((t2 - t0) * 1e3)
            fwd_times.append((t1 - t0) * 1e3)
    total.sort()
    fwd_times.sort()
    return fwd_times[len(fwd_times) // 2], total[len(total) // 2]


def backward_of(out):
    if out.dim() == 0:
        out.backward()
    else:
        out.backward(torch.full_like(out, 0.01))


def backward_all(outs):
    torch.autograd.backward(outs, [torch.full_like(o, 0.01) for o in outs])


class Phases:
    """The block's parts on their own, on its shapes (--phases 1), as the C++ bench times
    them: the attention core from rotated q, k, v to the merged heads; the seven linears, each
    on its own input; the elementwise ops (two RMSNorms, RoPE on q and k, SwiGLU, the two
    residual adds)."""

    def __init__(self, block, attn, b, t, h):
        nh, kv, hd = block.nh, block.kv, block.hd
        c = nh * hd
        self.block, self.attn = block, attn
        self.q = torch.randn(b, nh, t, hd, requires_grad=True)
        self.k = torch.randn(b, kv, t, hd, requires_grad=True)
        self.v = torch.randn(b, kv, t, hd, requires_grad=True)
        self.attn_leaves = [self.q, self.k, self.v]
        self.lins = [block.q_proj, block.k_proj, block.v_proj, block.o_proj, block.gate_proj,
                     block.up_proj, block.down_proj]
        self.lin_leaves = [torch.randn(b * t, lin.in_features, requires_grad=True)
                           for lin in self.lins]
        self.x = torch.randn(b, t, c, requires_grad=True)
        self.gate = torch.randn(b, t, h, requires_grad=True)
        self.up = torch.randn(b, t, h, requires_grad=True)
        self.elem_leaves = [self.x, self.q, self.k, self.gate, self.up]

    def attention(self):
        return [self.attn(self.q, self.k, self.v)]

    def linears(self):
        return [lin(xi) for lin, xi in zip(self.lins, self.lin_leaves)]

    def elementwise(self):
        bl = self.block
        xn1 = rms_norm(self.x, bl.rms_1, bl.eps)
        x1 = self.x + xn1
        xn2 = rms_norm(x1, bl.rms_2, bl.eps)
        act = F.silu(self.gate) * self.up
        return [bl.rope(self.q), bl.rope(self.k), xn2 + x1, act]


def row(what, th, fwd, ms, flops):
    rate = f"{flops / (ms * 1e6):>9.1f}" if flops else f"{'-':>9}"
    print(f"{what:<22} {th:>7} {fwd:>10.1f} {ms:>10.1f} {rate}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--t", type=int, default=256)
    ap.add_argument("--c", type=int, default=768)
    ap.add_argument("--nh", type=int, default=12)
    ap.add_argument("--kv", type=int, default=4)
    ap.add_argument("--h", type=int, default=2048)
    ap.add_argument("--v", type=int, default=49152)  # SmolLM2's vocabulary
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--phases", type=int, default=0)
    ap.add_argument("--head", type=int, default=1)
    ap.add_argument("--attn", choices=["auto", "manual", "sdpa"], default="auto")
    a = ap.parse_args()
    threads = [int(s) for s in a.threads.split(",")]
    b, t, c, nh, kv, h, v = a.b, a.t, a.c, a.nh, a.kv, a.h, a.v
    if nh % kv or c % nh or (c // nh) % 2:
        ap.error("need KV | NH, NH | C and an even head size")
    hd = c // nh
    kvd = kv * hd

    if a.attn == "manual" or (a.attn == "auto" and not has_sdpa()):
        mode = "manual"
    elif a.attn == "sdpa" and not has_sdpa():
        ap.error("this torch has no F.scaled_dot_product_attention")
    else:
        mode = "sdpa-gqa" if sdpa_has_gqa() else "sdpa"

    n = b * t
    linear = 2.0 * n * c * (c + 2 * kvd + c + 3 * h)
    attention = 2.0 * 2.0 * b * t * t * c
    block_flops = 3 * linear + 3 * attention
    head_flops = 3 * 2.0 * n * c * v

    torch.manual_seed(0)
    attn = Attention(t, nh, kv, mode)
    block = Block(c, nh, kv, h, t, attn)
    head = Head(c, v)
    x = torch.randn(b, t, c, requires_grad=True)
    targets = torch.randint(0, v, (b, t))

    blas_path, blas_set = find_openblas()
    if blas_path:
        blas = f"openblas_set_num_threads from {blas_path}"
    elif torch.backends.mkl.is_available():
        blas = "MKL: torch.set_num_threads"
    else:
        blas = "NOT FOUND: BLAS threads not limited"
    print(f"torch {torch.__version__} ({blas}; attention {mode}): "
          f"B={b} T={t} C={c} NH={nh} KV={kv} H={h} V={v}, median of {a.reps} (after 1 warm-up)")
    print(f"{'what':<22} {'threads':>7} {'fwd ms':>10} {'fwd+bwd ms':>10} {'GFLOP/s':>9}")
    for th in threads:
        set_threads(th, blas_set)
        fwd, ms = time_pair(lambda: block(x), backward_of, a.reps, [x])
        row("block fwd+bwd", th, fwd, ms, block_flops)
    if a.phases:
        phases = Phases(block, attn, b, t, h)
        for th in threads:
            set_threads(th, blas_set)
            fwd, ms = time_pair(phases.attention, backward_all, a.reps, phases.attn_leaves)
            row("  attention core", th, fwd, ms, 3 * attention)
            fwd, ms = time_pair(phases.linears, backward_all, a.reps, phases.lin_leaves)
            row("  7 linears", th, fwd, ms, 3 * linear)
            fwd, ms = time_pair(phases.elementwise, backward_all, a.reps, phases.elem_leaves)
            row("  norms+rope+swiglu", th, fwd, ms, 0)
    for th in threads if a.head else []:
        set_threads(th, blas_set)
        fwd, ms = time_pair(lambda: head(x, targets, n), backward_of, a.reps, [x])
        row("head+loss fwd+bwd", th, fwd, ms, head_flops)
    print(f"counted GFLOP: block {block_flops / 1e9:.2f} (attention {3 * attention / 1e9:.2f}), "
          f"head {head_flops / 1e9:.2f}")


if __name__ == "__main__":
    main()
