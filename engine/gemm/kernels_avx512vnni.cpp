// The int8 paged kernels (contract in gemm_int8.hpp): this TU alone is built
// with AVX-512 F/DQ/BW and AVX512-VNNI flags (engine/CMakeLists.txt).
//
// Blocking: Rows x 32 int32 accumulators (2 zmm per row) for the whole
// depth, one B panel of 32 columns, as the bf16 paged kernel. Each pair
// step loads rows 2q and 2q + 1 of the panel (32 bytes each), interleaves
// their bytes within 128-bit lanes (vpunpcklbw, vpunpckhbw on ymm) and
// sign-extends the pairs to int16 (vpmovsxbw): 4 shuffles, two of them
// 256-bit, per 2 * Rows vpdpwssd, each 32 multiply-adds of int16 pairs into
// int32, exact. The lanes then hold columns in the order 0-7, 16-23 | 8-15,
// 24-31; one 128-bit block shuffle per output vector restores C's order.
#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "engine/gemm/gemm_int8.hpp"

namespace kvhead::engine {
namespace {

// 12 rows: 24 accumulators, 2 pair vectors, 2 row halves and a broadcast,
// 29 of 32 zmm (with vpermt2w's 2 index vectors as well, GCC 12 spilled the
// accumulators of 8 rows and more to the stack).
constexpr std::size_t vnni_mr = 12;

// The first `count` of 32 lanes (all of them from 32 on).
inline __mmask32 first_lanes(std::size_t count) { return count >= 32 ? ~__mmask32{0} : (__mmask32{1} << count) - 1; }

// Rows `even` and `odd` (null: a zero row) of a B panel, columns [0, 32)
// where `lanes` says, as int16 pairs: in-lane byte interleaves (vpunpck*bw,
// 256-bit) then sign extension, so pairs[0] holds columns 0-7 and 16-23 and
// pairs[1] columns 8-15 and 24-31 (the kernel puts C back in order once).
inline void load_pairs(const std::int8_t* even, const std::int8_t* odd, __mmask32 lanes, __m512i pairs[2]) {
  const __m256i even_row = _mm256_maskz_loadu_epi8(lanes, even);
  const __m256i odd_row = odd != nullptr ? _mm256_maskz_loadu_epi8(lanes, odd) : _mm256_setzero_si256();
  pairs[0] = _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(even_row, odd_row));
  pairs[1] = _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(even_row, odd_row));
}

template <std::size_t Rows>
void int8_paged_kernel(const int8_paged_params& params) {
  static_assert(Rows <= vnni_mr);
  __m512i acc[Rows][2];
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row) acc[row][0] = acc[row][1] = _mm512_setzero_si512();
  const __mmask32 lanes = first_lanes(params.cols);
  auto step = [&](const __m512i pairs[2], const std::int16_t* a) {
#pragma GCC unroll 16
    for (std::size_t row = 0; row < Rows; ++row) {
      std::int32_t pair = 0;
      std::memcpy(&pair, a + row * params.a_row_stride, sizeof pair);
      const __m512i a_pair = _mm512_set1_epi32(pair);
      acc[row][0] = _mm512_dpwssd_epi32(acc[row][0], a_pair, pairs[0]);
      acc[row][1] = _mm512_dpwssd_epi32(acc[row][1], a_pair, pairs[1]);
    }
  };
  const std::size_t stride = params.b_row_stride;
  for (std::size_t page = 0, row0 = 0; row0 < params.depth; ++page, row0 += params.page_rows) {
    const auto* b = static_cast<const std::int8_t*>(params.b_pages[page]);
    const std::size_t rows = std::min(params.page_rows, params.depth - row0);
    __m512i pairs[2];
    std::size_t k = 0;
    for (; k + 1 < rows; k += 2) {
      load_pairs(b + k * stride, b + (k + 1) * stride, lanes, pairs);
      step(pairs, params.a + row0 + k);
    }
    if (k < rows) {  // the last row: its pair's odd row is zero
      load_pairs(b + k * stride, nullptr, lanes, pairs);
      step(pairs, params.a + row0 + k);
    }
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

template <std::size_t... Index>
constexpr std::array<int8_paged_function, sizeof...(Index)> paged_table(std::index_sequence<Index...>) {
  return {&int8_paged_kernel<Index + 1>...};
}

constexpr auto kernels = paged_table(std::make_index_sequence<vnni_mr>{});

// Rows to int16 by their absmax scale (gemm_int8.hpp), 16 columns at a time:
// fp32 division and rounding to nearest even as the emulation's.
void quantize_rows(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, std::int16_t* to,
                   std::size_t to_ld, float* scales) {
  constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  constexpr int non_finite = 0x01 | 0x08 | 0x10 | 0x80;  // vfpclassps: QNaN, +Inf, -Inf, SNaN
  auto lanes = [&](std::size_t col) {
    return cols - col >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - col)) - 1);
  };
  for (std::size_t row = 0; row < rows; ++row) {
    const float* x = from + row * from_ld;
    std::int16_t* q = to + row * to_ld;
    __m512 largest = _mm512_setzero_ps();
    __mmask16 special = 0;
    for (std::size_t col = 0; col < cols; col += 16) {
      const __m512 values = _mm512_maskz_loadu_ps(lanes(col), x + col);
      special |= _mm512_fpclass_ps_mask(values, non_finite);
      largest = _mm512_max_ps(largest, _mm512_abs_ps(values));
    }
    const float scale =
        special != 0 ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(largest) / float(int16_quantum);
    const __m512 divisor = _mm512_set1_ps(scale);
    for (std::size_t col = 0; col < cols; col += 16) {
      const __mmask16 mask = lanes(col);
      const __m512i integers =
          scale > 0.0f ? _mm512_cvt_roundps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(mask, x + col), divisor), nearest)
                       : _mm512_setzero_si512();  // NaN > 0 is false
      _mm256_mask_storeu_epi16(q + col, mask, _mm512_cvtsepi32_epi16(integers));
    }
    if (cols % 2 != 0) q[cols] = 0;
    scales[row] = scale;
  }
}

}  // namespace

const int8_paged_kernels& avx512vnni_int8_paged_kernels() {
  static const int8_paged_kernels table{vnni_mr, kernels.data(), quantize_rows};
  return table;
}

}  // namespace kvhead::engine
