#!/usr/bin/env python3
"""An independent reference forward of a Llama (LlamaForCausalLM) model, in numpy.

Written from the published equations, not from Tandem's code, so that a match means the
export (names, layouts, config.json) and Tandem's llama layers agree with the architecture:

  RMSNorm       y = x / sqrt(mean(x^2) + eps) * g                      (Zhang & Sennrich 2019)
  RoPE          q' = q cos(t w) + rotate_half(q) sin(t w),  w_j = theta^(-2j/hd), j < hd/2,
                rotate_half([a, b]) = [-b, a]                           (HF's convention)
  attention     grouped-query: query head h reads key/value head h // (NH / KV) (repeat_kv),
                causal softmax(q k^T / sqrt(hd)) v, then o_proj
  MLP           down_proj(silu(gate_proj x) * up_proj x)                (SwiGLU, Shazeer 2020)
  block         h = x + attn(rms_1(x));  out = h + mlp(rms_2(h))
  head          logits = rms_f(x) W^T, W = lm_head, or embed_tokens when tie_word_embeddings

Every weight is (out, in), as nn.Linear stores it. Computation is float64.

Usage: llama_reference.py MODEL.safetensors CONFIG.json TOKENS
  TOKENS: a file of bytes (one token per byte); tokens[:-1] are the inputs, tokens[1:] the
  targets. Prints the mean next-token cross-entropy over the window.
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file


def rms_norm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, theta):
    """x: (heads, T, hd); token t is rotated by position t."""
    _, t, hd = x.shape
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
    angles = np.outer(np.arange(t, dtype=np.float64), inv_freq)  # (T, hd/2)
    emb = np.concatenate([angles, angles], axis=-1)  # (T, hd)
    return x * np.cos(emb) + rotate_half(x) * np.sin(emb)


def silu(x):
    return x / (1.0 + np.exp(-x))


def attention(x, w, prefix, cfg):
    t, c = x.shape
    nh, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or c // nh
    q = (x @ w[prefix + "q_proj.weight"].T).reshape(t, nh, hd).transpose(1, 0, 2)
    k = (x @ w[prefix + "k_proj.weight"].T).reshape(t, kv, hd).transpose(1, 0, 2)
    v = (x @ w[prefix + "v_proj.weight"].T).reshape(t, kv, hd).transpose(1, 0, 2)
    q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
    # repeat_kv: key/value head j serves query heads j * rep .. (j + 1) * rep - 1.
    rep = nh // kv
    k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd)  # (NH, T, T)
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    y = (p @ v).transpose(1, 0, 2).reshape(t, nh * hd)
    return y @ w[prefix + "o_proj.weight"].T


def mean_cross_entropy(w, cfg, tokens):
    inputs, targets = tokens[:-1], tokens[1:]
    eps = cfg["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][inputs]  # (T, C)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(rms_norm(x, w[p + "input_layernorm.weight"], eps), w, p + "self_attn.",
                          cfg)
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T) \
            @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    logits = x @ head.T  # (T, V)
    m = logits.max(axis=-1, keepdims=True)
    logz = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[:, 0]
    return float(np.mean(logz - logits[np.arange(len(targets)), targets]))


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    with open(argv[2]) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"], cfg
    assert cfg["hidden_act"] == "silu" and not cfg["attention_bias"] and not cfg["mlp_bias"], cfg
    w = {k: v.astype(np.float64) for k, v in load_file(argv[1]).items()}
    # The file holds exactly the model's tensors (lm_head only when untied).
    layers = cfg["num_hidden_layers"]
    expected = 2 + 9 * layers + (0 if cfg["tie_word_embeddings"] else 1)
    assert len(w) == expected, (len(w), expected, sorted(w))
    c, v = cfg["hidden_size"], cfg["vocab_size"]
    kvd = cfg["num_key_value_heads"] * (cfg.get("head_dim") or c // cfg["num_attention_heads"])
    assert w["model.embed_tokens.weight"].shape == (v, c)
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (kvd, c)
    assert w["model.layers.0.mlp.gate_proj.weight"].shape == (cfg["intermediate_size"], c)
    with open(argv[3], "rb") as f:
        tokens = np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)
    assert 2 <= len(tokens) <= cfg["max_position_embeddings"] + 1, len(tokens)
    print(repr(mean_cross_entropy(w, cfg, tokens)))


if __name__ == "__main__":
    main(sys.argv)
