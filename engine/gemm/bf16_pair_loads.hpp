// Loads of a pair of rows of a B panel into the pair layout of vdpbf16ps and
// tdpbf16ps (16 columns x 2 k per 512-bit vector), as the bf16 paged
// kernels read K and V where they are stored (f32, bf16, f16). Include only
// from the translation units built with AVX-512 BW + VL and AVX512-BF16
// (kernels_avx512bf16.cpp, kernels_amx.cpp). Always inlined: an out-of-line
// copy would be a weak symbol that either TU's flags could end up defining
// (tests/check_isa_symbols.cmake).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "engine/gemm/panel_row_loads.hpp"
#include "engine/gemm/stored_element.hpp"

namespace kvhead::engine::pair_loads {

// vpermw indices: lane 2j takes element `first + j`, lane 2j + 1 element
// `second + j`.
struct interleave_index {
  alignas(64) std::uint16_t lane[32];
};
constexpr interleave_index interleave(std::uint16_t first, std::uint16_t second) {
  interleave_index index{};
  for (std::uint16_t j = 0; j < 16; ++j) {
    index.lane[2 * j] = std::uint16_t(first + j);
    index.lane[2 * j + 1] = std::uint16_t(second + j);
  }
  return index;
}
constexpr interleave_index halves = interleave(0, 16);

// The columns of `mask` (of 16) of one B row, the rest zero (Whole: all 16,
// panel_row_loads.hpp): as 16 bf16 (the two even and odd rows of a pair,
// [even | odd], rounded to nearest even from f32 and f16).
template <bool Whole>
[[gnu::always_inline]] inline __m512 load_16(const float* row, __mmask16 mask) {
  return panel_rows::load_floats<Whole>(row, mask);
}
template <bool Whole>
[[gnu::always_inline]] inline __m512 load_16(const f16_bits* row, __mmask16 mask) {
  return _mm512_cvtph_ps(panel_rows::load_words<Whole>(row, mask));
}
template <class Element, bool Whole>
[[gnu::always_inline]] inline __m512i even_odd_16(const Element* even, const Element* odd, __mmask16 mask) {
  if constexpr (std::is_same_v<Element, bf16_bits>) {
    const __m256i odd_row = odd != nullptr ? panel_rows::load_words<Whole>(odd, mask) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(panel_rows::load_words<Whole>(even, mask)), odd_row, 1);
  } else {
    const __m512 odd_row = odd != nullptr ? load_16<Whole>(odd, mask) : _mm512_setzero_ps();
    return (__m512i)_mm512_cvtne2ps_pbh(odd_row, load_16<Whole>(even, mask));
  }
}

// Rows `even` and `odd` (null: a zero row) of a B panel as the pairs of
// columns 0-15 and, with Vectors 2, 16-31 (Whole: all 16 * Vectors columns
// present, plain loads).
template <class Element, std::size_t Vectors, bool Whole>
[[gnu::always_inline]] inline void load_pairs(const Element* even, const Element* odd, __mmask16 low, __mmask16 high,
                                              __m512i pairs[Vectors]) {
  if constexpr (std::is_same_v<Element, bf16_bits> && Vectors == 2) {
    const __mmask32 mask = __mmask32(low) | (__mmask32(high) << 16);
    const __m512i even_row = panel_rows::load_words<Whole>(even, mask);
    const __m512i odd_row = odd != nullptr ? panel_rows::load_words<Whole>(odd, mask) : _mm512_setzero_si512();
    pairs[0] = _mm512_unpacklo_epi16(even_row, odd_row);
    pairs[1] = _mm512_unpackhi_epi16(even_row, odd_row);
  } else {
    const __m512i interleave = _mm512_load_si512(halves.lane);
    for (std::size_t v = 0; v < Vectors; ++v)
      pairs[v] = _mm512_permutexvar_epi16(
          interleave,
          even_odd_16<Element, Whole>(even + 16 * v, odd != nullptr ? odd + 16 * v : nullptr, v == 0 ? low : high));
  }
}

// The same pairs in memory order for every element type (vector v: columns
// [16 v, 16 v + 16)), as amx tiles read them from memory.
template <class Element, bool Whole>
[[gnu::always_inline]] inline void load_pairs_in_order(const Element* even, const Element* odd, __mmask16 low,
                                                       __mmask16 high, __m512i pairs[2]) {
  load_pairs<Element, 1, Whole>(even, odd, low, low, pairs);
  load_pairs<Element, 1, Whole>(even + 16, odd != nullptr ? odd + 16 : nullptr, high, high, pairs + 1);
}

}  // namespace kvhead::engine::pair_loads
