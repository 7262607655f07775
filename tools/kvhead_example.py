"""Decodes several sequences token by token with kvhead's C API from Python (tools/kvhead_ctypes.py) and checks
every output against the cache-free causal forward pass, bit for bit. Exit status 0 when all match.

    /usr/bin/python3 tools/kvhead_example.py --library build/release/engine/libkvhead.so \\
        --weights tests/data/golden/gqa_causal_rope/weights.safetensors --heads 8 --kv-heads 2 --rope-theta 10000

Prints "SKIPPED: ..." and exits 0 without numpy, or when KVHEAD_SANITIZED=ON (a sanitizer build's library
cannot be loaded into an uninstrumented Python).
"""

import argparse
import os
import sys


def skip_reason():
    """Why the ctypes wrapper cannot run here, or None: a sanitizer build's library cannot be loaded into an
    uninstrumented Python (KVHEAD_SANITIZED=ON), and the wrapper needs numpy."""
    if os.environ.get("KVHEAD_SANITIZED") == "ON":
        return "the sanitizer build's library cannot be loaded into Python; the release build runs this"
    try:
        import numpy  # noqa: F401
    except ImportError:
        return "numpy is missing (Debian: apt-get install python3-numpy)"
    return None


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--library", help="libkvhead.so (default: $KVHEAD_LIBRARY, else libkvhead.so.0)")
    parser.add_argument("--weights", required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, default=0)
    parser.add_argument("--rope-theta", type=float, default=0.0)
    parser.add_argument("--prefix")
    args = parser.parse_args()
    reason = skip_reason()
    if reason is not None:
        print(f"SKIPPED: {reason}")
        return 0
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kvhead_ctypes

    kvhead = kvhead_ctypes.Library(args.library)
    lengths = [6, 1, 11]
    random = np.random.default_rng(7)
    with kvhead.layer(args.weights, args.heads, args.kv_heads, args.rope_theta, prefix=args.prefix) as layer, \
            kvhead.cache(layer, byte_budget=16 << 20) as cache:
        x = [random.standard_normal((n, layer.d_model), dtype=np.float32) for n in lengths]
        ids = [cache.create() for _ in lengths]
        y = [np.empty_like(part) for part in x]
        # One call per step: every sequence with a token left gets one.
        for position in range(max(lengths)):
            live = [s for s, n in enumerate(lengths) if position < n]
            step_y = cache.decode(layer, [ids[s] for s in live], [1] * len(live),
                                  np.stack([x[s][position] for s in live]))
            for row, s in enumerate(live):
                y[s][position] = step_y[row]
        failures = 0
        for s, n in enumerate(lengths):
            expected = layer.forward(x[s][None], causal=True)[0]
            same = cache.length(ids[s]) == n and np.array_equal(expected.view(np.uint32), y[s].view(np.uint32))
            failures += not same
            print(f"sequence {s}: {n} tokens decoded one at a time: "
                  f"{'identical to' if same else 'DIFFERENT FROM'} the causal forward pass")
        # Errors arrive as exceptions carrying the C status and message.
        cache.free(ids[0])
        try:
            cache.length(ids[0])
            failures += 1
        except kvhead_ctypes.KvheadError as error:
            failures += error.status != kvhead_ctypes.NOT_FOUND
            print(f"a freed id: {error}")
    # bf16 precision: weights and GEMM inputs rounded to bf16, fp32 accumulation; close to f32, not equal.
    with kvhead.layer(args.weights, args.heads, args.kv_heads, args.rope_theta, prefix=args.prefix) as f32, \
            kvhead.layer(args.weights, args.heads, args.kv_heads, args.rope_theta, prefix=args.prefix,
                         precision="bf16") as bf16:
        sample = random.standard_normal((1, 5, f32.d_model), dtype=np.float32)
        exact, rounded = f32.forward(sample, causal=True), bf16.forward(sample, causal=True)
        relative = float(np.max(np.abs(rounded - exact)) / np.max(np.abs(exact)))
        close = 0.0 < relative <= 2e-2
        failures += not close
        print(f"precision bf16: max |y - y_f32| / max |y_f32| = {relative:.2e} "
              f"({'within' if close else 'OUTSIDE'} (0, 2e-2])")
    # Caches of 16-token blocks (kv_block_size): the same bits, 20 tokens over two blocks.
    with kvhead.layer(args.weights, args.heads, args.kv_heads, args.rope_theta, prefix=args.prefix,
                      kv_block_size=16) as small, kvhead.cache(small, byte_budget=16 << 20) as cache:
        tokens = random.standard_normal((20, small.d_model), dtype=np.float32)
        sequence, free_before = cache.create(), cache.free_tokens
        decoded = np.concatenate([cache.decode(small, [sequence], [1], tokens[t:t + 1]) for t in range(20)])
        expected = small.forward(tokens[None], causal=True)[0]
        same = np.array_equal(expected.view(np.uint32), decoded.view(np.uint32))
        blocks_taken = (free_before - cache.free_tokens) // 16
        failures += not same or blocks_taken != 2
        print(f"kv_block_size 16: 20 tokens decoded one at a time in {blocks_taken} blocks: "
              f"{'identical to' if same else 'DIFFERENT FROM'} the causal forward pass")
    try:
        kvhead.layer(args.weights + ".missing", args.heads)
        failures += 1
    except kvhead_ctypes.KvheadError as error:
        failures += error.status != kvhead_ctypes.IO
        print(f"a missing file: {error}")
    print(f"kvhead {kvhead.version()}: {'all outputs match' if failures == 0 else f'{failures} failures'}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
