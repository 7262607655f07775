// Attention benchmarks (names fixed: outside tools read them; shapes in
// bench/shapes.hpp):
//   S2_prefill_gqa_causal/threads:<t>  32/8 heads, d 128, 1024 tokens, causal,
//       projected Q/K/V in, attention only (8.59 GFLOP);
//   S3_mha_layer/threads:<t>  whole layer with projections: d_model 512,
//       8 heads, batch 4, seq 512, no mask (6.44 GFLOP).
// Counters: gflops, gbps (inputs and outputs once), pct_peak.
#include <tbb/task_arena.h>

#include "bench/bench_util.hpp"
#include "bench/kvhead_runs.hpp"
#include "kvhead/attention.hpp"

void kvhead::bench::kvhead_prefill(const prefill_shape& shape, const prefill_inputs& in, float* out) {
  using view = head_tensor<const float>;
  attention_options options;
  options.causal = true;
  scaled_dot_product_attention({1, shape.heads, shape.kv_heads, shape.tokens, shape.tokens, shape.head_dim},
                               view::bhsd(in.q.data(), shape.heads, shape.tokens, shape.head_dim),
                               view::bhsd(in.k.data(), shape.kv_heads, shape.tokens, shape.head_dim),
                               view::bhsd(in.v.data(), shape.kv_heads, shape.tokens, shape.head_dim),
                               head_tensor<float>::bhsd(out, shape.heads, shape.tokens, shape.head_dim), options);
}

kvhead::attention_layer kvhead::bench::kvhead_layer(const layer_shape& shape, const layer_inputs& in) {
  return attention_layer(
      {shape.heads, shape.heads, shape.head_dim, shape.d_model, {}, false, 0.0},
      {{in.wq.data(), nullptr}, {in.wk.data(), nullptr}, {in.wv.data(), nullptr}, {in.wo.data(), nullptr}});
}

void kvhead::bench::run_prefill(benchmark::State& state, const prefill_shape& shape, int threads) {
  const prefill_inputs in(shape);
  std::vector<float> out(in.q.size());
  tbb::task_arena arena(threads);
  for (auto _ : state) {
    arena.execute([&] { kvhead_prefill(shape, in, out.data()); });
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, shape.flops(), shape.bytes(), bound_by::fma_peak, threads);
}

namespace {

void s2_prefill_gqa_causal(benchmark::State& state) {
  kvhead::bench::run_prefill(state, kvhead::bench::s2_prefill_gqa_causal(), int(state.range(0)));
}

void s3_mha_layer(benchmark::State& state) {
  const kvhead::bench::layer_shape shape = kvhead::bench::s3_mha_layer();
  const kvhead::bench::layer_inputs in(shape);
  const kvhead::attention_layer layer = kvhead::bench::kvhead_layer(shape, in);
  std::vector<float> y(in.x.size());
  const int threads = int(state.range(0));
  tbb::task_arena arena(threads);
  for (auto _ : state) {
    arena.execute([&] { layer.forward(in.x.data(), shape.batch, shape.seq, y.data()); });
    benchmark::DoNotOptimize(y.data());
  }
  kvhead::bench::set_rates(state, shape.flops(), shape.bytes(), kvhead::bench::bound_by::fma_peak, threads);
}

}  // namespace

BENCHMARK(s2_prefill_gqa_causal)->Name("S2_prefill_gqa_causal")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(s3_mha_layer)->Name("S3_mha_layer")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
