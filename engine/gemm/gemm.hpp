// Single-precision GEMM, row-major:  C = alpha * op(A) * op(B) + beta * C
//
//   op(A) is m x k: A itself (a[i*lda + p], lda >= k) or, transposed, A is
//         k x m (a[p*lda + i], lda >= m);
//   op(B) is k x n: B itself (b[p*ldb + j], ldb >= n) or, transposed, B is
//         n x k (b[j*ldb + p], ldb >= k);
//   C     is m x n (c[i*ldc + j], ldc >= n).
// m or n = 0 does nothing; k = 0 gives C = beta * C; beta = 0 overwrites C
// (NaN in the old C never reaches the result). C must not overlap A or B.
// Bad arguments (a leading dimension too small, a null pointer with a
// non-empty shape) throw std::invalid_argument naming the argument.
//
// Structure (BLIS): pack panels of A and B, sweep them with the register
// micro-kernel (microkernel.hpp), blocks sized per ISA (blocking.hpp). Work is
// split over blocks of C with oneTBB, in the caller's task_arena.
//
// Determinism. Element C(i, j) is computed as: for each KC-block of k in
// increasing order, acc = sum over the block by fused multiply-add in
// increasing k, then C = alpha * acc + beta' * C, where beta' is beta for the
// first block and 1 after. KC is fixed per ISA. So on one SIMD path, C(i, j)
// depends only on row i of op(A), column j of op(B), alpha, beta and C(i, j):
// bit-identical whatever m, n, the other rows, the thread count, or whether B
// was pre-packed. (Different paths round differently: sse2 has no FMA.)
#pragma once

#include <cstddef>

#include "engine/arch/aligned_buffer.hpp"
#include "engine/gemm/blocking.hpp"
#include "kvhead/config.hpp"

namespace kvhead::engine {

enum class transpose : bool { no = false, yes = true };

/// A row-major operand: element (row, col) of op(X) at the index below.
struct gemm_operand {
  const float* data;
  std::size_t ld;
  transpose trans;
};

struct gemm_shape {
  std::size_t m, n, k;
};

void gemm(gemm_shape shape, float alpha, gemm_operand a, gemm_operand b, float beta, float* c, std::size_t ldc,
          simd_path path = active_simd_path());

/// The same with explicit blocking for the kernels of `config` (one path's
/// gemm_config with other MC or NC, say): same bits as gemm() on that path,
/// whatever MC and NC are (tested), since KC alone orders the sum.
void gemm(gemm_shape shape, float alpha, gemm_operand a, gemm_operand b, float beta, float* c, std::size_t ldc,
          const gemm_config& config);

/// A read-only view of op(B) (k x n) already in the micro-kernel's packed
/// layout for one SIMD path: for each KC-deep block of rows (in order), the
/// ceil(n / NR) micro-panels of that block, each (block depth x NR)
/// elements, columns past n padding. Produced by packed_b (fp32), or written
/// directly in this layout (pack_b_offset) by owners of long-lived operands
/// such as a KV cache, whose elements may be bf16, f16 or int8
/// (stored_element.hpp): the micro-kernel widens them to fp32 as it loads
/// them, and computes as if B held the widened values.
/// layout tile_pairs (bf16 elements, read by the amx unit's paged products
/// only: gemm_bf16.hpp): instead the ceil(n / 32) panels of the amx tiles'
/// [pairs][32][2] layout (k <= KC, padded with zero rows to a multiple of
/// 32: tile_pairs_offset), the fp32 panels staged once for many products.
enum class panel_layout { rows, tile_pairs };
struct packed_b_view {
  const void* panels;
  std::size_t k, n;
  simd_path path;
  kv_dtype element = kv_dtype::f32;
  panel_layout layout = panel_layout::rows;
};

/// Element offset of element (row, col) of op(B) in the packed layout of a
/// k x n operand, for a path's blocking.
std::size_t pack_b_offset(const gemm_config& config, std::size_t k, std::size_t n, std::size_t row, std::size_t col);

/// Elements a packed k x n operand occupies.
std::size_t packed_b_floats(const gemm_config& config, std::size_t k, std::size_t n);

/// op(B) (k x n) packed once into micro-panels for one SIMD path, to be
/// applied to many A (weight matrices). Holds its own copy: B may be freed.
class packed_b {
 public:
  packed_b(std::size_t k, std::size_t n, gemm_operand b, simd_path path = active_simd_path());

