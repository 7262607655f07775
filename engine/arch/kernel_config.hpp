// The table of kernel configurations, one row per kind of CPU, in the manner
// of BLIS's config/<arch>/bli_cntx_init_<arch>.c: the GEMM register tile
// (MR x NR) with its reason, and how the cache blocks follow from the caches
// the CPU reports (cpu_info.hpp). Every SIMD path has a row for any CPU (its
// last row); rows before it are for the CPUs they name.
//
// Determinism across configurations. KC, the depth of one block of the sum
// over k, is the same in every row (gemm_kc): it is the only blocking number
// that orders a reduction. MR, NR, MC and NC only decide which elements are
// computed together, never the order of any sum (engine/gemm/gemm.hpp), so on
// one SIMD path every configuration — and so every CPU — gives the same bits.
// The paged prefetch distance is a hint to the memory system only. One field
// does order sums: bf16_paged_products picks the kernels of attention's bf16
// products on the avx512bf16 unit (vdpbf16ps, summing in pairs of terms, or
// the fp32 FMAs; on the amx unit, bf16 precision always takes its tiles), so
// rows that differ in it give different last bits there, as two bf16 units
// do; KVHEAD_CONFIG names the row that reproduces another machine's results.
//
// Choice. The first row of the active path whose CPU class matches this CPU;
// the environment variable KVHEAD_CONFIG=<name> forces a row by name (its path
// then becomes the active one; it must run here, and KVHEAD_ISA, if set too,
// must name the same path).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "engine/arch/cpu_info.hpp"
#include "kvhead/config.hpp"

