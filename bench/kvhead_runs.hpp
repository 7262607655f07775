// kvhead's side of the S shapes, shared by the kvhead benchmarks, the sweeps
// and the textbook checks.
#pragma once

#include <benchmark/benchmark.h>

#include "bench/bench_util.hpp"
#include "bench/shapes.hpp"
#include "kvhead/attention.hpp"

namespace kvhead::bench {

/// out [heads, tokens, head_dim] := causal attention of the inputs
/// (attention_bench.cpp). bf16: the inputs must be bf16 values already (as a
/// bf16 layer rounds q, k and v); the probabilities are rounded for p v.
void kvhead_prefill(const prefill_shape& shape, const prefill_inputs& in, float* out,
                    precision compute = precision::f32);

/// The layer of the shape with the weights of `in`: no bias, mask or RoPE
/// (attention_bench.cpp), computing in `compute`.
attention_layer kvhead_layer(const layer_shape& shape, const layer_inputs& in, precision compute = precision::f32);

/// One decode step per iteration, rotating over the shape's calls
/// (decode_bench.cpp); counters gflops, gbps and the percentage of `limit`.
void run_cached_decode(benchmark::State& state, const decode_shape& shape, bound_by limit, int threads);

/// Causal attention over already-projected Q/K/V per iteration
/// (attention_bench.cpp); counters gflops, gbps, pct_peak. bf16: Q/K/V
/// rounded to bf16 once, before timing.
void run_prefill(benchmark::State& state, const prefill_shape& shape, int threads, precision compute = precision::f32);

}  // namespace kvhead::bench
