// Integer products over an int8 paged B (attention's q kᵀ and p v over an
// int8 KV cache's blocks, read in place):
//
//   C = alpha * s_i * (a_i . b8_j)        for row i of A, column j of B
//
// Each row of fp32 A is quantized with its own scale, to one of two widths
// (a_quantization):
//   int16  s_i = max_k |A(i, k)| / 32767, a = A / s_i rounded to nearest
//          even, in [-32767, 32767] (relative error at most 2^-16 of the
//          row's largest element): p v, whose small probabilities must not
//          vanish;
//   int8   s_i = max_k |A(i, k)| / 127, a in [-127, 127] (at most 2^-8 of the
//          largest element, the order of the int8 B's own rounding): q kᵀ,
//          where a byte per element lets one instruction take four of k.
// Both in fp32 arithmetic (division, rounding to nearest even); a row of
// zeros has s = 0 and a = 0; a row holding a NaN or an Inf has s = NaN (its
// C row is NaN). The dot products with int8 are exact in int32
// (static_asserts below), so their order cannot matter: C(i, j) depends
// only on row i of A and column j of B, whatever the cut into rows, columns
// or pages, on any CPU that runs the kernels. The sum becomes fp32 by one
// rounding to nearest even, then C = (alpha * s_i) * sum.
//
// Kernels (int8_paged_params), over panels as wide as their path's NR:
//   avx512 path with AVX512-VNNI and AVX512-VBMI (32-column panels): int16
//     A by vpdpwssd (32 multiply-adds of int16 pairs per instruction, twice
//     an fp32 FMA's), int8 A by vpdpbusd (64 multiply-adds of byte quads,
//     B's bytes regrouped by vpermt2b);
//   avx2 path (16-column panels): int16 A by vpmaddwd and vpaddd (16
//     multiply-adds of int16 pairs per pair of instructions, against 8 per
//     FMA of the widened int8), no int8 A kernels (AVX2's byte product
//     vpmaddubsw saturates its int16 sums): q kᵀ takes int16 A there too
//     (int8_scores_quantization);
// their scalar emulation, exact by construction, tests the driver and the
// layouts of either width on any CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "engine/arch/kernel_config.hpp"
#include "engine/gemm/gemm.hpp"

