// The kernels of the amx unit (contracts and layouts in bf16_microkernel.hpp):
// gemm_bf16's micro-kernel, and attention's paged kernels (tiles over B
// staged from K/V's pages, and their order on fp32 FMAs for few rows). This
// TU alone is built with AMX-TILE, AMX-BF16, AVX-512 F/BW/VL and AVX512-BF16
// flags (engine/CMakeLists.txt); every AMX CPU has those (engine/arch/isa.cpp).
//
// Blocking: a 32 x 32 block of C in four accumulator tiles (tmm0: rows 0-15 x
// columns 0-15, tmm1: rows 0-15 x 16-31, tmm2 and tmm3: rows 16-31), A in
// tmm4 and tmm5 (16 rows x 32 k each), B in tmm6 and tmm7 (16 pairs x 16
// columns each, the panel's [pairs][32][2] rows read 128 bytes apart). Each
// step of 32 k: 4 tile loads, 4 tdpbf16ps. Up to 16 rows, tmm2, tmm3 and tmm5
// are not used (rows never change another row's arithmetic). The tiles are
// stored to an fp32 block and C = acc + beta * C is done with AVX-512 (the
// staged paged kernel: C = alpha * acc over its columns, each group of B
// staged from the pages just before its tiles).
//
// Tile configuration (palette 1, 8 tiles of 16 rows x 64 bytes) is loaded
// by begin_task on the thread that runs a task and released by end_task
// (bf16_kernels), around a paged product by begin_product and end_product
// (bf16_paged_kernels); the OS permission to use the tile state is requested
// once per process before any of this runs (bf16_units.cpp).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "engine/gemm/bf16_microkernel.hpp"
#include "engine/gemm/bf16_pair_loads.hpp"
#include "engine/gemm/driver_support.hpp"
#include "engine/gemm/panel_row_loads.hpp"

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

