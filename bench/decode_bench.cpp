// Decode attention over the KV cache, K/V already cached, one new query token
// per sequence, attention only (names fixed: outside tools read them; shapes
// in bench/shapes.hpp):
//   S1_decode_gqa/threads:<t>       32/8 heads, past 4096, 5 sequences;
//   S4_decode_mqa/threads:<t>       32/1 heads, past 8192, 16 sequences;
//   S5_decode_ragged16/threads:<t>  16 sequences of pasts 256..4096, one call;
//   decode_block_size/block:<b>/threads:1  S1 over caches of block size b
//       (256-token blocks are read in place, smaller ones are copied into one
//       256-key chunk first).
// Counters: gbps = K/V bytes read per call, gflops = 4 H d (past + 1), and
// pct_dram, except S4 (each K/V byte serves 32 query heads): pct_peak.
#include <tbb/task_arena.h>

#include "bench/bench_util.hpp"
#include "bench/cached_decode.hpp"
#include "bench/kvhead_runs.hpp"

void kvhead::bench::run_cached_decode(benchmark::State& state, const decode_shape& shape, bound_by limit, int threads) {
  const cached_decode decode(shape);
  const auto q = decode_queries(shape);
  std::vector<float> out(q.size());
  tbb::task_arena arena(threads);
  arena.execute([&] { decode.run(0, q.data(), out.data()); });  // untimed: scratch grows on first use
  std::size_t next = 0;
  for (auto _ : state) {
    arena.execute([&] { decode.run(next, q.data(), out.data()); });
    next = (next + 1) % shape.calls();
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, shape.flops_per_call(), shape.bytes_per_call(), limit, threads);
}

namespace {

using kvhead::bench::bound_by;
using kvhead::bench::decode_shape;
using kvhead::bench::run_cached_decode;

void s1_decode_gqa(benchmark::State& state) {
  run_cached_decode(state, kvhead::bench::s1_decode_gqa(), bound_by::dram_read, int(state.range(0)));
}

// Each K/V byte serves 32 query heads: compute-bound.
void s4_decode_mqa(benchmark::State& state) {
  run_cached_decode(state, kvhead::bench::s4_decode_mqa(), bound_by::fma_peak, int(state.range(0)));
}

void s5_decode_ragged16(benchmark::State& state) {
  run_cached_decode(state, kvhead::bench::s5_decode_ragged16(), bound_by::dram_read, int(state.range(0)));
}

void decode_block_size(benchmark::State& state) {
  decode_shape shape = kvhead::bench::s1_decode_gqa();
  shape.block_size = std::size_t(state.range(0));
  run_cached_decode(state, shape, bound_by::dram_read, int(state.range(1)));
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
