// The int8 paged kernels of the avx2 path (contract in gemm_int8.hpp): this
// TU alone is built with AVX2 flags (engine/CMakeLists.txt).
//
// Blocking: Rows x 16 int32 accumulators (2 ymm per row) for the whole
// depth, one B panel of 16 columns (the path's NR; rows 16 bytes apart).
// int16 A only: each pair step loads rows 2q and 2q + 1 of the panel,
// interleaves their bytes (vpunpcklbw, vpunpckhbw) and sign-extends the
// pairs to int16 (vpmovsxbw): columns 0-7 and 8-15 in C's order. Per row a
// broadcast of A's pair, then 2 vpmaddwd (8 sums of two int16 products
// each, exact in int32) and 2 vpaddd: 32 multiply-adds for 4 operations
// that spread over all four of Zen 3's vector pipes, where the widened
// int8 takes 4 FMAs on its two FMA pipes (and the widening on the others)
// for 32. Zen 3 (2026-12-06): chains of vpmaddwd + vpaddd run 147 G int16
// operations/s (limit_avx2_int16_dot) against 98 GFLOP/s of FMA chains;
// S1's geometry over an int8 cache, the best of 1200 steps from DRAM, 1090
// -> 910 us against the fp32 kernels over the widened bytes. The tile is
// kept in registers over a panel's rows in all of the call's pages; a call
// may take several panels of each page (int8_paged_params::panels), so a
// 16-key block's 8 panels of V (head_dim 128) cost one call, not 8. AVX2
// has no int8 A kernel: its byte product vpmaddubsw saturates sums of two
// products of up to 255 x 127 (B + 128 times a).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "engine/gemm/gemm_int8.hpp"

namespace kvhead::engine {
namespace {

// 6 rows: 12 accumulators, 2 pair vectors, A's broadcast pair and one
// product: the 16 ymm.
constexpr std::size_t avx2_int8_mr = 6;
constexpr std::size_t panel_columns = 16;  // the avx2 path's NR: a panel's row is 16 bytes of int8

// The step's rows prefetched as far ahead as the configuration says (a hint).
[[gnu::always_inline]] inline void prefetch_rows(const std::int8_t* rows, stream_prefetch distance) {
  if (distance.l1_bytes != 0) __builtin_prefetch(rows + distance.l1_bytes, 0, 3);
  if (distance.l2_bytes != 0) __builtin_prefetch(rows + distance.l2_bytes, 0, 2);
}

__m128i load_row(const std::int8_t* row) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row)); }

// Lanes [0, count) of 8 (count <= 8), for vmaskmovps.
__m256i first_lanes(std::size_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// One panel of the call's (each page's rows from b_pages[i] + offset), C
// from c_tile, its carry tile from carry.
template <std::size_t Rows>
void int16_a_panel(const int8_paged_params& params, std::size_t offset, std::size_t cols, float* c_tile,
                   std::int32_t* carry) {
  __m256i acc[Rows][2];
#pragma GCC unroll 8
  for (std::size_t row = 0; row < Rows; ++row)
    for (std::size_t v = 0; v < 2; ++v)
      acc[row][v] = params.carry_in ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(carry) + 2 * row + v)
                                    : _mm256_setzero_si256();
  const auto* const a_rows = static_cast<const std::int16_t*>(params.a);
  auto step = [&](__m128i even_row, __m128i odd_row, const std::int16_t* a) {
    const __m256i pairs[2] = {_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(even_row, odd_row)),
                              _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(even_row, odd_row))};
#pragma GCC unroll 8
    for (std::size_t row = 0; row < Rows; ++row) {
      std::int32_t pair = 0;
      std::memcpy(&pair, a + row * params.a_row_stride, sizeof pair);  // two int16
      const __m256i a_pair = _mm256_set1_epi32(pair);
      acc[row][0] = _mm256_add_epi32(acc[row][0], _mm256_madd_epi16(a_pair, pairs[0]));
      acc[row][1] = _mm256_add_epi32(acc[row][1], _mm256_madd_epi16(a_pair, pairs[1]));
    }
  };
  for (std::size_t page = 0, row0 = 0; row0 < params.depth; ++page, row0 += params.page_rows) {
    const auto* b = static_cast<const std::int8_t*>(params.b_pages[page]) + offset;
    const std::size_t rows = std::min(params.page_rows, params.depth - row0);
    std::size_t k = 0;
    for (; k + 1 < rows; k += 2) {
      prefetch_rows(b + k * panel_columns, params.prefetch);
      step(load_row(b + k * panel_columns), load_row(b + (k + 1) * panel_columns), a_rows + row0 + k);
    }
    if (k < rows)  // the last row: its pair's odd row is zero
      step(load_row(b + k * panel_columns), _mm_setzero_si128(), a_rows + row0 + k);
  }
  if (params.carry_out) {  // the accumulators in column order
#pragma GCC unroll 8
    for (std::size_t row = 0; row < Rows; ++row)
      for (std::size_t v = 0; v < 2; ++v)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(carry) + 2 * row + v, acc[row][v]);
    return;
  }
  const __m256i edge = first_lanes(cols % 8);
