// The micro-kernels of the avx512bf16 unit (contract and layouts in
// bf16_microkernel.hpp): this TU alone is built with AVX-512 F/CD/DQ/BW/VL
// and AVX512-BF16 flags (engine/CMakeLists.txt).
//
// Blocking: Rows x (32 * Panels) accumulators in zmm registers (16 fp32
// lanes each) for the whole depth. Each pair step loads 2 * Panels vectors
// of B (16 columns x one k pair each), broadcasts each row's A pair (one
// 32-bit word: two bf16) and issues Rows * 2 * Panels vdpbf16ps.
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "engine/gemm/bf16_microkernel.hpp"

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

}  // namespace

const bf16_kernels& avx512bf16_kernels() {
  static const bf16_kernels table{bf16_unit::avx512bf16, bf16_a_layout::pairs, avx512bf16_mr, 1,
                                  kernels.data(),        bf16_skinny_rows,     bf16_skinny_panels,
                                  skinny.data(),         nullptr,              nullptr};
  return table;
}

}  // namespace kvhead::engine
