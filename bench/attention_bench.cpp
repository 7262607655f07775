// Attention benchmarks (names fixed: outside tools read them).
//   S2_prefill_gqa_causal/threads:<t>  batch 1, 32 q heads, 8 kv heads, d 128,
//       1024 tokens, causal, projected Q/K/V in, attention only (8.59 GFLOP).
//   S3_mha_layer/threads:<t>  whole layer with projections: d_model 512,
//       8 heads, batch 4, seq 512, no mask (6.44 GFLOP).
#include <cmath>

#include <tbb/task_arena.h>

#include "bench/bench_util.hpp"
#include "kvhead/attention.hpp"

namespace {

void s2_prefill_gqa_causal(benchmark::State& state) {
  constexpr std::size_t heads = 32, kv_heads = 8, head_dim = 128, tokens = 1024;
  const auto q = kvhead::bench::random_floats(heads * tokens * head_dim, 1);
  const auto k = kvhead::bench::random_floats(kv_heads * tokens * head_dim, 2);
  const auto v = kvhead::bench::random_floats(kv_heads * tokens * head_dim, 3);
  std::vector<float> out(q.size());
  const kvhead::attention_dims dims{1, heads, kv_heads, tokens, tokens, head_dim};
  using view = kvhead::head_tensor<const float>;
  kvhead::attention_options options;
  options.causal = true;
  tbb::task_arena arena(int(state.range(0)));
  for (auto _ : state) {
    arena.execute([&] {
      kvhead::scaled_dot_product_attention(
          dims, view::bhsd(q.data(), heads, tokens, head_dim), view::bhsd(k.data(), kv_heads, tokens, head_dim),
          view::bhsd(v.data(), kv_heads, tokens, head_dim),
          kvhead::head_tensor<float>::bhsd(out.data(), heads, tokens, head_dim), options);
    });
    benchmark::DoNotOptimize(out.data());
  }
  // q kᵀ and p v over the causal triangle: 2 GEMMs x 2 flops x H x d x L(L+1)/2.
  const double flops = 4.0 * heads * head_dim * (double(tokens) * (tokens + 1) / 2);
  kvhead::bench::set_rates(state, flops, 4.0 * double(q.size() + k.size() + v.size() + out.size()));
}

void s3_mha_layer(benchmark::State& state) {
  constexpr std::size_t d_model = 512, heads = 8, head_dim = 64, batch = 4, seq = 512;
  const float weight_scale = 1.0f / std::sqrt(float(d_model));
  const auto wq = kvhead::bench::random_floats(d_model * d_model, 1, -weight_scale, weight_scale);
  const auto wk = kvhead::bench::random_floats(d_model * d_model, 2, -weight_scale, weight_scale);
  const auto wv = kvhead::bench::random_floats(d_model * d_model, 3, -weight_scale, weight_scale);
  const auto wo = kvhead::bench::random_floats(d_model * d_model, 4, -weight_scale, weight_scale);
  const kvhead::attention_layer layer(
      {heads, heads, head_dim, d_model, {}, false, 0.0},
      {{wq.data(), nullptr}, {wk.data(), nullptr}, {wv.data(), nullptr}, {wo.data(), nullptr}});
  const auto x = kvhead::bench::random_floats(batch * seq * d_model, 5);
  std::vector<float> y(x.size());
  tbb::task_arena arena(int(state.range(0)));
  for (auto _ : state) {
    arena.execute([&] { layer.forward(x.data(), batch, seq, y.data()); });
    benchmark::DoNotOptimize(y.data());
  }
  const double projections = 4.0 * 2.0 * double(batch * seq) * d_model * d_model;
  const double attention = 4.0 * double(batch * heads) * seq * seq * head_dim;
  kvhead::bench::set_rates(state, projections + attention, 4.0 * double(2 * x.size() + 4 * wq.size()));
}

}  // namespace

BENCHMARK(s2_prefill_gqa_causal)->Name("S2_prefill_gqa_causal")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(s3_mha_layer)->Name("S3_mha_layer")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
