// This machine's limits as benchmarks of their own (kernels in bench/limits.hpp):
//   limit_fma_peak/threads:<t>   12 FMA chains per thread on the active SIMD
//                                path; counter gflops;
//   limit_avx512bf16/threads:<t>, limit_amx_bf16/threads:<t>   the bf16 units'
//                                peak kernels (limits.hpp); counter gflops;
//                                skipped with the reason where the unit does
//                                not run;
//   limit_avx512vnni/threads:<t>  12 vpdpwssd chains (the int8 KV cache's
//                                products); counter gflops (int16 operations);
//                                skipped where those kernels do not run;
//   limit_avx2_int16_dot/threads:<t>  6 vpmaddwd + vpaddd chains (the avx2
//                                path's int8 KV cache products); counter
//                                gflops (int16 operations); skipped off the
//                                avx2 path;
//   limit_dram_read/threads:<t>  one streaming pass over 1 GiB split among t
//                                threads, each slice read as the streams
//                                (1 or 2) that read faster here; counters
//                                gbps and streams.
#include "bench/bench_util.hpp"
#include "bench/limits.hpp"
#include "engine/gemm/gemm_int8.hpp"

namespace {

void limit_fma_peak(benchmark::State& state) {
  kvhead::bench::limit_kernels kernels(int(state.range(0)));
  double flops = 0.0;
  for (auto _ : state) flops = kernels.fma_flops();
  state.counters["gflops"] = kvhead::bench::rate(flops * 1e-9);
}

void limit_bf16_unit(benchmark::State& state, kvhead::engine::bf16_unit unit) {
  if (!kvhead::engine::bf16_unit_runs_here(unit)) {
    state.SkipWithError(("skipped: " + kvhead::engine::bf16_unit_refusal(unit)).c_str());
    for (auto _ : state) {
    }
    return;
  }
  kvhead::bench::limit_kernels kernels(int(state.range(0)));
  double flops = 0.0;
  for (auto _ : state) flops = kernels.bf16_flops(unit);
  state.counters["gflops"] = kvhead::bench::rate(flops * 1e-9);
}

void limit_avx512bf16(benchmark::State& state) { limit_bf16_unit(state, kvhead::engine::bf16_unit::avx512bf16); }
void limit_amx_bf16(benchmark::State& state) { limit_bf16_unit(state, kvhead::engine::bf16_unit::amx); }

// The chains of an int8 KV cache's integer products (`dot`), where `runs`;
// else skipped, saying why.
void limit_int16_dot(benchmark::State& state, bool runs, const char* skipped,
                     double (kvhead::bench::limit_kernels::*dot)()) {
  if (!runs) {
    state.SkipWithError(skipped);
    for (auto _ : state) {
    }
    return;
  }
  kvhead::bench::limit_kernels kernels(int(state.range(0)));
  double operations = 0.0;
  for (auto _ : state) operations = (kernels.*dot)();
  state.counters["gflops"] = kvhead::bench::rate(operations * 1e-9);
}

void limit_avx512vnni(benchmark::State& state) {
  limit_int16_dot(state,
                  kvhead::active_simd_path() == kvhead::simd_path::avx512 &&
                      kvhead::engine::gemm_int8_paged_runs(kvhead::simd_path::avx512, kvhead::kv_dtype::int8),
                  "skipped: the int8 paged kernels (AVX512-VNNI) do not run here (kvhead kernels says why)",
                  &kvhead::bench::limit_kernels::int8_dot_flops);
}

void limit_avx2_int16_dot(benchmark::State& state) {
  limit_int16_dot(state, kvhead::active_simd_path() == kvhead::simd_path::avx2,
                  "skipped: the avx2 path does not run here (its int8 paged kernels with it)",
                  &kvhead::bench::limit_kernels::avx2_int16_dot_flops);
}

void limit_dram_read(benchmark::State& state) {
  const int threads = int(state.range(0));
  const std::size_t streams = kvhead::bench::dram_read_streams(threads);
  kvhead::bench::limit_kernels kernels(threads);
  double bytes = 0.0;
  for (auto _ : state) bytes = kernels.dram_bytes(streams);
  state.counters["gbps"] = kvhead::bench::rate(bytes * 1e-9);
  state.counters["streams"] = double(streams);
}

}  // namespace

BENCHMARK(limit_fma_peak)->Name("limit_fma_peak")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(limit_avx512bf16)->Name("limit_avx512bf16")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(limit_amx_bf16)->Name("limit_amx_bf16")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(limit_avx512vnni)->Name("limit_avx512vnni")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(limit_avx2_int16_dot)->Name("limit_avx2_int16_dot")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(limit_dram_read)->Name("limit_dram_read")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
