// Sweeps over S1's and S2's geometry (bench/shapes.hpp), one thread:
//   decode_sweep/past:<p>/threads:1  the S1 kernel (attention only) over pasts
//       p = 256, 512, ..., 16384, rotating over as many sequences as hold at
//       least S1's 5 x 4097 keys (2 at least), so K/V come from DRAM; pct_dram.
//   decode_sweep_layer/past:<p>/cache:1/threads:1  one decode step of a whole
//       attention layer of S1's geometry (d_model 4096 = 32 x 128, causal,
//       RoPE theta 10000) over a KV cache of p tokens: layer.forward over the
//       cache for 1 token. The cache holds random K/V (written directly, not
//       by a prefill: the step costs the same). Counts: the projections of one
//       token plus S1's attention; bytes the weights (168 MB, streamed each
//       step) plus the K/V; pct_dram.
//   decode_sweep_layer/past:<p>/cache:0/threads:1  the same token's output
//       without a cache: layer.forward over all p + 1 tokens, recomputing the
//       prefix. Counts: the projections of p + 1 tokens plus causal attention
//       over them; pct_peak. Capped at p = 4096, where one step is already
//       about 350 GFLOP (seconds per iteration).
//   prefill_sweep/tokens:<n>/threads:1  S2's attention over n = 64, 128, ...,
//       4096 tokens; gflops, pct_peak.
#include <algorithm>
#include <cmath>

#include <tbb/task_arena.h>

#include "bench/bench_util.hpp"
#include "bench/cached_decode.hpp"
#include "bench/kvhead_runs.hpp"

namespace {

using namespace kvhead::bench;

constexpr std::size_t longest_past = 16384, longest_recomputed_past = 4096;

void decode_sweep(benchmark::State& state) {
  const std::size_t past = std::size_t(state.range(0));
  const decode_shape s1 = s1_decode_gqa();
  const std::size_t s1_keys = s1.pasts.size() * (s1.pasts[0] + 1);
  const std::size_t sequences = std::max<std::size_t>(2, (s1_keys + past) / (past + 1));
  run_cached_decode(state, {s1.heads, s1.kv_heads, s1.head_dim, std::vector<std::size_t>(sequences, past)},
                    bound_by::dram_read, int(state.range(1)));
}

// The layer of S1's geometry, built once (its weights take a while to draw
// and pack).
struct decode_layer {
  decode_shape geometry = s1_decode_gqa();
  std::size_t d_model = geometry.heads * geometry.head_dim;
  kvhead::attention_layer layer = [this] {
    const std::size_t q_rows = geometry.heads * geometry.head_dim, kv_rows = geometry.kv_heads * geometry.head_dim;
    const float scale = 1.0f / std::sqrt(float(d_model));
    const auto wq = random_floats(q_rows * d_model, 11, -scale, scale);
    const auto wk = random_floats(kv_rows * d_model, 12, -scale, scale);
    const auto wv = random_floats(kv_rows * d_model, 13, -scale, scale);
    const auto wo = random_floats(d_model * q_rows, 14, -scale, scale);
    return kvhead::attention_layer(
        {geometry.heads, geometry.kv_heads, geometry.head_dim, d_model, {}, true, 10000.0},
        {{wq.data(), nullptr}, {wk.data(), nullptr}, {wv.data(), nullptr}, {wo.data(), nullptr}});
  }();

  double weight_floats() const {
    return double(2 * geometry.heads + 2 * geometry.kv_heads) * geometry.head_dim * d_model;
  }
  double projection_flops_per_token() const { return 2.0 * weight_floats(); }
  double attention_flops_per_key() const { return 4.0 * double(geometry.heads * geometry.head_dim); }

  static const decode_layer& get() {
    static const decode_layer built;
    return built;
  }
};

void step_over_cache(benchmark::State& state, const decode_layer& model, std::size_t past) {
  decode_shape shape = model.geometry;
  shape.pasts = {past};
  filled_cache filled(shape);
  const kvhead::sequence_id id = filled.ids[0];
  filled.cache.truncate(id, past);
  const auto x = random_floats(model.d_model, 21);
  std::vector<float> y(x.size());
  tbb::task_arena arena(int(state.range(2)));
  const auto step = [&] {
    filled.cache.append(id, 1);
    arena.execute([&] { model.layer.forward(filled.cache, 0, {{id, 1}}, x.data(), y.data()); });
    filled.cache.truncate(id, past);
  };
  step();  // untimed: scratch grows on first use
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(y.data());
  }
  const double keys = double(past + 1);
  set_rates(state, model.projection_flops_per_token() + model.attention_flops_per_key() * keys,
            4.0 * model.weight_floats() + shape.bytes_per_call(), bound_by::dram_read, int(state.range(2)));
}

void recompute_prefix(benchmark::State& state, const decode_layer& model, std::size_t past) {
  const std::size_t tokens = past + 1;
  const auto x = random_floats(tokens * model.d_model, 21);
  std::vector<float> y(x.size());
  tbb::task_arena arena(int(state.range(2)));
  time_calls(
      state, arena, [&] { model.layer.forward(x.data(), 1, tokens, y.data()); }, y.data());
  const double causal_keys = double(tokens) * double(tokens + 1) / 2;
  set_rates(state, model.projection_flops_per_token() * double(tokens) + model.attention_flops_per_key() * causal_keys,
            4.0 * (model.weight_floats() + 2.0 * double(x.size())), bound_by::fma_peak, int(state.range(2)));
}

void decode_sweep_layer(benchmark::State& state) {
  const std::size_t past = std::size_t(state.range(0));
  if (state.range(1) != 0) {
    step_over_cache(state, decode_layer::get(), past);
  } else {
    recompute_prefix(state, decode_layer::get(), past);
  }
}

void prefill_sweep(benchmark::State& state) {
  prefill_shape shape = s2_prefill_gqa_causal();
  shape.tokens = std::size_t(state.range(0));
  run_prefill(state, shape, int(state.range(1)));
}

void pasts(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"past", "threads"});
  for (std::size_t past = 256; past <= longest_past; past *= 2) bench->Args({long(past), 1});
  bench->UseRealTime();
}

void pasts_with_and_without_cache(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"past", "cache", "threads"});
  for (std::size_t past = 256; past <= longest_past; past *= 2) bench->Args({long(past), 1, 1});
  for (std::size_t past = 256; past <= longest_recomputed_past; past *= 2) bench->Args({long(past), 0, 1});
  bench->UseRealTime();
}

void prefill_lengths(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"tokens", "threads"});
  for (long tokens = 64; tokens <= 4096; tokens *= 2) bench->Args({tokens, 1});
  bench->UseRealTime();
}

}  // namespace

BENCHMARK(decode_sweep)->Name("decode_sweep")->Apply(pasts);
BENCHMARK(decode_sweep_layer)->Name("decode_sweep_layer")->Apply(pasts_with_and_without_cache);
BENCHMARK(prefill_sweep)->Name("prefill_sweep")->Apply(prefill_lengths);