namespace kvhead::engine {

/// KC for every configuration (see above). 256 floats of depth keep the B
/// micro-panel (KC x NR) within L1 or a fast L2 stream on every row below.
inline constexpr std::size_t gemm_kc = 256;

/// Which CPUs a row is for.
enum class cpu_class {
  any,        // every CPU that runs the row's path
  amd_zen3,   // AMD family 0x19, Zen 3 models (Milan, Vermeer, Rembrandt, Cezanne): AVX2, two 256-bit FMA pipes
  amd_zen4,   // AMD family 0x19 with AVX-512: 512-bit FMAs split over two 256-bit pipes
  amd_zen5,   // AMD family 0x1a: two full 512-bit FMA pipes
  intel_amx,  // Intel with AMX tiles (Sapphire Rapids and later Xeons): two 512-bit FMA ports, 2 MiB L2
};

struct kernel_config_row {
  const char* name;
  simd_path path;
  cpu_class cpu;
  std::size_t mr, nr;         // GEMM register tile: MR rows of A x NR columns of B
  std::size_t a_block_share;  // MC x KC of packed A takes 1 / a_block_share of L2
  std::size_t attention_rows;  // stacked query rows per attention tile (a multiple of MR)
  // How far ahead, in bytes, a decode step's products over a paged B (K/V as
  // a cache stores them) prefetch the panel rows they stream: the bf16 and
  // int8 paged kernels; the fp32 GEMM under a single A panel over f32 K/V,
  // and over the K/V it widens (f16; bf16 and int8 where their own kernels
  // do not run), whose best distances were measured apart; 0: none, the
  // hardware prefetchers alone.
  std::size_t paged_prefetch_bytes, fp32_paged_prefetch_bytes, widened_paged_prefetch_bytes;
  // Under a single row block (a decode step's GQA group, whose stream alone
  // sets the pace) over compressed K/V (bf16, f16, int8), each step also
  // prefetches its rows this many bytes beyond the distance above into L2
  // only (prefetcht1): L1's few fill buffers bound the lines a prefetcht0
  // stream keeps in flight, L2 takes more. 0: no L2 prefetch.
  std::size_t paged_l2_lead_bytes;
  // Whether the bf16 paged kernels prefetch under a single row block; false:
  // paged_prefetch_bytes applies to them under several row blocks only (S4's
  // query tiles, whose first row block brings each panel in for the others),
  // and one row block's bf16 stream is left to the hardware prefetchers,
  // where that measured faster.
  bool bf16_single_row_block_prefetch;
  // The fp32 GEMM's paged prefetches with no L2 lead behind them (the next
  // B panel under several row blocks; a single row block's own rows where
  // the element has no L2 lead, f32) go into L2 only (prefetcht1), not L1:
  // true where that measured faster (fill buffers again).
  bool fp32_paged_prefetch_to_l2;
  // An untransposed A (not rounded) is read where it is, the micro-kernel
  // taking its strides, instead of packed, when each of its MR-row panels
  // meets at most this many NR-column panels of the block of B (a short
  // product: packing would cost more than it saves); a single A panel
  // always is. 0: only a single A panel. Same values, same bits either way.
  std::size_t a_in_place_panels;
  // Under a single row block (a decode step's p v over an int8 cache), the
  // int8 kernels take pages of fewer rows than this several to a call, each
  // panel's rows of all of them in turn (fewer calls and carries, the same
  // integer sums); 0 (or no more than a page's rows): one page per call,
  // each page's panels read as one stream, the pages in address order.
  std::size_t int8_pv_rows_per_call;
  // Attention's products in bf16 precision and over bf16 K/V run on the bf16
  // paged kernels (vdpbf16ps) where the CPU has them; false: on this row's
  // fp32 FMAs over the same rounded values, where vdpbf16ps runs at a
  // fraction of their rate. On the amx unit, bf16 precision runs on its
  // paged kernels either way (bf16_paged_products_chosen, gemm_bf16.hpp).
  bool bf16_paged_products;
  const char* why;  // the tile, the share, the rows, the prefetch and A in place, measured where stated
};

inline constexpr kernel_config_row kernel_config_rows[] = {
    {"avx512-zen4", simd_path::avx512, cpu_class::amd_zen4, 12, 32, 2, 120, 8192, 0, 4096, 12288, false, false, 8, 32,
     true,
     "Zen 4 splits each 512-bit FMA over its two 256-bit pipes (16 fp32 FMAs per cycle). 32 zmm: "
     "12 x 32 = 24 accumulators + 2 B vectors + 1 broadcast = 27 live; 24 chains cover the 4-cycle "
     "latency; 14 x 32 (31 live) measured no faster. The 32 KiB B micro-panel streams from L2 "
     "(64 B/cycle, twice what the kernel reads); 86% of FMA peak at 1024^3 (round 1, Zen 4). "
     "Attention tiles of 120 rows: 120 x 256 scores (120 KiB) with the chunk's K and V (256 KiB "
     "at head_dim 128) in a 1 MiB L2. Measured on an EPYC that reports model 0x11 under KVM (2026-12-07; "
     "S1, S4, S5 from DRAM, medians of 3 in alternated runs): the bf16 and int8 paged kernels' rows 8 KiB "
     "ahead, but the bf16 ones not under a single row block: S4 over bf16 888-911 -> 799-817 us, over "
     "int8 755-779 -> 678-692 (2 and 4 KiB: less), while S1 over bf16 took 747-765 us without, 790-876 "
     "with 2-8 KiB ahead (S5 alike); int8 under a single row block the same either way at 256-key "
     "blocks, block 128 1.22 -> 1.09 of block 256's time. The fp32 GEMM's paged rows over f32 not prefetched (4 "
     "KiB ahead: S1 f32 1-3% slower; 2-4 KiB with a further 6-8 KiB into L2: 8-30% slower), over f16 4 KiB "
     "ahead, and under a single row block every compressed stream that prefetches (f16, int8) 12 KiB further "
     "into L2 (prefetcht1; 2026-12-07, S1_decode_gqa_vs_limit, 2 runs each of a throwaway build reading the "
     "distances from the environment, time over f32's in the same iterations): f16 0.75-0.80 -> 0.63-0.65, "
     "int8 0.46-0.47 -> 0.41-0.42; S5 f16 9.17 -> 7.85-7.98 ms, int8 5.47-5.63 -> 4.99-5.08; 2-8 KiB ahead "
     "and 8-16 KiB further within the noise of these; the bf16 kernels with any prefetch under a single row "
     "block, into L2 only as well, 10-20% slower. A in place up to 8 B panels, as on Zen 5: S2 96-101 -> 92-95 ms, "
     "S4 f32 75% -> 79% of the peak beside it, 256^3 3% and 32 x 4096 x 128 3% faster, 1024 x 128 x 1024 "
     "within 1%. int8 p v pages of 16 rows two to a call: before the L2 lead one page per call measured faster "
     "than several up to 64 rows (block 16 1.44-1.46 -> 1.18-1.23 of block 256's time, 32 1.34-1.35 -> "
     "1.07-1.09); with it (decode_block_sizes_int8, 2-4 runs of each) block 16 1.11-1.22 -> 1.04 at two a call, "
     "1.02-1.03 at three, 1.07-1.10 at up to 64 rows (blocks of 32 then two a call as well)."},
    {"avx512-zen5", simd_path::avx512, cpu_class::amd_zen5, 12, 32, 2, 120, 8192, 4096, 4096, 0, true, false, 8, 64,
     true,
     "Zen 5: two full 512-bit FMA pipes (32 fp32 FMAs per cycle), 48 KiB L1d, 1 MiB L2; the tile, "
     "blocks and attention tiles of avx512-2x512 (below), measured here: 81-89% of FMA peak at 1024^3; "
     "an A block of 1/8 to 3/4 of L2 and NC 1024 to 4096 within the noise of the default; attention "
     "tiles of 60, 120 and 240 rows within 2% on S2 and S3. Paged prefetch 8 KiB ahead: a decode step "
     "over a compressed cache keeps too few bytes in flight for DRAM's latency (bf16 rows of 64 B per "
     "2 vdpbf16ps per query row), and the rows of every step prefetched 8 KiB ahead took S1 over a bf16 "
     "cache from 0.56-0.59 to 0.44-0.46 ms and S5 from 5.3 to 4.2 ms (4 and 12 KiB: less; 2026-12-03). "
     "The fp32 GEMM's paged rows (f32 and f16 caches) 4 KiB ahead: against 8 KiB, 5 alternations, S1 "
     "0.92 -> 0.87 ms (f32) and 0.61 -> 0.57 (f16), S5 8.2 -> 7.5 and 5.4 -> 5.1 ms, every block size "
     "16-256 as fast or faster; 2, 3, 5 and 6 KiB no better (the bf16 and int8 kernels: 4 KiB 2-7% slower). "
     "A in place when each A panel meets at most 8 B panels (an attention tile's q k^T over a 256-key "
     "chunk, its p v at head_dim 128; 2 runs each, 2026-12-03): S2 48.8-49.3 -> 47.5-47.8 ms, S4 758 -> "
     "719-722 us, 256^3 146 -> 141 us, 1024 x 128 x 1024 1.19-1.21 -> 1.13 ms; at 16 B panels 1024^3 "
     "within the noise, and with every A in place 2048^3 lost 9-13%. int8 p v pages several to a call up to 64 "
     "rows (5 alternations, S1 over an int8 cache): block 16 405 -> 366 us, 32 348 -> 340."},
    {"avx512-xeon", simd_path::avx512, cpu_class::intel_amx, 12, 32, 2, 120, 2048, 3072, 3072, 4096, true, true, 8, 0,
     false,
     "Intel Xeon with AMX (measured on one that reports model 0xa7 under KVM, 2026-12-04): the tile, blocks "
     "and attention tiles of avx512-2x512 (below); attention tiles of 240 rows within the noise of 120. "
     "vdpbf16ps runs at half the FMA rate here (limit_avx512bf16 120 GFLOP/s against limit_fma_peak 242), "
     "so attention's products over a bf16 cache in f32 precision run on the fp32 FMAs over the same "
     "values: S1 over a bf16 cache 2.18 -> 1.67 ms, S4 over one 1.76 -> 1.06 ms (in bf16 precision the "
     "amx unit's paged kernels run instead, 2026-12-05: S2 in bf16 precision 67-78 -> 30-32 ms). Paged "
     "prefetch (2 alternations each, S1 and S5 from DRAM): the fp32 GEMM's paged rows 3 KiB ahead, S1 "
     "f32 3.29-3.34 -> 2.39-2.43 ms, bf16 1.66 -> 1.35, f16 1.72 -> 1.34, S5 f32 28.2 -> 20.5-20.9 ms (1, "
     "1.5, 2, 4 and 8 KiB: no better for all three); the int8 kernels' 2 KiB ahead, S1 1.15-1.17 -> "
     "0.88-0.90 ms, S5 10.0 -> 7.5-7.8 ms, S4 0.74-0.77 -> 0.60-0.64 ms (4 and 8 KiB: no better). Under a "
     "single row block each step also prefetches its rows 4 KiB further into L2 (2 alternations of builds, "
     "2026-12-04 evening): S1 over bf16 1.37-1.40 -> 1.27 ms, int8 0.90 -> 0.81, S5 bf16 12.2-12.4 -> "
     "10.8-11.0 ms, int8 7.9-8.0 -> 7.1, int8 at block 16 1.13-1.14 -> 0.96 ms; a lead of 8 or 12 KiB the "
     "same, 16 KiB less, prefetcht0 or prefetchnta there slower. Not for f32 rows (2 lines a step): in one "
     "process, alternated, S1 f32 2.38-2.50 ms without, 2.54-2.64 with a 4-32 KiB lead; nor under several "
     "row blocks (S4): bf16 and int8 2-4% slower. A in place up to 8 B panels, as on Zen 5: S2 76-81 -> "
     "70-71 ms, 1024 x 128 x 1024 1.94-2.06 -> 1.67-1.69 ms, 256^3 and 1024^3 within the noise. int8 p v one "
     "page per call, in address order, not pages of up to 64 rows several to a call as on Zen 5 (S1 over an int8 "
     "cache, 2 alternations in one process): block 16 919-950 -> 883-900 us, block 32 899-907 -> 876-885. The fp32 "
     "GEMM's paged prefetches with no L2 lead behind them into L2 only (prefetcht1; S1 and S4 from DRAM, builds "
     "alternated 3 times, 2026-12-05): S4 f32 1.59-1.63 -> 1.52-1.55 ms, S1 f32 2.48-2.68 -> 2.42-2.51 ms, S4 over a "
     "bf16 cache and f32 at 2 threads within the noise; the near prefetch of bf16 and f16 rows (an L2 lead behind it) "
     "into L2 as well: S1 slower in 4 of 6 runs, kept in L1."},
    {"avx512-2x512", simd_path::avx512, cpu_class::any, 12, 32, 2, 120, 0, 0, 0, 0, true, false, 0, 64, true,
     "Two full 512-bit FMA ports (Intel Xeon, AMD Zen 5): 32 fp32 FMAs per cycle, 4-cycle latency, "
     "so at least 8 independent chains; 12 x 32 keeps 24 (BLIS's skx sgemm, 32 x 12 transposed) "
     "with 14 loads per 24 FMAs, within two load ports. The 32 KiB B micro-panel fits a 48 KiB L1d. "
     "Attention tiles of 120 rows (measured on Zen 5, avx512-zen5 above). No paged prefetch, no A in place "
     "beyond one panel: CPUs no row names (the Xeons and Zen 5 measured have theirs above). int8 p v pages "
     "several to a call up to 64 rows, as on Zen 5."},
    {"avx2-zen3", simd_path::avx2, cpu_class::amd_zen3, 6, 16, 2, 120, 2048, 2048, 2048, 0, true, false, 0, 32, true,
     "Zen 3 (measured on an EPYC that reports model 0x1 under KVM, 2026-12-06): the tile, blocks and attention "
     "tiles of avx2 (below). The int8 paged kernels' rows 2 KiB ahead, as the fp32 GEMM's (S1's geometry over "
     "an int8 cache from DRAM, the best of 1200 steps in one process: 975 -> 910 us; 4 and 8 KiB within the "
     "noise), their p v pages of 16 rows two to a call (decode_block_sizes_int8, 2 runs: block 16 1.17 -> 1.13 "
     "of block 256's time; 4 to a call no better). The fp32 GEMM's paged rows (f32, bf16 and f16 caches: this "
     "path widens bf16 and f16 into its fp32 kernels) 2 KiB ahead: against none, 6 alternations of "
     "S1_decode_gqa_vs_limit, S1 f32 2.09-2.33 -> 1.75-1.94 ms, bf16 1.35-1.48 -> 1.08-1.12, f16 1.34-1.46 -> "
     "1.04-1.09, int8 (then widened as well) 1.13-1.24 -> "
     "1.09-1.11, S5 f32 17.9-20.4 -> 15.4-17.7 ms; 1, 3, 8 and 16 KiB no better, a further 4 KiB into L2 "
     "(bf16 1.29-1.34 ms) or the prefetches into L2 only (1.18-1.21) slower. A packed unless it is one panel: "
     "A in place up to 8 B panels, as on Zen 5, was slower here (2 alternations: S4 2.07-2.16 -> 2.19-2.33 ms, "
     "1024 x 128 x 1024 3.23-3.28 -> 3.36-3.55 ms, S2 within the noise)."},
    {"avx2", simd_path::avx2, cpu_class::any, 6, 16, 2, 120, 0, 0, 0, 0, true, false, 0, 0, true,
     "AVX2 + FMA, two 256-bit FMA pipes (Intel Haswell on, AMD Zen 1-4): 16 ymm: 6 x 16 = 12 "
     "accumulators + 2 B vectors + 1 broadcast = 15 live (BLIS's haswell sgemm); 12 chains cover "
     "4-cycle latency x 2 pipes (needs 8); 8 loads per 12 FMAs. B micro-panel 16 KiB, half of L1d. "
     "On Zen 3 an A block of a quarter of L2 measured no faster than half. Attention tiles of 120 "
     "rows: 60, 120 and 240 measured within 2% on S2 and S3 (Zen 3, 512 KiB L2); fewer rows re-read "
     "each chunk's K and V more often, more spill the scores from L2. int8 K/V: the int8 paged kernels of 16 "
     "columns (vpmaddwd, kernels_avx2int8.cpp)."},
    {"sse2", simd_path::sse2, cpu_class::any, 6, 8, 2, 120, 0, 0, 0, 0, true, false, 0, 0, true,
     "SSE2 (no FMA): 16 xmm: 6 x 8 = 12 accumulators + 2 B + 1 broadcast + 1 product temporary = 16. "
     "B micro-panel 8 KiB. Attention tiles of 120 rows, as for AVX2. No int8 paged kernels (they need AVX2 at least)."},
};

static_assert([] {
  for (const kernel_config_row& row : kernel_config_rows)
    if (row.attention_rows == 0 || row.attention_rows % row.mr != 0) return false;
  return true;
}(), "attention tiles are whole MR panels: no short row edge in their GEMMs");

static_assert([] {
  for (const kernel_config_row& row : kernel_config_rows)
    if (row.paged_prefetch_bytes % 64 != 0 || row.fp32_paged_prefetch_bytes % 64 != 0 ||
        row.widened_paged_prefetch_bytes % 64 != 0 || row.paged_l2_lead_bytes % 64 != 0)
      return false;
  return true;
}(), "paged prefetch distances are whole cache lines");

/// How far ahead, in bytes, a paged product's kernels prefetch the B rows
/// each step reads: into L1 (prefetcht0) and into L2 only (prefetcht1); 0:
/// not at all. A hint only: no value changes.
struct stream_prefetch {
  std::size_t l1_bytes = 0, l2_bytes = 0;
};

/// The distances of `row` for a paged product of the kernels whose L1
/// distance is `l1_bytes` (paged_prefetch_bytes, fp32_paged_prefetch_bytes or
/// widened_paged_prefetch_bytes) over B stored as `element`: the L2 one only
/// under a single row block and over compressed elements (paged_l2_lead_bytes).
constexpr stream_prefetch paged_stream_prefetch(const kernel_config_row& row, std::size_t l1_bytes,
                                                bool single_row_block, kv_dtype element) {
  const bool l2 = single_row_block && element != kv_dtype::f32 && l1_bytes != 0 && row.paged_l2_lead_bytes != 0;
  return {l1_bytes, l2 ? l1_bytes + row.paged_l2_lead_bytes : 0};
}

/// The bf16 paged kernels' distances: paged_prefetch_bytes, none under a
/// single row block where the row says so (bf16_single_row_block_prefetch).
constexpr stream_prefetch bf16_paged_stream_prefetch(const kernel_config_row& row, bool single_row_block,
                                                     kv_dtype element) {
  if (single_row_block && !row.bf16_single_row_block_prefetch) return {};
  return paged_stream_prefetch(row, row.paged_prefetch_bytes, single_row_block, element);
}

/// The largest MR x NR of any row (edge tiles are kept on the stack).
inline constexpr std::size_t max_tile_floats = [] {
  std::size_t largest = 0;
  for (const kernel_config_row& row : kernel_config_rows) largest = row.mr * row.nr > largest ? row.mr * row.nr : largest;
  return largest;
}();

/// A row resolved for this machine: the cache blocks computed from its caches.
struct kernel_config {
  const kernel_config_row* row;
  std::size_t mr, nr, mc, kc, nc;
  std::size_t b_sweep_panels;  // B panels each A panel meets in turn (resolve_kernel_config)
  std::size_t attention_rows;
  std::string blocking_why;  // how MC, NC and the sweep followed from this CPU's caches
  std::string chosen_why;    // why this row (CPU class match, or KVHEAD_CONFIG)
};

/// The configuration every kernel of `path` uses in this process (fixed at
/// first use). Throws std::runtime_error for a bad KVHEAD_CONFIG.
const kernel_config& kernel_config_for(simd_path path);

/// The first row of `path` whose CPU class matches `cpu` (KVHEAD_CONFIG aside).
const kernel_config_row& kernel_config_row_for(simd_path path, const cpu_info& cpu);

/// `row` with its cache blocks computed for `cpu`'s caches.
kernel_config resolve_kernel_config(const kernel_config_row& row, const cpu_info& cpu, std::string chosen_why = {});

/// KVHEAD_CONFIG's row, or null when it is unset. Throws std::runtime_error
/// naming the problem when it names no row or a path this CPU cannot run.
const kernel_config_row* forced_kernel_config();

/// Whether `cpu` belongs to `cpu_class`, and the class in words.
bool cpu_matches(cpu_class wanted, const cpu_info& cpu);
const char* to_string(cpu_class wanted);

}  // namespace kvhead::engine
