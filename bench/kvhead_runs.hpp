// kvhead's side of the S shapes, shared by the kvhead benchmarks, the sweeps
// and the textbook checks.
#pragma once

#include <benchmark/benchmark.h>

#include "bench/bench_util.hpp"
#include "bench/shapes.hpp"
#include "kvhead/attention.hpp"

namespace kvhead::bench {

/// out [heads, tokens, head_dim] := causal attention of the inputs
/// (attention_bench.cpp).
void kvhead_prefill(const prefill_shape& shape, const prefill_inputs& in, float* out);

/// The layer of the shape with the weights of `in`: no bias, mask or RoPE
/// (attention_bench.cpp).
attention_layer kvhead_layer(const layer_shape& shape, const layer_inputs& in);

/// One decode step per iteration, rotating over the shape's calls
/// (decode_bench.cpp); counters gflops, gbps and the percentage of `limit`.
void run_cached_decode(benchmark::State& state, const decode_shape& shape, bound_by limit, int threads);

/// Causal attention over already-projected Q/K/V per iteration
/// (attention_bench.cpp); counters gflops, gbps, pct_peak.
void run_prefill(benchmark::State& state, const prefill_shape& shape, int threads);

}  // namespace kvhead::bench
