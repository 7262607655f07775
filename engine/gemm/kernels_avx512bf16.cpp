// The micro-kernels of the avx512bf16 unit (contract and layouts in
// bf16_microkernel.hpp): this TU alone is built with AVX-512 F/CD/DQ/BW/VL
// and AVX512-BF16 flags (engine/CMakeLists.txt).
//
// Blocking: Rows x (32 * Panels) accumulators in zmm registers (16 fp32
// lanes each) for the whole depth. Each pair step loads 2 * Panels vectors
// of B (16 columns x one k pair each), broadcasts each row's A pair (one
// 32-bit word: two bf16) and issues Rows * 2 * Panels vdpbf16ps.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "engine/gemm/bf16_microkernel.hpp"
#include "engine/gemm/bf16_pair_loads.hpp"
#include "engine/gemm/panel_row_loads.hpp"

namespace kvhead::engine {
namespace {

template <std::size_t Rows, std::size_t Panels>
void dot_kernel(const bf16_microkernel_params& params) {
  constexpr std::size_t vectors = 2 * Panels, mr = avx512bf16_mr;
  static_assert(Rows <= mr);
  __m512 acc[Rows][vectors];
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row)
#pragma GCC unroll 8
    for (std::size_t v = 0; v < vectors; ++v) acc[row][v] = _mm512_setzero_ps();

  const bf16_bits* a = params.a_panel;
  const bf16_bits* b = params.b_panels;
  for (std::size_t q = 0; q < params.pairs; ++q, a += 2 * mr, b += 2 * bf16_nr) {
    __m512i b_pairs[vectors];
#pragma GCC unroll 8
    for (std::size_t v = 0; v < vectors; ++v)
      b_pairs[v] = _mm512_loadu_si512(b + (v / 2) * params.b_panel_stride + (v % 2) * bf16_nr);
#pragma GCC unroll 16
    for (std::size_t row = 0; row < Rows; ++row) {
      std::int32_t pair = 0;
      std::memcpy(&pair, a + 2 * row, sizeof pair);
      const __m512i a_pair = _mm512_set1_epi32(pair);
#pragma GCC unroll 8
      for (std::size_t v = 0; v < vectors; ++v)
        acc[row][v] = _mm512_dpbf16_ps(acc[row][v], (__m512bh)a_pair, (__m512bh)b_pairs[v]);
    }
  }

  const __m512 beta = _mm512_set1_ps(params.beta);
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row) {
    float* c = params.c + row * params.ldc;
#pragma GCC unroll 8
    for (std::size_t v = 0; v < vectors; ++v) {
      __m512 result = acc[row][v];
      if (params.beta != 0.0f) result = _mm512_add_ps(result, _mm512_mul_ps(beta, _mm512_loadu_ps(c + v * 16)));
      _mm512_storeu_ps(c + v * 16, result);
    }
  }
}

template <std::size_t Panels, std::size_t... Index>
constexpr std::array<bf16_microkernel_function, sizeof...(Index)> kernel_table(std::index_sequence<Index...>) {
  return {&dot_kernel<Index + 1, Panels>...};
}

constexpr auto kernels = kernel_table<1>(std::make_index_sequence<avx512bf16_mr>{});
constexpr auto skinny = kernel_table<bf16_skinny_panels>(std::make_index_sequence<bf16_skinny_rows>{});

// ---- The paged kernel (bf16_paged_params): B as another layer packed it.
//
// Blocking: Rows x 32 accumulators (2 zmm per row) for the whole depth, one
// B panel of 32 columns. Each pair step loads rows 2q and 2q + 1 of the
// panel and interleaves them into the pair layout vdpbf16ps reads (f32 and
// f16 rounded by vcvtne2ps2bf16, which also orders them [even | odd], then
// one vpermw per 16 columns; bf16 by vpunpcklwd and vpunpckhwd, which pair
// within 128-bit lanes, so its accumulators hold the columns in another
// lane order until the end of the k loop): 2 to 4 shuffles per 2 * Rows
// vdpbf16ps, so a 12-row tile stays bound by the dot products. The
// in-lane unpacks cost less than the cross-lane vpermt2w they replace: a
// decode step (4 rows) over a bf16 cache in L3 ran 3-12% faster in 5 of 5
// alternations (S1's geometry, Zen 4; from DRAM the change was within the
// noise). Lane order only moves elements between registers: every column's
// arithmetic is the same.
// A panel of at most 16 columns (a 16-key block's kᵀ) keeps one zmm per row
// and one vpermw per pair step, in memory order for every element type:
// half the vdpbf16ps of a 32-column tile (S1 decode, bf16 cache at block 16,
// Zen 4, 3 alternations: 1.92-2.09 ms -> 1.79-1.93).

