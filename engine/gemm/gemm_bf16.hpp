// bf16 GEMM, row-major:  C = round_bf16(op(A)) * B + beta * C
//
//   op(A) is m x k, fp32 (gemm_operand, as for gemm()), rounded to the
//         nearest even bf16 as it is packed (the fallback: round_to_bf16;
//         the bf16 units: vcvtne2ps2bf16, which also reads subnormal fp32
//         as zero, as their products do with subnormal bf16);
//   B     is k x n, stored bf16, packed once (packed_bf16_b) in the layout
//         of the unit that multiplies;
//   C     is m x n fp32 (c[i*ldc + j], ldc >= n); fp32 accumulation.
// m or n = 0 does nothing; k = 0 gives C = beta * C; beta = 0 overwrites C
// (NaN in the old C never reaches the result). shape.k must equal B's k and
// shape.n be at most B's n (the leading columns). Bad arguments throw
// std::invalid_argument naming the problem, as gemm() does.
//
// Units (bf16_unit), best first, chosen once per process (active_bf16_unit):
//   amx            AMX-BF16 tiles (tdpbf16ps), Intel Sapphire Rapids on;
//   avx512bf16     AVX512-BF16 vdpbf16ps (Intel Cooper Lake on, AMD Zen 4);
//   fp32_fallback  every CPU: B's bf16 elements widened to fp32 in the fp32
//                  micro-kernel of a SIMD path, A rounded as it is packed —
//                  the bits of gemm() on the rounded inputs (same order).
// KVHEAD_ISA limits the unit: amx and avx512bf16 name a unit (an error when
// the CPU or OS lacks it), avx512, avx2 and sse2 leave the fp32 fallback on
// that fp32 path (kvhead/config.hpp).
//
// Determinism. For one unit (and, for the fallback, one SIMD path) on one
// machine, C(i, j) depends only on row i of A, column j of B and C(i, j):
// bit-identical for any m, n, thread count or other rows. Different units
// sum in different orders (and the bf16 instructions flush subnormals), so
// their results differ in the last bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "engine/arch/aligned_buffer.hpp"
#include "engine/gemm/gemm.hpp"
#include "engine/gemm/stored_element.hpp"
#include "kvhead/config.hpp"

namespace kvhead::engine {

enum class bf16_unit { amx, avx512bf16, fp32_fallback };

/// "amx", "avx512bf16" or "fp32_fallback".
const char* to_string(bf16_unit unit);

/// The best unit that works on this CPU, limited by KVHEAD_ISA (fixed at
/// first use). Throws std::runtime_error when KVHEAD_ISA names a unit this
/// CPU, its OS or the unit's self-test refuses.
bf16_unit active_bf16_unit();

/// Why the active unit is not a better one ("" when it is the best there
/// is): a missing CPUID bit, OS state, a refused AMX permission, a failed
/// self-test, or KVHEAD_ISA. For `kvhead kernels` and `kvhead --version`.
const std::string& bf16_unit_reason();

/// Whether `unit` can run here (CPUID, OS state, for AMX its permission
/// request, and the unit's self-test), whatever KVHEAD_ISA says; and if not,
/// why ("" when it can). Decided once per process.
bool bf16_unit_runs_here(bf16_unit unit);
const std::string& bf16_unit_refusal(bf16_unit unit);

/// Layout of a packed_bf16_b, per unit (the driver and the kernels read it):
///   fp32_fallback  packed_b_view's layout for the SIMD path (gemm.hpp), bf16
///                  elements;
///   avx512bf16, amx  for each bf16_kc-deep block of k (in order), the
///                  ceil(n / bf16_nr) panels of that block, each
///                  [depth / 2][bf16_nr][2]: element (k, col) of the block
///                  at ((k / 2) * bf16_nr + col) * 2 + k % 2 — two
///                  consecutive k of one column side by side, as vdpbf16ps
///                  and tdpbf16ps read them. The last block's depth is
///                  padded with zero rows to a multiple of 2 (avx512bf16) or
///                  of 32 (amx: whole tile steps); columns past n are zero.
///                  Block k0 starts at element k0 * round_up(n, bf16_nr).
inline constexpr std::size_t bf16_nr = 32;  // two zmm of 16 fp32 lanes; two 16-column AMX tiles
/// bf16_kc: the depth of one sum block (a multiple of the AMX tile's 32).
/// Deep, because each block costs a pass over C (read, add, write) and a
/// restart of every B stream, while a 12-row A panel of 2048 k (48 KiB)
/// still sits in L2 beside the B panel it streams: Zen 4, 1 thread, in one
/// session, against 256: 1024^3 165 -> 197 GFLOP/s, 2048^3 180 -> 201
/// (86-88 % of limit_avx512bf16), a decode projection (m 1, 2048 x 3072,
/// from DRAM) 20 -> 23 GB/s; 1024 measured within noise of 2048.
inline constexpr std::size_t bf16_kc = 2048;
static_assert(bf16_kc % 32 == 0 && bf16_nr % 16 == 0);

/// op(B) (k x n), stored bf16, packed once in the layout `unit` reads (see
/// above). Holds its own copy: the source may be freed. Packing for a unit
/// this CPU cannot run is allowed (tests read the layout); multiplying with
/// it is an error.
class packed_bf16_b {
 public:
  /// op(B) from bf16 elements: B itself (b[p*ldb + j], ldb >= n) or,
  /// transposed, B is n x k (b[j*ldb + p], ldb >= k).
  packed_bf16_b(std::size_t k, std::size_t n, const bf16_bits* b, std::size_t ldb, transpose trans,
                bf16_unit unit = active_bf16_unit(), simd_path fallback_path = active_simd_path());
  /// op(B) from fp32, rounded to nearest even as it is packed.
  packed_bf16_b(std::size_t k, std::size_t n, gemm_operand b_fp32, bf16_unit unit = active_bf16_unit(),
                simd_path fallback_path = active_simd_path());

