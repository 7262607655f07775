// The limit kernels and the cached limits (see limits.hpp).
#include "bench/limits.hpp"

#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>

#include <benchmark/benchmark.h>
#include <tbb/parallel_for.h>

#include "engine/arch/aligned_buffer.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "engine/gemm/gemm_int8.hpp"
#include "kvhead/config.hpp"

namespace kvhead::bench {
namespace {

// Loop trips per thread and run: a few milliseconds.
constexpr std::uint64_t fma_loops = std::uint64_t(1) << 20;

// Each loop trip is 12 independent register-to-register operations on zeroed
// registers (0 * 0 + 0 stays 0: no denormals, no overflow), then dec + jnz.
// The FMA chains on one register width: `width` is zmm or ymm (the same
// instructions otherwise, so one asm text for both).
#define KVHEAD_FMA_CHAINS(width)                       \
  "vxorps %%xmm0, %%xmm0, %%xmm0\n\t"                  \
  "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"                  \
  "vxorps %%xmm2, %%xmm2, %%xmm2\n\t"                  \
  "vxorps %%xmm3, %%xmm3, %%xmm3\n\t"                  \
  "vxorps %%xmm4, %%xmm4, %%xmm4\n\t"                  \
  "vxorps %%xmm5, %%xmm5, %%xmm5\n\t"                  \
  "vxorps %%xmm6, %%xmm6, %%xmm6\n\t"                  \
  "vxorps %%xmm7, %%xmm7, %%xmm7\n\t"                  \
  "vxorps %%xmm8, %%xmm8, %%xmm8\n\t"                  \
  "vxorps %%xmm9, %%xmm9, %%xmm9\n\t"                  \
  "vxorps %%xmm10, %%xmm10, %%xmm10\n\t"               \
  "vxorps %%xmm11, %%xmm11, %%xmm11\n\t"               \
  "vxorps %%xmm12, %%xmm12, %%xmm12\n\t"               \
  "vxorps %%xmm13, %%xmm13, %%xmm13\n\t"               \
  "1:\n\t"                                             \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "0\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "1\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "2\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "3\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "4\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "5\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "6\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "7\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "8\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "9\n\t"                                              \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "10\n\t"                                             \
  "vfmadd231ps %%" width "13, %%" width "12, %%" width \
  "11\n\t"                                             \
  "dec %[loops]\n\t"                                   \
  "jnz 1b\n\t"                                         \
  "vzeroupper"

#define KVHEAD_FMA_CLOBBERS                                                                                        \
  "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13"

void fma_chains_avx512(std::uint64_t loops) {
  asm volatile(KVHEAD_FMA_CHAINS("zmm") : [loops] "+r"(loops) : : KVHEAD_FMA_CLOBBERS);
}

void fma_chains_avx2(std::uint64_t loops) {
  asm volatile(KVHEAD_FMA_CHAINS("ymm") : [loops] "+r"(loops) : : KVHEAD_FMA_CLOBBERS);
}

#undef KVHEAD_FMA_CHAINS
#undef KVHEAD_FMA_CLOBBERS

// The avx2 int8 kernels' step, six chains of it: an int16 pair product
// (vpmaddwd, 16 multiply-adds into a temporary: AVX2 has no integer
// multiply-add into an accumulator) and its sum (vpaddd).
void madd_chains_avx2(std::uint64_t loops) {
  asm volatile(
      "vpxor %%xmm0, %%xmm0, %%xmm0\n\t"
      "vmovdqa %%ymm0, %%ymm1\n\t"
      "vmovdqa %%ymm0, %%ymm2\n\t"
      "vmovdqa %%ymm0, %%ymm3\n\t"
      "vmovdqa %%ymm0, %%ymm4\n\t"
      "vmovdqa %%ymm0, %%ymm5\n\t"
      "vmovdqa %%ymm0, %%ymm12\n\t"
      "vmovdqa %%ymm0, %%ymm13\n\t"
      "1:\n\t"
      "vpmaddwd %%ymm13, %%ymm12, %%ymm6\n\t"
      "vpmaddwd %%ymm13, %%ymm12, %%ymm7\n\t"
      "vpmaddwd %%ymm13, %%ymm12, %%ymm8\n\t"
      "vpmaddwd %%ymm13, %%ymm12, %%ymm9\n\t"
      "vpmaddwd %%ymm13, %%ymm12, %%ymm10\n\t"
      "vpmaddwd %%ymm13, %%ymm12, %%ymm11\n\t"
      "vpaddd %%ymm6, %%ymm0, %%ymm0\n\t"
      "vpaddd %%ymm7, %%ymm1, %%ymm1\n\t"
      "vpaddd %%ymm8, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm9, %%ymm3, %%ymm3\n\t"
      "vpaddd %%ymm10, %%ymm4, %%ymm4\n\t"
      "vpaddd %%ymm11, %%ymm5, %%ymm5\n\t"
      "dec %[loops]\n\t"
      "jnz 1b\n\t"
      "vzeroupper"
      : [loops] "+r"(loops)
      :
      : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13");
}

// Six multiply chains and six add chains: the two kinds issue to separate
// ports on Zen and to the same two on Intel; 12 chains cover both.
void fma_chains_sse2(std::uint64_t loops) {
  asm volatile(
      "xorps %%xmm0, %%xmm0\n\t"
      "xorps %%xmm1, %%xmm1\n\t"
      "xorps %%xmm2, %%xmm2\n\t"
      "xorps %%xmm3, %%xmm3\n\t"
      "xorps %%xmm4, %%xmm4\n\t"
      "xorps %%xmm5, %%xmm5\n\t"
      "xorps %%xmm6, %%xmm6\n\t"
      "xorps %%xmm7, %%xmm7\n\t"
      "xorps %%xmm8, %%xmm8\n\t"
      "xorps %%xmm9, %%xmm9\n\t"
      "xorps %%xmm10, %%xmm10\n\t"
      "xorps %%xmm11, %%xmm11\n\t"
      "xorps %%xmm12, %%xmm12\n\t"
      "1:\n\t"
      "mulps %%xmm12, %%xmm0\n\t"
      "mulps %%xmm12, %%xmm1\n\t"
      "mulps %%xmm12, %%xmm2\n\t"
      "mulps %%xmm12, %%xmm3\n\t"
      "mulps %%xmm12, %%xmm4\n\t"
      "mulps %%xmm12, %%xmm5\n\t"
      "addps %%xmm12, %%xmm6\n\t"
      "addps %%xmm12, %%xmm7\n\t"
      "addps %%xmm12, %%xmm8\n\t"
      "addps %%xmm12, %%xmm9\n\t"
      "addps %%xmm12, %%xmm10\n\t"
      "addps %%xmm12, %%xmm11\n\t"
      "dec %[loops]\n\t"
      "jnz 1b"
      : [loops] "+r"(loops)
      :
      : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
        "xmm12");
}

// The bf16 units' peaks, in the same manner. vdpbf16ps: 12 zmm chains, each
// 16 lanes x 2 products x 2 flops. tdpbf16ps: 4 independent accumulator
// tiles (tmm0-3) from zeroed A and B tiles (tmm4-7), each 16 x 16 x 32 x 2
// flops; the tile configuration is this thread's for the run (loaded, then
// released). vpdpwssd (the int8 attention kernels, gemm_int8.hpp): 12 zmm
// chains of 16 lanes x 2 int16 products x 2 operations.
#define KVHEAD_DOT_CHAINS(instruction)                                                                             \
  asm volatile(                                                                                                    \
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"                                                                          \
      "vmovaps %%zmm0, %%zmm1\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm2\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm3\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm4\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm5\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm6\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm7\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm8\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm9\n\t"                                                                                 \
      "vmovaps %%zmm0, %%zmm10\n\t"                                                                                \
      "vmovaps %%zmm0, %%zmm11\n\t"                                                                                \
      "vmovaps %%zmm0, %%zmm12\n\t"                                                                                \
      "vmovaps %%zmm0, %%zmm13\n\t"                                                                                \
      "1:\n\t" instruction " %%zmm13, %%zmm12, %%zmm0\n\t" instruction " %%zmm13, %%zmm12, %%zmm1\n\t" instruction \
      " %%zmm13, %%zmm12, %%zmm2\n\t" instruction " %%zmm13, %%zmm12, %%zmm3\n\t" instruction                      \
      " %%zmm13, %%zmm12, %%zmm4\n\t" instruction " %%zmm13, %%zmm12, %%zmm5\n\t" instruction                      \
      " %%zmm13, %%zmm12, %%zmm6\n\t" instruction " %%zmm13, %%zmm12, %%zmm7\n\t" instruction                      \
      " %%zmm13, %%zmm12, %%zmm8\n\t" instruction " %%zmm13, %%zmm12, %%zmm9\n\t" instruction                      \
      " %%zmm13, %%zmm12, %%zmm10\n\t" instruction                                                                 \
      " %%zmm13, %%zmm12, %%zmm11\n\t"                                                                             \
      "dec %[loops]\n\t"                                                                                           \
      "jnz 1b\n\t"                                                                                                 \
      "vzeroupper"                                                                                                 \
      : [loops] "+r"(loops)                                                                                        \
      :                                                                                                            \
      : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",    \
        "xmm12", "xmm13")

void dot_chains_avx512bf16(std::uint64_t loops) { KVHEAD_DOT_CHAINS("vdpbf16ps"); }
void dot_chains_avx512vnni(std::uint64_t loops) { KVHEAD_DOT_CHAINS("vpdpwssd"); }
#undef KVHEAD_DOT_CHAINS

void tile_chains_amx(std::uint64_t loops) {
  // ldtilecfg's operand: palette 1, 8 tiles of 16 rows x 64 bytes.
  alignas(64) std::uint8_t config[64] = {1};
  for (int tile = 0; tile < 8; ++tile) {
    config[16 + 2 * tile] = 64;
    config[48 + tile] = 16;
  }
  asm volatile(
      "ldtilecfg %[config]\n\t"
      "tilezero %%tmm0\n\t"
      "tilezero %%tmm1\n\t"
      "tilezero %%tmm2\n\t"
      "tilezero %%tmm3\n\t"
      "tilezero %%tmm4\n\t"
      "tilezero %%tmm5\n\t"
      "tilezero %%tmm6\n\t"
      "tilezero %%tmm7\n\t"
      "1:\n\t"
      "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
      "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
      "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
      "tdpbf16ps %%tmm7, %%tmm5, %%tmm3\n\t"
      "dec %[loops]\n\t"
      "jnz 1b\n\t"
      "tilerelease"
      : [loops] "+r"(loops)
      : [config] "m"(config)
      : "cc");
}

}  // namespace

struct fma_kernel {
  void (*chains)(std::uint64_t loops);
  double flops_per_loop;  // 12 instructions x lanes, x 2 for an FMA
};

namespace {

fma_kernel fma_kernel_for(simd_path path) {
  if (path == simd_path::avx512) return {fma_chains_avx512, 12 * 16 * 2};
  if (path == simd_path::avx2) return {fma_chains_avx2, 12 * 8 * 2};
  return {fma_chains_sse2, 12 * 4};
}

fma_kernel bf16_kernel_for(engine::bf16_unit unit) {
  if (unit == engine::bf16_unit::amx) return {tile_chains_amx, 4 * 16 * 16 * 32 * 2};
  if (unit == engine::bf16_unit::avx512bf16) return {dot_chains_avx512bf16, 12 * 16 * 2 * 2};
  return fma_kernel_for(active_simd_path());
}

// 12 vpdpwssd chains, 2 multiply-adds per int16 pair per lane.
constexpr fma_kernel int8_dot_kernel{dot_chains_avx512vnni, 12 * 16 * 2 * 2};
// 6 vpmaddwd + vpaddd chains, 2 multiply-adds per int16 pair per lane.
constexpr fma_kernel avx2_int16_dot_kernel{madd_chains_avx2, 6 * 8 * 2 * 2};

// 1 GiB of floats, touched once, alive for the whole process.
constexpr std::size_t dram_floats = std::size_t(1) << 28;

const float* dram_buffer() {
  static const engine::aligned_buffer buffer = [] {
    engine::aligned_buffer touched(dram_floats);
    std::fill_n(touched.data(), dram_floats, 1.0f);
    return touched;
  }();
  return buffer.data();
}

// Sum of n floats (n a multiple of 64, p 16-byte aligned), read as Streams
// (1 or 2) equal parts in lockstep, with 8 independent SSE2 accumulators:
// two loads per cycle, far more than DRAM delivers.
template <std::size_t Streams>
float stream_sum(const float* p, std::size_t n) {
  static_assert(Streams == 1 || Streams == 2, "8 accumulators, 32 floats a step, split among the streams");
  constexpr std::size_t per_stream = 8 / Streams;  // accumulators (and 16-byte loads per step) of each stream
  const std::size_t part = n / Streams;
  __m128 sums[8];
  for (__m128& sum : sums) sum = _mm_setzero_ps();
  for (std::size_t i = 0; i < part; i += 4 * per_stream)
    for (std::size_t stream = 0; stream < Streams; ++stream)
      for (std::size_t j = 0; j < per_stream; ++j)
        sums[stream * per_stream + j] =
            _mm_add_ps(sums[stream * per_stream + j], _mm_load_ps(p + stream * part + i + 4 * j));
  for (int j = 1; j < 8; ++j) sums[0] = _mm_add_ps(sums[0], sums[j]);
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, sums[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// Runs `run` (which returns the work it did) for about 0.3 s after one
// warm-up run; the best rate in units per second of the runs whose slices
// ran at the same time (limit_kernels::last_run_concurrent). A limit is a
// ceiling: another process on the shared machine can only slow a run down,
// so the fastest run is the closest to what the hardware does (a median
// measured while the other core was busy gave 65 of 102 GFLOP/s, and
// fractions of it above 100%). A run whose slices took turns measures one
// core, not the t-thread limit: with the other core taken for all of 0.3 s,
// the 2-thread FMA peak read 229 GFLOP/s, the 1-thread rate, and 2-thread
// benchmarks then reported 160% of it (Zen 5, 2026-12-05). So the window
// grows until 3 runs were concurrent, up to 10 s; if none was, the best
// run stands and stderr says so.
// Slices can overlap in wall time and still take turns on one core (a
// virtual CPU descheduled by the host while its slice runs: Zen 4 under KVM,
// 2026-12-07, the 2-thread FMA peak read 117.8 GFLOP/s, the 1-thread rate, and
// a suite's 2-thread rows 139-166% of it). So a compute limit's run counts as
// concurrent only where every slice ran at least min_slice_rate (units per
// second and thread; 0: any), which cached_limit sets to 3/4 of the 1-thread
// rate: this project's machines run one thread per core (2 threads of the
// FMA chains ran 0.90-0.95x the 1-thread rate each on Zen 4).
template <class Run>
double best_rate(limit_kernels& kernels, Run run, const char* name, int threads, double min_slice_rate = 0.0) {
  using clock = std::chrono::steady_clock;
  run();
  double best = 0.0, best_concurrent = 0.0;
  int concurrent_runs = 0;
  const clock::time_point start = clock::now();
  while (clock::now() - start < std::chrono::milliseconds(300) || concurrent_runs < 3) {
    if (clock::now() - start > std::chrono::seconds(10)) break;
    const clock::time_point begin = clock::now();
    const double work = run();
    const double rate = work / std::chrono::duration<double>(clock::now() - begin).count();
    best = std::max(best, rate);
    const double slice_rate = work / double(threads) / kernels.last_run_slowest_slice();
    if (kernels.last_run_concurrent() && slice_rate >= min_slice_rate) {
      best_concurrent = std::max(best_concurrent, rate);
      ++concurrent_runs;
    }
  }
  if (concurrent_runs > 0) return best_concurrent;
  std::fprintf(stderr,
               "kvhead_bench: warning: no run of the %s limit at %d threads had its threads running at once (each at "
               "least 3/4 of one thread's rate, for compute limits) in 10 s (another process on the other cores?); the "
               "limit is the best run's rate, too low\n",
               name, threads);
  return best;
}

// The limit `run` measures at `threads` threads, in giga-units per second,
// measured on first use.
double cached_limit(std::map<int, double>& measured, int threads, double (limit_kernels::*run)(), const char* name) {
  if (const auto found = measured.find(threads); found != measured.end()) return found->second;
  // Several threads: a run counts where each kept 3/4 of one thread's rate (best_rate).
  const double min_slice_rate = threads > 1 ? 0.75e9 * cached_limit(measured, 1, run, name) : 0.0;
  limit_kernels kernels(threads);
  const double units_per_second = best_rate(
      kernels, [&] { return (kernels.*run)(); }, name, threads, min_slice_rate);
  return measured[threads] = units_per_second * 1e-9;
}

}  // namespace

limit_kernels::limit_kernels(int threads) : threads_(threads), arena_(threads), slices_(std::size_t(threads)) {}

template <class Slice>
void limit_kernels::run_slices(Slice slice) {
  using clock = std::chrono::steady_clock;
  arena_.execute([&] {
    tbb::parallel_for(
        0, threads_,
        [&](int t) {
          slice_times& times = slices_[std::size_t(t)];
          times.thread = tbb::this_task_arena::current_thread_index();
          times.begin = clock::now();
          slice(t);
          times.end = clock::now();
        },
        tbb::static_partitioner{});
  });
  // Concurrent: every slice on its own thread, and every slice began before
  // any ended.
  clock::time_point last_begin = slices_[0].begin, first_end = slices_[0].end;
  concurrent_ = true;
  for (std::size_t t = 0; t < slices_.size(); ++t) {
    last_begin = std::max(last_begin, slices_[t].begin);
    first_end = std::min(first_end, slices_[t].end);
    for (std::size_t other = 0; other < t; ++other)
      if (slices_[other].thread == slices_[t].thread) concurrent_ = false;
  }
  if (last_begin >= first_end && slices_.size() > 1) concurrent_ = false;
}

double limit_kernels::last_run_slowest_slice() const {
  double slowest = 0.0;
  for (const slice_times& times : slices_)
    slowest = std::max(slowest, std::chrono::duration<double>(times.end - times.begin).count());
  return slowest;
}

double limit_kernels::run_chains(const fma_kernel& kernel, std::uint64_t loops) {
  run_slices([&](int) { kernel.chains(loops); });
  return kernel.flops_per_loop * double(loops) * threads_;
}

namespace {

// The chains of a peak limit (not dram_read).
fma_kernel peak_kernel(bound_by limit) {
  const simd_path path = active_simd_path();
  switch (limit) {
    case bound_by::bf16_peak:
      return bf16_kernel_for(engine::active_bf16_unit());
    case bound_by::attention_bf16_peak:
      return engine::bf16_paged_products_chosen(path, kv_dtype::bf16, kvhead::precision::f32)
                 ? bf16_kernel_for(engine::bf16_unit::avx512bf16)
                 : fma_kernel_for(path);
    case bound_by::attention_int8_peak:
      if (!engine::gemm_int8_paged_runs(path, kv_dtype::int8)) return fma_kernel_for(path);
      return path == simd_path::avx2 ? avx2_int16_dot_kernel : int8_dot_kernel;
    default:
      return fma_kernel_for(path);
  }
}

}  // namespace

double limit_kernels::fma_flops() { return run_chains(peak_kernel(bound_by::fma_peak), fma_loops); }

double limit_kernels::bf16_flops(engine::bf16_unit unit) {
  // AMX runs 16384 flops per instruction: fewer trips for a run of a few ms.
  const std::uint64_t loops = unit == engine::bf16_unit::amx ? fma_loops / 16 : fma_loops;
  return run_chains(bf16_kernel_for(unit), loops);
}

double limit_kernels::active_bf16_flops() { return bf16_flops(engine::active_bf16_unit()); }

double limit_kernels::int8_dot_flops() { return run_chains(int8_dot_kernel, fma_loops); }

double limit_kernels::avx2_int16_dot_flops() { return run_chains(avx2_int16_dot_kernel, fma_loops); }

double limit_kernels::attention_int8_flops() {
  return run_chains(peak_kernel(bound_by::attention_int8_peak), fma_loops);
}

double limit_kernels::attention_bf16_flops() {
  return run_chains(peak_kernel(bound_by::attention_bf16_peak), fma_loops);
}

double limit_kernels::limit_work(bound_by limit, double amount) {
  if (limit == bound_by::dram_read) return dram_bytes_next(std::size_t(amount), dram_read_streams(threads_));
  const fma_kernel kernel = peak_kernel(limit);
  const double loops = std::ceil(amount / (kernel.flops_per_loop * threads_));
  return run_chains(kernel, std::max<std::uint64_t>(1, std::uint64_t(loops)));
}

double limit_kernels::dram_bytes(std::size_t streams) {
  next_float_ = 0;
  return dram_bytes_next(dram_floats * sizeof(float), streams);
}

double limit_kernels::dram_bytes_next(std::size_t bytes, std::size_t streams) {
  const std::size_t floats = std::min(bytes / sizeof(float), dram_floats);
  const std::size_t slice = floats / std::size_t(threads_) / 64 * 64;
  if (next_float_ + slice * std::size_t(threads_) > dram_floats) next_float_ = 0;
  const float* const buffer = dram_buffer() + next_float_;
  run_slices([&](int t) {
    const float* const start = buffer + std::size_t(t) * slice;
    const float sum = streams == 2 ? stream_sum<2>(start, slice) : stream_sum<1>(start, slice);
    benchmark::DoNotOptimize(sum);
  });
  next_float_ += slice * std::size_t(threads_);
  return double(slice * std::size_t(threads_) * sizeof(float));
}

double fma_peak_gflops(int threads) {
  static std::map<int, double> measured;
  return cached_limit(measured, threads, &limit_kernels::fma_flops, "fma_peak");
}

// The DRAM limit: each thread's slice read as one stream and as two in
// lockstep, the faster of the two, as a ceiling is the most the machine
// reads. On Zen 5 two streams read 4-12% faster at 1 thread and 3-8% at 2
// (a loop outside kvhead, 3 rounds), and limit_dram_read with two against
// one, in turn, 11-25% (2026-12-05), where S5 had measured 99% of the
// one-stream rate.
struct dram_limit {
  double gbps;
  std::size_t streams;
};

const dram_limit& dram_read_limit(int threads) {
  static std::map<int, dram_limit> measured;
  auto [entry, missing] = measured.try_emplace(threads, dram_limit{0.0, 1});
  if (missing) {
    limit_kernels kernels(threads);
    for (const std::size_t streams : {std::size_t{1}, std::size_t{2}}) {
      const double bytes_per_second = best_rate(
          kernels, [&] { return kernels.dram_bytes(streams); }, "dram_read", threads);
      if (bytes_per_second * 1e-9 > entry->second.gbps) entry->second = {bytes_per_second * 1e-9, streams};
    }
  }
  return entry->second;
}

double dram_read_gbps(int threads) { return dram_read_limit(threads).gbps; }

std::size_t dram_read_streams(int threads) { return dram_read_limit(threads).streams; }

double bf16_peak_gflops(int threads) {
  static std::map<int, double> measured;
  return cached_limit(measured, threads, &limit_kernels::active_bf16_flops, "bf16_peak");
}

double attention_int8_peak_gflops(int threads) {
  static std::map<int, double> measured;
  return cached_limit(measured, threads, &limit_kernels::attention_int8_flops, "attention_int8_peak");
}

double attention_bf16_peak_gflops(int threads) {
  static std::map<int, double> measured;
  return cached_limit(measured, threads, &limit_kernels::attention_bf16_flops, "attention_bf16_peak");
}

}  // namespace kvhead::bench
