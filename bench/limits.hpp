// This machine's limits, measured by the benchmark process itself:
//   FMA peak   12 independent multiply-add chains per thread on the engine's
//              widest fp32 path (kvhead::active_simd_path(): zmm vfmadd231ps
//              for avx512, ymm vfmadd231ps for avx2, xmm mulps + addps for
//              sse2, which has no FMA), in inline asm, so the instructions are
//              exactly these whatever the compiler flags. 12 chains cover
//              latency x ports on Zen (4 x 2) and Intel (4 x 2);
//   DRAM read  a streaming read of a 1 GiB buffer on 2 MiB pages (the
//              engine's aligned_buffer, as the KV pool), touched once first.
// Both run on the threads of a tbb::task_arena, one slice of the work each.
//
// fma_peak_gflops(t) and dram_read_gbps(t) are the limits the other benchmarks
// report their pct_peak and pct_dram against: measured once per thread count,
// on first use, over about 0.3 s (the best of the runs in that time: noise
// only slows a run), then
// cached for the rest of the process.
#pragma once

#include <tbb/task_arena.h>

namespace kvhead::bench {

class limit_kernels {
 public:
  explicit limit_kernels(int threads);

  /// One run of the FMA chains on every thread: floating-point operations done.
  double fma_flops();
  /// One pass over the DRAM buffer, split among the threads: bytes read.
  double dram_bytes();

 private:
  int threads_;
  tbb::task_arena arena_;
};

double fma_peak_gflops(int threads);
double dram_read_gbps(int threads);

}  // namespace kvhead::bench