#pragma GCC unroll 8
  for (std::size_t row = 0; row < Rows; ++row) {
    const __m256 scale = _mm256_set1_ps(params.alpha * params.a_scales[row]);
    float* const c = c_tile + row * params.ldc;
    for (std::size_t v = 0; v < 2 && 8 * v < cols; ++v) {
      const __m256 values = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(acc[row][v]));  // exact sums, one rounding
      if (cols >= 8 * (v + 1))
        _mm256_storeu_ps(c + 8 * v, values);
      else
        _mm256_maskstore_ps(c + 8 * v, edge, values);
    }
  }
}

// The call's panels one after the other (a page's panels in one call: a
// decode step's p v over 16-key blocks has 8 per page at head_dim 128).
template <std::size_t Rows>
void int16_a_kernel(const int8_paged_params& params) {
  static_assert(Rows <= avx2_int8_mr);
  for (std::size_t panel = 0; panel < params.panels; ++panel)
    int16_a_panel<Rows>(params, panel * params.panel_stride, panel + 1 < params.panels ? panel_columns : params.cols,
                        params.c + panel * panel_columns, params.carry + panel * Rows * panel_columns);
}

template <std::size_t... Index>
constexpr std::array<int8_paged_function, sizeof...(Index)> paged_table(std::index_sequence<Index...>) {
  return {&int16_a_kernel<Index + 1>...};
}

constexpr auto int16_a_kernels = paged_table(std::make_index_sequence<avx2_int8_mr>{});

// Up to 8 floats of a row from `col` (zeros past `cols`).
__m256 load_floats(const float* x, std::size_t cols, std::size_t col) {
  if (cols >= col + 8) return _mm256_loadu_ps(x + col);
  float padded[8] = {};
  if (cols > col) std::memcpy(padded, x + col, (cols - col) * sizeof(float));
  return _mm256_loadu_ps(padded);
}

// Rows to int16 by their absmax scale (gemm_int8.hpp), 8 columns at a time:
// fp32 division and rounding to nearest even (vroundps) as the emulation's;
// zeros from cols up to to_ld.
void quantize_rows_int16(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, std::int16_t* to,
                         std::size_t to_ld, float* scales) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  for (std::size_t row = 0; row < rows; ++row) {
    const float* x = from + row * from_ld;
    std::int16_t* q = to + row * to_ld;
    __m256 largest = _mm256_setzero_ps();
    __m256i special = _mm256_setzero_si256();  // lanes that met an Inf or a NaN
    for (std::size_t col = 0; col < cols; col += 8) {
      const __m256 values = load_floats(x, cols, col);
      const __m256i bits = _mm256_and_si256(_mm256_castps_si256(values), exponent);
      special = _mm256_or_si256(special, _mm256_cmpeq_epi32(bits, exponent));
      largest = _mm256_max_ps(largest, _mm256_and_ps(values, magnitude));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, largest);
    float row_largest = 0.0f;
    for (const float lane : lanes) row_largest = lane > row_largest ? lane : row_largest;
    const float scale = _mm256_testz_si256(special, special) == 0 ? std::numeric_limits<float>::quiet_NaN()
                                                                  : row_largest / float(int16_quantum);
    const __m256 divisor = _mm256_set1_ps(scale);
    for (std::size_t col = 0; col < to_ld; col += 8) {
      constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      const __m256i integers =
          scale > 0.0f ? _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(load_floats(x, cols, col), divisor), nearest))
                       : _mm256_setzero_si256();  // NaN > 0 is false
      const __m128i words =
          _mm_packs_epi32(_mm256_castsi256_si128(integers), _mm256_extracti128_si256(integers, 1));  // |q| <= 32767
      if (to_ld >= col + 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + col), words);
      else {
        std::int16_t part[8];
        _mm_storeu_si128(reinterpret_cast<__m128i*>(part), words);
        std::memcpy(q + col, part, (to_ld - col) * sizeof(std::int16_t));
      }
    }
    scales[row] = scale;
  }
}

}  // namespace

const int8_paged_kernels& avx2_int8_paged_kernels() {
  static const int8_paged_kernels table{avx2_int8_mr, panel_columns, int16_a_kernels.data(), nullptr,
                                        nullptr,      true,          quantize_rows_int16,    nullptr};
  return table;
}

}  // namespace kvhead::engine