namespace kvhead::engine {

/// How gemm_int8_paged quantizes A's rows (above).
enum class a_quantization { int16, int8 };

inline constexpr std::int32_t int16_quantum = 32767;  // |a| <= this, int16 A
inline constexpr std::int32_t int8_quantum = 127;     // |a| <= this, int8 A
static_assert(std::uint64_t{gemm_kc} * int16_quantum * 127 <= std::uint64_t{std::numeric_limits<std::int32_t>::max()},
              "the int32 sums of gemm_int8_paged must be exact up to KC terms");
// vpdpbusd multiplies unsigned by signed bytes: the kernels take B + 128 (in
// [1, 255]) times a, then subtract 128 * sum_k a, each sum exact in int32.
static_assert(std::uint64_t{gemm_kc} * 255 * int8_quantum <= std::uint64_t{std::numeric_limits<std::int32_t>::max()},
              "the int32 sums of gemm_int8_paged's int8 kernels must be exact up to KC terms");

/// The paged kernel (rows 1..mr of quantized A against one panel of int8 B,
/// panel_columns wide; the layout of bf16_paged_params in bf16_microkernel.hpp):
///   C[0:rows, 0:cols] := (alpha * a_scales[r]) * float(sum_k a[r][k] b[k][col])
/// A quantized rows (int16 or int8, as the kernel's table says), a_row_stride
/// elements apart (a multiple of 2 for int16, of 4 for int8, zero past the
/// depth up to it) and, for int8, a_sums[r] = sum_k a[r][k]; B's rows in
/// pages (row k of page i at b_pages[i] + k * b_row_stride, page_rows per
/// page: even for int16 A, a multiple of 4 for int8 A), only `cols` columns
/// written. The int8 A kernels read a panel's rows 32 bytes apart
/// (b_row_stride 32; the narrow ones, for a narrow panel of 16 columns, 16
/// bytes apart) and whole rows, columns past `cols` included; the int16 A
/// kernels rows 32 or 16 bytes apart (b_row_stride), `cols` columns of each
/// (AVX512-VNNI) or whole 16-byte rows (AVX2: b_row_stride 16).
/// carry (int16 A only, null otherwise): the int32 sums of a product whose
/// pages run over several calls, in the kernel's own layout: with carry_in the sums start from it instead of 0; with
/// carry_out they are left in it and C is not written. Integer sums are
/// exact, so the bits are those of one call over all the pages. A tile's
/// carry is rows x panel_columns int32. prefetch: how far ahead each step prefetches
/// its rows' bytes (paged_stream_prefetch, kernel_config.hpp). panels (only
/// where int8_paged_kernels::page_panels, else 1): the call computes that
/// many panels, each page's panel j at b_pages[i] + j * panel_stride bytes,
/// its C columns from c + j * panel_columns, its carry tile from carry + j *
/// rows * panel_columns; all but the last whole, `cols` the last one's width.
struct int8_paged_params {
  const void* a;
  std::size_t a_row_stride;
  const float* a_scales;
  const std::int32_t* a_sums;  // int8 A only
  const void* const* b_pages;
  std::size_t page_rows, depth, b_row_stride, cols;
  float alpha;
  float* c;
  std::size_t ldc;
  std::int32_t* carry = nullptr;
  bool carry_in = false, carry_out = false;
  stream_prefetch prefetch{};
  std::size_t panels = 1, panel_stride = 0;
};
using int8_paged_function = void (*)(const int8_paged_params&);

/// Rows [0, rows) of fp32 A, columns [0, cols), to int16 rows (to_ld
/// apart, zero up to a whole pair) and their scales (quantization above).
using int16_quantize_rows_function = void (*)(const float* from, std::size_t from_ld, std::size_t rows,
                                              std::size_t cols, std::int16_t* to, std::size_t to_ld, float* scales);
/// The same to int8 rows (zero up to a whole quad) and their sums as well.
using int8_quantize_rows_function = void (*)(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols,
                                             std::int8_t* to, std::size_t to_ld, float* scales, std::int32_t* sums);

struct int8_paged_kernels {
  std::size_t mr;
  std::size_t panel_columns;                         // the width of the panels read: the path's NR
  const int8_paged_function* int16_a_by_rows;        // [rows - 1]
  const int8_paged_function* int8_a_by_rows;         // [rows - 1]; null: no int8 A kernels
  const int8_paged_function* int8_a_narrow_by_rows;  // [rows - 1], 16-byte rows (narrow pages); null as int8_a_by_rows
  bool page_panels;                                  // the int16 A kernels take several panels a call
  int16_quantize_rows_function quantize_rows_int16;
  int8_quantize_rows_function quantize_rows_int8;
};

/// The hardware kernels (kernels_avx512vnni.cpp: 32-column panels;
/// kernels_avx2int8.cpp: 16-column panels, int16 A only) and their scalar
/// emulation over panels `panel_columns` wide (32 or 16), with int8 A
/// kernels at either width.
const int8_paged_kernels& avx512vnni_int8_paged_kernels();
const int8_paged_kernels& avx2_int8_paged_kernels();
const int8_paged_kernels& emulated_int8_paged_kernels(std::size_t panel_columns = 32);

/// The hardware kernels that run here over B packed for `path`, or null
/// (gemm_int8_paged_runs below).
const int8_paged_kernels* int8_paged_kernels_for(simd_path path);

/// How attention's q kᵀ quantizes the queries on `path` (where
/// gemm_int8_paged_runs): int8 where the kernels have int8 A kernels, int16
/// otherwise.
a_quantization int8_scores_quantization(simd_path path);

/// A's m rows of depth k quantized as `quantization` says (above), in the
/// layout the kernels read: the rows' scales, (int8) their sums, then the
/// rows, ld elements apart. quantize_rows writes them into storage of
/// quantized_rows_floats floats; quantized_rows_at reads back the view of
/// rows written there before. Made once, they serve every product with the
/// same A (a tile's queries against each chunk of keys).
struct quantized_rows {
  a_quantization quantization;
  std::size_t m, k, ld;
  const float* scales;
  const std::int32_t* sums;  // int8 only
  const void* rows;
};
std::size_t quantized_rows_floats(a_quantization quantization, std::size_t m, std::size_t k);
quantized_rows quantized_rows_at(a_quantization quantization, std::size_t m, std::size_t k, const float* storage);
/// By the given kernels (gemm_int8_paged_with's), or the hardware's for
/// `path` (gemm_int8_paged's; where gemm_int8_paged_runs).
quantized_rows quantize_rows_with(const int8_paged_kernels& kernels, a_quantization quantization, gemm_operand a,
                                  std::size_t m, std::size_t k, float* storage);
quantized_rows quantize_rows(simd_path path, a_quantization quantization, gemm_operand a, std::size_t m, std::size_t k,
                             float* storage);

/// C = alpha * quantized(A) * B (above, A's rows quantized as `quantization`
/// says) for A m x k (not transposed) and B a paged_b_view of int8 elements
/// on a path whose NR is the kernels' panel width, pages at most KC deep,
/// each page along k an even number of rows (int16 A) or a multiple of 4
/// (int8 A, where the kernels have it), narrow pages
/// (paged_b_view::narrow_row_stride) of row stride 16 for either A. Runs on the
/// calling thread. `quantized`, when not null: A's rows as quantize_rows made
/// them from this A (the same quantization, m and k), read instead of
/// quantizing A again (the same values). Throws std::invalid_argument naming
/// the problem for bad arguments or when gemm_int8_paged_runs is false.
void gemm_int8_paged(a_quantization quantization, gemm_shape shape, float alpha, gemm_operand a, const paged_b_view& b,
                     float* c, std::size_t ldc, const quantized_rows* quantized = nullptr);

/// pv_rows_per_call of gemm_int8_paged_with: the configuration's
/// (kernel_config_row::int8_pv_rows_per_call).
inline constexpr std::size_t int8_pv_rows_configured = ~std::size_t{0};

/// The same through the given kernels (the emulation runs on any CPU); a
/// single row block of int16 A over row pages (p v) takes pages of fewer
/// than pv_rows_per_call rows several to a call. No value changes.
void gemm_int8_paged_with(const int8_paged_kernels& kernels, a_quantization quantization, gemm_shape shape, float alpha,
                          gemm_operand a, const paged_b_view& b, float* c, std::size_t ldc,
                          std::size_t pv_rows_per_call = int8_pv_rows_configured,
                          const quantized_rows* quantized = nullptr);

/// Whether gemm_int8_paged runs here over B packed for `path` with elements
/// `element`: element is int8 and either path is avx512, CPUID reports
/// AVX512-VNNI and AVX512-VBMI and KVHEAD_ISA does not name avx512 or a
/// lower path (its levels amx and avx512bf16 sit above avx512), or path is
/// avx2 (which runs only where the CPU has AVX2).
bool gemm_int8_paged_runs(simd_path path, kv_dtype element);

}  // namespace kvhead::engine
