// This machine's limits, measured by the benchmark process itself:
//   FMA peak   12 independent multiply-add chains per thread on the engine's
//              widest fp32 path (kvhead::active_simd_path(): zmm vfmadd231ps
//              for avx512, ymm vfmadd231ps for avx2, xmm mulps + addps for
//              sse2, which has no FMA), in inline asm, so the instructions are
//              exactly these whatever the compiler flags. 12 chains cover
//              latency x ports on Zen (4 x 2) and Intel (4 x 2);
//   bf16 peak  the same for the bf16 GEMM unit in use (engine/gemm/gemm_bf16.hpp):
//              12 zmm vdpbf16ps chains (avx512bf16), 4 independent AMX
//              accumulator tiles under tdpbf16ps (amx), or the FMA peak (the
//              fp32 fallback runs the fp32 kernels);
//   attention bf16 peak  the same for the unit of attention's bf16 products
//              (gemm_bf16_paged: bf16 precision, bf16 KV caches): the
//              avx512bf16 chains where those kernels run, else the FMA peak;
//   attention int8 peak  the same for the int8 KV cache's products
//              (gemm_int8_paged): 12 zmm vpdpwssd chains where those kernels
//              run (p v's instruction; q kᵀ's vpdpbusd does twice the
//              multiply-adds per instruction), else the FMA peak;
//   DRAM read  a streaming read of a 1 GiB buffer on 2 MiB pages (the
//              engine's aligned_buffer, as the KV pool), touched once first,
//              each thread's slice as one stream or as two halves in
//              lockstep, whichever reads faster here.
// Both run on the threads of a tbb::task_arena, one slice of the work each.
//
// fma_peak_gflops(t), bf16_peak_gflops(t), attention_bf16_peak_gflops(t),
// attention_int8_peak_gflops(t) and dram_read_gbps(t) are the limits the other benchmarks
// report their pct_peak and pct_dram against: measured once per thread count,
// on first use, over about 0.3 s (the best of the runs in that time whose
// threads all ran at once: noise only slows a run), then cached for the rest
// of the process.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include <tbb/task_arena.h>

#include "engine/gemm/gemm_bf16.hpp"

namespace kvhead::bench {

struct fma_kernel;  // a peak kernel and its flops per loop trip (limits.cpp)

// The limit that bounds a benchmark: the FMA peak, the bf16 GEMM unit's peak
// or that of attention's bf16 or int8 products (compute-bound, reported as pct_peak),
// or the DRAM read bandwidth (memory-bound, pct_dram).
enum class bound_by { fma_peak, bf16_peak, attention_bf16_peak, attention_int8_peak, dram_read };

class limit_kernels {
 public:
  explicit limit_kernels(int threads);

  /// One run of the FMA chains on every thread: floating-point operations done.
  double fma_flops();
  /// One run of `unit`'s peak kernel (it must run here) on every thread: flops done.
  double bf16_flops(engine::bf16_unit unit);
  double active_bf16_flops();
  /// One run of the peak kernel of attention's bf16 products (gemm_bf16_paged
  /// where it runs, else the FMA chains): flops done.
  double attention_bf16_flops();
  /// One run of 12 vpdpwssd chains (AVX512-VNNI: it must run here): operations done.
  double int8_dot_flops();
  /// One run of 6 vpmaddwd + vpaddd chains (AVX2: it must run here): operations done.
  double avx2_int16_dot_flops();
  /// One run of the peak kernel of the int8 cache's products (gemm_int8_paged
  /// where it runs: the vpdpwssd or the vpmaddwd + vpaddd chains; else the
  /// FMA chains): operations done.
  double attention_int8_flops();
  /// One pass over the DRAM buffer, split among the threads, each reading
  /// its slice as `streams` (1 or 2) equal parts in lockstep: bytes read.
  double dram_bytes(std::size_t streams);
  /// The next `bytes` of the DRAM buffer (at most all of it, in whole steps
  /// of 64 floats per slice), from where the last such read stopped, read as
  /// dram_bytes reads the whole: bytes read. A pass of the size of a decode
  /// call, to time in the same iterations as the call (decode_bench.cpp).
  double dram_bytes_next(std::size_t bytes, std::size_t streams);
  /// One run of `limit`'s kernel doing at least `amount` of its work: the
  /// peaks' chains for whole loop trips on every thread (operations), the
  /// DRAM read as dram_bytes_next in the faster pattern (bytes): the work
  /// done. A run of the size of one benchmark call, to time beside it.
  double limit_work(bound_by limit, double amount);
  /// Whether the last run's slices ran at the same time, each on its own
  /// thread (always, at 1 thread): a run whose slices took turns (a worker
  /// late, or its core taken by another process) measured fewer cores.
  bool last_run_concurrent() const { return concurrent_; }
  /// The longest wall time one slice of the last run took, in seconds.
  double last_run_slowest_slice() const;
  /// The arena the slices run on: work timed beside a limit run (a decode
  /// call) runs here too, so that the same worker threads serve both.
  tbb::task_arena& arena() { return arena_; }

 private:
  struct slice_times {
    int thread = -1;  // the arena slot that ran it
    std::chrono::steady_clock::time_point begin, end;
  };
  /// slice(t) for t in [0, threads) on the arena's threads, one each; sets concurrent_.
  template <class Slice>
  void run_slices(Slice slice);
  /// `kernel`'s chains, `loops` trips, on every thread: the operations done.
  double run_chains(const fma_kernel& kernel, std::uint64_t loops);

  int threads_;
  tbb::task_arena arena_;
  std::vector<slice_times> slices_;
  bool concurrent_ = true;
  std::size_t next_float_ = 0;  // where dram_bytes_next reads from
};

double fma_peak_gflops(int threads);
double bf16_peak_gflops(int threads);
double attention_bf16_peak_gflops(int threads);
double attention_int8_peak_gflops(int threads);
double dram_read_gbps(int threads);
/// The streams per thread (1 or 2) of the faster DRAM pass, the one dram_read_gbps measured.
std::size_t dram_read_streams(int threads);

}  // namespace kvhead::bench