using pair_loads::load_pairs;
using panel_rows::first_lanes;

// The lane order of a row's accumulators, as load_pairs leaves it: for bf16
// (unpacked within 128-bit lanes) lane 4 L + j of acc[0] holds column 8 L + j
// and of acc[1] column 8 L + 4 + j (L < 4, j < 4); memory order otherwise.
// to_memory_order puts them back in column order (vector v: columns
// [16 v, 16 v + 16)); a carry keeps them as they are.
struct lane_index {
  alignas(64) std::uint32_t lane[16];
};
constexpr lane_index memory_columns(std::uint32_t first_column) {
  lane_index index{};
  for (std::uint32_t lane = 0; lane < 16; ++lane) {
    const std::uint32_t column = first_column + lane, quarter = column / 8, within = column % 8;
    index.lane[lane] = (within < 4 ? 0 : 16) + 4 * quarter + within % 4;  // vpermt2ps: lanes 16+ from acc[1]
  }
  return index;
}
constexpr lane_index memory_first = memory_columns(0), memory_second = memory_columns(16);

// bf16 over 32 columns only: the other loads leave memory order.
template <class Element, std::size_t Vectors>
void to_memory_order(__m512 acc[Vectors]) {
  if constexpr (std::is_same_v<Element, bf16_bits> && Vectors == 2) {
    const __m512 low = acc[0], high = acc[1];
    acc[0] = _mm512_permutex2var_ps(low, _mm512_load_si512(memory_first.lane), high);
    acc[1] = _mm512_permutex2var_ps(low, _mm512_load_si512(memory_second.lane), high);
  }
}

// Vectors: 2 (32 columns) or 1 (at most 16); Whole: all 16 * Vectors
// columns present.
template <class Element, std::size_t Rows, std::size_t Vectors, bool Whole>
void paged_tile(const bf16_paged_params& params) {
  __m512 acc[Rows][Vectors];
  const std::size_t cols = params.cols;
  const __mmask32 lanes = first_lanes(cols);
  const auto low = __mmask16(lanes), high = __mmask16(lanes >> 16);
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row)
    for (std::size_t v = 0; v < Vectors; ++v)
      acc[row][v] = params.carry_in ? _mm512_loadu_ps(params.carry + (2 * row + v) * 16) : _mm512_setzero_ps();
  auto step = [&](const __m512i pairs[Vectors], const bf16_bits* a) {
#pragma GCC unroll 16
    for (std::size_t row = 0; row < Rows; ++row) {
      std::int32_t pair = 0;
      std::memcpy(&pair, a + row * params.a_row_stride, sizeof pair);
      const __m512i a_pair = _mm512_set1_epi32(pair);
      for (std::size_t v = 0; v < Vectors; ++v)
        acc[row][v] = _mm512_dpbf16_ps(acc[row][v], (__m512bh)a_pair, (__m512bh)pairs[v]);
    }
  };
  const std::size_t stride = params.b_row_stride;
  for (std::size_t page = 0, row0 = 0; row0 < params.depth; ++page, row0 += params.page_rows) {
    const Element* b = static_cast<const Element*>(params.b_pages[page]);
    const std::size_t rows = std::min(params.page_rows, params.depth - row0);
    __m512i pairs[Vectors];
    std::size_t k = 0;
    for (; k + 1 < rows; k += 2) {
      panel_rows::prefetch_ahead(b + k * stride, 2 * stride * sizeof(Element), params.prefetch);
      load_pairs<Element, Vectors, Whole>(b + k * stride, b + (k + 1) * stride, low, high, pairs);
      step(pairs, params.a + row0 + k);
    }
    if (k < rows) {  // the last row: its pair's odd row is zero
      load_pairs<Element, Vectors, Whole>(b + k * stride, nullptr, low, high, pairs);
      step(pairs, params.a + row0 + k);
    }
  }
  if (params.carry_out) {  // the accumulators as they are (in this kernel's lane order)
#pragma GCC unroll 16
    for (std::size_t row = 0; row < Rows; ++row)
      for (std::size_t v = 0; v < Vectors; ++v) _mm512_storeu_ps(params.carry + (2 * row + v) * 16, acc[row][v]);
    return;
  }
  const __m512 alpha = _mm512_set1_ps(params.alpha);
