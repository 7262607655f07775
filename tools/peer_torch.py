#!/usr/bin/python3
"""The S shapes of kvhead_bench through PyTorch, as a PyTorch user would best write them.

  /usr/bin/python3 tools/peer_torch.py [--threads N] [--dtype f32|bf16|all] [--repetitions R] [--min-time S]
                                       [--out torch.json]

Same geometry, fp32 inputs and flop/byte formulas as bench/shapes.hpp, so the figures
compare directly with kvhead_bench's:
  torch_S1_decode_gqa        32 q / 8 kv heads, d 128, past 4096, rotating over 5 sequences;
  torch_S2_prefill_gqa_causal  32 / 8 heads, d 128, 1024 tokens, causal, attention only;
  torch_S3_mha_layer         nn.MultiheadAttention(512, 8 heads), batch 4 x seq 512, no mask;
  torch_S4_decode_mqa        32 q / 1 kv head, d 128, past 8192, rotating over 16 sequences;
  torch_S5_decode_ragged16   16 sequences of pasts 256..4096 evenly, one step each per call;
  torch_S2_prefill_gqa_causal_bf16, torch_S3_mha_layer_bf16  S2 and S3 in torch.bfloat16, as
                             kvhead_bench's S2_prefill_gqa_causal_bf16 and S3_mha_layer_bf16: q, k, v
                             (S2), or the layer's weights and x (S3), converted to bf16 once before
                             timing (.to(torch.bfloat16)), the same calls on them. Their flops and
                             bytes are the f32 rows' (kvhead_bench counts its bf16 rows so too): gbps
                             there is the rate of the same work, not the bytes torch moved.
--dtype picks the rows: f32 (S1-S5), bf16 (the two bf16 rows), all (default: both, one table).
Forms (all under torch.inference_mode()): decode is F.scaled_dot_product_attention(
enable_gqa=True) where this torch has it, else a grouped batched matmul that never copies
K/V: a group's query heads are the rows of one matmul per kv head (q [kv_heads, group, d]
against K [kv_heads, past + 1, d]ᵀ, torch.bmm). S2 is F.scaled_dot_product_attention(
is_causal=True) where this torch has it (K/V repeated per query head when it lacks
enable_gqa), else the same grouped bmm with a causal mask. S3 is nn.MultiheadAttention with
zeroed biases. The form used is printed with each row. Times are medians over repetitions of the mean time per
call over at least --min-time seconds. --threads sets torch.set_num_threads and, before torch
is imported, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS; it clears
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, so that OpenBLAS runs its own kernels for this CPU.
--out writes a Google-Benchmark-shaped JSON (names torch_<shape>/threads:<N>) for
tools/plot_bench.py --peer. Needs Debian's python3-torch.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="threads for torch (default 1)")
    parser.add_argument("--dtype", choices=("f32", "bf16", "all"), default="all",
                        help="f32 rows, bf16 rows or all (default all)")
    parser.add_argument("--repetitions", type=int, default=5, help="timed repetitions per shape (default 5)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition at least (default 0.2)")
    parser.add_argument("--out", help="write the results as Google Benchmark JSON here")
    args = parser.parse_args()
    if args.threads < 1 or args.repetitions < 1 or args.min_time < 0:
        parser.error("--threads and --repetitions must be >= 1, --min-time >= 0")
    return args


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


class Shapes:
    """The S shapes with torch inputs; each shape is (name, form, call(i), flops, bytes), flops and bytes per call."""

    def __init__(self, torch):
        self.torch = torch
        self.F = torch.nn.functional
        self.generator = torch.Generator().manual_seed(0)
        probe = torch.zeros(1, 2, 1, 8)
        self.has_sdpa = hasattr(self.F, "scaled_dot_product_attention")
        self.has_gqa = False
        if self.has_sdpa:
            try:
                self.F.scaled_dot_product_attention(probe, probe[:, :1], probe[:, :1], enable_gqa=True)
                self.has_gqa = True
            except TypeError:
                pass

    def uniform(self, *shape, dtype=None):
        """U(-1, 1) in fp32, converted to dtype (default: kept fp32)."""
        values = self.torch.rand(*shape, generator=self.generator) * 2 - 1
        return values if dtype is None else values.to(dtype)

    # One decode step: q [H, d] against one sequence's cache k, v [G, past + 1, d]. Without
    # enable_gqa, a group's query heads are the rows of one batched matmul per kv head.
    def decode_step(self, q, k, v):
        heads, d = q.shape
        kv_heads = k.shape[0]
        if self.has_gqa:
            return self.F.scaled_dot_product_attention(q.view(1, heads, 1, d), k.unsqueeze(0), v.unsqueeze(0),
                                                       enable_gqa=True).view(heads, d)
        scores = self.torch.bmm(q.view(kv_heads, heads // kv_heads, d), k.transpose(1, 2)).mul_(1.0 / math.sqrt(d))
        return self.torch.bmm(scores.softmax(dim=-1), v).view(heads, d)

    def decode(self, name, heads, kv_heads, d, pasts, per_call):
        caches = [(self.uniform(kv_heads, past + 1, d), self.uniform(kv_heads, past + 1, d)) for past in pasts]
        queries = self.uniform(per_call, heads, d)
        calls = len(pasts) // per_call

        def call(i):
            group = caches[i % calls * per_call:(i % calls + 1) * per_call]
            return [self.decode_step(queries[row], k, v) for row, (k, v) in enumerate(group)]

        keys = sum(past + 1 for past in pasts)
        form = "SDPA enable_gqa" if self.has_gqa else "grouped bmm, K/V not copied"
        return name, form, call, 4.0 * heads * d * keys / calls, 2.0 * kv_heads * d * 4 * keys / calls

    def prefill(self, dtype=None, suffix="", heads=32, kv_heads=8, d=128, tokens=1024):
        q = self.uniform(1, heads, tokens, d, dtype=dtype)
        k, v = self.uniform(1, kv_heads, tokens, d, dtype=dtype), self.uniform(1, kv_heads, tokens, d, dtype=dtype)
        group = heads // kv_heads
        if self.has_gqa:
            form = "SDPA is_causal enable_gqa"

            def call(_):
                return self.F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif self.has_sdpa:
            form = "SDPA is_causal, K/V repeated"

            def call(_):
                return self.F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1),
                                                           v.repeat_interleave(group, dim=1), is_causal=True)
        else:
            form = "grouped bmm + causal mask, K/V not copied (no SDPA in this torch)"
            grouped = q.view(kv_heads, group * tokens, d)
            masked = self.torch.ones(tokens, tokens, dtype=self.torch.bool).triu(1)

            def call(_):
                scores = self.torch.bmm(grouped, k.view(kv_heads, tokens, d).transpose(1, 2)).mul_(1.0 / math.sqrt(d))
                scores.view(kv_heads, group, tokens, tokens).masked_fill_(masked, float("-inf"))
                return self.torch.bmm(scores.softmax(dim=-1), v.view(kv_heads, tokens, d)).view(1, heads, tokens, d)
        flops = 4.0 * heads * d * tokens * (tokens + 1) / 2
        bytes_moved = 4.0 * tokens * d * (2 * heads + 2 * kv_heads)
        return "torch_S2_prefill_gqa_causal" + suffix, form, call, flops, bytes_moved

    def mha_layer(self, dtype=None, suffix="", d_model=512, heads=8, batch=4, seq=512):
        # Zero biases rather than bias=False, which torch 1.13's fast path rejects.
        layer = self.torch.nn.MultiheadAttention(d_model, heads, batch_first=True).eval()
        self.torch.nn.init.zeros_(layer.in_proj_bias)
        self.torch.nn.init.zeros_(layer.out_proj.bias)
        if dtype is not None:
            layer = layer.to(dtype)
        x = self.uniform(batch, seq, d_model, dtype=dtype)

        def call(_):
            return layer(x, x, x, need_weights=False)[0]

        flops = 4.0 * 2.0 * batch * seq * d_model * d_model + 4.0 * batch * heads * seq * seq * (d_model // heads)
        bytes_moved = 4.0 * (2 * batch * seq * d_model + 4 * d_model * d_model)
        return "torch_S3_mha_layer" + suffix, "nn.MultiheadAttention", call, flops, bytes_moved

    def all(self, dtypes):
        """The rows of `dtypes` ("f32", "bf16"), each a function making (name, form, call, flops, bytes)."""
        if "f32" in dtypes:
            ragged = [256 + i * (4096 - 256) // 15 for i in range(16)]
            yield lambda: self.decode("torch_S1_decode_gqa", 32, 8, 128, [4096] * 5, 1)
            yield self.prefill
            yield self.mha_layer
            yield lambda: self.decode("torch_S4_decode_mqa", 32, 1, 128, [8192] * 16, 1)
            yield lambda: self.decode("torch_S5_decode_ragged16", 32, 8, 128, ragged, 16)
        if "bf16" in dtypes:
            yield lambda: self.bf16(self.prefill(self.torch.bfloat16, "_bf16"))
            yield lambda: self.bf16(self.mha_layer(self.torch.bfloat16, "_bf16"))

    @staticmethod
    def bf16(row):
        name, form, call, flops, bytes_moved = row
        return name, form + ", torch.bfloat16", call, flops, bytes_moved


def time_per_call(call, repetitions, min_time):
    """Median over repetitions of the mean seconds per call (after one warm-up call), and the calls made."""
    call(0)
    means, total = [], 0
    for _ in range(repetitions):
        calls, start = 0, time.perf_counter()
        while True:
            call(calls)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        means.append(elapsed / calls)
        total += calls
    return statistics.median(means), total


def main():
    args = parse_args()
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)
    # The peer at its best: OpenBLAS (Debian's torch's BLAS) picks its own
    # kernels for this CPU, as in tools/run bench.
    for variable in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if os.environ.pop(variable, None) is not None:
            print(f"peer_torch.py: {variable} unset (OpenBLAS chooses its kernels for this CPU)", file=sys.stderr)
    try:
        import torch
    except ImportError:
        print("peer_torch.py: PyTorch is missing: apt-get install python3-torch", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {cpu_model()}")
    print(f"{'name':<42} {'time':>12} {'gflops':>9} {'gbps':>9}  form")
    rows = []
    with torch.inference_mode():
        dtypes = ("f32", "bf16") if args.dtype == "all" else (args.dtype,)
        for make in Shapes(torch).all(dtypes):
            name, form, call, flops, bytes_read = make()
            seconds, calls = time_per_call(call, args.repetitions, args.min_time)
            full_name = f"{name}/threads:{args.threads}"
            gflops, gbps = flops / seconds * 1e-9, bytes_read / seconds * 1e-9
            print(f"{full_name:<42} {seconds * 1e3:>9.3f} ms {gflops:>9.2f} {gbps:>9.2f}  {form}", flush=True)
            rows.append({"name": full_name, "run_name": full_name, "run_type": "iteration",
                         "repetitions": args.repetitions, "iterations": calls,
                         "real_time": seconds * 1e9, "cpu_time": seconds * 1e9, "time_unit": "ns",
                         "gflops": gflops, "gbps": gbps, "label": form})
    if args.out:
        context = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu_model": cpu_model(),
                   "peer": f"torch {torch.__version__}", "torch_threads": str(args.threads),
                   "torch_dtypes": args.dtype}
        with open(args.out, "w") as f:
            json.dump({"context": context, "benchmarks": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
