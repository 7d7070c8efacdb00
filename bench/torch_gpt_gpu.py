#!/usr/bin/env python3
"""PyTorch peer of bench/gpu_gpt_bench.cc: GPT-2 124M (12 layers, d 768, 12 heads,
V 50304, T 1024, tied LM head, GELU tanh, pre-LN) trained on one GPU in eager PyTorch with
bf16 autocast (fp32 master weights), AdamW (fused where this torch has it) with the spec's
defaults (betas 0.9 / 0.95, eps 1e-8, weight decay 0; --weight-decay on 2-D weights only), on uniform random
tokens; warm-up steps, then timed steps.

    python3 bench/torch_gpt_gpu.py [--batch 8] [--seq 1024] [--accum 1] [--warmup 3]
                                   [--steps 10] [--precision bf16|fp32] [--lr 6e-4]
                                   [--peak-tflops 989] [--attn sdpa|manual] [--seed 1]
                                   [--weight-decay 0]

--attn sdpa (default) uses F.scaled_dot_product_attention(is_causal=True), what an eager
PyTorch GPT-2 uses today (flash attention where available); --attn manual materialises the
(T, T) probabilities as GpuGpt does (softmax of a masked q k^T, then att v).

MFU = (6 N + 12 L T C) * tokens/s / (peak TFLOP/s * 1e12), N the parameter count (the tied
wte once, wpe included): the same formula as the C++ bench. Standard library + torch only.
Without CUDA it says so and exits 77. The last line is machine-readable:
"RESULT impl=torch tokens_per_s=... step_ms=... mfu=...".
"""

import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, c, nh, n_layer, attn):
        super().__init__()
        self.nh = nh
        self.attn = attn
        self.ln_1 = torch.nn.LayerNorm(c)
        self.c_attn = torch.nn.Linear(c, 3 * c)
        self.attn_proj = torch.nn.Linear(c, c)
        self.ln_2 = torch.nn.LayerNorm(c)
        self.c_fc = torch.nn.Linear(c, 4 * c)
        self.mlp_proj = torch.nn.Linear(4 * c, c)
        proj_std = 0.02 / math.sqrt(2 * n_layer)
        for lin, std in ((self.c_attn, 0.02), (self.attn_proj, proj_std),
                         (self.c_fc, 0.02), (self.mlp_proj, proj_std)):
            torch.nn.init.normal_(lin.weight, std=std)
            torch.nn.init.zeros_(lin.bias)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, n_layer, nh, c, t_max, v, attn):
        super().__init__()
        self.wte = torch.nn.Embedding(v, c)
        self.wpe = torch.nn.Embedding(t_max, c)
        torch.nn.init.normal_(self.wte.weight, std=0.02)
        torch.nn.init.normal_(self.wpe.weight, std=0.02)
        self.blocks = torch.nn.ModuleList(Block(c, nh, n_layer, attn) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(c)

    def forward(self, tokens, targets):
        t = tokens.size(1)
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)  # the spec's default
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--attn", choices=("sdpa", "manual"), default="sdpa")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compile", action="store_true",
                   help="run the model under torch.compile (its compile time is in the warm-up)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(f"torch_gpt_gpu: no usable CUDA device (torch {torch.__version__}), "
              "nothing to measure")
        return 77
    n_layer, nh, c, t_max, v = 12, 12, 768, 1024, 50304  # common/spec.cc preset gpt2
    if not 1 <= args.seq <= t_max:
        print(f"torch_gpt_gpu: --seq must be in [1, {t_max}]", file=sys.stderr)
        return 2
    if args.attn == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        print(f"torch_gpt_gpu: torch {torch.__version__} has no scaled_dot_product_attention; "
              "using --attn manual")
        args.attn = "manual"
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    # fp32 GEMMs in fp32 (no TF32), as GpuGpt's fp32 mode.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = Gpt(n_layer, nh, c, t_max, v, args.attn).to(dev)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
        fused = True
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
        fused = False
    n_params = sum(q.numel() for q in model.parameters())  # the tied wte once
    if args.compile:
        if not hasattr(torch, "compile"):
            print(f"torch_gpt_gpu: torch {torch.__version__} has no torch.compile", file=sys.stderr)
            return 2
        model = torch.compile(model)
    name = torch.cuda.get_device_name(dev)
    print(f"torch_gpt_gpu: GPT-2 124M (L {n_layer}, d {c}, NH {nh}, V {v}, T {args.seq}), "
          f"{args.precision}, B {args.batch}, accum {args.accum}, attn {args.attn}, "
          f"AdamW fused={fused}, compiled={args.compile}, torch {torch.__version__}, device {name}")
    print(f"parameters N = {n_params} (tied wte once)")

    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed ^ 0x5EED)

    def next_batch():
        s = torch.randint(0, v, (args.batch * args.seq + 1,), device=dev, generator=gen)
        return (s[:-1].view(args.batch, args.seq), s[1:].view(args.batch, args.seq))

    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    print(f"{'step':>5} {'loss':>8} {'step ms':>9}")
    timed_ms = 0.0
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss_sum = 0.0
        for _ in range(args.accum):
            tokens, targets = next_batch()
            with autocast:
                loss = model(tokens, targets) / args.accum
            loss.backward()
            loss_sum += loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = float(loss_sum)  # waits for the step
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        timed = step >= args.warmup
        print(f"{step:5d} {loss_value:8.4f} {ms:9.2f}{'' if timed else '  (warm-up)'}")
        if timed:
            timed_ms += ms
    tokens_per_s = args.batch * args.seq * args.accum * args.steps / (timed_ms / 1e3)
    flops_per_token = 6 * n_params + 12 * n_layer * args.seq * c
    mfu = flops_per_token * tokens_per_s / (args.peak_tflops * 1e12)
    print(f"timed {args.steps} steps: step {timed_ms / args.steps:.2f} ms, "
          f"{tokens_per_s:.0f} tokens/s")
    print(f"MFU = (6 x {n_params} + 12 x {n_layer} x {args.seq} x {c}) x {tokens_per_s:.0f} / "
          f"{args.peak_tflops:.0f} TFLOP/s = {100 * mfu:.2f}%")
    print(f"max memory allocated {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    print(f"RESULT impl={'torch_compile' if args.compile else 'torch'} precision={args.precision} batch={args.batch} seq={args.seq} "
          f"tokens_per_s={tokens_per_s:.1f} step_ms={timed_ms / args.steps:.3f} mfu={mfu:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
