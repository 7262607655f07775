#include "engine/gemm/bf16_emulation.hpp"

#include <array>
#include <bit>
#include <cstdint>
#include <cmath>
#include <utility>

namespace kvhead::engine {
namespace {

float flushed(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float operand(bf16_bits x) { return flushed(widen_bf16(x)); }
float fused(float a, float b, float acc) { return flushed(std::fma(a, b, flushed(acc))); }

// Exact binary16 -> fp32 (normal, subnormal, Inf and NaN alike).
float widen_f16(f16_bits x) {
  const std::uint32_t sign = std::uint32_t(x.bits & 0x8000u) << 16, exponent = (x.bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = x.bits & 0x3ffu;
  if (exponent == 0) return std::copysign(float(mantissa) * 0x1p-24f, sign != 0 ? -1.0f : 1.0f);
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// An element of B as the paged kernel loads it: vcvtne2ps2bf16 reads
// subnormal fp32 as zero and rounds to nearest even.
bf16_bits loaded(float x) { return encode_bf16(flushed(x)); }
bf16_bits loaded(bf16_bits x) { return x; }
bf16_bits loaded(f16_bits x) { return loaded(widen_f16(x)); }

template <class Element, std::size_t Rows>
void emulated_paged(const bf16_paged_params& params) {
  auto b_element = [&](std::size_t k, std::size_t col) {
    if (k >= params.depth) return bf16_bits{0};  // the zero row completing an odd depth
    const auto* page = static_cast<const Element*>(params.b_pages[k / params.page_rows]);
    return loaded(page[k % params.page_rows * params.b_row_stride + col]);
  };
  for (std::size_t row = 0; row < Rows; ++row)
    for (std::size_t col = 0; col < params.cols; ++col) {
      const bf16_bits* a = params.a + row * params.a_row_stride;
      float acc = params.carry_in ? params.carry[row * 32 + col] : 0.0f;  // the carry in column order
      for (std::size_t k = 0; k < params.depth; k += 2)
        acc = emulate_vdpbf16ps(acc, a[k], a[k + 1], b_element(k, col), b_element(k + 1, col));
      if (params.carry_out)
        params.carry[row * 32 + col] = acc;
      else
        params.c[row * params.ldc + col] = params.alpha * acc;
    }
}

void emulated_convert_rows(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, bf16_bits* to,
                           std::size_t to_ld) {
  for (std::size_t row = 0; row < rows; ++row) {
    for (std::size_t col = 0; col < cols; ++col) to[row * to_ld + col] = loaded(from[row * from_ld + col]);
    if (cols % 2 != 0) to[row * to_ld + cols] = bf16_bits{0};
  }
}

template <class Element, std::size_t... Index>
constexpr std::array<bf16_paged_function, sizeof...(Index)> paged_table(std::index_sequence<Index...>) {
  return {&emulated_paged<Element, Index + 1>...};
}

constexpr std::size_t skinny_rows = bf16_skinny_rows, skinny_panels = bf16_skinny_panels;

// acc + beta * C for a row of 32 * panels results (fp32, as the kernels do it).
void store(const bf16_microkernel_params& params, std::size_t row, const float* acc, std::size_t cols) {
  float* c = params.c + row * params.ldc;
  for (std::size_t col = 0; col < cols; ++col)
    c[col] = params.beta == 0.0f ? acc[col] : acc[col] + params.beta * c[col];
}

template <std::size_t Rows, std::size_t Panels>
void emulated_avx512bf16(const bf16_microkernel_params& params) {
  constexpr std::size_t mr = avx512bf16_mr;
  for (std::size_t row = 0; row < Rows; ++row) {
    float acc[32 * Panels] = {};
    for (std::size_t panel = 0; panel < Panels; ++panel)
      for (std::size_t q = 0; q < params.pairs; ++q) {
        const bf16_bits* a = params.a_panel + (q * mr + row) * 2;
        const bf16_bits* b = params.b_panels + panel * params.b_panel_stride + q * 64;
        for (std::size_t lane = 0; lane < 32; ++lane)
          acc[panel * 32 + lane] = emulate_vdpbf16ps(acc[panel * 32 + lane], a[0], a[1], b[lane * 2], b[lane * 2 + 1]);
      }
    store(params, row, acc, 32 * Panels);
  }
}

// One row of the amx tiles' sums: A's tile row (2 * pairs k) times a packed
// [pairs][32][2] panel, a tdpbf16ps per 16 pairs.
void amx_row_sums(const bf16_bits* a_row, const bf16_bits* b_panel, std::size_t pairs, float (&acc)[32]) {
  bf16_bits column[32];  // one column of B for one tile step, k in order
  for (std::size_t step = 0; step < pairs; step += 16)
    for (std::size_t lane = 0; lane < 32; ++lane) {
      for (std::size_t q = 0; q < 16; ++q)
        for (std::size_t e = 0; e < 2; ++e) column[q * 2 + e] = b_panel[((step + q) * 32 + lane) * 2 + e];
      acc[lane] = emulate_tdpbf16ps(acc[lane], a_row + step * 2, column, 16);
    }
}

template <std::size_t Rows>
void emulated_amx(const bf16_microkernel_params& params) {
  for (std::size_t row = 0; row < Rows; ++row) {
    float acc[32] = {};
    amx_row_sums(params.a_panel + row * 2 * params.pairs, params.b_panels, params.pairs, acc);
    store(params, row, acc, 32);
  }
}

// A B panel as the amx unit stages it (bf16_staged_params): [pairs][32][2],
// its first `cols` columns and `depth` rows loaded, zero elsewhere.
template <class Element>
void emulated_stage(const void* const* pages, std::size_t page_rows, std::size_t depth, std::size_t row_stride,
                    std::size_t cols, std::size_t pairs, bf16_bits* staged) {
  for (std::size_t k = 0; k < 2 * pairs; ++k)
    for (std::size_t col = 0; col < 32; ++col) {
      bf16_bits value{0};
      if (k < depth && col < cols) {
        const auto* page = static_cast<const Element*>(pages[k / page_rows]);
        value = loaded(page[k % page_rows * row_stride + col]);
      }
      staged[(k / 2 * 32 + col) * 2 + k % 2] = value;
    }
}

// C = alpha * the amx sums of `rows` rows of A (tile rows) over a staged
// panel, flushed to zero when subnormal.
void emulated_tile_rows(const bf16_bits* a, std::size_t rows, const bf16_bits* staged, std::size_t pairs,
                        std::size_t cols, float alpha, float* c, std::size_t ldc) {
  for (std::size_t row = 0; row < rows; ++row) {
    float acc[32] = {};
    amx_row_sums(a + row * 2 * pairs, staged, pairs, acc);
    for (std::size_t col = 0; col < cols; ++col) c[row * ldc + col] = flushed(alpha * acc[col]);
  }
}

// The amx unit's staged paged kernel: with stage_into, the whole panel
// staged first (its groups' values do not depend on when), then the tiles.
template <class Element, std::size_t Rows>
void emulated_staged(const bf16_staged_params& params) {
  if (params.stage_into != nullptr)
    emulated_stage<Element>(params.b_pages, params.page_rows, params.depth, params.b_row_stride, params.cols,
                            params.pairs, params.stage_into);
  emulated_tile_rows(params.a, Rows, params.panel, params.pairs, params.cols, params.alpha, params.c, params.ldc);
}

// The amx unit's staging of a whole fp32 panel (bf16_stage_panel_function).
void emulated_stage_panel(const float* rows, std::size_t depth, std::size_t pairs, bf16_bits* to) {
  const void* const pages[1] = {rows};
  emulated_stage<float>(pages, 2 * pairs, depth, 32, 32, pairs, to);
}

// The amx unit's FMA form: the tiles' sums (bf16_paged_params, a_row_stride
// = 2 * pairs).
template <class Element, std::size_t Rows>
void emulated_fma(const bf16_paged_params& params) {
  const std::size_t pairs = params.a_row_stride / 2;
  bf16_bits staged[gemm_kc * 32];
  emulated_stage<Element>(params.b_pages, params.page_rows, params.depth, params.b_row_stride, params.cols, pairs,
                          staged);
  emulated_tile_rows(params.a, Rows, staged, pairs, params.cols, params.alpha, params.c, params.ldc);
}

template <template <std::size_t> class Kernel, std::size_t... Index>
constexpr auto table(std::index_sequence<Index...>) {
  return std::array{&Kernel<Index + 1>::run...};
}
template <std::size_t Panels>
struct avx512bf16_kernel {
  template <std::size_t Rows>
  struct rows {
    static void run(const bf16_microkernel_params& params) { emulated_avx512bf16<Rows, Panels>(params); }
  };
};
template <std::size_t Rows>
struct amx_kernel {
  static void run(const bf16_microkernel_params& params) { emulated_amx<Rows>(params); }
};
template <class Element>
struct fma_kernel {
  template <std::size_t Rows>
  struct rows {
    static void run(const bf16_paged_params& params) { emulated_fma<Element, Rows>(params); }
  };
};
template <class Element>
struct staged_kernel {
  template <std::size_t Rows>
  struct rows {
    static void run(const bf16_staged_params& params) { emulated_staged<Element, Rows>(params); }
  };
};

}  // namespace

float emulate_vdpbf16ps(float acc, bf16_bits a_even, bf16_bits a_odd, bf16_bits b_even, bf16_bits b_odd) {
  acc = fused(operand(a_odd), operand(b_odd), acc);
  return fused(operand(a_even), operand(b_even), acc);
}

float emulate_tdpbf16ps(float acc, const bf16_bits* a, const bf16_bits* b, std::size_t pairs) {
  float even = 0.0f, odd = 0.0f;
  for (std::size_t q = 0; q < pairs; ++q) {
    even = fused(operand(a[2 * q]), operand(b[2 * q]), even);
    odd = fused(operand(a[2 * q + 1]), operand(b[2 * q + 1]), odd);
  }
  return flushed(flushed(acc) + flushed(even + odd));
}

const bf16_kernels& emulated_bf16_kernels(bf16_unit unit) {
  static constexpr auto avx512bf16_table = table<avx512bf16_kernel<1>::rows>(std::make_index_sequence<avx512bf16_mr>{});
  static constexpr auto skinny_table =
      table<avx512bf16_kernel<skinny_panels>::rows>(std::make_index_sequence<skinny_rows>{});
  static constexpr auto amx_table = table<amx_kernel>(std::make_index_sequence<amx_mr>{});
  static const bf16_kernels avx512bf16{
      bf16_unit::avx512bf16, bf16_a_layout::pairs, avx512bf16_mr, 1,       avx512bf16_table.data(), skinny_rows,
      skinny_panels,         skinny_table.data(),  nullptr,       nullptr, emulated_convert_rows};
  static const bf16_kernels amx{
      bf16_unit::amx, bf16_a_layout::tile_rows, amx_mr, 16, amx_table.data(), 0, 0, nullptr, nullptr,
      nullptr,        emulated_convert_rows};
  return unit == bf16_unit::amx ? amx : avx512bf16;
}

const bf16_paged_kernels& emulated_bf16_paged_kernels(bf16_unit unit) {
  static constexpr auto f32 = paged_table<float>(std::make_index_sequence<avx512bf16_mr>{});
  static constexpr auto bf16 = paged_table<bf16_bits>(std::make_index_sequence<avx512bf16_mr>{});
  static constexpr auto f16 = paged_table<f16_bits>(std::make_index_sequence<avx512bf16_mr>{});
  static const bf16_paged_kernels avx512bf16{
      avx512bf16_mr, {f32.data(), bf16.data(), f16.data(), nullptr}, emulated_convert_rows};
  static constexpr auto staged_f32 = table<staged_kernel<float>::rows>(std::make_index_sequence<amx_mr>{});
  static constexpr auto staged_bf16 = table<staged_kernel<bf16_bits>::rows>(std::make_index_sequence<amx_mr>{});
  static constexpr auto staged_f16 = table<staged_kernel<f16_bits>::rows>(std::make_index_sequence<amx_mr>{});
  static constexpr auto fma_f32 = table<fma_kernel<float>::rows>(std::make_index_sequence<amx_fma_mr>{});
  static constexpr auto fma_bf16 = table<fma_kernel<bf16_bits>::rows>(std::make_index_sequence<amx_fma_mr>{});
  static constexpr auto fma_f16 = table<fma_kernel<f16_bits>::rows>(std::make_index_sequence<amx_fma_mr>{});
  static const bf16_paged_kernels amx{amx_fma_mr,
                                      {fma_f32.data(), fma_bf16.data(), fma_f16.data(), nullptr},
                                      emulated_convert_rows,
                                      {staged_f32.data(), staged_bf16.data(), staged_f16.data(), nullptr},
                                      16,
                                      nullptr,
                                      nullptr,
                                      &emulated_stage_panel};
  return unit == bf16_unit::amx ? amx : avx512bf16;
}

}  // namespace kvhead::engine
