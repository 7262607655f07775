#!/usr/bin/python3
"""Write random inputs for `kvhead run` of any size (for memory and timing
measurements; no expected output): weights.safetensors (F32 q/k/v/o_proj in
nn.Linear layout, no bias) and input.npy (float32 [batch, seq, d_model]).

    /usr/bin/python3 tools/make_layer_files.py OUT_DIR --d-model 4096 \\
        --heads 32 --kv-heads 8 --seq 2048 [--batch 1] [--seed 0]

head_dim = d_model / heads. Values are N(0, 1/d_model) weights and N(0, 1)
inputs, from a fixed seed. Needs only numpy (Debian's python3-numpy).
"""
import argparse
import json
import struct
from pathlib import Path

import numpy as np


def write_safetensors(path, tensors):
    """tensors: dict name -> float32 array, written in order, tiling the data."""
    header, offset = {}, 0
    for name, array in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for array in tensors.values():
            out.write(np.ascontiguousarray(array, dtype="<f4").tobytes())


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.d_model % args.heads != 0 or args.heads % args.kv_heads != 0:
        parser.error("heads must divide d_model, kv-heads must divide heads")
    head_dim = args.d_model // args.heads
    generator = np.random.default_rng(args.seed)
    scale = 1.0 / np.sqrt(args.d_model)

    def weight(rows, cols):
        return (generator.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float32)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors(args.out_dir / "weights.safetensors", {
        "q_proj.weight": weight(args.heads * head_dim, args.d_model),
        "k_proj.weight": weight(args.kv_heads * head_dim, args.d_model),
        "v_proj.weight": weight(args.kv_heads * head_dim, args.d_model),
        "o_proj.weight": weight(args.d_model, args.heads * head_dim),
    })
    x = generator.standard_normal((args.batch, args.seq, args.d_model), dtype=np.float32)
    np.save(args.out_dir / "input.npy", x)


if __name__ == "__main__":
    main()
