"""The Hugging Face config.json of a job's model, as `tandem export` writes it beside the
safetensors file: a Python port of coordinator/hf_config.cc (HfConfigJson, HfConfigPath), kept
byte for byte the same (the tests compare it with the CLI's file).

The model spec is the job's resolved one (Job.spec: presets applied, llama's n_kv_head and
d_hidden filled in), as a dict of ModelSpec's fields.
"""

import json
import os
from typing import Any, Mapping, Optional

GPT2_VOCAB = 50257          # GPT-2's real vocabulary
GPT2_PADDED_VOCAB = 50304   # the padded size the gpt2 preset trains with


def hf_vocab_rows(model: Mapping[str, Any]) -> int:
    """The vocabulary rows of the exported file: GPT-2's padding cut back, others whole."""
    vocab = int(model.get("vocab_size", 0))
    return GPT2_VOCAB if model.get("arch") == "gpt" and vocab == GPT2_PADDED_VOCAB else vocab


def hf_config(model: Mapping[str, Any]) -> Optional[dict]:
    """The config.json object of `model` (LlamaConfig or GPT2Config), or None for an arch
    without a Hugging Face counterpart (mlp_lm), as the CLI then writes none."""
    arch = model.get("arch")
    n_head = int(model.get("n_head", 0))
    d_model = int(model.get("d_model", 0))
    if arch == "llama":
        kv = int(model.get("n_kv_head", 0)) or n_head
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": d_model,
            "intermediate_size": int(model.get("d_hidden", 0)),
            "num_hidden_layers": int(model.get("n_layer", 0)),
            "num_attention_heads": n_head,
            "num_key_value_heads": kv,
            "head_dim": d_model // n_head if n_head > 0 else 0,
            "vocab_size": hf_vocab_rows(model),
            "max_position_embeddings": int(model.get("seq_len", 0)),
            "rope_theta": float(model.get("rope_theta", 10000.0)),
            "rms_norm_eps": float(model.get("rms_eps", 1e-5)),
            "tie_word_embeddings": bool(model.get("tie_embeddings", False)),
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
        }
    if arch == "gpt":
        d_hidden = int(model.get("d_hidden", 0))
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": hf_vocab_rows(model),
            "n_positions": int(model.get("seq_len", 0)),
            "n_ctx": int(model.get("seq_len", 0)),
            "n_embd": d_model,
            "n_layer": int(model.get("n_layer", 0)),
            "n_head": n_head,
            "n_inner": d_hidden if d_hidden > 0 else 4 * d_model,
            "activation_function": "gelu_new",  # the tanh approximation, as Tandem's GELU
            "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": bool(model.get("tie_embeddings", True)),
            "torch_dtype": "float32",
        }
    return None


def hf_config_json(model: Mapping[str, Any]) -> Optional[str]:
    """hf_config as text, formatted as nlohmann::json's dump(2) and a newline, like the CLI."""
    config = hf_config(model)
    return None if config is None else json.dumps(config, indent=2) + "\n"


def hf_config_path(safetensors_path: str) -> str:
    """config.json in the file's directory ("out/model.safetensors" -> "out/config.json")."""
    return os.path.join(os.path.dirname(safetensors_path), "config.json")
