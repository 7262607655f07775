// The int8 paged kernels (contract in gemm_int8.hpp): this TU alone is built
// with AVX-512 F/DQ/BW, AVX512-VNNI and AVX512-VBMI flags
// (engine/CMakeLists.txt).
//
// Blocking: Rows x 32 int32 accumulators (2 zmm per row) for the whole
// depth, one B panel of 32 columns, as the bf16 paged kernel.
//   int16 A (p v): each pair step loads rows 2q and 2q + 1 of the panel (32
//   bytes each), interleaves their bytes within 128-bit lanes (vpunpcklbw,
//   vpunpckhbw on ymm) and sign-extends the pairs to int16 (vpmovsxbw): 4
//   shuffles, two of them 256-bit, per 2 * Rows vpdpwssd, each 32
//   multiply-adds of int16 pairs into int32, exact. The lanes then hold
//   columns in the order 0-7, 16-23 | 8-15, 24-31; one 128-bit block shuffle
//   per output vector restores C's order.
//   int8 A (q kᵀ): each quad step loads rows 4q .. 4q + 3 (128 contiguous
//   bytes), regroups them into the quads of columns 0-15 and 16-31 (two
//   vpermt2b) and makes them unsigned (xor 0x80: b + 128): 4 operations per
//   2 * Rows vpdpbusd, each 64 multiply-adds of byte quads, twice vpdpwssd's
//   depth per instruction. The sums lose 128 * sum_k a at the end. A narrow
//   panel (16 columns, rows 16 bytes apart: a 16-token block's keys) holds
//   its 4 rows in one zmm: one vpermb, one accumulator per row.
#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "engine/gemm/gemm_int8.hpp"
#include "engine/gemm/panel_row_loads.hpp"

namespace kvhead::engine {
namespace {

// 12 rows: 24 accumulators, then for int16 A 2 pair vectors, 2 row halves
// and a broadcast (29 of 32 zmm; with vpermt2w's 2 index vectors as well,
// GCC 12 spilled the accumulators of 8 rows and more to the stack), for int8
// A 2 index vectors, the 0x80 bytes, rows 0-1, 2 quad vectors and a
// broadcast (31; rows 2-3 are a memory operand). No spills in either
// (objdump).
constexpr std::size_t vnni_mr = 12;

using panel_rows::first_lanes;

// Rows `even` and `odd` of a B panel, columns [0, 32) as loaded (load_bytes:
// zeros past the panel's columns), as int16 pairs: in-lane byte interleaves
// (vpunpck*bw, 256-bit) then sign extension, so pairs[0] holds columns 0-7
// and 16-23 and pairs[1] columns 8-15 and 24-31 (the kernel puts C back in
// order once).
inline void widen_pairs(__m256i even_row, __m256i odd_row, __m512i pairs[2]) {
  pairs[0] = _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(even_row, odd_row));
  pairs[1] = _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(even_row, odd_row));
}

