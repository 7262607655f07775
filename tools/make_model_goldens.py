#!/usr/bin/python3
"""Generate tiny Hugging Face model folders and their expected attention outputs.

Run with Debian's Python (python3-torch, python3-numpy); called by
tools/make_golden.py, or alone:

    python3 tools/make_model_goldens.py

Each case becomes tests/data/models/<case>/, a folder laid out as Hugging Face
stores a model (config.json; model.safetensors, or model.safetensors.index.json
and its shards; tensors model.layers.N.self_attn.* for every layer plus a few
non-attention tensors), and:

    input.npy     the attention block's input hidden states, float32 [batch, seq, hidden]
    expected.npy  the block's output after o_proj, float32, same shape
    args          `--layer N` for `kvhead run --model <case folder>`

The expected output is computed in float64 from the weights as stored, with
the formulas of the Hugging Face `transformers` code of each family (written
here from them, since transformers is not installable): modeling_rope_utils
(_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
_compute_llama3_parameters, _compute_yarn_parameters,
_compute_longrope_parameters with the dynamic update's seq_len = the call's
largest position + 1: inv_freq and the attention factor that multiplies cos
and sin), apply_rotary_pos_emb with
rotate_half (Phi-3: on the first rotary_dim dims, the rest passed through),
Qwen3's RMSNorm of q and k over head_dim before RoPE, eager_attention_forward
(scores * scaling, Gemma 2's soft-capping: scores / cap, tanh, * cap, then
the causal mask and the sliding-window mask of a
sliding layer (masking_utils' sliding_window_overlay: key j visible to query i
only if i - j < sliding_window; which layers slide as each family's config
decides: layer_types when given, Mistral every layer, Qwen 2 from
max_window_layers on with use_sliding_window, Gemma 2 and gpt-oss even
layers), softmax, P v; gpt-oss's sinks: the sink logit concatenated to each
row, the row max subtracted, softmax, the sink column dropped), the biases
each family's q/k/v/o_proj have, and Phi-3's fused qkv_proj (rows q,
k, v).

Cases:

  case              model_type  dtype  H  G  d   hidden  rope                          extra
  ----------------  ----------  -----  -  -  --  ------  ----------------------------  --------------------------------
  llama3_sharded    llama       F32    4  2  16  64      llama3 f8 low1 high4 orig64   3 layers in 2 shards + index
  qwen25_bias       qwen2       F32    6  2  8   48      default theta 1e6             q/k/v biases; sliding off
  qwen3_qk_norm     qwen3       BF16   4  2  16  48      default theta 1e6             QK-norm; head_dim != hidden/H
  mistral_no_window mistral     F16    8  2  8   64      default                       sliding_window null
  phi3_partial      phi3        F32    4  4  16  64      default, partial 0.75         fused qkv_proj; rotary_dim 12
  llama_yarn        llama       F32    4  1  16  64      yarn f4 orig32 (max_pos 128)  attention_bias: q/k/v/o biases
  llama_linear      llama       F32    4  2  16  64      linear f2                     -
  gemma2_full       gemma2      F32    4  2  16  48      default                       layer 1 (full); query_pre_attn_scalar 24
  mistral_window    mistral     F32    4  2  16  64      default                       sliding_window 5, seq 23
  qwen2_window      qwen2       BF16   6  2  8   48      default theta 1e6             use_sliding_window, window 6, layer 1 of
                                                                                     max_window_layers 1 slides
  gemma2_sliding    gemma2      F32    4  2  16  48      default                       layer 0 slides (layer_types), window 4
  gemma2_softcap    gemma2      F32    4  2  16  48      default                       layer 1; softcapping 1.5,
                                                                                       query_pre_attn_scalar 8,
                                                                                       input x 3: |score| >> cap
  gpt_oss_sinks     gpt_oss     BF16   8  2  16  64      yarn f32 orig4096 no trunc    layer 1 (full); q/k/v/o
                                                                                       biases; sinks ~ N(0, 1.5^2)
  gpt_oss_sliding   gpt_oss     BF16   8  2  16  64      yarn f32 orig4096 no trunc    layer 0 slides (even layer),
                                                                                       window 5, seq 17; sinks, biases
  gemma2_softcap_sliding gemma2 F32    4  2  16  48      default                       layer 0 slides, window 4;
                                                                                       softcapping 1.5, input x 3
  phi3_longrope     phi3        F32    4  2  16  64      longrope orig16 max64, partial 0.75; seq 13: short factors
  phi3_longrope_long phi3       BF16   4  2  16  64      longrope "su" orig16 max64, partial 0.75; seq 23 > 16: long
                                                                                       factors for every token (HF
                                                                                       picks them per forward call)

The cases mistral_window, qwen2_window and gemma2_sliding take their seed from
their index like the first eight; the later cases carry their own seed
(ModelCase.seed), so a case added on another branch does not change theirs.
"""

