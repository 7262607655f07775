#!/usr/bin/python3
"""Generate golden test data for one kvhead attention layer.

Run from anywhere with Debian's Python (python3-torch, python3-numpy):

    python3 tools/make_golden.py

Everything is regenerated deterministically (fixed seeds) into
tests/data/golden/<case_name>/, one directory per case, each holding:

    weights.safetensors  q/k/v/o projection weights (and optional biases) in
                         PyTorch nn.Linear layout (weight [out, in],
                         y = x @ W.T + b), written by hand in safetensors format
    input.npy            x, float32, [batch, seq, d_model] or [seq, d_model]
                         (rank 2 means batch 1)
    expected.npy         the layer output, float32, same shape as input.npy
    args                 one line of flags for `kvhead run` (without
                         --weights/--input/--output)

Cases (H = num_heads, G = num_kv_heads, d = head_dim):

  case                   dtype  H  G  d   d_model  input shape   causal  rope_theta  scale      bias  prefix
  ---------------------  -----  -  -  --  -------  ------------  ------  ----------  ---------  ----  ----------------------------
  mha_torch_mha          F32    4  4  8   32       [2, 7, 32]    no      0           1/sqrt(d)  yes   -
  gqa_causal_rope        F32    8  2  16  64       [2, 19, 64]   yes     10000       1/sqrt(d)  no    -
  mqa_causal             F32    6  1  8   40       [13, 40]      yes     0           1/sqrt(d)  yes   -
  bf16_prefix            BF16   4  2  32  96       [1, 23, 96]   yes     500000      1/sqrt(d)  no    model.layers.0.self_attn.
  f16_scale              F16    2  2  24  48       [3, 5, 48]    no      0           0.3        yes   -
  mha_long_causal_rope   F32    4  4  64  128      [1, 40, 128]  yes     10000       1/sqrt(d)  no    -
  odd_head_dim           F32    3  1  7   21       [2, 11, 21]   no      0           1/sqrt(d)  no    -

mha_torch_mha's expected output comes from torch.nn.MultiheadAttention itself
(run in float64 with the same weights copied in); all other expected outputs
come from reference_attention() below, which the self-check shows agrees with
nn.MultiheadAttention to 1e-10 on that case.

Conventions (the engine follows exactly these):
  * q = x Wq^T + bq reshaped [batch, seq, H, d]; k, v likewise with G heads;
    d = rows(q_proj) / H; d_model = columns(q_proj) (need not equal H*d).
  * Query head h uses kv head h // (H / G).
  * RoPE (rope_theta > 0), Hugging Face Llama "rotate_half" convention
    (non-interleaved pairs (i, i + d/2)): inv_freq_i = theta^(-2i/d),
    angle = position * inv_freq_i, cos/sin of length d are
    [cos(angles), cos(angles)], q' = q*cos + rotate_half(q)*sin; positions are
    absolute and start at 0 for each sequence. Applied to q and k only.
  * scores = scale * q . k^T (scale = 1/sqrt(d) unless --scale is given);
    causal: key j is visible to query i iff j <= i; masked scores are -inf;
    softmax over keys; out = P v; heads concatenated to [batch, seq, H*d];
    y = out Wo^T + bo.

Reference values are computed in float64 from the weights and input exactly
as stored (F32/F16/BF16 weights rounded to their dtype, input rounded to
float32, then upcast to float64), and the result is stored as float32.

Random weights and biases are drawn from N(0, std = 1/sqrt(d_model)), inputs
from N(0, 1), so outputs are O(1).

Then tools/make_model_goldens.py writes tests/data/models/: tiny Hugging Face
model folders (Llama 3, Qwen 2.5, Qwen 3, Mistral, Phi-3, Gemma 2; RoPE
scaling llama3, yarn and linear; F32, F16, BF16; one sharded) with the
expected output of one layer's attention block (its docstring lists them).

At the end the script self-checks: every safetensors file is re-read with a
small independent parser and compared bit-for-bit with the intended tensors,
case 1's manual formula is compared with nn.MultiheadAttention, and for the
RoPE cases rotate_half is compared with an explicit per-pair rotation.
"""

import json
import math
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = REPO_ROOT / "tests" / "data" / "golden"

BASE_SEED = 20240601  # case i uses BASE_SEED + i

# torch dtype used to round (and store) weights of each safetensors dtype.
TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass
class Case:
    name: str
    heads: int  # H
    kv_heads: int  # G
    head_dim: int  # d
    d_model: int
    input_shape: tuple  # (batch, seq, d_model) or (seq, d_model)
    causal: bool = False
    rope_theta: float = 0.0
    scale: float = None  # None: 1/sqrt(d)
    bias: bool = False
    dtype: str = "F32"
    prefix: str = ""
    metadata: dict = None  # optional safetensors "__metadata__"
    use_torch_mha: bool = False  # expected.npy from nn.MultiheadAttention