// RowBytes: the panel's row stride, 32 (a 32-column panel) or 16 (a narrow
// panel's 16 columns), a constant, so the pair loop holds no index
// arithmetic, no loop over prefetched lines and no test for a missing odd
// row (the last row's pair, after the loop); read at run time, it held 3
// such tests per pair step. Zen 5, S1's geometry over an int8 cache in L3
// (past 4095, one sequence, 2 alternations): block 16 366-371 -> 351-356
// us, block 256 271-277 -> 269-271 us; from DRAM within the noise. Whole:
// all 32 columns present, plain loads (panel_row_loads.hpp).
template <std::size_t Rows, bool Whole, std::size_t RowBytes>
void int16_a_kernel(const int8_paged_params& params) {
  static_assert(Rows <= vnni_mr && (RowBytes == 32 || (RowBytes == 16 && !Whole)));
  constexpr std::size_t row_bytes = RowBytes;
  __m512i acc[Rows][2];
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row)
    for (std::size_t v = 0; v < 2; ++v)
      acc[row][v] = params.carry_in ? _mm512_loadu_si512(params.carry + (2 * row + v) * 16) : _mm512_setzero_si512();
  const __mmask32 lanes = first_lanes(params.cols);
  const auto* const a_rows = static_cast<const std::int16_t*>(params.a);
  auto step = [&](const __m512i pairs[2], const std::int16_t* a) {
#pragma GCC unroll 16
    for (std::size_t row = 0; row < Rows; ++row) {
      std::int32_t pair = 0;
      std::memcpy(&pair, a + row * params.a_row_stride, sizeof pair);  // two int16
      const __m512i a_pair = _mm512_set1_epi32(pair);
      acc[row][0] = _mm512_dpwssd_epi32(acc[row][0], a_pair, pairs[0]);
      acc[row][1] = _mm512_dpwssd_epi32(acc[row][1], a_pair, pairs[1]);
    }
  };
  for (std::size_t page = 0, row0 = 0; row0 < params.depth; ++page, row0 += params.page_rows) {
    const auto* b = static_cast<const std::int8_t*>(params.b_pages[page]);
    const std::size_t rows = std::min(params.page_rows, params.depth - row0);
    __m512i pairs[2];
    std::size_t k = 0;
    for (; k + 1 < rows; k += 2) {
      panel_rows::prefetch_ahead(b + k * row_bytes, 2 * row_bytes, params.prefetch);
      widen_pairs(panel_rows::load_bytes<Whole>(b + k * row_bytes, lanes),
                  panel_rows::load_bytes<Whole>(b + (k + 1) * row_bytes, lanes), pairs);
      step(pairs, a_rows + row0 + k);
    }
    if (k < rows) {  // the last row: its pair's odd row is zero
      widen_pairs(panel_rows::load_bytes<Whole>(b + k * row_bytes, lanes), _mm256_setzero_si256(), pairs);
      step(pairs, a_rows + row0 + k);
    }
  }
  if (params.carry_out) {  // the accumulators as they are (their lane order is this kernel's)
#pragma GCC unroll 16
    for (std::size_t row = 0; row < Rows; ++row)
      for (std::size_t v = 0; v < 2; ++v) _mm512_storeu_si512(params.carry + (2 * row + v) * 16, acc[row][v]);
    return;
  }
  const auto low = __mmask16(lanes), high = __mmask16(lanes >> 16);
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row) {
    const __m512 scale = _mm512_set1_ps(params.alpha * params.a_scales[row]);
    float* c = params.c + row * params.ldc;
    constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    // Columns 0-15: the low halves of both accumulators; 16-31: the high halves.
    const __m512i first = _mm512_shuffle_i64x2(acc[row][0], acc[row][1], 0x44);
    const __m512i second = _mm512_shuffle_i64x2(acc[row][0], acc[row][1], 0xee);
    _mm512_mask_storeu_ps(c, low, _mm512_mul_ps(scale, _mm512_cvt_roundepi32_ps(first, nearest)));
    _mm512_mask_storeu_ps(c + 16, high, _mm512_mul_ps(scale, _mm512_cvt_roundepi32_ps(second, nearest)));
  }
}

// vpermt2b's (vpermb's, for 16-byte rows) indices over 4 rows of a panel,
// row_bytes apart (rows 0, 1 in bytes 0-63 and rows 2, 3 in 64-127 for
// 32-byte rows; all four in bytes 0-63 for 16-byte rows): byte 4c + r of the
// result is row r of column `first` + c.
constexpr std::array<std::int8_t, 64> quad_indices(int row_bytes, int first) {
  std::array<std::int8_t, 64> index{};
  for (int col = 0; col < 16; ++col)
    for (int row = 0; row < 4; ++row) index[std::size_t(4 * col + row)] = std::int8_t(row * row_bytes + first + col);
  return index;
}
constexpr std::array<std::int8_t, 64> low_quads = quad_indices(32, 0), high_quads = quad_indices(32, 16),
                                      narrow_quads = quad_indices(16, 0);

// The first `count` bytes of 64 (count <= 64).
inline __mmask64 first_bytes(std::size_t count) { return count >= 64 ? ~__mmask64{0} : (__mmask64{1} << count) - 1; }