import json
import math
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import read_safetensors, write_safetensors, TORCH_DTYPES  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO_ROOT / "tests" / "data" / "models"
BASE_SEED = 20261201
HF_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


@dataclass
class ModelCase:
    name: str
    config: dict  # config.json
    layer: int
    input_shape: tuple  # (batch, seq, hidden)
    dtype: str = "F32"
    shards: int = 1  # > 1: model.safetensors.index.json and that many shards
    seed: int = None  # None: BASE_SEED + the case's index
    input_scale: float = 1.0  # the input hidden states ~ N(0, input_scale^2)


def base_config(model_type, hidden, heads, kv_heads, layers, **extra):
    config = {"architectures": [f"{model_type}ForCausalLM"], "model_type": model_type, "hidden_size": hidden,
              "intermediate_size": 2 * hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": layers, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
              "vocab_size": 32}
    config.update(extra)
    return config


CASES = [
    ModelCase("llama3_sharded",
              base_config("llama", 64, 4, 2, 3, rope_theta=10000.0, attention_bias=False, torch_dtype="float32",
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
              layer=2, input_shape=(2, 24, 64), shards=2),
    ModelCase("qwen25_bias",
              base_config("qwen2", 48, 6, 2, 2, rope_theta=1000000.0, use_sliding_window=False, sliding_window=32,
                          max_window_layers=2, torch_dtype="float32", rope_scaling=None),
              layer=1, input_shape=(2, 13, 48)),
    ModelCase("qwen3_qk_norm",
              base_config("qwen3", 48, 4, 2, 2, head_dim=16, rope_theta=1000000.0, attention_bias=False,
                          use_sliding_window=False, sliding_window=None, max_window_layers=2, rms_norm_eps=1e-6,
                          torch_dtype="bfloat16", rope_scaling=None),
              layer=1, input_shape=(2, 11, 48), dtype="BF16"),
    ModelCase("mistral_no_window",
              base_config("mistral", 64, 8, 2, 2, rope_theta=1000000.0, sliding_window=None, torch_dtype="float16"),
              layer=0, input_shape=(2, 17, 64), dtype="F16"),
    ModelCase("phi3_partial",
              base_config("phi3", 64, 4, 4, 2, rope_theta=10000.0, partial_rotary_factor=0.75, sliding_window=None,
                          rope_scaling=None, torch_dtype="float32"),
              layer=1, input_shape=(2, 15, 64)),
    ModelCase("llama_yarn",
              base_config("llama", 64, 4, 1, 2, rope_theta=10000.0, attention_bias=True, max_position_embeddings=128,
                          rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
              layer=1, input_shape=(2, 40, 64)),
    ModelCase("llama_linear",
              base_config("llama", 64, 4, 2, 2, rope_theta=10000.0,
                          rope_scaling={"type": "linear", "factor": 2.0}),
              layer=0, input_shape=(1, 30, 64)),
    ModelCase("gemma2_full",
              base_config("gemma2", 48, 4, 2, 2, head_dim=16, rope_theta=10000.0, query_pre_attn_scalar=24,
                          attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window=4096,
                          attention_bias=False, torch_dtype="float32"),
              layer=1, input_shape=(2, 9, 48)),
    ModelCase("mistral_window",
              base_config("mistral", 64, 4, 2, 2, head_dim=16, rope_theta=1000000.0, sliding_window=5,
                          torch_dtype="float32"),
              layer=1, input_shape=(2, 23, 64)),
    ModelCase("qwen2_window",
              base_config("qwen2", 48, 6, 2, 2, rope_theta=1000000.0, use_sliding_window=True, sliding_window=6,
                          max_window_layers=1, torch_dtype="bfloat16", rope_scaling=None),
              layer=1, input_shape=(2, 19, 48), dtype="BF16"),
    ModelCase("gemma2_sliding",
              base_config("gemma2", 48, 4, 2, 2, head_dim=16, rope_theta=10000.0, query_pre_attn_scalar=24,
                          attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window=4,
                          layer_types=["sliding_attention", "full_attention"], attention_bias=False,
                          torch_dtype="float32"),
              layer=0, input_shape=(2, 11, 48)),
    ModelCase("gemma2_softcap",
              base_config("gemma2", 48, 4, 2, 2, head_dim=16, rope_theta=10000.0, query_pre_attn_scalar=8,
                          attn_logit_softcapping=1.5, final_logit_softcapping=30.0, sliding_window=4096,
                          attention_bias=False, torch_dtype="float32"),
              layer=1, input_shape=(2, 21, 48), seed=BASE_SEED + 1001, input_scale=3.0),
    ModelCase("gpt_oss_sinks",
              base_config("gpt_oss", 64, 8, 2, 2, head_dim=16, rope_theta=150000.0, attention_bias=True,
                          sliding_window=128, layer_types=["sliding_attention", "full_attention"],
                          max_position_embeddings=131072, rms_norm_eps=1e-5, torch_dtype="bfloat16",
                          rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                        "truncate": False, "original_max_position_embeddings": 4096},
                          num_local_experts=4, num_experts_per_tok=2),
              layer=1, input_shape=(2, 19, 64), dtype="BF16", seed=BASE_SEED + 1002),
    ModelCase("gpt_oss_sliding",
              base_config("gpt_oss", 64, 8, 2, 2, head_dim=16, rope_theta=150000.0, attention_bias=True,
                          sliding_window=5, max_position_embeddings=131072, rms_norm_eps=1e-5,
                          torch_dtype="bfloat16",
                          rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                        "truncate": False, "original_max_position_embeddings": 4096},
                          num_local_experts=4, num_experts_per_tok=2),
              layer=0, input_shape=(2, 17, 64), dtype="BF16", seed=BASE_SEED + 1003),
    ModelCase("gemma2_softcap_sliding",
              base_config("gemma2", 48, 4, 2, 2, head_dim=16, rope_theta=10000.0, query_pre_attn_scalar=8,
                          attn_logit_softcapping=1.5, final_logit_softcapping=30.0, sliding_window=4,
                          attention_bias=False, torch_dtype="float32"),
              layer=0, input_shape=(2, 13, 48), seed=BASE_SEED + 1004, input_scale=3.0),
    ModelCase("phi3_longrope",
              base_config("phi3", 64, 4, 2, 2, rope_theta=10000.0, partial_rotary_factor=0.75, sliding_window=None,
                          max_position_embeddings=64, original_max_position_embeddings=16, torch_dtype="float32",
                          rope_scaling={"type": "longrope", "short_factor": [1.0, 1.05, 1.2, 1.6, 2.3, 3.1],
                                        "long_factor": [1.0, 1.4, 2.5, 5.0, 11.0, 24.0]}),
              layer=1, input_shape=(2, 13, 64), seed=BASE_SEED + 1005),
    ModelCase("phi3_longrope_long",
              base_config("phi3", 64, 4, 2, 2, rope_theta=10000.0, partial_rotary_factor=0.75, sliding_window=None,
                          max_position_embeddings=64, original_max_position_embeddings=16, torch_dtype="bfloat16",
                          rope_scaling={"type": "su", "short_factor": [1.0, 1.05, 1.2, 1.6, 2.3, 3.1],
                                        "long_factor": [1.0, 1.4, 2.5, 5.0, 11.0, 24.0]}),
              layer=0, input_shape=(2, 23, 64), dtype="BF16", seed=BASE_SEED + 1006),
]