CASES = [
    Case("mha_torch_mha", 4, 4, 8, 32, (2, 7, 32), bias=True, use_torch_mha=True),
    Case("gqa_causal_rope", 8, 2, 16, 64, (2, 19, 64), causal=True, rope_theta=10000.0),
    Case("mqa_causal", 6, 1, 8, 40, (13, 40), causal=True, bias=True),
    Case("bf16_prefix", 4, 2, 32, 96, (1, 23, 96), causal=True, rope_theta=500000.0,
         dtype="BF16", prefix="model.layers.0.self_attn.", metadata={"format": "pt"}),
    Case("f16_scale", 2, 2, 24, 48, (3, 5, 48), scale=0.3, bias=True, dtype="F16"),
    Case("mha_long_causal_rope", 4, 4, 64, 128, (1, 40, 128), causal=True, rope_theta=10000.0),
    Case("odd_head_dim", 3, 1, 7, 21, (2, 11, 21)),
]


# ----------------------------------------------------------------------------
# safetensors writing and reading (by hand; Debian has no safetensors package)
# ----------------------------------------------------------------------------

def tensor_bytes(t, dtype):
    """Raw little-endian bytes of tensor t stored as safetensors dtype."""
    t = t.detach().cpu().contiguous()
    if dtype == "F32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t.to(torch.float16).numpy().astype("<f2").tobytes()
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype, metadata=None):
    """Write {name: tensor} to path, all tensors in one safetensors dtype."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        blob = tensor_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad the header with spaces so the data starts 8-byte aligned
    # (allowed by the format, and what the reference implementation does).
    header_bytes += b" " * ((8 - len(header_bytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path):
    """Minimal independent parser: returns ({name: float64 tensor}, {name: dtype}, metadata)."""
    raw = Path(path).read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len].decode("utf-8"))
    data = raw[8 + header_len:]
    metadata = header.pop("__metadata__", None)
    tensors, dtypes = {}, {}
    covered = []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        shape = info["shape"]
        chunk = data[begin:end]
        count = int(np.prod(shape)) if shape else 1
        if info["dtype"] == "F32":
            arr = np.frombuffer(chunk, dtype="<f4")
            t = torch.from_numpy(arr.astype(np.float64))
        elif info["dtype"] == "F16":
            arr = np.frombuffer(chunk, dtype="<f2")
            t = torch.from_numpy(arr.astype(np.float64))
        elif info["dtype"] == "BF16":
            # bf16 is the top half of an f32: shift the 16 bits up and reinterpret.
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            t = torch.from_numpy(bits.view(np.float32).astype(np.float64))
        else:
            raise ValueError(f"{path}: unsupported dtype {info['dtype']}")
        assert t.numel() == count, f"{path}:{name}: {t.numel()} elements, shape {shape}"
        tensors[name] = t.reshape(shape)
        dtypes[name] = info["dtype"]
        covered.append((begin, end))
    # The data offsets must tile the byte buffer exactly, with no gaps or overlaps.
    covered.sort()
    pos = 0
    for begin, end in covered:
        assert begin == pos, f"{path}: gap/overlap at byte {pos}"
        pos = end
    assert pos == len(data), f"{path}: {len(data) - pos} trailing bytes"
    return tensors, dtypes, metadata


# ----------------------------------------------------------------------------
# reference attention (float64)
# ----------------------------------------------------------------------------

def rotate_half(x):
    """Hugging Face Llama rotate_half: [x1, x2] -> [-x2, x1] on the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(seq, d, theta):
    """cos, sin of shape [seq, d] for positions 0..seq-1 (float64)."""
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    pos = torch.arange(seq, dtype=torch.float64)
    angles = pos[:, None] * inv_freq[None, :]  # [seq, d/2]
    emb = torch.cat((angles, angles), dim=-1)  # [seq, d]
    return emb.cos(), emb.sin()


def apply_rope(x, theta):
    """x: [batch, seq, heads, d]; positions are the seq index."""
    _, seq, _, d = x.shape
    cos, sin = rope_cos_sin(seq, d, theta)
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    return x * cos + rotate_half(x) * sin