  std::size_t k() const { return k_; }
  std::size_t n() const { return n_; }
  bf16_unit unit() const { return unit_; }
  /// The fp32 path whose micro-kernel the fp32_fallback unit runs.
  simd_path fallback_path() const { return path_; }
  /// Bytes of the packed panels.
  std::size_t bytes() const { return elements_ * sizeof(bf16_bits); }
  /// The packed elements (layout above).
  const bf16_bits* panels() const { return reinterpret_cast<const bf16_bits*>(panels_.data()); }

 private:
  template <class Element>
  void pack(const Element& element, bool contiguous_in_k);

  std::size_t k_, n_;
  bf16_unit unit_;
  simd_path path_;
  std::size_t elements_ = 0;
  aligned_buffer panels_;
};

/// C = round_bf16(op(A)) * B + beta * C (see the top of this file), on B's unit.
void gemm_bf16(gemm_shape shape, gemm_operand a, const packed_bf16_b& b, float beta, float* c, std::size_t ldc);

/// bf16 products over a B another layer packed (bf16 attention's q kᵀ and
/// p v over a chunk's packed K and V or a KV cache's blocks):
///
///   C = alpha * round_bf16(A) * round_bf16(B)      (A m x k, not transposed)
///
/// B a paged_b_view (gemm.hpp) of f32, bf16 or f16 elements on a path whose
/// NR is 32, its pages at most KC deep, each page along k an even number of
/// rows. Rounding to nearest even, subnormal fp32 read as zero: values that
/// are bf16 already (attention's rounded q, k, v and p) are exact. Sum: the
/// active unit's (bf16_microkernel.hpp): avx512bf16's in pairs of k from
/// k = 0, amx's in tiles of 32 k from k = 0 (each B panel staged in L1 in
/// the tiles' layout first, unless B comes in it: panel_layout::tile_pairs,
/// amx only), on across the pages of a B paged along k. On one machine C(i, j) depends
/// only on row i of A and column j of B: bit-identical however the rows,
/// columns and pages are cut. Runs on the calling thread. Throws
/// std::invalid_argument naming the problem for bad arguments or when
/// gemm_bf16_paged_runs is false.
/// `converted`, when not null: A's rows as convert_rows_bf16 made them from
/// this A (the same m and k, here), read instead of converting A again (the
/// same values); named in the error otherwise.
struct bf16_rows;
void gemm_bf16_paged(gemm_shape shape, float alpha, gemm_operand a, const paged_b_view& b, float* c, std::size_t ldc,
                     const bf16_rows* converted = nullptr);

/// A's m rows of depth k rounded to bf16 as gemm_bf16_paged reads them (the
/// active unit's conversion and row layout: ld elements apart, zero past k,
/// `held` rows with zero rows past m up to whole tile blocks on amx).
/// convert_rows_bf16 writes them into storage of bf16_rows_floats floats;
/// bf16_rows_at reads back the view of rows written there before. Made
/// once, they serve every product with the same A (a tile's queries against
/// each chunk of keys).
struct bf16_rows {
  const bf16_bits* rows;
  std::size_t m, k, ld, held;
};
std::size_t bf16_rows_floats(std::size_t m, std::size_t k);
bf16_rows bf16_rows_at(std::size_t m, std::size_t k, const float* storage);
bf16_rows convert_rows_bf16(gemm_operand a, std::size_t m, std::size_t k, float* storage);

/// Whether gemm_bf16_paged runs here over B packed for `path` with
/// elements `element`: the active bf16 unit is a hardware one (amx or
/// avx512bf16; every AMX CPU has AVX512-BF16, whose kernels this uses), the
/// path's NR is 32, and element is f32, bf16 or f16.
bool gemm_bf16_paged_runs(simd_path path, kv_dtype element);

/// Whether attention's products in `precision` over K/V stored as `element`
/// (bf16 precision, or a bf16 cache in either) take gemm_bf16_paged: it
/// runs here, and the unit is amx in bf16 precision or the path's kernel
/// configuration says so (kernel_config_row::bf16_paged_products); else
/// they take the fp32 kernels over the same rounded values. (amx's form for
/// a decode step's few rows streams a bf16 cache 8-11% slower than the fp32
/// kernels, which also keep q unrounded: Xeon, S1 and S5 over a bf16 cache
/// in f32 precision, 2 alternations; so only bf16 precision takes it.)
bool bf16_paged_products_chosen(simd_path path, kv_dtype element, kvhead::precision precision);

/// packed_b_view's tile_pairs layout (gemm.hpp) of a k x n operand: panels
/// of 32 columns, each tile_pairs_depth(k) rows as [pairs][32][2] (element
/// (row, col) at tile_pairs_offset), zero past k and n: gemm_bf16_paged's
/// B panels as the amx tiles load them, packed once for many products
/// (pack_tile_pairs) instead of staged by each product.
inline constexpr std::size_t tile_pairs_k_step = 32;  // one tdpbf16ps: 16 pairs
inline std::size_t tile_pairs_depth(std::size_t k) {
  return std::max<std::size_t>(1, (k + tile_pairs_k_step - 1) / tile_pairs_k_step) * tile_pairs_k_step;
}
inline std::size_t tile_pairs_offset(std::size_t k, std::size_t row, std::size_t col) {
  return col / bf16_nr * tile_pairs_depth(k) * bf16_nr + (row / 2 * bf16_nr + col % bf16_nr) * 2 + row % 2;
}
inline std::size_t tile_pairs_elements(std::size_t k, std::size_t n) {
  return std::max<std::size_t>(1, (n + bf16_nr - 1) / bf16_nr) * tile_pairs_depth(k) * bf16_nr;
}

/// Whether gemm_bf16_paged reads B in the tile_pairs layout here: the
/// active unit is amx.
bool gemm_bf16_paged_reads_tile_pairs();

/// A packed fp32 operand (`from`: packed_b_view's rows layout on a path of
/// NR 32, k <= KC, f32 elements, its padding columns zero as pack_b writes
/// them) into the tile_pairs layout at `to`
/// (tile_pairs_elements(from.k, from.n)), each element converted as the amx
/// unit stages it (vcvtne2ps2bf16: to nearest even, subnormal fp32 read as
/// zero), so a product over `to` has the bits of one over `from`. Requires
/// gemm_bf16_paged_reads_tile_pairs(); throws std::invalid_argument
/// otherwise or for a bad operand.
void pack_tile_pairs(const packed_b_view& from, bf16_bits* to);

/// How many k gemm_bf16_paged sums as one group here, from B's first row
/// on (2 on vdpbf16ps: pairs; 32 on amx tiles: a tdpbf16ps): two products
/// that read the same values give the same bits when their first rows are
/// a multiple of it apart (zeros before, in A or B, add nothing).
std::size_t gemm_bf16_paged_k_group();

}  // namespace kvhead::engine
