// The bf16 micro-kernel contract (units avx512bf16 and amx; the fp32
// fallback runs the fp32 micro-kernels, microkernel.hpp).
//
//   C[0:rows, 0:32 * panels] := acc + beta * C     (beta == 0: C is not read)
//
// acc(i, j) is the sum over the block's k of A(i, k) * B(k, j) in the unit's
// order (below), from zero; the driver calls once per bf16_kc-deep block of
// k, in order, with the caller's beta for the first block and 1 after.
//
// A_panel  bf16, MR rows (rows past the matrix are zero), packed per unit:
//   avx512bf16  [pairs][MR][2]: row r, k = 2q + e at a_panel[(q * MR + r) * 2 + e];
//   amx         [MR][2 * pairs] (tile rows): row r, k at a_panel[r * 2 * pairs + k].
// B_panels `panels` packed panels of [pairs][32][2] (gemm_bf16.hpp), each
//          b_panel_stride elements after the previous one.
// pairs    half the block's padded depth (amx: a multiple of 16, one tile
//          instruction's k; avx512bf16: any).
// C        rows x (32 * panels) fp32, rows ldc apart, read (beta != 0) and
//          written whole; the driver runs column edges on a padded copy.
//
// Order of the sum (fixed per unit, the same for every row and column):
//   avx512bf16  acc = 0; for each pair q: acc = vdpbf16ps(acc, A pair, B pair)
//               (Intel SDM: acc += a[2q+1] * b[2q+1], then acc += a[2q] * b[2q],
//               each a fused multiply-add);
//   amx         acc = 0; for each 16 pairs: acc = tdpbf16ps(acc, A tile, B tile)
//               (SDM: per row and column, an even and an odd chain over the 16
//               pairs from zero, fused, then acc += even + odd).
// Both flush subnormal inputs and results to zero and round to nearest even,
// whatever MXCSR says. bf16_emulation.hpp computes the same in scalar code.
#pragma once

#include <cstddef>
#include <string>

#include "engine/arch/kernel_config.hpp"
#include "engine/gemm/gemm_bf16.hpp"

