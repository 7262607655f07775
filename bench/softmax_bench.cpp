// exp and softmax on the active SIMD path, and a scalar std::exp loop as the
// baseline. One thread (these kernels work on one row).
// Names: exp/n:<n>, softmax_row/n:<n>, exp_std/n:<n>.
// Counters: elems_per_s (elements per second) and gbps (bytes the kernel
// reads and writes: 8 per element for exp; 20 for softmax_row, whose three
// passes read, read + write, read + write the row).
#include <cmath>
#include <cstddef>
#include <vector>

#include "bench/bench_util.hpp"
#include "engine/softmax/softmax.hpp"

namespace {

using namespace kvhead::engine;

std::size_t length(const benchmark::State& state) { return std::size_t(state.range(0)); }

void exp_kvhead(benchmark::State& state) {
  const std::size_t n = length(state);
  const std::vector<float> in = kvhead::bench::random_floats(n, 1, -10.0f, 10.0f);
  std::vector<float> out(n);
  for (auto _ : state) {
    exp_floats(in.data(), out.data(), n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  kvhead::bench::set_element_rates(state, double(n), 8.0 * double(n));
}

void exp_std(benchmark::State& state) {
  const std::size_t n = length(state);
  const std::vector<float> in = kvhead::bench::random_floats(n, 1, -10.0f, 10.0f);
  std::vector<float> out(n);
  for (auto _ : state) {
    for (std::size_t i = 0; i < n; ++i) out[i] = std::exp(in[i]);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  kvhead::bench::set_element_rates(state, double(n), 8.0 * double(n));
}

// In place: from the second iteration on the row holds probabilities, which
// cost the same (no special values either way).
void softmax_row_kvhead(benchmark::State& state) {
  const std::size_t n = length(state);
  std::vector<float> row = kvhead::bench::random_floats(n, 2, -10.0f, 10.0f);
  for (auto _ : state) {
    softmax_row(row.data(), n);
    benchmark::DoNotOptimize(row.data());
    benchmark::ClobberMemory();
  }
  kvhead::bench::set_element_rates(state, double(n), 20.0 * double(n));
}

// Row lengths from one attention tile to a whole long-context score row.
void lengths(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"n"});
  for (int n : {64, 1024, 16384, 1 << 20}) bench->Args({n});
}

}  // namespace

BENCHMARK(exp_kvhead)->Name("exp")->Apply(lengths);
BENCHMARK(softmax_row_kvhead)->Name("softmax_row")->Apply(lengths);
BENCHMARK(exp_std)->Name("exp_std")->Apply(lengths);
