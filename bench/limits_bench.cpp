// This machine's limits as benchmarks of their own (kernels in bench/limits.hpp):
//   limit_fma_peak/threads:<t>   12 FMA chains per thread on the active SIMD
//                                path; counter gflops;
//   limit_dram_read/threads:<t>  one streaming pass over 1 GiB split among t
//                                threads; counter gbps.
#include "bench/bench_util.hpp"
#include "bench/limits.hpp"

namespace {

void limit_fma_peak(benchmark::State& state) {
  kvhead::bench::limit_kernels kernels(int(state.range(0)));
  double flops = 0.0;
  for (auto _ : state) flops = kernels.fma_flops();
  state.counters["gflops"] = kvhead::bench::rate(flops * 1e-9);
}

void limit_dram_read(benchmark::State& state) {
  kvhead::bench::limit_kernels kernels(int(state.range(0)));
  double bytes = 0.0;
  for (auto _ : state) bytes = kernels.dram_bytes();
  state.counters["gbps"] = kvhead::bench::rate(bytes * 1e-9);
}

}  // namespace

BENCHMARK(limit_fma_peak)->Name("limit_fma_peak")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(limit_dram_read)->Name("limit_dram_read")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
