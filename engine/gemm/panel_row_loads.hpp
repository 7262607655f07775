// Loads of one row of a B panel as the paged kernels read it: the columns a
// mask says, zeros past them. Include only from the AVX-512 BW + VL
// translation units (kernels_avx512bf16.cpp, kernels_avx512vnni.cpp).
//
// Whole (every column of the panel present, the common case) loads plainly;
// only a panel's column edge uses a masked load. On AMD Zen 5 a masked load
// of 8- or 16-bit elements (vmovdqu8/16 with a mask) streams from DRAM at
// two thirds of a plain load's rate or less, while from L1 and L2 both cost
// the same (a sum over 256 MiB, 2026-12-03: zmm 29.7 against 44.3 GB/s, ymm
// 19.6 against 45.6; masked 32-bit loads at the plain rate): with every row of
// a decode step's K and V panels masked, S1 over a bf16 cache took 1.53 ms
// against f32's 0.96.
#pragma once

#include <immintrin.h>

#include <cstddef>

namespace kvhead::engine::panel_rows {

/// The first `count` of 32 lanes (all of them from 32 on).
inline __mmask32 first_lanes(std::size_t count) { return count >= 32 ? ~__mmask32{0} : (__mmask32{1} << count) - 1; }

/// 32 16-bit elements.
template <bool Whole>
[[gnu::always_inline]] inline __m512i load_words(const void* row, __mmask32 mask) {
  if constexpr (Whole) return _mm512_loadu_si512(row);
  else return _mm512_maskz_loadu_epi16(mask, row);
}

/// 16 16-bit elements.
template <bool Whole>
[[gnu::always_inline]] inline __m256i load_words(const void* row, __mmask16 mask) {
  if constexpr (Whole) return _mm256_loadu_si256(static_cast<const __m256i*>(row));
  else return _mm256_maskz_loadu_epi16(mask, row);
}

/// 32 bytes.
template <bool Whole>
[[gnu::always_inline]] inline __m256i load_bytes(const void* row, __mmask32 mask) {
  if constexpr (Whole) return _mm256_loadu_si256(static_cast<const __m256i*>(row));
  else return _mm256_maskz_loadu_epi8(mask, row);
}

/// 16 floats.
template <bool Whole>
[[gnu::always_inline]] inline __m512 load_floats(const float* row, __mmask16 mask) {
  if constexpr (Whole) return _mm512_loadu_ps(row);
  else return _mm512_maskz_loadu_ps(mask, row);
}

}  // namespace kvhead::engine::panel_rows
