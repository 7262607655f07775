// The int8 paged kernels (contract in gemm_int8.hpp): this TU alone is built
// with AVX-512 F/DQ/BW and AVX512-VNNI flags (engine/CMakeLists.txt).
//
// Blocking: Rows x 32 int32 accumulators (2 zmm per row) for the whole
// depth, one B panel of 32 columns, as the bf16 paged kernel. Each pair
// step loads rows 2q and 2q + 1 of the panel (32 bytes each), sign-extends
// them to int16 (vpmovsxbw) and interleaves them into vpdpwssd's pair layout
// (one vpermt2w per 16 columns): 4 shuffles per 2 * Rows vpdpwssd, each 32
// multiply-adds of int16 pairs into int32, exact.
#include <immintrin.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "engine/gemm/gemm_int8.hpp"

namespace kvhead::engine {
namespace {

// 7 rows: 14 accumulators, 4 pair and row vectors, a broadcast and 2 indices.
// GCC 12 spills the accumulators of 8 rows and more to the stack (16 of 32
// zmm: it keeps the rest for the vpermt2w and vpdpwssd operands), which
// costs more than the extra pass over the L1-resident B panel.
constexpr std::size_t vnni_mr = 7;

// vpermt2w indices: lane 2j takes element `first + j` of the first source,
// lane 2j + 1 element `first + j` of the second (numbered from 32).
struct interleave_index {
  alignas(64) std::uint16_t lane[32];
};
constexpr interleave_index interleave(std::uint16_t first) {
  interleave_index index{};
  for (std::uint16_t j = 0; j < 16; ++j) {
    index.lane[2 * j] = std::uint16_t(first + j);
    index.lane[2 * j + 1] = std::uint16_t(32 + first + j);
  }
  return index;
}
constexpr interleave_index first_columns = interleave(0), second_columns = interleave(16);

// The first `count` of 32 lanes (all of them from 32 on).
inline __mmask32 first_lanes(std::size_t count) { return count >= 32 ? ~__mmask32{0} : (__mmask32{1} << count) - 1; }

// Rows `even` and `odd` (null: a zero row) of a B panel, columns [0, 32)
// where `lanes` says, as the int16 pairs of columns 0-15 and 16-31.
inline void load_pairs(const std::int8_t* even, const std::int8_t* odd, __mmask32 lanes, __m512i pairs[2]) {
  const __m512i first = _mm512_load_si512(first_columns.lane), second = _mm512_load_si512(second_columns.lane);
  const __m512i even_row = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(lanes, even));
  const __m512i odd_row =
      odd != nullptr ? _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(lanes, odd)) : _mm512_setzero_si512();
  pairs[0] = _mm512_permutex2var_epi16(even_row, first, odd_row);
  pairs[1] = _mm512_permutex2var_epi16(even_row, second, odd_row);
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
    _mm512_mask_storeu_ps(c, low, _mm512_mul_ps(scale, _mm512_cvt_roundepi32_ps(acc[row][0], nearest)));
    _mm512_mask_storeu_ps(c + 16, high, _mm512_mul_ps(scale, _mm512_cvt_roundepi32_ps(acc[row][1], nearest)));
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
