"""tools/kvhead_ctypes.py refuses what C would wrap, truncate, cut short or read wrongly, and opens model folders.

    /usr/bin/python3 tests/ctypes_inputs_test.py --library build/release/engine/libkvhead.so \\
        --golden tests/data/golden --models tests/data/models

Each check names itself; exit status 0 when all pass. Prints "SKIPPED: ..." and exits 0 without numpy, or when
KVHEAD_SANITIZED=ON (a sanitizer build's library cannot be loaded into an uninstrumented Python).
"""

import argparse
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--library", required=True)
    parser.add_argument("--golden", required=True, help="tests/data/golden")
    parser.add_argument("--models", required=True, help="tests/data/models")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    from kvhead_example import skip_reason
    reason = skip_reason()
    if reason is not None:
        print(f"SKIPPED: {reason}")
        return 0
    import numpy as np
    import kvhead_ctypes

    kvhead = kvhead_ctypes.Library(args.library)
    weights = os.path.join(args.golden, "gqa_causal_rope", "weights.safetensors")
    failures = []

    def refuses(name, error, call):
        try:
            call()
        except error as raised:
            print(f"ok: {name}: {type(raised).__name__}: {raised}")
            return
        except Exception as raised:  # the wrong kind of error
            failures.append(f"{name}: {type(raised).__name__} instead of {error.__name__}: {raised}")
            return
        failures.append(f"{name}: accepted")

    def check(name, condition):
        print(f"{'ok' if condition else 'FAILED'}: {name}")
        if not condition:
            failures.append(name)

    big = 1 << 64
    with kvhead.layer(weights, 8, 2, 10000.0) as layer, kvhead.cache(layer, byte_budget=16 << 20) as cache:
        first, second = cache.create(), cache.create()
        x = np.random.default_rng(3).standard_normal((3, layer.d_model)).astype(np.float32)
        cache.decode(layer, [first], [3], x)
        # Integers C would wrap or truncate.
        refuses("an id beyond int64 (it wrapped to a live sequence)", ValueError, lambda: cache.length(first + big))
        refuses("a truncate length beyond int64", ValueError, lambda: cache.truncate(first, big))
        refuses("free of an id beyond int64", ValueError, lambda: cache.free(second + big))
        refuses("a fractional id", TypeError, lambda: cache.decode(layer, [1.9], [1], x[:1]))
        refuses("ids given as strings", TypeError, lambda: cache.decode(layer, ["1"], [1], x[:1]))
        refuses("a count given as a bool", TypeError, lambda: cache.append([second], [True]))
        refuses("a layer index beyond int32", ValueError,
                lambda: cache.decode_layer(layer, 1 << 32, [first], [1], x[:1]))
        refuses("num_heads beyond int32", ValueError, lambda: kvhead.layer(weights, (1 << 32) + 8, 2))
        refuses("a sliding window beyond int64", ValueError, lambda: kvhead.layer(weights, 8, 2, sliding_window=big + 3))
        refuses("a negative byte budget", ValueError, lambda: kvhead.cache(layer, byte_budget=4 - big))
        refuses("num_layers beyond int32", ValueError, lambda: kvhead.cache(layer, 16 << 20, num_layers=(1 << 32) + 1))
        # Floats that round to "none" in float32, and strings C would cut at a NUL.
        refuses("a rope_theta that rounds to 0", ValueError, lambda: kvhead.layer(weights, 8, 2, rope_theta=1e-50))
        refuses("a scale that rounds to 0", ValueError, lambda: kvhead.layer(weights, 8, 2, scale=1e-50))
        refuses("an int beyond double's range as a scale", ValueError, lambda: kvhead.layer(weights, 8, 2, scale=10**400))
        for option in ("scale", "logit_softcap", "rope_theta"):  # the library refuses them, naming the value given
            for value, text in ((float("nan"), "nan"), (float("-inf"), "-inf")):
                try:
                    kvhead.layer(weights, 8, 2, **{option: value})
                    failures.append(f"{option} {value}: accepted")
                except kvhead_ctypes.KvheadError as raised:
                    check(f"{option} {value} is named as {text}: {raised}", text in str(raised).lower())
        # ALiBi slopes: one per query head, used (BLOOM's change the output, zeros do not).
        refuses("alibi_slopes of the wrong length", ValueError, lambda: kvhead.layer(weights, 8, 2, alibi_slopes=[0.5] * 7))
        with kvhead.layer(weights, 8, 2, 10000.0, alibi_slopes=[0.0] * 8) as zero_slopes, \
                kvhead.layer(weights, 8, 2, 10000.0, alibi_slopes=[2.0 ** -(h + 1) for h in range(8)]) as bloom:
            check("zero ALiBi slopes change no bit", np.array_equal(zero_slopes.forward(x, causal=True),
                                                                    layer.forward(x, causal=True)))
            check("BLOOM's ALiBi slopes change the output", not np.array_equal(bloom.forward(x, causal=True),
                                                                             layer.forward(x, causal=True)))
        refuses("a path with a NUL", ValueError, lambda: kvhead.layer(weights + "\0.missing", 8, 2))
        refuses("a prefix with a NUL", ValueError, lambda: kvhead.layer(weights, 8, 2, prefix="\0model."))
        # Arrays that are not real numbers, or beyond float32.
        refuses("a complex x", TypeError, lambda: layer.forward(x.astype(np.complex64)))
        refuses("a masked x", TypeError, lambda: layer.forward(np.ma.masked_all(x.shape, dtype=np.float32)))
        refuses("a string x", TypeError, lambda: layer.forward(x.astype(str)))
        refuses("a float64 x beyond float32's range", ValueError, lambda: layer.forward(np.full(x.shape, 1e39)))
        check("a float64, strided, Fortran-ordered x reads as its float32 copy",
              np.array_equal(layer.forward(np.asfortranarray(np.repeat(x, 2, axis=0)[::2].astype(np.float64))),
                             layer.forward(x)))
        # Arrays whose buffer is not aligned for their type (C reads whole int64s and floats): copied, same result.
        def misaligned(values, dtype):
            values = np.asarray(values, dtype=dtype)
            array = np.ndarray(values.shape, dtype=dtype, buffer=bytearray(values.nbytes + 1), offset=1)
            array[...] = values
            return array
        for convert, dtype in ((kvhead_ctypes._int64s, np.int64), (kvhead_ctypes._floats, np.float32)):
            passed = convert(misaligned([1, 2], dtype), "values")[0]
            check(f"{convert.__name__} hands C an aligned copy of a misaligned {np.dtype(dtype).name} buffer",
                  passed.ctypes.data % np.dtype(dtype).alignment == 0)
        third, fourth = cache.create(), cache.create()
        check("misaligned seq_ids, num_tokens and x give the aligned arrays' bits",
              np.array_equal(cache.decode(layer, misaligned([third], np.int64), misaligned([2], np.int64),
                                          misaligned(x[:2], np.float32)),
                             cache.decode(layer, [fourth], [2], x[:2])))
        # Messages name the shape given, and the exact count expected.
        for name, call in (("forward", lambda: layer.forward(np.float32(1))),
                           ("decode", lambda: cache.decode(layer, [third], [1], np.float32(1)))):
            try:
                call()
                failures.append(f"a 0-d x to {name}: accepted")
            except ValueError as raised:
                check(f"a 0-d x to {name} is named as shape (): {raised}", "shape ()" in str(raised))
        try:
            cache.decode(layer, [third, fourth], [1 << 62, 1 << 62], x[:1])
            failures.append("num_tokens summing beyond int64: accepted")
        except ValueError as raised:
            check(f"num_tokens summing beyond int64 is named exactly: {raised}", f"= {1 << 63}," in str(raised))
        check("num_layers is the cache's", cache.num_layers == 1)
    refuses("free_tokens of a destroyed cache", kvhead_ctypes.KvheadError, lambda: cache.free_tokens)
    # A model folder's layer, against its expected output.
    for case in ("gemma2_softcap", "gpt_oss_sinks", "qwen3_qk_norm"):
        folder = os.path.join(args.models, case)
        with open(os.path.join(folder, "args")) as words:
            layer_index = int(words.read().split()[1])  # "--layer N"
        with kvhead.model_layer(folder, layer_index) as layer:
            inputs = np.load(os.path.join(folder, "input.npy"))
            expected = np.load(os.path.join(folder, "expected.npy"))
            got = layer.forward(inputs, causal=True)
            error = float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))
            check(f"model_layer {case}: max |y - expected| / max |expected| = {error:.2e} <= 1e-4", error <= 1e-4)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
