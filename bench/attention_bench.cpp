// Attention benchmarks (names fixed: outside tools read them; shapes in
// bench/shapes.hpp):
//   S2_prefill_gqa_causal/threads:<t>  32/8 heads, d 128, 1024 tokens, causal,
//       projected Q/K/V in, attention only (8.59 GFLOP);
//   S3_mha_layer/threads:<t>  whole layer with projections: d_model 512,
//       8 heads, batch 4, seq 512, no mask (6.44 GFLOP);
//   S2_prefill_gqa_causal_bf16/threads:<t>, S3_mha_layer_bf16/threads:<t>
//       the same in bf16 precision (attention.hpp, attention_config::
//       precision): S2 the public SDPA with attention_options::precision
//       bf16 (its rounding of Q/K/V timed with it); S3 a bf16 layer.
// Counters: gflops, gbps (fp32 inputs and outputs once, for either precision),
// pct_peak (of the FMA peak; for bf16, of the active bf16 unit's peak,
// limit_avx512bf16 or limit_amx_bf16, which is the FMA peak on the fallback).
#include <tbb/task_arena.h>

#include "bench/bench_util.hpp"
#include "bench/kvhead_runs.hpp"
#include "kvhead/attention.hpp"

void kvhead::bench::kvhead_prefill(const prefill_shape& shape, const prefill_inputs& in, float* out,
                                   precision compute) {
  using view = head_tensor<const float>;
  const attention_dims dims{1, shape.heads, shape.kv_heads, shape.tokens, shape.tokens, shape.head_dim};
  const view q = view::bhsd(in.q.data(), shape.heads, shape.tokens, shape.head_dim);
  const view k = view::bhsd(in.k.data(), shape.kv_heads, shape.tokens, shape.head_dim);
  const view v = view::bhsd(in.v.data(), shape.kv_heads, shape.tokens, shape.head_dim);
  const head_tensor<float> o = head_tensor<float>::bhsd(out, shape.heads, shape.tokens, shape.head_dim);
  attention_options options;
  options.causal = true;
  options.precision = compute;
  scaled_dot_product_attention(dims, q, k, v, o, options);
}

kvhead::attention_layer kvhead::bench::kvhead_layer(const layer_shape& shape, const layer_inputs& in,
                                                    precision compute) {
  attention_config config{shape.heads, shape.heads, shape.head_dim, shape.d_model, {}, false, 0.0};
  config.precision = compute;
  return attention_layer(
      config, {{in.wq.data(), nullptr}, {in.wk.data(), nullptr}, {in.wv.data(), nullptr}, {in.wo.data(), nullptr}});
}

void kvhead::bench::run_prefill(benchmark::State& state, const prefill_shape& shape, int threads, precision compute) {
  const prefill_inputs in(shape);
  std::vector<float> out(in.q.size());
  tbb::task_arena arena(threads);
  time_calls(
      state, arena, [&] { kvhead_prefill(shape, in, out.data(), compute); }, out.data());
  set_rates(state, shape.flops(), shape.bytes(), compute_bound(compute), threads);
}

namespace {

void s2_prefill_gqa_causal(benchmark::State& state, kvhead::precision compute) {
  kvhead::bench::run_prefill(state, kvhead::bench::s2_prefill_gqa_causal(), int(state.range(0)), compute);
}

void s3_mha_layer(benchmark::State& state, kvhead::precision compute) {
  const kvhead::bench::layer_shape shape = kvhead::bench::s3_mha_layer();
  const kvhead::bench::layer_inputs in(shape);
  const kvhead::attention_layer layer = kvhead::bench::kvhead_layer(shape, in, compute);
  std::vector<float> y(in.x.size());
  const int threads = int(state.range(0));
  tbb::task_arena arena(threads);
  kvhead::bench::time_calls(
      state, arena, [&] { layer.forward(in.x.data(), shape.batch, shape.seq, y.data()); }, y.data());
  kvhead::bench::set_rates(state, shape.flops(), shape.bytes(), kvhead::bench::compute_bound(compute), threads);
}

}  // namespace

BENCHMARK_CAPTURE(s2_prefill_gqa_causal, f32, kvhead::precision::f32)
    ->Name("S2_prefill_gqa_causal")
    ->ArgNames({"threads"})
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();
BENCHMARK_CAPTURE(s3_mha_layer, f32, kvhead::precision::f32)
    ->Name("S3_mha_layer")
    ->ArgNames({"threads"})
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();
BENCHMARK_CAPTURE(s2_prefill_gqa_causal, bf16, kvhead::precision::bf16)
    ->Name("S2_prefill_gqa_causal_bf16")
    ->ArgNames({"threads"})
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();
BENCHMARK_CAPTURE(s3_mha_layer, bf16, kvhead::precision::bf16)
    ->Name("S3_mha_layer_bf16")
    ->ArgNames({"threads"})
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();