// Around a paged product (bf16_paged_kernels::begin_product, end_product):
// MXCSR's DAZ and FTZ set as the tiles flush, for the FMA form's sums and
// both forms' C = alpha * acc; on tiles, their configuration.
unsigned int begin_paged_product(bool on_tiles) {
  const unsigned int mxcsr = _mm_getcsr();
  _mm_setcsr(mxcsr | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  if (on_tiles) load_tile_config();
  return mxcsr;
}

void end_paged_product(bool on_tiles, unsigned int mxcsr) {
  if (on_tiles) _tile_release();
  _mm_setcsr(mxcsr);
}

void release_tiles() { _tile_release(); }

// The rows of a B panel two at a time through its pages (each of page_rows
// rows, an even number: a pair never spans two), as both paged kernels read
// them: next() is the even row of the next pair.
template <class Element>
struct pair_rows {
  const void* const* pages;
  std::size_t page_rows, stride, page = 0, row = 0;
  const Element* next() {
    const Element* const even = static_cast<const Element*>(pages[page]) + row * stride;
    if ((row += 2) == page_rows) {
      ++page;
      row = 0;
    }
    return even;
  }
};

// The Rows x 32 sums of A (tile rows, 2 * pairs apart) times B (packed
// [pairs][32][2]) into acc; stage(pair) before each group of 16 pairs' tiles
// (the staged kernel's conversion of that group into B; or nothing).
template <std::size_t Rows, class Stage>
[[gnu::always_inline]] inline void tile_sums(const bf16_bits* a, const bf16_bits* b, std::size_t pairs,
                                             float (&acc)[amx_mr][bf16_nr], Stage&& stage) {
  static_assert(Rows <= amx_mr);
  constexpr bool lower_half = Rows > 16;
  constexpr std::size_t b_row_bytes = 2 * bf16_nr * sizeof(bf16_bits);
  const std::size_t a_row_bytes = 2 * pairs * sizeof(bf16_bits);
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (lower_half) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::size_t pair = 0; pair < pairs; pair += 16) {
    stage(pair);
    _tile_loadd(4, a + 2 * pair, a_row_bytes);
    _tile_loadd(6, b + pair * 2 * bf16_nr, b_row_bytes);
    _tile_loadd(7, b + pair * 2 * bf16_nr + bf16_nr, b_row_bytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (lower_half) {
      _tile_loadd(5, a + 16 * 2 * pairs + 2 * pair, a_row_bytes);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr std::size_t acc_row_bytes = bf16_nr * sizeof(float);
  _tile_stored(0, &acc[0][0], acc_row_bytes);
  _tile_stored(1, &acc[0][16], acc_row_bytes);
  if constexpr (lower_half) {
    _tile_stored(2, &acc[16][0], acc_row_bytes);
    _tile_stored(3, &acc[16][16], acc_row_bytes);
  }
}

template <std::size_t Rows>
void tile_kernel(const bf16_microkernel_params& params) {
  alignas(64) float acc[amx_mr][bf16_nr];
  tile_sums<Rows>(params.a_panel, params.b_panels, params.pairs, acc, [](std::size_t) {});
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

// Pairs [first_pair, first_pair + 16) of a panel into the tiles' layout at
// `target` ([16][32][2]): its rows read through the pages (pair_loads:
// rounded by vcvtne2ps2bf16, in memory order), zero from `depth` on.
template <class Element, bool Whole>
[[gnu::always_inline]] inline void stage_group(pair_rows<Element>& rows, std::size_t first_pair, std::size_t depth,
                                               __mmask16 low, __mmask16 high, stream_prefetch prefetch,
                                               bf16_bits* target) {
  for (std::size_t k = 2 * first_pair; k < 2 * (first_pair + 16); k += 2, target += 2 * bf16_nr) {
    __m512i pairs[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    if (k < depth) {
      const Element* const even = rows.next();
      panel_rows::prefetch_ahead(even, 2 * rows.stride * sizeof(Element), prefetch);
      pair_loads::load_pairs_in_order<Element, Whole>(even, k + 1 < depth ? even + rows.stride : nullptr, low, high,
                                                      pairs);
    }
    _mm512_storeu_si512(target, pairs[0]);
    _mm512_storeu_si512(target + bf16_nr, pairs[1]);
  }
}

// The staged paged kernel (bf16_staged_params): with stage_into, each
// group's 16 pairs of panel rows staged there (stage_group) just before the
// group's tiles load them; then C = alpha * acc over `cols` columns.
// Whole: the panel has all 32 columns.
template <class Element, std::size_t Rows, bool Whole>
void staged_tile(const bf16_staged_params& params) {
  const __mmask32 lanes = panel_rows::first_lanes(params.cols);
  const auto low = __mmask16(lanes), high = __mmask16(lanes >> 16);
  pair_rows<Element> rows{params.b_pages, params.page_rows, params.b_row_stride};
  auto stage = [&](std::size_t first_pair) {
    if (params.stage_into != nullptr)
      stage_group<Element, Whole>(rows, first_pair, params.depth, low, high, params.prefetch,
                                  params.stage_into + first_pair * 2 * bf16_nr);
  };
  alignas(64) float acc[amx_mr][bf16_nr];
  tile_sums<Rows>(params.a, params.panel, params.pairs, acc, stage);
  const __m512 alpha = _mm512_set1_ps(params.alpha);
  for (std::size_t row = 0; row < Rows; ++row) {
    float* const c = params.c + row * params.ldc;
    _mm512_mask_storeu_ps(c, low, _mm512_mul_ps(alpha, _mm512_load_ps(&acc[row][0])));
    _mm512_mask_storeu_ps(c + 16, high, _mm512_mul_ps(alpha, _mm512_load_ps(&acc[row][16])));
  }
}

// A whole fp32 panel staged ahead of its products (bf16_stage_panel_function).
void stage_panel(const float* panel_rows, std::size_t depth, std::size_t pairs, bf16_bits* to) {
  const void* const pages[1] = {panel_rows};
  pair_rows<float> rows{pages, 2 * pairs, bf16_nr};
  for (std::size_t first_pair = 0; first_pair < pairs; first_pair += 16)
    stage_group<float, true>(rows, first_pair, depth, 0xffff, 0xffff, {}, to + first_pair * 2 * bf16_nr);
}

template <class Element, std::size_t Rows>
void staged_kernel(const bf16_staged_params& params) {
  if (params.cols >= bf16_nr) return staged_tile<Element, Rows, true>(params);
  staged_tile<Element, Rows, false>(params);
}

// ---- The FMA form (bf16_microkernel.hpp, amx_fma_mr): Rows x 32 sums in
// zmm registers, per row and 16 columns an even chain, an odd chain and the
// running sum (3 * 2 * Rows <= 24 registers, B's rows in 4 more). Each
// pair step loads rows 2q and 2q + 1 of the panel as the bf16 values the
// tiles would read (rounded as vcvtne2ps2bf16 does), widened to fp32 by a
// shift (even columns) and a mask (odd columns), broadcasts each row's two
// A values and issues 4 FMAs per row; after 16 steps, acc += even + odd.
// The sums hold the even columns in their first vector and the odd ones in
// the second (lane order only), put back in column order at the end.

// 32 bf16 of a B row (its first columns as the masks say, the rest zero):
// loaded, or rounded from f32 and f16.
template <class Element, bool Whole>
[[gnu::always_inline]] inline __m512i row_bf16(const Element* row, __mmask16 low, __mmask16 high) {
  if constexpr (std::is_same_v<Element, bf16_bits>) {
    return panel_rows::load_words<Whole>(row, __mmask32(low) | (__mmask32(high) << 16));
  } else {
    auto half = [&](std::size_t first, __mmask16 mask) {
      if constexpr (std::is_same_v<Element, float>)
        return panel_rows::load_floats<Whole>(row + first, mask);
      else
        return _mm512_cvtph_ps(panel_rows::load_words<Whole>(row + first, mask));
    };
    return (__m512i)_mm512_cvtne2ps_pbh(half(16, high), half(0, low));
  }
}

// fp32 vectors of the even and of the odd columns of 32 bf16.
[[gnu::always_inline]] inline void split_columns(__m512i bits, __m512 (&columns)[2]) {
  columns[0] = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  columns[1] = _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(std::int32_t(0xffff0000u))));
}

// vpermt2ps indices putting (even, odd) columns back in column order.
struct column_index {
  alignas(64) std::uint32_t lane[16];
};
constexpr column_index interleaved(std::uint32_t first) {
  column_index index{};
  for (std::uint32_t lane = 0; lane < 16; ++lane) index.lane[lane] = (lane % 2 == 0 ? 0 : 16) + first + lane / 2;
  return index;
}
constexpr column_index columns_low = interleaved(0), columns_high = interleaved(8);

template <class Element, std::size_t Rows, bool Whole>
void fma_tile(const bf16_paged_params& params) {
  static_assert(Rows <= amx_fma_mr);
  const __mmask32 lanes = panel_rows::first_lanes(params.cols);
  const auto low = __mmask16(lanes), high = __mmask16(lanes >> 16);
  const std::size_t depth = params.depth, stride = params.b_row_stride;
  const std::size_t padded = round_up(std::max<std::size_t>(depth, 1), 32), pair_bytes = 2 * stride * sizeof(Element);
  const stream_prefetch prefetch = params.prefetch;
  // A's rows widened to fp32 once, for broadcasts from memory.
  alignas(64) float a[Rows][gemm_kc];
  for (std::size_t row = 0; row < Rows; ++row)
    for (std::size_t k = 0; k < padded; k += 16)
      _mm512_store_ps(&a[row][k], _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                          reinterpret_cast<const __m256i*>(params.a + row * params.a_row_stride + k))),
                                      16)));
  __m512 acc[Rows][2];
  for (std::size_t row = 0; row < Rows; ++row) acc[row][0] = acc[row][1] = _mm512_setzero_ps();
  pair_rows<Element> rows{params.b_pages, params.page_rows, stride};
  for (std::size_t group = 0; group < padded; group += 32) {
    __m512 even[Rows][2], odd[Rows][2];
    for (std::size_t row = 0; row < Rows; ++row)
      even[row][0] = even[row][1] = odd[row][0] = odd[row][1] = _mm512_setzero_ps();
    for (std::size_t k = group; k < group + 32; k += 2) {
      __m512 b_even[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, b_odd[2] = {b_even[0], b_even[1]};
      if (k < depth) {
        const Element* const row_k = rows.next();
        panel_rows::prefetch_ahead(row_k, pair_bytes, prefetch);
        split_columns(row_bf16<Element, Whole>(row_k, low, high), b_even);
        if (k + 1 < depth) split_columns(row_bf16<Element, Whole>(row_k + stride, low, high), b_odd);
      }
#pragma GCC unroll 4
      for (std::size_t row = 0; row < Rows; ++row) {
        const __m512 a_even = _mm512_set1_ps(a[row][k]), a_odd = _mm512_set1_ps(a[row][k + 1]);
        for (std::size_t v = 0; v < 2; ++v) {
          even[row][v] = _mm512_fmadd_ps(a_even, b_even[v], even[row][v]);
          odd[row][v] = _mm512_fmadd_ps(a_odd, b_odd[v], odd[row][v]);
        }
      }
    }
    for (std::size_t row = 0; row < Rows; ++row)
      for (std::size_t v = 0; v < 2; ++v)
        acc[row][v] = _mm512_add_ps(acc[row][v], _mm512_add_ps(even[row][v], odd[row][v]));
  }
  const __m512 alpha = _mm512_set1_ps(params.alpha);
  const __m512i first = _mm512_load_si512(columns_low.lane), second = _mm512_load_si512(columns_high.lane);
  for (std::size_t row = 0; row < Rows; ++row) {
    float* const c = params.c + row * params.ldc;
    const __m512 scaled[2] = {_mm512_mul_ps(alpha, acc[row][0]), _mm512_mul_ps(alpha, acc[row][1])};
    _mm512_mask_storeu_ps(c, low, _mm512_permutex2var_ps(scaled[0], first, scaled[1]));
    _mm512_mask_storeu_ps(c + 16, high, _mm512_permutex2var_ps(scaled[0], second, scaled[1]));
  }
}

