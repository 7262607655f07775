// The micro-kernel of the amx unit (contract and layouts in
// bf16_microkernel.hpp): this TU alone is built with AMX-TILE, AMX-BF16 and
// AVX-512 F flags (engine/CMakeLists.txt); every AMX CPU has AVX-512.
//
// Blocking: a 32 x 32 block of C in four accumulator tiles (tmm0: rows 0-15 x
// columns 0-15, tmm1: rows 0-15 x 16-31, tmm2 and tmm3: rows 16-31), A in
// tmm4 and tmm5 (16 rows x 32 k each), B in tmm6 and tmm7 (16 pairs x 16
// columns each, the panel's [pairs][32][2] rows read 128 bytes apart). Each
// step of 32 k: 4 tile loads, 4 tdpbf16ps. Up to 16 rows, tmm2, tmm3 and tmm5
// are not used (rows never change another row's arithmetic). The tiles are
// stored to an fp32 block and C = acc + beta * C is done with AVX-512.
//
// Tile configuration (palette 1, 8 tiles of 16 rows x 64 bytes) is loaded
// by begin_task on the thread that runs a task and released by end_task
// (bf16_kernels); the OS permission to use the tile state is requested once
// per process before any of this runs (bf16_units.cpp).
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <utility>

#include "engine/gemm/bf16_microkernel.hpp"

namespace kvhead::engine {
namespace {

// The 64-byte operand of ldtilecfg.
struct tile_config {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(tile_config) == 64);

// Tiles 0-7 of 16 rows x 64 bytes. In static storage, built at compile time:
// g++ 12's _tile_loadconfig tells the compiler it reads 8 bytes of its
// operand, so the stores that filled a local config were dropped as dead
// (the tiles stayed unconfigured and the first tilezero raised SIGILL).
alignas(64) constexpr tile_config full_tiles = [] {
  tile_config config;
  for (std::size_t tile = 0; tile < 8; ++tile) {
    config.bytes_per_row[tile] = 64;
    config.rows[tile] = 16;
  }
  return config;
}();

void load_tile_config() { _tile_loadconfig(&full_tiles); }

void release_tiles() { _tile_release(); }

template <std::size_t Rows>
void tile_kernel(const bf16_microkernel_params& params) {
  static_assert(Rows <= amx_mr);
  constexpr bool lower_half = Rows > 16;
  constexpr std::size_t b_row_bytes = 2 * bf16_nr * sizeof(bf16_bits);
  const std::size_t a_row_bytes = 2 * params.pairs * sizeof(bf16_bits);
  const bf16_bits* const a = params.a_panel;
  const bf16_bits* const b = params.b_panels;
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (lower_half) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::size_t pair = 0; pair < params.pairs; pair += 16) {
    _tile_loadd(4, a + 2 * pair, a_row_bytes);
    _tile_loadd(6, b + pair * 2 * bf16_nr, b_row_bytes);
    _tile_loadd(7, b + pair * 2 * bf16_nr + bf16_nr, b_row_bytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (lower_half) {
      _tile_loadd(5, a + 16 * 2 * params.pairs + 2 * pair, a_row_bytes);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float acc[amx_mr][bf16_nr];
  constexpr std::size_t acc_row_bytes = bf16_nr * sizeof(float);
  _tile_stored(0, &acc[0][0], acc_row_bytes);
  _tile_stored(1, &acc[0][16], acc_row_bytes);
  if constexpr (lower_half) {
    _tile_stored(2, &acc[16][0], acc_row_bytes);
    _tile_stored(3, &acc[16][16], acc_row_bytes);
  }
  const __m512 beta = _mm512_set1_ps(params.beta);
  for (std::size_t row = 0; row < Rows; ++row) {
    float* c = params.c + row * params.ldc;
    for (std::size_t v = 0; v < 2; ++v) {
      __m512 result = _mm512_load_ps(&acc[row][v * 16]);
      if (params.beta != 0.0f) result = _mm512_add_ps(result, _mm512_mul_ps(beta, _mm512_loadu_ps(c + v * 16)));
      _mm512_storeu_ps(c + v * 16, result);
    }
  }
}

template <std::size_t... Index>
constexpr std::array<bf16_microkernel_function, sizeof...(Index)> kernel_table(std::index_sequence<Index...>) {
  return {&tile_kernel<Index + 1>...};
}

constexpr auto kernels = kernel_table(std::make_index_sequence<amx_mr>{});

}  // namespace

const bf16_kernels& amx_kernels() {
  static const bf16_kernels table{
      bf16_unit::amx, bf16_a_layout::tile_rows, amx_mr, 16, kernels.data(), 0, 0, nullptr, &load_tile_config,
      &release_tiles, avx512bf16_convert_rows};
  return table;
}

}  // namespace kvhead::engine
