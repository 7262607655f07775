// Decode attention over the KV cache, K/V already cached, one new query token
// per sequence, attention only (names fixed: outside tools read them).
//   S1_decode_gqa/threads:<t>       batch 1, 32 q heads, 8 kv heads, d 128, past
//                                   4096 (33.5 MB of K/V), rotating over 5
//                                   sequences (168 MB) so K/V comes from DRAM;
//   S4_decode_mqa/threads:<t>       32 q heads, 1 kv head, d 128, past 8192,
//                                   rotating over 16 sequences (134 MB);
//   S5_decode_ragged16/threads:<t>  16 sequences, pasts 256..4096 evenly, 32/8
//                                   heads, d 128, one batched call (285 MB).
// Counters: gbps = K/V bytes read per call, gflops = 4 H d (past + 1).
#include <cmath>

#include <tbb/task_arena.h>

#include "bench/bench_util.hpp"
#include "engine/cache/cached_attention.hpp"
#include "engine/cache/kv_cache_internals.hpp"

namespace {

using kvhead::engine::cached_rows;

struct decode_setup {
  std::size_t heads, kv_heads, head_dim;
  std::vector<std::size_t> pasts;  // one sequence each
  std::size_t block_size = 0;      // 0: the cache's default
};

// A cache holding every sequence's past + 1 tokens of random K/V.
struct filled_cache {
  kvhead::kv_cache cache;
  std::vector<kvhead::sequence_id> ids;

  explicit filled_cache(const decode_setup& setup)
      : cache([&] {
          kvhead::kv_cache_config config;
          config.num_kv_heads = setup.kv_heads;
          config.head_dim = setup.head_dim;
          config.block_size = setup.block_size;
          std::size_t tokens = 0;
          for (std::size_t past : setup.pasts) tokens += past + 1 + kvhead::kv_cache_default_block_size;
          config.capacity_bytes = tokens * 2 * setup.kv_heads * ((setup.head_dim + 31) / 32 * 32) * sizeof(float);
          return config;
        }()) {
    const kvhead::simd_path path = kvhead::active_simd_path();
    for (std::size_t past : setup.pasts) {
      const kvhead::sequence_id id = cache.create();
      cache.append(id, past + 1);
      const std::size_t values = (past + 1) * setup.kv_heads * setup.head_dim;
      const auto k = kvhead::bench::random_floats(values, unsigned(id));
      const auto v = kvhead::bench::random_floats(values, unsigned(id) + 1000);
      kvhead::engine::write_cached_kv(cache, 0, {rows(id, 0)}, k.data(), v.data(), path);
      ids.push_back(id);
    }
  }
  // The whole sequence as new rows (for filling), or its last token.
  cached_rows rows(kvhead::sequence_id id, std::size_t row0, bool last_only = false) const {
    std::size_t count = 0;
    const std::uint32_t* table = kvhead::engine::kv_cache_internals::block_table(cache, id, &count);
    const std::size_t length = cache.length(id);
    return {table, length, last_only ? length - 1 : 0, row0};
  }
};

// Calls cycle through `rotation` groups of sequences; each call decodes one
// token for every sequence of its group.
void run_decode(benchmark::State& state, const decode_setup& setup, std::size_t per_call) {
  const filled_cache filled(setup);
  const std::size_t rotation = setup.pasts.size() / per_call;
  std::vector<std::vector<cached_rows>> calls(rotation);
  double bytes = 0.0, flops = 0.0;
  for (std::size_t i = 0; i < setup.pasts.size(); ++i) {
    auto& call = calls[i / per_call];
    call.push_back(filled.rows(filled.ids[i], call.size(), true));
    const double keys = double(setup.pasts[i] + 1);
    bytes += keys * 2.0 * double(setup.kv_heads * setup.head_dim) * sizeof(float);
    flops += 4.0 * double(setup.heads * setup.head_dim) * keys;
  }
  const auto q = kvhead::bench::random_floats(per_call * setup.heads * setup.head_dim, 7);
  std::vector<float> out(q.size());
  const float scale = 1.0f / std::sqrt(float(setup.head_dim));
  tbb::task_arena arena(int(state.range(setup.block_size == 0 ? 0 : 1)));  // the threads argument
  std::size_t next = 0;
  for (auto _ : state) {
    arena.execute([&] {
      kvhead::engine::cached_attention(filled.cache, 0, calls[next], setup.heads, q.data(), out.data(), scale,
                                       kvhead::active_simd_path());
    });
    next = (next + 1) % rotation;
    benchmark::DoNotOptimize(out.data());
  }
  kvhead::bench::set_rates(state, flops / double(rotation), bytes / double(rotation));
}

void s1_decode_gqa(benchmark::State& state) { run_decode(state, {32, 8, 128, std::vector<std::size_t>(5, 4096)}, 1); }

void s4_decode_mqa(benchmark::State& state) { run_decode(state, {32, 1, 128, std::vector<std::size_t>(16, 8192)}, 1); }

void s5_decode_ragged16(benchmark::State& state) {
  std::vector<std::size_t> pasts;
  for (std::size_t i = 0; i < 16; ++i) pasts.push_back(256 + i * (4096 - 256) / 15);
  run_decode(state, {32, 8, 128, pasts}, 16);
}

// S1's shape over caches of each block size (256 blocks are read in place,
// smaller ones are copied into one 256-key chunk first).
void decode_block_size(benchmark::State& state) {
  run_decode(state, {32, 8, 128, std::vector<std::size_t>(5, 4096), std::size_t(state.range(0))}, 1);
}

}  // namespace

BENCHMARK(decode_block_size)
    ->Name("decode_block_size")
    ->ArgNames({"block", "threads"})
    ->Args({32, 1})
    ->Args({64, 1})
    ->Args({128, 1})
    ->Args({256, 1})
    ->UseRealTime();
BENCHMARK(s1_decode_gqa)->Name("S1_decode_gqa")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(s4_decode_mqa)->Name("S4_decode_mqa")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(s5_decode_ragged16)->Name("S5_decode_ragged16")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