// RowBytes: 32 (a 32-column panel) or 16 (a narrow panel of 16 columns, a
// 16-token block's keys: 4 rows in one zmm, one vpermb, one accumulator
// per row).
template <std::size_t Rows, std::size_t RowBytes>
void int8_a_kernel(const int8_paged_params& params) {
  static_assert(Rows <= vnni_mr && (RowBytes == 32 || RowBytes == 16));
  constexpr std::size_t row_bytes = RowBytes;  // a panel's rows, contiguous (b_row_stride RowBytes)
  constexpr std::size_t vectors = RowBytes / 16;
  __m512i acc[Rows][vectors];
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row)
    for (std::size_t v = 0; v < vectors; ++v) acc[row][v] = _mm512_setzero_si512();
  const __m512i low_index = _mm512_loadu_si512(RowBytes == 32 ? low_quads.data() : narrow_quads.data());
  const __m512i high_index = _mm512_loadu_si512(high_quads.data());
  const __m512i unsigned_offset = _mm512_set1_epi8(char(0x80));
  const auto* const a_rows = static_cast<const std::int8_t*>(params.a);
  // Rows 0-1 and 2-3 of a quad (the rows past the depth zero) as unsigned
  // quads of columns 0-15 and 16-31 (16-byte rows: all four rows in
  // first_rows, quads of columns 0-15), into the accumulators.
  auto step = [&](__m512i first_rows, __m512i last_rows, const std::int8_t* a) {
    __m512i quads[vectors];
    if constexpr (RowBytes == 32) {
      quads[0] = _mm512_xor_si512(_mm512_permutex2var_epi8(first_rows, low_index, last_rows), unsigned_offset);
      quads[1] = _mm512_xor_si512(_mm512_permutex2var_epi8(first_rows, high_index, last_rows), unsigned_offset);
    } else {
      quads[0] = _mm512_xor_si512(_mm512_permutexvar_epi8(low_index, first_rows), unsigned_offset);
    }
#pragma GCC unroll 16
    for (std::size_t row = 0; row < Rows; ++row) {
      std::int32_t quad = 0;
      std::memcpy(&quad, a + row * params.a_row_stride, sizeof quad);  // four int8
      const __m512i a_quad = _mm512_set1_epi32(quad);
      for (std::size_t v = 0; v < vectors; ++v) acc[row][v] = _mm512_dpbusd_epi32(acc[row][v], quads[v], a_quad);
    }
  };
  // The bytes of 4 rows from `rows` (left: at most 4 rows of the page).
  auto load = [&](const std::int8_t* rows, std::size_t bytes, std::size_t offset) {
    if (bytes <= offset) return _mm512_setzero_si512();
    return bytes - offset >= 64 ? _mm512_loadu_si512(rows + offset)
                                : _mm512_maskz_loadu_epi8(first_bytes(bytes - offset), rows + offset);
  };
  for (std::size_t page = 0, row0 = 0; row0 < params.depth; ++page, row0 += params.page_rows) {
    const auto* b = static_cast<const std::int8_t*>(params.b_pages[page]);
    const std::size_t rows = std::min(params.page_rows, params.depth - row0);
    std::size_t k = 0;
    for (; k + 4 <= rows; k += 4) {
      panel_rows::prefetch_ahead(b + k * row_bytes, 4 * row_bytes, params.prefetch);
      step(_mm512_loadu_si512(b + k * row_bytes),
           RowBytes == 32 ? _mm512_loadu_si512(b + (k + 2) * row_bytes) : _mm512_setzero_si512(), a_rows + row0 + k);
    }
    if (k < rows) {  // 1 to 3 rows left: the others read as zeros (A is zero there)
      const std::size_t left = (rows - k) * row_bytes;
      step(load(b + k * row_bytes, left, 0),
           RowBytes == 32 ? load(b + k * row_bytes, left, 64) : _mm512_setzero_si512(), a_rows + row0 + k);
    }
  }
  const __mmask32 lanes = first_lanes(params.cols);
  const __mmask16 masks[2] = {__mmask16(lanes), __mmask16(lanes >> 16)};
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row) {
    const __m512 scale = _mm512_set1_ps(params.alpha * params.a_scales[row]);
    const __m512i offset = _mm512_set1_epi32(128 * params.a_sums[row]);  // (b + 128) a - 128 a = b a
    float* c = params.c + row * params.ldc;
    constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (std::size_t v = 0; v < vectors; ++v)
      _mm512_mask_storeu_ps(
          c + 16 * v, masks[v],
          _mm512_mul_ps(scale, _mm512_cvt_roundepi32_ps(_mm512_sub_epi32(acc[row][v], offset), nearest)));
  }
}

// int16 A; int8 A over 32-byte rows; int8 A over a narrow panel's 16-byte rows.
enum class paged_variant { int16_a, int8_a, int8_a_narrow };