# ----------------------------------------------------------------------------
# Hugging Face formulas, float64
# ----------------------------------------------------------------------------

# Absent from config.json: num_key_value_heads and head_dim as each family's configuration_*.py defaults them
# (None: the heads, and hidden / heads; an explicit null means those too).
HF_DEFAULTS = {"mistral": (8, None), "qwen2": (32, None), "qwen3": (32, 128), "gemma2": (4, 256),
               "gpt_oss": (8, 64)}


def head_dim_of(config):
    if "head_dim" not in config:
        default = HF_DEFAULTS.get(config["model_type"], (None, None))[1]
        if default is not None:
            return default
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def kv_heads_of(config):
    if "num_key_value_heads" not in config:
        default = HF_DEFAULTS.get(config["model_type"], (None, None))[0]
        if default is not None:
            return default
    return config.get("num_key_value_heads") or config["num_attention_heads"]


def rope_parameters(config, seq_len=None):
    """(inv_freq [rotary_dim/2], attention_factor, rotary_dim) as modeling_rope_utils computes them (longrope: for a
    forward call whose largest position is seq_len - 1)."""
    base = config.get("rope_theta", 10000.0)
    dim = int(head_dim_of(config) * config.get("partial_rotary_factor", 1.0))
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    # _compute_default_rope_parameters
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    attention_factor = 1.0
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_context / low, old_context / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif kind == "yarn":
        factor = scaling["factor"]
        original = scaling.get("original_max_position_embeddings") or config["max_position_embeddings"]
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")

        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
            else:
                attention_factor = get_mscale(factor)
        beta_fast = scaling.get("beta_fast") or 32
        beta_slow = scaling.get("beta_slow") or 1

        def correction_dim(rotations):
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    elif kind in ("longrope", "su"):  # Phi3Config reads su (and yarn) as longrope
        original = scaling.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
        max_positions = config.get("max_position_embeddings", 4096)
        if original is None and config["model_type"] == "phi3":
            original = 4096  # Phi3Config's default
        # 4.x: max / original whenever the config has the top-level field (Phi-3 always does); 5: the factor if given.
        factor = scaling.get("factor") or max_positions / (original or max_positions)
        original = original or max_positions
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        ext = scaling["long_factor"] if seq_len and seq_len > original else scaling["short_factor"]
        ext = torch.tensor(ext, dtype=torch.float64)
        inv_freq = 1.0 / (ext * base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    elif kind != "default":
        raise ValueError(kind)
    return inv_freq, attention_factor, dim


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, config):
    """x [batch, seq, heads, d], positions 0..seq-1; partial rotary as Phi-3."""
    seq = x.shape[1]
    inv_freq, attention_factor, rotary_dim = rope_parameters(config, seq)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos = (emb.cos() * attention_factor)[None, :, None, :]
    sin = (emb.sin() * attention_factor)[None, :, None, :]
    rot, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, passed), dim=-1)


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def sliding_window_of(config, layer):
    """The layer's sliding window (None: full attention), as each family's HF config decides it."""
    family = config["model_type"]
    # layer_types: read by Gemma 2, gpt-oss and Qwen 2/3 (Mistral's code warns and ignores it, Phi-3 is Mistral's,
    # Llama never slides).
    if config.get("layer_types") is not None and family in ("gemma2", "gpt_oss", "qwen2", "qwen3"):
        return config["sliding_window"] if config["layer_types"][layer] == "sliding_attention" else None
    if family == "mistral":
        return config.get("sliding_window", 4096)
    if family in ("qwen2", "qwen3"):
        slides = config.get("use_sliding_window", False) and layer >= config.get("max_window_layers", 28)
        return config.get("sliding_window", 4096) if slides else None
    if family == "gemma2":
        return config.get("sliding_window", 4096) if layer % 2 == 0 else None
    if family == "gpt_oss":
        return config.get("sliding_window", 128) if layer % 2 == 0 else None
    if family == "phi3":
        return config.get("sliding_window")
    return None