  std::size_t k() const { return k_; }
  std::size_t n() const { return n_; }
  packed_b_view view() const { return {panels_.data(), k_, n_, path_}; }

 private:
  std::size_t k_, n_;
  simd_path path_;
  aligned_buffer panels_;
};

/// How the elements of A enter the micro-kernel: as they are, or rounded to
/// the nearest even bf16 value (round_to_bf16, stored_element.hpp) as A is
/// packed. Rounded, the result has the bits of the same call on an A
/// rounded beforehand (the bf16 GEMM's portable fallback, gemm_bf16.hpp).
enum class a_rounding { none, bf16 };

/// C = alpha * op(A) * B[0:k, 0:n] + beta * C: the leading k x n block of a
/// pre-packed B (shape.k <= b.k, shape.n <= b.n), m x k times k x n.
/// Same arithmetic, so the same bits, as gemm() with that block unpacked
/// (widened to fp32 when stored in another element type).
void gemm(gemm_shape shape, float alpha, gemm_operand a, packed_b_view b, float beta, float* c, std::size_t ldc,
          a_rounding rounding = a_rounding::none);

/// op(B) (k x n) cut into pages of `page` rows (along_k) or columns (else):
/// page i is a packed operand of its own (packed_b_view layout, `page` rows
/// x n, or k x `page` columns) at pages[i], anywhere in memory, all of one
/// element type: the blocks of a KV cache read as one operand, in one call.
/// Column pages need not be whole NR panels: a page's last panel may be
/// narrower (zero-padded in memory), all in one call.
/// narrow_row_stride (column pages of fewer than NR columns only): nonzero
/// when each page is instead one narrow panel, row r of it at r *
/// narrow_row_stride elements (>= page; a KV cache's 16-key blocks on a
/// 32-wide path). Pages of at most NR / 2 columns run the half-panel
/// kernels (microkernel.hpp); wider narrow pages read whole NR-wide rows,
/// so the page's last row reads up to NR - narrow_row_stride elements past
/// it, which must be readable memory (they only reach columns never used).
/// layout tile_pairs: every page in packed_b_view's tile_pairs layout (all
/// of k in one page: gemm_bf16_paged's amx tiles only).
struct paged_b_view {
  const void* const* pages;
  std::size_t page;
  bool along_k;
  std::size_t k, n;
  simd_path path;
  kv_dtype element = kv_dtype::f32;
  std::size_t narrow_row_stride = 0;
  panel_layout layout = panel_layout::rows;
};

/// Whether b's narrow pages, if any, are as paged_b_view says (column pages
/// of fewer than `nr` columns, within their row stride): the check every
/// paged product makes.
inline bool narrow_pages_valid(const paged_b_view& b, std::size_t nr) {
  return b.narrow_row_stride == 0 || (!b.along_k && b.page < nr && b.narrow_row_stride >= b.page);
}

/// C = alpha * op(A) * B + beta * C over a paged B, with the bits of gemm()
/// over the concatenated B: across column pages every column is computed
/// alone; across row pages each element's FMA chain continues from page to
/// page, which requires k <= KC, alpha = 1 and beta = 0 (checked).
void gemm(gemm_shape shape, float alpha, gemm_operand a, const paged_b_view& b, float beta, float* c, std::size_t ldc,
          a_rounding rounding = a_rounding::none);

/// While alive, GEMM calls (gemm, gemm_bf16) made by this thread run serially (for callers that
/// already run one GEMM per parallel task). Never changes a result.
class gemm_serial_scope {
 public:
  gemm_serial_scope();
  ~gemm_serial_scope();
  gemm_serial_scope(const gemm_serial_scope&) = delete;
  gemm_serial_scope& operator=(const gemm_serial_scope&) = delete;

  /// Whether one is open on the calling thread.
  static bool active();
};

}  // namespace kvhead::engine