namespace kvhead::engine {

/// Register and tile blocking of the units (the kernels and their emulation).
///   avx512bf16  12 rows x 32 columns: 24 zmm accumulators + 2 B vectors + 1
///               broadcast of an A pair = 27 of 32 registers; 24 chains cover
///               vdpbf16ps's latency on two ports. Skinny: 1 or 2 rows x 4
///               panels (128 columns): 8 or 16 accumulators + 8 B vectors + 1
///               broadcast <= 25 registers, B streamed once (3 and 4 rows
///               run the 1-panel kernel: 6 and 8 chains).
///   amx         32 x 32: 4 accumulator tiles (2 A tiles of 16 rows x 32 k,
///               2 B tiles of 16 pairs x 16 columns), 8 tiles in all.
inline constexpr std::size_t avx512bf16_mr = 12, amx_mr = 32, bf16_skinny_rows = 2, bf16_skinny_panels = 4;
static_assert(avx512bf16_mr * 2 + 3 <= 32 &&
              bf16_skinny_rows * 2 * bf16_skinny_panels + 2 * bf16_skinny_panels + 1 <= 32);
static_assert(amx_mr == 2 * 16 && bf16_nr == 2 * 16);

struct bf16_microkernel_params {
  const bf16_bits* a_panel;
  const bf16_bits* b_panels;
  std::size_t b_panel_stride;  // elements
  std::size_t pairs;
  float beta;
  float* c;
  std::size_t ldc;
};

using bf16_microkernel_function = void (*)(const bf16_microkernel_params&);

/// How A is packed for a unit (see above).
enum class bf16_a_layout { pairs, tile_rows };

/// The kernels of one unit, as the untemplated driver (gemm_bf16.cpp) uses
/// them: one per row count 1..mr for `panels` = 1, and the skinny kernels
/// for rows 1..skinny_rows over skinny_panels panels at once (few rows of A,
/// decode projections: enough independent accumulators to hide latency).
/// begin_task / end_task (may be null) run around each task on its thread
/// (AMX: load the tile configuration, release the tiles). convert_rows
/// rounds A's fp32 rows to bf16 rows for the packing (every unit's:
/// vcvtne2ps2bf16, or its emulation): to nearest even, subnormal fp32 read
/// as zero, zero from `cols` up to a whole pair.
using bf16_convert_rows_function = void (*)(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols,
                                            bf16_bits* to, std::size_t to_ld);
struct bf16_kernels {
  bf16_unit unit;
  bf16_a_layout a_layout;
  std::size_t mr;
  std::size_t pair_multiple;                 // pairs is padded to a multiple of this
  const bf16_microkernel_function* kernels;  // [rows - 1]
  std::size_t skinny_rows, skinny_panels;
  const bf16_microkernel_function* skinny;  // [rows - 1], or null
  void (*begin_task)();
  void (*end_task)();
  bf16_convert_rows_function convert_rows;
};

/// The hardware kernels of `unit` (avx512bf16 or amx), compiled in
/// engine/gemm/kernels_<unit>.cpp.
const bf16_kernels& avx512bf16_kernels();
const bf16_kernels& amx_kernels();

/// vcvtne2ps2bf16's conversion (kernels_avx512bf16.cpp), which the amx unit
/// also uses (an AMX CPU has AVX512-BF16: engine/arch/isa.cpp checks).
void avx512bf16_convert_rows(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, bf16_bits* to,
                             std::size_t to_ld);

/// The one-time self-test of a unit (bf16_units.cpp): "" when `kernels`
/// reproduce their emulation bit for bit on a small GEMM whose partial sums
/// are all exact, else why not — also when they raise SIGILL or SIGSEGV,
/// which is caught (on this thread, while the test runs).
std::string bf16_self_test(const bf16_kernels& kernels);

/// gemm_bf16 through the given kernels (the hardware ones, or the scalar
/// emulation of bf16_emulation.hpp over the same packed buffers): B must be
/// packed for kernels.unit. The checks of gemm_bf16 except that the unit runs here.
void gemm_bf16_with(const bf16_kernels& kernels, gemm_shape shape, gemm_operand a, const packed_bf16_b& b, float beta,
                    float* c, std::size_t ldc);

// The paged kernel of the avx512bf16 unit (bf16 attention: q kᵀ and p v,
// gemm_bf16_paged in gemm_bf16.hpp), over a B that some other layer packed:
//
//   C[0:rows, 0:cols] := alpha * acc         acc as in avx512bf16 above
//
// A        bf16 rows: row r, k at a[r * a_row_stride + k] (a_row_stride
//          even, each row zero past the depth up to a whole pair).
// B        one 32-column panel of the fp32 path's packed layout (gemm.hpp,
//          NR = 32: avx512), its rows in pages: row k of page i at
//          b_pages[i] + k * b_row_stride elements, page_rows rows per page
//          (even; the last page may be shorter), `depth` rows in all; its
//          elements stored as f32, bf16 or f16 and rounded to nearest even
//          bf16 as they are loaded (exact for values that are bf16 already).
//          Only the first `cols` columns are read (the rest count as zero)
//          and written.
// Pairs of k: (2q, 2q + 1) from the first row, the last one completed by a
// zero row when the depth is odd; the order of the sum is avx512bf16's.
// carry: the fp32 sums of a product whose pages run over several calls, in
// the kernel's own layout (rows x 32 floats): with carry_in the sums start
// from it instead of 0; with carry_out they are left in it and C is not
// written. The sums go on exactly as in one call over all the pages.
// prefetch: how far ahead each pair step prefetches its rows' bytes
// (paged_stream_prefetch, kernel_config.hpp). No value changes.
struct bf16_paged_params {
  const bf16_bits* a;
  std::size_t a_row_stride;
  const void* const* b_pages;
  std::size_t page_rows, depth, b_row_stride, cols;
  float alpha;
  float* c;
  std::size_t ldc;
  float* carry = nullptr;
  bool carry_in = false, carry_out = false;
  stream_prefetch prefetch{};
};

using bf16_paged_function = void (*)(const bf16_paged_params&);

// The staged paged kernels of the amx unit, whose tiles load only from
// memory, in their own layout:
//
//   C[0:rows, 0:cols] := alpha * acc         acc as in amx above; the
//                                            product flushed to zero when
//                                            subnormal (begin_product's FTZ)
//
// A        bf16 tile rows: row r, k at a[r * 2 * pairs + k], zero past the
//          depth; rows up to a whole tile of 16 are read (zero or not:
//          their sums are not stored).
// B        one 32-column panel in the packed layout [pairs][32][2] of
//          gemm_bf16 at `panel` (16 KiB at KC: in L1), its first `cols`
//          columns and `depth` rows as bf16_paged_params says (pages,
//          rounding), zero past them up to 32 columns and 2 * pairs rows.
//          With stage_into (== panel), each group of 16 pairs is converted
//          there from the pages just before its tiles load it; without, the
//          call reads a panel staged by an earlier call (the first of the
//          panel's row blocks stages it for the others) or packed so
//          beforehand (pack_tile_pairs; its rows past `depth` are then read
//          too, against A's zeros: they must be finite).
// pairs    a multiple of 16 (one tdpbf16ps's k): groups of 32 k from the
//          first row, so a product's bits follow its depth's alignment.
struct bf16_staged_params {
  const bf16_bits* a;
  const bf16_bits* panel;
  bf16_bits* stage_into;  // null, or panel itself
  std::size_t pairs, cols;
  float alpha;
  float* c;
  std::size_t ldc;
  const void* const* b_pages;
  std::size_t page_rows, depth, b_row_stride;
  stream_prefetch prefetch{};
};
using bf16_staged_function = void (*)(const bf16_staged_params&);

// The amx unit's sums on fp32 FMAs (bf16_paged_params, no carry), for
// products of at most amx_fma_mr rows (a decode step's query rows per kv
// head; more run on the tiles): each tile instruction's order exactly (amx
// above: per group of 16 pairs an even and an odd chain of fused
// multiply-adds from zero, then acc + (even + odd)), under begin_product's
// MXCSR (DAZ and FTZ set, as the tiles flush), so a row's bits are those of
// the tiles whatever the product's row count; C as the staged kernels'. A
// (a_row_stride = 2 * pairs) and the depth as for the staged kernels: zero
// up to whole groups.
// Why: a tile instruction costs the same for 1 row as for 16 (about 20
// cycles here), and the tiles' sums per panel did not overlap the stream of
// K and V from memory, however the staging was placed. Xeon, decode over a
// bf16 cache from DRAM (S1's geometry, 4 query rows per kv head): 1.60-1.82
// ms on tiles, 1.41-1.48 on this form, 1.29-1.30 on the fp32 kernels (which
// also keep q unrounded: a bf16 cache in f32 precision stays on those,
// bf16_paged_products_chosen); in bf16 precision, 1.72 ms on tiles and 1.48
// on this form at 4 rows per kv head, 0.89 against 1.04 at 8 (two calls of
// this form), 0.48 against 0.92 at 16.
inline constexpr std::size_t amx_fma_mr = 4;

/// The paged kernels of a unit, for B stored as kv_dtype e (null for int8,
/// which none takes): by_element[e][rows - 1] for rows 1..mr (avx512bf16's;
/// amx's FMA form, for products of at most mr rows), and amx's
/// staged[e][rows - 1] for rows 1..amx_mr (products of more than mr rows);
/// amx's depths padded to a multiple of 2 * pair_multiple, begin_product /
/// end_product run around a product on its thread (MXCSR, the tile
/// configuration); the conversion of A's fp32 rows to bf16 rows (as
/// bf16_kernels'); amx's staging of a whole fp32 panel (pack_tile_pairs).
/// amx's stage_panel: `depth` fp32 rows of a 32-column panel (row r at
/// rows + 32 r) into [pairs][32][2] at `to` as the staged kernels stage them,
/// zero past the depth (pack_tile_pairs).
using bf16_stage_panel_function = void (*)(const float* rows, std::size_t depth, std::size_t pairs, bf16_bits* to);
struct bf16_paged_kernels {
  std::size_t mr;
  const bf16_paged_function* by_element[stored_dtype_count];
  bf16_convert_rows_function convert_rows;
  const bf16_staged_function* staged[stored_dtype_count] = {};
  std::size_t pair_multiple = 1;
  unsigned int (*begin_product)(bool on_tiles) = nullptr;  // returns end_product's state
  void (*end_product)(bool on_tiles, unsigned int state) = nullptr;
  bf16_stage_panel_function stage_panel = nullptr;
};

/// The hardware paged kernels (kernels_avx512bf16.cpp, kernels_amx.cpp;
/// their scalar emulation is in bf16_emulation.hpp).
const bf16_paged_kernels& avx512bf16_paged_kernels();
const bf16_paged_kernels& amx_paged_kernels();

/// gemm_bf16_paged (gemm_bf16.hpp) through the given kernels, on any CPU
/// for the emulation; the checks of gemm_bf16_paged except where it runs.
void gemm_bf16_paged_with(const bf16_paged_kernels& kernels, gemm_shape shape, float alpha, gemm_operand a,
                          const paged_b_view& b, float* c, std::size_t ldc, const bf16_rows* converted = nullptr);

/// bf16_rows_floats and convert_rows_bf16 (gemm_bf16.hpp) for the given
/// kernels' layout and conversion.
std::size_t bf16_rows_floats_with(const bf16_paged_kernels& kernels, std::size_t m, std::size_t k);
bf16_rows convert_rows_bf16_with(const bf16_paged_kernels& kernels, gemm_operand a, std::size_t m, std::size_t k,
                                 float* storage);

/// pack_tile_pairs (gemm_bf16.hpp) through the given kernels' stage_panel
/// (amx's, or its emulation), on any CPU for the emulation.
void pack_tile_pairs_with(const bf16_paged_kernels& kernels, const packed_b_view& from, bf16_bits* to);

}  // namespace kvhead::engine