template <paged_variant Variant, std::size_t Rows>
void paged_kernel(const int8_paged_params& params) {
  if constexpr (Variant == paged_variant::int16_a)
    params.b_row_stride == 16 ? int16_a_kernel<Rows, false, 16>(params)
    : params.cols >= 32       ? int16_a_kernel<Rows, true, 32>(params)
                              : int16_a_kernel<Rows, false, 32>(params);
  else
    int8_a_kernel<Rows, Variant == paged_variant::int8_a ? 32 : 16>(params);
}

template <paged_variant Variant, std::size_t... Index>
constexpr std::array<int8_paged_function, sizeof...(Index)> paged_table(std::index_sequence<Index...>) {
  return {&paged_kernel<Variant, Index + 1>...};
}

constexpr auto int16_a_kernels = paged_table<paged_variant::int16_a>(std::make_index_sequence<vnni_mr>{});
constexpr auto int8_a_kernels = paged_table<paged_variant::int8_a>(std::make_index_sequence<vnni_mr>{});
constexpr auto int8_a_narrow_kernels = paged_table<paged_variant::int8_a_narrow>(std::make_index_sequence<vnni_mr>{});

// Rows to Integer by their absmax scale (gemm_int8.hpp), 16 columns at a
// time: fp32 division and rounding to nearest even as the emulation's;
// zeros from cols up to to_ld; with `sums`, each row's sum.
template <class Integer>
void quantize(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, Integer* to,
              std::size_t to_ld, float* scales, std::int32_t* sums, std::int32_t quantum) {
  constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  constexpr int non_finite = 0x01 | 0x08 | 0x10 | 0x80;  // vfpclassps: QNaN, +Inf, -Inf, SNaN
  auto lanes = [](std::size_t count, std::size_t col) {
    return count - std::min(count, col) >= 16 ? __mmask16(0xffff)
                                              : __mmask16((1u << (count - std::min(count, col))) - 1);
  };
  for (std::size_t row = 0; row < rows; ++row) {
    const float* x = from + row * from_ld;
    Integer* q = to + row * to_ld;
    __m512 largest = _mm512_setzero_ps();
    __mmask16 special = 0;
    for (std::size_t col = 0; col < cols; col += 16) {
      const __m512 values = _mm512_maskz_loadu_ps(lanes(cols, col), x + col);
      special |= _mm512_fpclass_ps_mask(values, non_finite);
      largest = _mm512_max_ps(largest, _mm512_abs_ps(values));
    }
    const float scale =
        special != 0 ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(largest) / float(quantum);
    const __m512 divisor = _mm512_set1_ps(scale);
    __m512i sum = _mm512_setzero_si512();
    for (std::size_t col = 0; col < to_ld; col += 16) {
      const __m512i integers =
          scale > 0.0f
              ? _mm512_cvt_roundps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(lanes(cols, col), x + col), divisor),
                                         nearest)
              : _mm512_setzero_si512();  // NaN > 0 is false
      sum = _mm512_add_epi32(sum, integers);
      if constexpr (sizeof(Integer) == 2)
        _mm256_mask_storeu_epi16(q + col, lanes(to_ld, col), _mm512_cvtsepi32_epi16(integers));
      else
        _mm_mask_storeu_epi8(q + col, lanes(to_ld, col), _mm512_cvtsepi32_epi8(integers));
    }
    scales[row] = scale;
    if (sums != nullptr) sums[row] = _mm512_reduce_add_epi32(sum);
  }
}

void quantize_rows_int16(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, std::int16_t* to,
                         std::size_t to_ld, float* scales) {
  quantize(from, from_ld, rows, cols, to, to_ld, scales, nullptr, int16_quantum);
}

void quantize_rows_int8(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, std::int8_t* to,
                        std::size_t to_ld, float* scales, std::int32_t* sums) {
  quantize(from, from_ld, rows, cols, to, to_ld, scales, sums, int8_quantum);
}

}  // namespace

const int8_paged_kernels& avx512vnni_int8_paged_kernels() {
  static const int8_paged_kernels table{vnni_mr,
                                        32,  // two zmm of 16 lanes
                                        int16_a_kernels.data(),
                                        int8_a_kernels.data(),
                                        int8_a_narrow_kernels.data(),
                                        false,
                                        quantize_rows_int16,
                                        quantize_rows_int8};
  return table;
}

}  // namespace kvhead::engine