#pragma GCC unroll 16
  for (std::size_t row = 0; row < Rows; ++row) {
    to_memory_order<Element, Vectors>(acc[row]);
    float* c = params.c + row * params.ldc;
    for (std::size_t v = 0; v < Vectors; ++v)
      _mm512_mask_storeu_ps(c + 16 * v, v == 0 ? low : high, _mm512_mul_ps(alpha, acc[row][v]));
  }
}

template <class Element, std::size_t Rows>
void paged_kernel(const bf16_paged_params& params) {
  if (params.cols < 16) return paged_tile<Element, Rows, 1, false>(params);
  if (params.cols == 16) return paged_tile<Element, Rows, 1, true>(params);
  if (params.cols < 32) return paged_tile<Element, Rows, 2, false>(params);
  paged_tile<Element, Rows, 2, true>(params);
}

template <class Element, std::size_t... Index>
constexpr std::array<bf16_paged_function, sizeof...(Index)> paged_table(std::index_sequence<Index...>) {
  return {&paged_kernel<Element, Index + 1>...};
}

constexpr auto paged_f32 = paged_table<float>(std::make_index_sequence<avx512bf16_mr>{});
constexpr auto paged_bf16 = paged_table<bf16_bits>(std::make_index_sequence<avx512bf16_mr>{});
constexpr auto paged_f16 = paged_table<f16_bits>(std::make_index_sequence<avx512bf16_mr>{});

}  // namespace

// Rows [0, rows) of fp32 A, columns [0, cols), to bf16 rows rounded to
// nearest even (vcvtne2ps2bf16), zero up to a whole pair.
void avx512bf16_convert_rows(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, bf16_bits* to,
                             std::size_t to_ld) {
  const std::size_t padded = cols + cols % 2, whole = cols / 32 * 32;
  for (std::size_t row = 0; row < rows; ++row) {
    const float* const source = from + row * from_ld;
    bf16_bits* const target = to + row * to_ld;
    // Whole runs of 32 columns plainly, the rest through masks.
    for (std::size_t col = 0; col < whole; col += 32)
      _mm512_storeu_si512(target + col, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(source + col + 16),
                                                                     _mm512_loadu_ps(source + col)));
    if (whole == padded) continue;
    const __mmask32 loaded = first_lanes(cols - whole);
    const auto low = __mmask16(loaded), high = __mmask16(loaded >> 16);
    const __m512bh converted = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(high, source + whole + 16),
                                                   _mm512_maskz_loadu_ps(low, source + whole));
    _mm512_mask_storeu_epi16(target + whole, first_lanes(padded - whole), (__m512i)converted);
  }
}

const bf16_kernels& avx512bf16_kernels() {
  static const bf16_kernels table{bf16_unit::avx512bf16,  bf16_a_layout::pairs, avx512bf16_mr, 1,       kernels.data(),
                                  bf16_skinny_rows,       bf16_skinny_panels,   skinny.data(), nullptr, nullptr,
                                  avx512bf16_convert_rows};
  return table;
}

const bf16_paged_kernels& avx512bf16_paged_kernels() {
  static const bf16_paged_kernels table{
      avx512bf16_mr, {paged_f32.data(), paged_bf16.data(), paged_f16.data(), nullptr}, avx512bf16_convert_rows};
  return table;
}

}  // namespace kvhead::engine