def reference_attention(x, w, config, layer, use_variants=True):
    """The attention block of layer `layer`, float64. x [batch, seq, hidden]; w: name -> float64 tensor.
    use_variants=False drops soft-capping and sinks (for the check that they matter)."""
    family = config["model_type"]
    p = f"model.layers.{layer}.self_attn."
    batch, seq, _ = x.shape
    H, G, d = config["num_attention_heads"], kv_heads_of(config), head_dim_of(config)

    def linear(inp, name):
        y = inp @ w[p + name + ".weight"].T
        return y + w[p + name + ".bias"] if p + name + ".bias" in w else y

    if family == "phi3":
        qkv = linear(x, "qkv_proj")
        q, k, v = qkv[..., :H * d], qkv[..., H * d:(H + G) * d], qkv[..., (H + G) * d:]
    else:
        q, k, v = linear(x, "q_proj"), linear(x, "k_proj"), linear(x, "v_proj")
    q, k, v = q.reshape(batch, seq, H, d), k.reshape(batch, seq, G, d), v.reshape(batch, seq, G, d)
    if family == "qwen3":
        q = rms_norm(q, w[p + "q_norm.weight"], config["rms_norm_eps"])
        k = rms_norm(k, w[p + "k_norm.weight"], config["rms_norm_eps"])
    q, k = apply_rope(q, config), apply_rope(k, config)
    k = k.repeat_interleave(H // G, dim=2)  # repeat_kv: query head h reads kv head h // (H/G)
    v = v.repeat_interleave(H // G, dim=2)
    scaling = config["query_pre_attn_scalar"] ** -0.5 if family == "gemma2" else d ** -0.5
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scaling
    softcap = config.get("attn_logit_softcapping", 50.0) if family == "gemma2" else None  # Gemma2Config: 50
    reference_attention.largest_score = scores.abs().max().item()  # before capping (for the summary)
    if softcap is not None and use_variants:
        scores = torch.tanh(scores / softcap) * softcap
    query, key = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    visible = key <= query  # causal
    window = sliding_window_of(config, layer)
    if window is not None:
        visible = visible & (query - key < window)  # sliding_window_overlay: kv_idx > q_idx - sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    if family == "gpt_oss" and use_variants:
        sinks = w[p + "sinks"].reshape(1, -1, 1, 1).expand(batch, H, seq, 1)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[..., :-1]  # the sink's column dropped
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, H * d)
    return linear(out, "o_proj")


def apply_rope_per_pair(x, config):
    """Independent check of apply_rope: explicit rotation of pairs (i, i + r/2)."""
    inv_freq, attention_factor, r = rope_parameters(config, x.shape[1])
    out = x.clone()
    for pos in range(x.shape[1]):
        for i in range(r // 2):
            c = math.cos(pos * inv_freq[i].item()) * attention_factor
            s = math.sin(pos * inv_freq[i].item()) * attention_factor
            a, b = x[:, pos, :, i], x[:, pos, :, i + r // 2]
            out[:, pos, :, i] = a * c - b * s
            out[:, pos, :, i + r // 2] = a * s + b * c
    return out


# ----------------------------------------------------------------------------
# folders
# ----------------------------------------------------------------------------

def attention_shapes(config):
    """{suffix: shape} of one layer's attention tensors, as the family names them."""
    family, hidden = config["model_type"], config["hidden_size"]
    H, G, d = config["num_attention_heads"], kv_heads_of(config), head_dim_of(config)
    shapes = {}
    if family == "phi3":
        shapes["qkv_proj.weight"] = ((H + 2 * G) * d, hidden)
    else:
        shapes.update({"q_proj.weight": (H * d, hidden), "k_proj.weight": (G * d, hidden),
                       "v_proj.weight": (G * d, hidden)})
    shapes["o_proj.weight"] = (hidden, H * d)
    all_biases = family in ("llama", "qwen3", "gemma2", "gpt_oss") and config.get("attention_bias")
    if family == "qwen2" or all_biases:
        shapes.update({"q_proj.bias": (H * d,), "k_proj.bias": (G * d,), "v_proj.bias": (G * d,)})
    if all_biases:
        shapes["o_proj.bias"] = (hidden,)
    if family == "gpt_oss":
        shapes["sinks"] = (H,)
    if family == "qwen3":
        shapes.update({"q_norm.weight": (d,), "k_norm.weight": (d,)})
    return shapes


def make_tensors(case, gen):
    """Every tensor of the folder (float64, rounded to the storage dtype)."""
    config, hidden = case.config, case.config["hidden_size"]
    std = 1.0 / math.sqrt(hidden)
    tensors = {"model.embed_tokens.weight": torch.randn(config["vocab_size"], hidden, generator=gen,
                                                        dtype=torch.float64)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen, dtype=torch.float64)
        for suffix, shape in attention_shapes(config).items():
            if suffix.endswith("norm.weight"):  # RMSNorm weights near 1
                t = 1 + 0.2 * torch.randn(shape, generator=gen, dtype=torch.float64)
            elif suffix == "sinks":  # logits of the size of the scores, so they take a visible share
                t = 1.5 * torch.randn(shape, generator=gen, dtype=torch.float64)
            else:
                t = torch.randn(shape, generator=gen, dtype=torch.float64) * std
            tensors[p + "self_attn." + suffix] = t
    store = TORCH_DTYPES[case.dtype]
    return {k: v.to(store).to(torch.float64) for k, v in tensors.items()}


def write_folder(case, tensors, folder):
    (folder / "config.json").write_text(json.dumps(case.config, indent=2) + "\n")
    if case.shards == 1:
        write_safetensors(folder / "model.safetensors", tensors, case.dtype, {"format": "pt"})
        return
    names = sorted(tensors)
    weight_map, total = {}, 0
    for s in range(case.shards):
        shard = f"model-{s + 1:05d}-of-{case.shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::case.shards]}
        write_safetensors(folder / shard, part, case.dtype, {"format": "pt"})
        for n, t in part.items():
            weight_map[n] = shard
            total += t.numel() * (4 if case.dtype == "F32" else 2)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def read_folder(folder):
    """Every tensor of the folder, through the independent parser (for the self-check)."""
    if (folder / "model.safetensors").exists():
        return read_safetensors(folder / "model.safetensors")[0]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        part = read_safetensors(folder / shard)[0]
        assert not set(part) & set(tensors), "a tensor in two shards"
        tensors.update(part)
    assert set(tensors) == set(index["weight_map"])
    return tensors


def generate(case, index):
    gen = torch.Generator().manual_seed(case.seed if case.seed is not None else BASE_SEED + index)
    tensors = make_tensors(case, gen)
    x = (case.input_scale * torch.randn(case.input_shape, generator=gen, dtype=torch.float64)).to(torch.float32)
    x = x.to(torch.float64)
    y = reference_attention(x, tensors, case.config, case.layer)
    largest_score = reference_attention.largest_score
    folder = MODELS_DIR / case.name
    folder.mkdir(parents=True)
    write_folder(case, tensors, folder)
    np.save(folder / "input.npy", x.numpy().astype(np.float32))
    np.save(folder / "expected.npy", y.numpy().astype(np.float32))
    (folder / "args").write_text(f"--layer {case.layer}\n")

    # Self-check: the files re-read give the same tensors and output; RoPE
    # against the per-pair rotation; the layer index matters.
    again = read_folder(folder)
    assert set(again) == set(tensors) and all(torch.equal(again[n], tensors[n]) for n in tensors)
    assert torch.equal(reference_attention(x, again, case.config, case.layer), y)
    probe = torch.randn(2, 7, 3, head_dim_of(case.config), generator=gen, dtype=torch.float64)
    rope_error = (apply_rope(probe, case.config) - apply_rope_per_pair(probe, case.config)).abs().max().item()
    assert rope_error < 1e-12, rope_error
    other = (case.layer + 1) % case.config["num_hidden_layers"]
    assert (reference_attention(x, tensors, case.config, other) - y).abs().max() > 1e-3
    if sliding_window_of(case.config, case.layer) is not None:  # the window matters
        full = dict(case.config, layer_types=None, sliding_window=None)
        assert (reference_attention(x, tensors, full, case.layer) - y).abs().max() > 1e-3
    # Soft-capping and sinks, where the case has them, change the output far
    # beyond the test's tolerance (1e-4 of max|y|).
    plain = reference_attention(x, tensors, case.config, case.layer, use_variants=False)
    variant_effect = ((plain - y).abs().max() / y.abs().max()).item()
    if case.name in ("gemma2_softcap", "gpt_oss_sinks", "gpt_oss_sliding", "gemma2_softcap_sliding"):
        assert variant_effect > 1e-2, variant_effect
    if case.name == "phi3_longrope_long":  # the long factors, not the short ones, made it
        short = dict(case.config, rope_scaling=dict(case.config["rope_scaling"],
                                                    long_factor=case.config["rope_scaling"]["short_factor"]))
        assert (reference_attention(x, tensors, short, case.layer) - y).abs().max() > 1e-2 * y.abs().max()
    _, attention_factor, rotary_dim = rope_parameters(case.config)
    return (f"{case.name:18s} {case.config['model_type']:8s} {case.dtype:4s} layer {case.layer} "
            f"rotary_dim {rotary_dim} attention_factor {attention_factor:.4f} "
            f"output rms {y.pow(2).mean().sqrt().item():.3f} max|score| {largest_score:.1f} "
            f"variants change it by {variant_effect:.3g}")


def main():
    torch.set_num_threads(1)
    if MODELS_DIR.exists():
        shutil.rmtree(MODELS_DIR)
    MODELS_DIR.mkdir(parents=True)
    for index, case in enumerate(CASES):
        print(generate(case, index))
    return 0


if __name__ == "__main__":
    sys.exit(main())