template <class Element, std::size_t Rows>
void fma_kernel(const bf16_paged_params& params) {
  if (params.cols >= bf16_nr) return fma_tile<Element, Rows, true>(params);
  fma_tile<Element, Rows, false>(params);
}

template <class Element, std::size_t... Index>
constexpr std::array<bf16_paged_function, sizeof...(Index)> fma_table(std::index_sequence<Index...>) {
  return {&fma_kernel<Element, Index + 1>...};
}

constexpr auto fma_f32 = fma_table<float>(std::make_index_sequence<amx_fma_mr>{});
constexpr auto fma_bf16 = fma_table<bf16_bits>(std::make_index_sequence<amx_fma_mr>{});
constexpr auto fma_f16 = fma_table<f16_bits>(std::make_index_sequence<amx_fma_mr>{});

template <std::size_t... Index>
constexpr std::array<bf16_microkernel_function, sizeof...(Index)> kernel_table(std::index_sequence<Index...>) {
  return {&tile_kernel<Index + 1>...};
}

constexpr auto kernels = kernel_table(std::make_index_sequence<amx_mr>{});

template <class Element, std::size_t... Index>
constexpr std::array<bf16_staged_function, sizeof...(Index)> staged_table(std::index_sequence<Index...>) {
  return {&staged_kernel<Element, Index + 1>...};
}

constexpr auto staged_f32 = staged_table<float>(std::make_index_sequence<amx_mr>{});
constexpr auto staged_bf16 = staged_table<bf16_bits>(std::make_index_sequence<amx_mr>{});
constexpr auto staged_f16 = staged_table<f16_bits>(std::make_index_sequence<amx_mr>{});

}  // namespace

const bf16_kernels& amx_kernels() {
  static const bf16_kernels table{
      bf16_unit::amx, bf16_a_layout::tile_rows, amx_mr, 16, kernels.data(), 0, 0, nullptr, &load_tile_config,
      &release_tiles, avx512bf16_convert_rows};
  return table;
}

const bf16_paged_kernels& amx_paged_kernels() {
  static const bf16_paged_kernels table{amx_fma_mr,
                                        {fma_f32.data(), fma_bf16.data(), fma_f16.data(), nullptr},
                                        avx512bf16_convert_rows,
                                        {staged_f32.data(), staged_bf16.data(), staged_f16.data(), nullptr},
                                        16,
                                        &begin_paged_product,
                                        &end_paged_product,
                                        &stage_panel};
  return table;
}

}  // namespace kvhead::engine
