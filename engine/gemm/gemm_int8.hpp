// Integer products over an int8 paged B (attention's q kᵀ and p v over an
// int8 KV cache's blocks, read in place):
//
//   C = alpha * s_i * (a16_i . b8_j)        for row i of A, column j of B
//
// Each row of fp32 A is quantized to int16 with its own scale s_i = max_k
// |A(i, k)| / 32767 (fp32 division): a16 = A / s_i (fp32 division) rounded
// to nearest even, in [-32767, 32767] (relative error at most 2^-16 of the
// row's largest element); a row of zeros has s = 0 and a16 = 0; a row
// holding a NaN or an Inf has s = NaN (its C row is NaN). The dot products
// of int16 and int8 are exact in int32 (|sum| <= KC * 32767 * 127 < 2^31,
// static_assert below), so their order cannot matter: C(i, j) depends only
// on row i of A and column j of B, whatever the cut into rows, columns or
// pages, on any CPU that runs the kernels. The sum becomes fp32 by one
// rounding to nearest even, then C = (alpha * s_i) * sum.
//
// Kernels (int8_paged_params): AVX512-VNNI's vpdpwssd (32 multiply-adds of
// int16 pairs per instruction, twice an fp32 FMA's) on the avx512 path;
// their scalar emulation, exact by construction, tests the driver and the
// layouts on any CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "engine/arch/kernel_config.hpp"
#include "engine/gemm/gemm.hpp"

namespace kvhead::engine {

inline constexpr std::int32_t int16_quantum = 32767;  // |a16| <= this
static_assert(std::uint64_t{gemm_kc} * int16_quantum * 127 <= std::uint64_t{std::numeric_limits<std::int32_t>::max()},
              "the int32 sums of gemm_int8_paged must be exact up to KC terms");

/// The paged kernel (rows 1..mr of quantized A against one 32-column panel
/// of int8 B; the layout of bf16_paged_params in bf16_microkernel.hpp):
///   C[0:rows, 0:cols] := (alpha * a_scales[r]) * float(sum_k a[r][k] b[k][col])
/// A int16 rows, a_row_stride apart (even, zero past the depth up to a
/// pair); B's rows in pages (row k of page i at b_pages[i] + k *
/// b_row_stride, page_rows per page, even), only `cols` columns read and
/// written.
struct int8_paged_params {
  const std::int16_t* a;
  std::size_t a_row_stride;
  const float* a_scales;
  const void* const* b_pages;
  std::size_t page_rows, depth, b_row_stride, cols;
  float alpha;
  float* c;
  std::size_t ldc;
};
using int8_paged_function = void (*)(const int8_paged_params&);

/// Rows [0, rows) of fp32 A, columns [0, cols), to int16 rows (to_ld
/// apart, zero up to a whole pair) and their scales (quantization above).
using int16_quantize_rows_function = void (*)(const float* from, std::size_t from_ld, std::size_t rows,
                                              std::size_t cols, std::int16_t* to, std::size_t to_ld, float* scales);

struct int8_paged_kernels {
  std::size_t mr;
  const int8_paged_function* by_rows;  // [rows - 1]
  int16_quantize_rows_function quantize_rows;
};

/// The hardware kernels (kernels_avx512vnni.cpp) and their scalar emulation.
const int8_paged_kernels& avx512vnni_int8_paged_kernels();
const int8_paged_kernels& emulated_int8_paged_kernels();

/// C = alpha * quantized(A) * B (above) for A m x k (not transposed) and B a
/// paged_b_view of int8 elements on a path whose NR is 32, pages at most KC
/// deep, each page along k an even number of rows. Runs on the calling
/// thread. Throws std::invalid_argument naming the problem for bad
/// arguments or when gemm_int8_paged_runs is false.
void gemm_int8_paged(gemm_shape shape, float alpha, gemm_operand a, const paged_b_view& b, float* c, std::size_t ldc);

/// The same through the given kernels (the emulation runs on any CPU).
void gemm_int8_paged_with(const int8_paged_kernels& kernels, gemm_shape shape, float alpha, gemm_operand a,
                          const paged_b_view& b, float* c, std::size_t ldc);

/// Whether gemm_int8_paged runs here over B packed for `path` with elements
/// `element`: CPUID reports AVX512-VNNI, KVHEAD_ISA does not name avx512 or
/// a lower path (its levels amx and avx512bf16 sit above avx512), the path's
/// NR is 32 and element is int8.
bool gemm_int8_paged_runs(simd_path path, kv_dtype element);

}  // namespace kvhead::engine
