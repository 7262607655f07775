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
//
// The loads are prefetched (prefetch_ahead) as far ahead as the CPU's row of
// kernel_config.hpp says: a step of a decode product reads few bytes per
// instruction (a bf16 row pair is 128 bytes for 2 vdpbf16ps per query row),
// so the out-of-order window alone keeps too few lines in flight to cover
// DRAM's latency.
#pragma once

#include <immintrin.h>

#include <cstddef>

#include "engine/arch/kernel_config.hpp"

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

/// Prefetches the `bytes` of a step's panel rows (contiguous from `rows`)
/// `distance.l1_bytes` ahead into L1 and `distance.l2_bytes` ahead into L2
/// only, a line at a time: the rows of a later step of the same panel, or
/// of the panels after it in its page (kernel_config_row::
/// paged_prefetch_bytes and paged_l2_lead_bytes; 0: nothing). A prefetch
/// never faults, so one past the page's end only fetches a line for nothing.
[[gnu::always_inline]] inline void prefetch_ahead(const void* rows, std::size_t bytes, stream_prefetch distance) {
  const char* const from = static_cast<const char*>(rows);
  if (distance.l1_bytes != 0)
    for (std::size_t line = 0; line < bytes; line += 64) __builtin_prefetch(from + distance.l1_bytes + line, 0, 3);
  if (distance.l2_bytes != 0)
    for (std::size_t line = 0; line < bytes; line += 64) __builtin_prefetch(from + distance.l2_bytes + line, 0, 2);
}

/// 16 floats.
template <bool Whole>
[[gnu::always_inline]] inline __m512 load_floats(const float* row, __mmask16 mask) {
  if constexpr (Whole) return _mm512_loadu_ps(row);
  else return _mm512_maskz_loadu_ps(mask, row);
}

}  // namespace kvhead::engine::panel_rows