def apply_rope_per_pair(x, theta):
    """Explicit per-pair rotation, written independently of rotate_half (for the self-check)."""
    x = x.numpy()
    out = np.empty_like(x)
    _, seq, _, d = x.shape
    half = d // 2
    for p in range(seq):
        for i in range(half):
            angle = p * math.pow(theta, -2.0 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            a = x[:, p, :, i]
            b = x[:, p, :, i + half]
            out[:, p, :, i] = a * c - b * s
            out[:, p, :, i + half] = a * s + b * c
    return torch.from_numpy(out)


def reference_attention(x, w, case):
    """The kvhead conventions, in float64. x: [batch, seq, d_model]."""
    batch, seq, _ = x.shape
    H, G, d = case.heads, case.kv_heads, case.head_dim

    def linear(inp, name):
        y = inp @ w[name + ".weight"].T
        if name + ".bias" in w:
            y = y + w[name + ".bias"]
        return y

    q = linear(x, "q_proj").reshape(batch, seq, H, d)
    k = linear(x, "k_proj").reshape(batch, seq, G, d)
    v = linear(x, "v_proj").reshape(batch, seq, G, d)
    if case.rope_theta > 0:
        q = apply_rope(q, case.rope_theta)
        k = apply_rope(k, case.rope_theta)
    # Query head h uses kv head h // (H / G).
    group = H // G
    kv_index = torch.arange(H) // group
    k = k[:, :, kv_index, :]  # [batch, seq, H, d]
    v = v[:, :, kv_index, :]
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(d)
    scores = scale * torch.einsum("bqhd,bkhd->bhqk", q, k)
    if case.causal:
        visible = torch.tril(torch.ones(seq, seq, dtype=torch.bool))  # j <= i
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, H * d)
    return linear(out, "o_proj")


def torch_mha_attention(x, w, case):
    """Same layer through torch.nn.MultiheadAttention (MHA, no mask, no RoPE)."""
    assert case.heads == case.kv_heads and case.rope_theta == 0 and not case.causal
    assert case.scale is None and case.heads * case.head_dim == case.d_model
    mha = torch.nn.MultiheadAttention(embed_dim=case.d_model, num_heads=case.heads,
                                      bias=True, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([w["q_proj.weight"], w["k_proj.weight"],
                                            w["v_proj.weight"]], dim=0))
        mha.in_proj_bias.copy_(torch.cat([w["q_proj.bias"], w["k_proj.bias"],
                                          w["v_proj.bias"]], dim=0))
        mha.out_proj.weight.copy_(w["o_proj.weight"])
        mha.out_proj.bias.copy_(w["o_proj.bias"])
    mha.eval()
    with torch.no_grad():
        y, _ = mha(x, x, x, need_weights=False)
    return y


# ----------------------------------------------------------------------------
# case generation
# ----------------------------------------------------------------------------

def make_weights(case, gen):
    """Random weights (unprefixed names), already rounded to the storage dtype, as float64."""
    H, G, d, dm = case.heads, case.kv_heads, case.head_dim, case.d_model
    std = 1.0 / math.sqrt(dm)
    shapes = {"q_proj": (H * d, dm), "k_proj": (G * d, dm),
              "v_proj": (G * d, dm), "o_proj": (dm, H * d)}
    w = {}
    for name, shape in shapes.items():
        w[name + ".weight"] = torch.randn(shape, generator=gen, dtype=torch.float64) * std
        if case.bias:
            w[name + ".bias"] = torch.randn(shape[0], generator=gen, dtype=torch.float64) * std
    # Round to what the file stores, then back to float64 for the reference.
    store = TORCH_DTYPES[case.dtype]
    return {k: v.to(store).to(torch.float64) for k, v in w.items()}


def args_line(case):
    parts = [f"--heads {case.heads}", f"--kv-heads {case.kv_heads}"]
    if case.causal:
        parts.append("--causal")
    if case.rope_theta > 0:
        parts.append(f"--rope-theta {case.rope_theta:g}")
    if case.scale is not None:
        parts.append(f"--scale {case.scale!r}")
    if case.prefix:
        parts.append(f"--prefix {case.prefix}")
    return " ".join(parts)


def generate(case, index):
    gen = torch.Generator().manual_seed(BASE_SEED + index)
    w = make_weights(case, gen)
    x = torch.randn(case.input_shape, generator=gen, dtype=torch.float64)
    x = x.to(torch.float32).to(torch.float64)  # what input.npy holds
    x3 = x if x.dim() == 3 else x.unsqueeze(0)

    y = torch_mha_attention(x3, w, case) if case.use_torch_mha else reference_attention(x3, w, case)
    y = y.reshape(case.input_shape)

    out_dir = GOLDEN_DIR / case.name
    out_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors(out_dir / "weights.safetensors",
                      {case.prefix + k: v for k, v in w.items()}, case.dtype, case.metadata)
    np.save(out_dir / "input.npy", x.numpy().astype(np.float32))
    np.save(out_dir / "expected.npy", y.numpy().astype(np.float32))
    (out_dir / "args").write_text(args_line(case) + "\n")
    return w, x3, y


