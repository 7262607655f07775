// Shared helpers of the benchmarks: seeded inputs and counters in the units
// outside tools read (gflops in GFLOP/s, gbps in GB/s, elems_per_s, and
// pct_peak or pct_dram in percent of this machine's limit, bench/limits.hpp).
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>
#include <tbb/task_arena.h>

#include "bench/limits.hpp"
#include "kvhead/config.hpp"

namespace kvhead::bench {

inline std::vector<float> random_floats(std::size_t count, unsigned seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(count);
  for (float& x : values) x = uniform(generator);
  return values;
}

// Times `call` on `arena` once per iteration, after one untimed call: a
// first call grows scratch and touches fresh pages (tools/run bench --quick,
// which times a single call, took 74 ms for S3_mha_layer's first and 41 for
// the next). `result`: what the call writes, kept from being optimized away.
template <class Call>
void time_calls(benchmark::State& state, tbb::task_arena& arena, const Call& call, const float* result) {
  arena.execute(call);
  for (auto _ : state) {
    arena.execute(call);
    benchmark::DoNotOptimize(result);
  }
}

// `amount` per iteration, reported per second (of real time for the
// benchmarks that UseRealTime).
inline benchmark::Counter rate(double amount) {
  return benchmark::Counter(amount, benchmark::Counter::kIsIterationInvariantRate);
}

// The compute limit of a precision: the FMA peak for f32, the bf16 unit's for bf16.
inline bound_by compute_bound(precision compute) {
  return compute == precision::bf16 ? bound_by::bf16_peak : bound_by::fma_peak;
}

// Per-iteration flops and bytes as gflops and gbps, the rate of the
// bounding one in percent of that limit at the benchmark's thread count, and
// floor_ms: the time per iteration that limit allows (a constant, so its
// median over repetitions is exact, where the median time times the median
// percentage is not for an even count).
inline void set_rates(benchmark::State& state, double flops, double bytes, bound_by limit, int threads) {
  state.counters["gflops"] = rate(flops * 1e-9);
  state.counters["gbps"] = rate(bytes * 1e-9);
  const bool compute = limit != bound_by::dram_read;
  const double limit_rate = limit == bound_by::fma_peak              ? fma_peak_gflops(threads)
                            : limit == bound_by::bf16_peak           ? bf16_peak_gflops(threads)
                            : limit == bound_by::attention_bf16_peak ? attention_bf16_peak_gflops(threads)
                            : limit == bound_by::attention_int8_peak ? attention_int8_peak_gflops(threads)
                                                                     : dram_read_gbps(threads);
  const double bounding = (compute ? flops : bytes) * 1e-9;
  state.counters[compute ? "pct_peak" : "pct_dram"] = rate(bounding / limit_rate * 100.0);
  state.counters["floor_ms"] = bounding / limit_rate * 1e3;
}

// Per-iteration elements and bytes (read + written), as rates per second.
inline void set_element_rates(benchmark::State& state, double elements, double bytes) {
  state.counters["elems_per_s"] = rate(elements);
  state.counters["gbps"] = rate(bytes * 1e-9);
}

}  // namespace kvhead::bench
