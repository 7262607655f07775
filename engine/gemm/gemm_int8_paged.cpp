// Integer products over an int8 paged B (gemm_int8_paged, gemm_int8.hpp):
// the driver of the int8 paged kernels and their scalar emulation.
//
//   A's rows to int16 or int8 rows and scales (once per call, or given by
//   the caller: quantize_rows) -> for each panel of B (NR columns:
//   for_each_paged_panel) -> for each MR-row block of A -> kernel over the
//   panel's rows in all pages (int16 A in a single row block over row
//   pages: the pages outermost, one call per page and panel)
//
// One B panel (at most KC rows of NR bytes) is read by every row block in
// turn while it is in L1; A's quantized rows stay in L1/L2.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "engine/arch/bf16_support.hpp"
#include "engine/arch/dispatch.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/gemm/gemm_int8.hpp"
#include "engine/gemm/paged_panels.hpp"

namespace kvhead::engine {
namespace {

// The emulation's blocking: 12 rows, as the hardware kernels' (the sums are
// exact, so any blocking gives the same bits).
constexpr std::size_t int8_mr = 12;

// x rounded to the nearest integer, ties to even (x finite, |x| < 2^23).
float nearest_even(float x) {
  const float below = std::floor(x), fraction = x - below;
  const bool odd = std::fmod(below, 2.0f) != 0.0f;
  return fraction > 0.5f || (fraction == 0.5f && odd) ? below + 1.0f : below;
}

// Row by row: the scale max|x| / quantum, x / scale rounded to nearest even.
template <class Integer>
void emulated_quantize(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols, Integer* to,
                       std::size_t to_ld, float* scales, std::int32_t* sums, std::int32_t quantum) {
  for (std::size_t row = 0; row < rows; ++row) {
    const float* x = from + row * from_ld;
    Integer* q = to + row * to_ld;
    float largest = 0.0f;
    bool finite = true;
    for (std::size_t col = 0; col < cols; ++col) {
      finite = finite && std::isfinite(x[col]);
      largest = std::max(largest, std::fabs(x[col]));
    }
    const float scale = finite ? largest / float(quantum) : std::numeric_limits<float>::quiet_NaN();
    std::int32_t sum = 0;
    for (std::size_t col = 0; col < to_ld; ++col) {
      q[col] = col < cols && scale > 0.0f ? Integer(nearest_even(x[col] / scale)) : Integer{0};  // NaN > 0 is false
      sum += q[col];
    }
    scales[row] = scale;
    if (sums != nullptr) sums[row] = sum;
  }
}

void emulated_quantize_rows_int16(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols,
                                  std::int16_t* to, std::size_t to_ld, float* scales) {
  emulated_quantize(from, from_ld, rows, cols, to, to_ld, scales, nullptr, int16_quantum);
}

void emulated_quantize_rows_int8(const float* from, std::size_t from_ld, std::size_t rows, std::size_t cols,
                                 std::int8_t* to, std::size_t to_ld, float* scales, std::int32_t* sums) {
  emulated_quantize(from, from_ld, rows, cols, to, to_ld, scales, sums, int8_quantum);
}

template <class Integer, std::size_t PanelColumns, std::size_t Rows>
void emulated_paged(const int8_paged_params& params) {
  const auto* a = static_cast<const Integer*>(params.a);
  for (std::size_t panel = 0; panel < params.panels; ++panel) {
    const std::size_t cols = panel + 1 < params.panels ? PanelColumns : params.cols;
    std::int32_t* const carry = params.carry + panel * Rows * PanelColumns;  // in column order
    for (std::size_t row = 0; row < Rows; ++row)
      for (std::size_t col = 0; col < cols; ++col) {
        std::int32_t sum = params.carry_in ? carry[row * PanelColumns + col] : 0;
        for (std::size_t k = 0; k < params.depth; ++k) {
          const auto* page =
              static_cast<const std::int8_t*>(params.b_pages[k / params.page_rows]) + panel * params.panel_stride;
          sum += std::int32_t{a[row * params.a_row_stride + k]} *
                 std::int32_t{page[k % params.page_rows * params.b_row_stride + col]};
        }
        if (params.carry_out)
          carry[row * PanelColumns + col] = sum;
        else
          params.c[row * params.ldc + panel * PanelColumns + col] = params.alpha * params.a_scales[row] * float(sum);
      }
  }
}

template <class Integer, std::size_t PanelColumns, std::size_t... Index>
constexpr std::array<int8_paged_function, sizeof...(Index)> paged_table(std::index_sequence<Index...>) {
  return {&emulated_paged<Integer, PanelColumns, Index + 1>...};
}

// The emulation over panels PanelColumns wide: int16 A and int8 A (any row stride).
template <std::size_t PanelColumns>
const int8_paged_kernels& emulated_kernels() {
  static constexpr auto int16_a = paged_table<std::int16_t, PanelColumns>(std::make_index_sequence<int8_mr>{});
  static constexpr auto int8_a = paged_table<std::int8_t, PanelColumns>(std::make_index_sequence<int8_mr>{});
  static const int8_paged_kernels table{int8_mr,
                                        PanelColumns,
                                        int16_a.data(),
                                        int8_a.data(),
                                        int8_a.data(),
                                        true,
                                        emulated_quantize_rows_int16,
                                        emulated_quantize_rows_int8};
  return table;
}

// KVHEAD_ISA's levels amx and avx512bf16 sit above avx512: naming avx512 or
// a lower path leaves these kernels out too (read once, as the path is).
bool isa_allows_int8_kernels() {
  static const bool allowed = bf16_request_from_isa_variable().limit != bf16_isa_limit::fp32_fallback;
  return allowed;
}

}  // namespace

const int8_paged_kernels& emulated_int8_paged_kernels(std::size_t panel_columns) {
  engine::require(panel_columns == 16 || panel_columns == 32, [&] {
    return "emulated_int8_paged_kernels: panels of 16 or 32 columns, not " + std::to_string(panel_columns);
  });
  return panel_columns == 16 ? emulated_kernels<16>() : emulated_kernels<32>();
}

const int8_paged_kernels* int8_paged_kernels_for(simd_path path) {
  switch (path) {
    case simd_path::avx512:
      return isa_allows_int8_kernels() && host_bf16_hardware().int8_kernels_missing.empty()
                 ? &avx512vnni_int8_paged_kernels()
                 : nullptr;
    case simd_path::avx2: {
      static const bool runs = simd_path_runs_here(simd_path::avx2);  // CPUID is slow under a hypervisor: once
      return runs ? &avx2_int8_paged_kernels() : nullptr;
    }
    default:
      return nullptr;
  }
}

bool gemm_int8_paged_runs(simd_path path, kv_dtype element) {
  const int8_paged_kernels* const kernels = int8_paged_kernels_for(path);
  return kernels != nullptr && kernels->panel_columns == gemm_config_for(path).nr && element == kv_dtype::int8;
}

a_quantization int8_scores_quantization(simd_path path) {
  const int8_paged_kernels* const kernels = int8_paged_kernels_for(path);
  return kernels != nullptr && kernels->int8_a_by_rows != nullptr ? a_quantization::int8 : a_quantization::int16;
}

namespace {

// A's rows in storage: per row its scale and (int8) its sum, then the rows.
std::size_t quantized_ld(a_quantization quantization, std::size_t k) {
  return round_up(std::max<std::size_t>(k, 1), quantization == a_quantization::int8 ? 4 : 2);
}
std::size_t quantized_row_bytes(a_quantization quantization, std::size_t k) {
  return quantized_ld(quantization, k) * (quantization == a_quantization::int8 ? 1 : 2);
}

}  // namespace

std::size_t quantized_rows_floats(a_quantization quantization, std::size_t m, std::size_t k) {
  return 2 * m + ceil_div(m * quantized_row_bytes(quantization, k), sizeof(float));
}

quantized_rows quantized_rows_at(a_quantization quantization, std::size_t m, std::size_t k, const float* storage) {
  return {
      quantization,   m, k, quantized_ld(quantization, k), storage, reinterpret_cast<const std::int32_t*>(storage + m),
      storage + 2 * m};
}

quantized_rows quantize_rows_with(const int8_paged_kernels& kernels, a_quantization quantization, gemm_operand a,
                                  std::size_t m, std::size_t k, float* storage) {
  engine::require(quantization == a_quantization::int16 || kernels.quantize_rows_int8 != nullptr,
                  [] { return "quantize_rows: these kernels take A in int16 only (no int8 A kernels)"; });
  const std::size_t ld = quantized_ld(quantization, k);
  if (quantization == a_quantization::int8)
    kernels.quantize_rows_int8(a.data, a.ld, m, k, reinterpret_cast<std::int8_t*>(storage + 2 * m), ld, storage,
                               reinterpret_cast<std::int32_t*>(storage + m));
  else
    kernels.quantize_rows_int16(a.data, a.ld, m, k, reinterpret_cast<std::int16_t*>(storage + 2 * m), ld, storage);
  return quantized_rows_at(quantization, m, k, storage);
}

quantized_rows quantize_rows(simd_path path, a_quantization quantization, gemm_operand a, std::size_t m, std::size_t k,
                             float* storage) {
  engine::require(gemm_int8_paged_runs(path, kv_dtype::int8), [&] {
    return std::string("quantize_rows: no int8 paged kernels run here for the path ") + to_string(path);
  });
  return quantize_rows_with(*int8_paged_kernels_for(path), quantization, a, m, k, storage);
}

void gemm_int8_paged_with(const int8_paged_kernels& kernels, a_quantization quantization, gemm_shape shape, float alpha,
                          gemm_operand a, const paged_b_view& b, float* c, std::size_t ldc,
                          std::size_t pv_rows_per_call, const quantized_rows* quantized) {
  const std::size_t m = shape.m, n = shape.n, k = shape.k;
  const bool int8_a = quantization == a_quantization::int8;
  constexpr std::size_t narrow_row_bytes = 16;  // the kernels' narrow panels
  check_paged_product(
      "gemm_int8_paged", shape, a, b, c, ldc, kernels.panel_columns, int8_a ? 4 : 2,
      b.element == kv_dtype::int8 && (b.narrow_row_stride == 0 || b.narrow_row_stride == narrow_row_bytes),
      "int8 (narrow pages of row stride 16)");
  engine::require(!int8_a || kernels.int8_a_by_rows != nullptr,
                  [] { return "gemm_int8_paged: these kernels take A in int16 only (no int8 A kernels)"; });
  engine::require(
      quantized == nullptr || (quantized->quantization == quantization && quantized->m == m && quantized->k == k), [&] {
        return "gemm_int8_paged: the quantized rows given (" + std::to_string(quantized->m) + " x " +
               std::to_string(quantized->k) + ", " +
               (quantized->quantization == a_quantization::int8 ? "int8" : "int16") + ") are not A's (" +
               std::to_string(m) + " x " + std::to_string(k) + ", " + (int8_a ? "int8" : "int16") + ")";
      });
  if (m == 0 || n == 0) return;
  // A's rows quantized here unless given.
  scratch_lease a_storage(quantized != nullptr ? 0 : quantized_rows_floats(quantization, m, k));
  const quantized_rows quantized_a =
      quantized != nullptr ? *quantized : quantize_rows_with(kernels, quantization, a, m, k, a_storage.data());
  const std::size_t a_ld = quantized_a.ld, row_bytes = quantized_row_bytes(quantization, k);
  const float* const a_scales = quantized_a.scales;
  const std::int32_t* const a_sums = quantized_a.sums;
  const void* const a_rows = quantized_a.rows;
  const int8_paged_function* const by_rows = !int8_a                    ? kernels.int16_a_by_rows
                                             : b.narrow_row_stride != 0 ? kernels.int8_a_narrow_by_rows
                                                                        : kernels.int8_a_by_rows;
  const std::size_t mr = kernels.mr;
  const kernel_config_row& row = *kernel_config_for(b.path).row;
  const stream_prefetch prefetch = paged_stream_prefetch(row, row.paged_prefetch_bytes, m <= mr, b.element);
  if (pv_rows_per_call == int8_pv_rows_configured) pv_rows_per_call = row.int8_pv_rows_per_call;
  if (!int8_a && b.along_k && k > b.page && m <= mr) {
    // One row block over several row pages (a decode step's p v over a
    // cache's blocks): the pages outermost, each page's panels (contiguous
    // in it) read as one stream before the next page, as gemm_bf16_paged
    // does; each tile's int32 sums run on from page to page in `carry`.
    // Measured on Zen 4 (S1's geometry, int8 cache, 4 alternations): block
    // 16 1.61-2.01 ms -> 1.30-1.63, block 32 1.43-1.59 -> 1.16-1.67. Where
    // the configuration says, pages of fewer than pv_rows_per_call rows go
    // several to a call, each panel's rows of all of them: fewer calls and
    // carries, the same integer sums (kernel_config_row::int8_pv_rows_per_call).
    const std::size_t row_stride = paged_row_stride(b), panel_stride = paged_panel_stride(b);
    for_each_page_and_panel<std::int32_t>(
        b, k, n, m, pv_rows_per_call / b.page, kernels.page_panels,
        [&](const void* const* rows_of_panel, std::size_t row0, std::size_t rows, std::size_t col, std::size_t cols,
            page_carry<std::int32_t> carry, std::size_t panels) {
          by_rows[m - 1]({static_cast<const std::int16_t*>(a_rows) + row0, a_ld, a_scales, a_sums, rows_of_panel,
                          b.page, rows, row_stride, cols, alpha, c + col, ldc, carry.sums, carry.in, carry.out,
                          prefetch, panels, panel_stride});
        });
    return;
  }
  for_each_paged_panel(b, k, n,
                       [&](const void* const* rows_of_panel, std::size_t page_rows, std::size_t col, std::size_t cols) {
                         for (std::size_t row0 = 0; row0 < m; row0 += mr) {
                           const std::size_t rows = std::min(mr, m - row0);
                           by_rows[rows - 1]({static_cast<const std::byte*>(a_rows) + row0 * row_bytes, a_ld,
                                              a_scales + row0, a_sums + row0, rows_of_panel, page_rows, k,
                                              paged_row_stride(b), cols, alpha, c + row0 * ldc + col, ldc, nullptr,
                                              false, false, prefetch});
                         }
                       });
}

void gemm_int8_paged(a_quantization quantization, gemm_shape shape, float alpha, gemm_operand a, const paged_b_view& b,
                     float* c, std::size_t ldc, const quantized_rows* quantized) {
  engine::require(gemm_int8_paged_runs(b.path, b.element), [&] {
    return std::string(
               "gemm_int8_paged: needs int8 B and either the avx2 path or the avx512 path with AVX512-VNNI "
               "and AVX512-VBMI (") +
           (host_bf16_hardware().int8_kernels_missing.empty() ? "present" : host_bf16_hardware().int8_kernels_missing) +
           ") and KVHEAD_ISA not naming avx512 or a lower path; the path is " + to_string(b.path);
  });
  gemm_int8_paged_with(*int8_paged_kernels_for(b.path), quantization, shape, alpha, a, b, c, ldc,
                       int8_pv_rows_configured, quantized);
}

}  // namespace kvhead::engine