# ----------------------------------------------------------------------------
# self-check
# ----------------------------------------------------------------------------

def self_check(case, w, x3, y):
    """Returns a list of short result strings; raises AssertionError on failure."""
    out_dir = GOLDEN_DIR / case.name
    notes = []

    # 1. safetensors round trip: names, dtypes, shapes, values bit-exact, metadata.
    tensors, dtypes, metadata = read_safetensors(out_dir / "weights.safetensors")
    expected_names = {case.prefix + k for k in w}
    assert set(tensors) == expected_names, (sorted(tensors), sorted(expected_names))
    for k, v in w.items():
        got = tensors[case.prefix + k]
        assert dtypes[case.prefix + k] == case.dtype
        assert tuple(got.shape) == tuple(v.shape), (k, got.shape, v.shape)
        assert torch.equal(got, v), f"{k} differs after round trip"
    assert metadata == case.metadata, (metadata, case.metadata)
    notes.append(f"safetensors round-trip ok ({len(tensors)} {case.dtype} tensors)")

    # 2. input/expected npy files hold what we computed.
    x_file = np.load(out_dir / "input.npy")
    y_file = np.load(out_dir / "expected.npy")
    assert x_file.dtype == np.float32 and y_file.dtype == np.float32
    assert x_file.shape == tuple(case.input_shape) == y_file.shape
    assert np.array_equal(x_file.astype(np.float64).reshape(x3.shape), x3.numpy())
    assert np.all(np.isfinite(y_file))

    # 3. The expected output recomputed from the files as written (independent parser).
    unprefixed = {k[len(case.prefix):]: v for k, v in tensors.items()}
    x_re = torch.from_numpy(x_file.astype(np.float64)).reshape(x3.shape)
    y_manual = reference_attention(x_re, unprefixed, case).reshape(case.input_shape)
    err_file = (y_manual - torch.from_numpy(y_file.astype(np.float64))).abs().max().item()
    assert err_file < 1e-5, f"expected.npy vs recomputation: {err_file:.3g}"

    # 4. Case 1: manual formula vs nn.MultiheadAttention.
    if case.use_torch_mha:
        err = (y_manual - y).abs().max().item()
        assert err < 1e-10, f"manual vs nn.MultiheadAttention: {err:.3g}"
        notes.append(f"manual vs nn.MultiheadAttention max|diff| {err:.2e} (< 1e-10)")

    # 5. RoPE cases: rotate_half vs explicit per-pair rotation on the real q and k.
    if case.rope_theta > 0:
        b, s, _ = x3.shape
        worst = 0.0
        for name, heads in (("q_proj", case.heads), ("k_proj", case.kv_heads)):
            t = (x3 @ unprefixed[name + ".weight"].T).reshape(b, s, heads, case.head_dim)
            a = apply_rope(t, case.rope_theta)
            p = apply_rope_per_pair(t, case.rope_theta)
            worst = max(worst, (a - p).abs().max().item())
        assert worst < 1e-12, f"rotate_half vs per-pair rotation: {worst:.3g}"
        notes.append(f"rotate_half vs per-pair rotation max|diff| {worst:.2e}")

    rms = y.pow(2).mean().sqrt().item()
    notes.append(f"output rms {rms:.3f}")
    return notes


def main():
    torch.set_num_threads(1)  # bit-for-bit reproducible reductions
    # Start from a clean directory so removed/renamed cases leave nothing behind.
    if GOLDEN_DIR.exists():
        shutil.rmtree(GOLDEN_DIR)
    GOLDEN_DIR.mkdir(parents=True)

    for index, case in enumerate(CASES):
        w, x3, y = generate(case, index)
        notes = self_check(case, w, x3, y)
        print(f"{case.name:22s} {str(list(case.input_shape)):14s} "
              f"args: {args_line(case)}  | " + "; ".join(notes))

    total = sum(p.stat().st_size for p in GOLDEN_DIR.rglob("*") if p.is_file())
    print(f"all {len(CASES)} cases ok; {GOLDEN_DIR.relative_to(REPO_ROOT)} holds {total} bytes")
    # Hugging Face model folders (tests/data/models), from each family's formulas.
    import make_model_goldens
    return make_model_goldens.main()


if __name__ == "__main__":
    sys.exit(main())
