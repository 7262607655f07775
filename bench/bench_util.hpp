// Shared helpers of the benchmarks: seeded inputs and counters in the units
// outside tools read (gflops in GFLOP/s, gbps in GB/s, elems_per_s).
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

namespace kvhead::bench {

inline std::vector<float> random_floats(std::size_t count, unsigned seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(count);
  for (float& x : values) x = uniform(generator);
  return values;
}

// Per-iteration work, reported as rates per second of real time.
inline void set_rates(benchmark::State& state, double flops, double bytes) {
  state.counters["gflops"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gbps"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Per-iteration elements and bytes (read + written), as rates per second.
inline void set_element_rates(benchmark::State& state, double elements, double bytes) {
  state.counters["elems_per_s"] = benchmark::Counter(elements, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gbps"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace kvhead::bench
