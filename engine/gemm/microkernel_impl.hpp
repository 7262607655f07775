// The register-blocked micro-kernel (contract in microkernel.hpp), written
// once with xsimd for every ISA. Include only from engine/gemm/kernels_<isa>.cpp,
// after that ISA's widen() overloads for the stored element types
// (bf16_bits, f16_bits, std::int8_t: W elements to one fp32 vector).
//
// Blocking: MR x NR accumulators live in registers for the whole k loop
// (sizes and register budget per CPU in engine/arch/kernel_config.hpp). Each k step loads NR / W
// vectors of B (widening stored elements to fp32 in the same registers),
// broadcasts MR scalars of A and issues MR * NR / W FMAs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>

#include "engine/arch/multiply_add.hpp"
#include "engine/gemm/microkernel.hpp"

namespace kvhead::engine {

/// W fp32 elements of B as one vector (the other element types: per ISA).
template <class Arch>
[[gnu::always_inline]] inline xsimd::batch<float, Arch> widen(Arch, const float* elements) {
  return xsimd::batch<float, Arch>::load_unaligned(elements);
}

/// How the micro-kernel holds one row of a B panel of elements Element: its
/// PanelVectors vectors of W fp32 lanes. Here, the memory order (vector v
/// holds columns [v W, (v + 1) W)); an ISA may specialize it to widen an
/// element type into another lane order with fewer instructions, and then
/// maps C's rows between memory order and its own around the k loop. Lane
/// order only moves elements between registers: no result changes.
template <class Arch, class Element, std::size_t PanelVectors>
struct panel_order {
  using batch = xsimd::batch<float, Arch>;
  [[gnu::always_inline]] static void widen_row(const Element* row, batch* lanes) {
#pragma GCC unroll 4
    for (std::size_t v = 0; v < PanelVectors; ++v) lanes[v] = widen(Arch{}, row + v * batch::size);
  }
  [[gnu::always_inline]] static void to_memory(batch*) {}
  [[gnu::always_inline]] static void from_memory(batch*) {}
};

template <class Arch, std::size_t MR, std::size_t NR>
template <class Element, std::size_t Rows, std::size_t Panels, std::size_t Columns>
void gemm_kernels<Arch, MR, NR>::microkernel(const microkernel_params& params) {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::size_t rows = Rows;
  // The tile's vectors per row: Columns / W of each of its Panels B panels
  // (Columns: NR, or NR / 2 for a half panel), whose vector v of panel j is
  // column (j * NR + v * W) of C.
  constexpr std::size_t panel_vectors = Columns / batch::size, vectors = Panels * panel_vectors;
  static_assert(NR % batch::size == 0 && Columns % batch::size == 0 && Rows <= MR &&
                (Panels == 1 || Rows <= wide_max_rows) && (Columns == NR || (2 * Columns == NR && Panels == 1)));
  using order = panel_order<Arch, Element, panel_vectors>;

  // A sequence of panels (microkernel.hpp): each one's tile in turn.
  const std::size_t sequence = Panels == 1 ? params.panel_sequence : 1;
  for (std::size_t j = 0; j < sequence; ++j) {
    float* const c = params.c + j * Columns;
    // Fetch the C tile now: it is read and written only after the k loop, and
    // on large C it comes from L3 or DRAM (a stall per tile otherwise). Each
    // vector's first line and the row's last: a row not 64-byte aligned (a
    // std::vector's C) spans one line more than its vectors. Later in the k
    // loop (32-128 steps before its end) measured slower on Zen 5. Not when
    // accumulating: the chain's last call has just written it.
    const bool accumulate = params.accumulate;
    if (!accumulate)
#pragma GCC unroll 16
      for (std::size_t row = 0; row < rows; ++row) {
        const float* const c_row = c + row * params.ldc;
#pragma GCC unroll 8
        for (std::size_t v = 0; v < vectors; ++v) __builtin_prefetch(c_row + v * batch::size, 1);
        __builtin_prefetch(c_row + vectors * batch::size - 1, 1);
      }

    batch acc[rows][vectors];
#pragma GCC unroll 16
    for (std::size_t row = 0; row < rows; ++row)
#pragma GCC unroll 8
      for (std::size_t v = 0; v < vectors; ++v)
        acc[row][v] = accumulate ? batch::load_unaligned(c + row * params.ldc + v * batch::size) : batch(0.0f);
    if (accumulate && !params.c_from_lanes)
#pragma GCC unroll 16
      for (std::size_t row = 0; row < rows; ++row)
#pragma GCC unroll 4
        for (std::size_t panel = 0; panel < Panels; ++panel) order::from_memory(acc[row] + panel * panel_vectors);

    // What each k step prefetches: nothing, b_next's row, or that and its
    // row b_next_l2_offset further into L2. Rows shorter than a line (half
    // panels of 16-bit or 8-bit elements, Columns apart in a cache's narrow
    // K pages) prefetch at the first row of each line only: a prefetch per
    // row made S1 over a bf16 cache at block 16 3-5% slower (Xeon, 2
    // alternations), prefetches of lines already on their way waiting for a
    // fill buffer.
    // prefetch_l1_l2_and_copy: as prefetch_l1_and_l2, and B's row stored at b_copy.
    // prefetch_l2: b_next's rows into L2 only (b_next_to_l2).
    enum { prefetch_none, prefetch_l1, prefetch_l2, prefetch_l1_and_l2, prefetch_l1_l2_and_copy };
    constexpr bool copies = std::is_same_v<Element, float> && Panels == 1 && Columns == NR;
    constexpr std::size_t rows_per_line = Columns * sizeof(Element) >= 64 ? 1 : 64 / (Columns * sizeof(Element));
    // The k loop over A's strides: compile-time constants for a packed A
    // panel (1 along rows, MR along k: no index arithmetic in the loop), the
    // caller's for an A read in place; with the next call's B prefetched
    // (row k at step k) only when the caller names it. Same arithmetic in
    // every variant.
    const Element* const b_panel = static_cast<const Element*>(params.b_panel) + j * params.b_panel_stride;
    const Element* const b_next =
        params.b_next == nullptr ? nullptr : static_cast<const Element*>(params.b_next) + j * params.b_panel_stride;
    float* const b_copy = params.b_copy;
    const auto k_loop = [&](auto a_row_stride, auto a_k_stride, auto prefetch) {
      // A's rows in groups of 3 from one pointer each (rows r, r + 1, r + 2 at
      // offsets 0, a_row_stride, 2 a_row_stride: one base and one index register
      // per address): a pointer per row, or an offset per row, left 12 live
      // values for 16 registers and spilled half of them in A in place's loop
      // (Xeon, 2026-12-04: 1024 x 128 x 1024 1.80-1.87 -> 1.58-1.74 ms, S4's
      // products alone 147-153 -> 151-162 GFLOP/s). A packed A folds them
      // into one pointer and constant offsets.
      constexpr std::size_t groups = (rows + 2) / 3;
      const float* a_group[groups];
#pragma GCC unroll 8
      for (std::size_t group = 0; group < groups; ++group) a_group[group] = params.a + 3 * group * a_row_stride;
      const Element* b = b_panel;
      for (std::size_t k = 0; k < params.k_depth; ++k, b += params.b_row_stride) {
        if constexpr (decltype(prefetch)::value != prefetch_none)
          if (k % rows_per_line == 0) {
            const auto* next_row = reinterpret_cast<const char*>(b_next + k * params.b_row_stride);
#pragma GCC unroll 2
            for (std::size_t line = 0; line < Columns * sizeof(Element); line += 64) {
              if constexpr (decltype(prefetch)::value == prefetch_l2)
                __builtin_prefetch(next_row + line, 0, 2);
              else
                __builtin_prefetch(next_row + line);
              if constexpr (decltype(prefetch)::value == prefetch_l1_and_l2 ||
                            decltype(prefetch)::value == prefetch_l1_l2_and_copy)
                __builtin_prefetch(next_row + params.b_next_l2_offset + line, 0, 2);
            }
          }
        batch b_row[vectors];
#pragma GCC unroll 4
        for (std::size_t panel = 0; panel < Panels; ++panel)
          order::widen_row(b + panel * params.b_panel_stride, b_row + panel * panel_vectors);
        if constexpr (decltype(prefetch)::value == prefetch_l1_l2_and_copy)
#pragma GCC unroll 8
          for (std::size_t v = 0; v < vectors; ++v) b_row[v].store_unaligned(b_copy + k * NR + v * batch::size);
#pragma GCC unroll 16
        for (std::size_t row = 0; row < rows; ++row) {
          const batch a_value(a_group[row / 3][row % 3 * a_row_stride]);
#pragma GCC unroll 8
          for (std::size_t v = 0; v < vectors; ++v) acc[row][v] = multiply_add(a_value, b_row[v], acc[row][v]);
        }
#pragma GCC unroll 8
        for (std::size_t group = 0; group < groups; ++group) a_group[group] += a_k_stride;
      }
    };
    const auto with_a = [&](auto prefetch) {
      if (params.a_row_stride == 1 && params.a_k_stride == MR)
        k_loop(std::integral_constant<std::size_t, 1>{}, std::integral_constant<std::size_t, MR>{}, prefetch);
      else
        k_loop(params.a_row_stride, params.a_k_stride, prefetch);
    };
    if (copies && b_copy != nullptr) {
      if constexpr (copies) with_a(std::integral_constant<int, prefetch_l1_l2_and_copy>{});
    } else if (b_next == nullptr) {
      with_a(std::integral_constant<int, prefetch_none>{});
    } else if (params.b_next_l2_offset == 0) {
      if (params.b_next_to_l2)
        with_a(std::integral_constant<int, prefetch_l2>{});
      else
        with_a(std::integral_constant<int, prefetch_l1>{});
    } else {
      with_a(std::integral_constant<int, prefetch_l1_and_l2>{});
    }

    if (!params.c_to_lanes)
#pragma GCC unroll 16
      for (std::size_t row = 0; row < rows; ++row)
#pragma GCC unroll 4
        for (std::size_t panel = 0; panel < Panels; ++panel) order::to_memory(acc[row] + panel * panel_vectors);
    const batch alpha(params.alpha);
    const batch beta(params.beta);
    const bool read_c = !accumulate && params.beta != 0.0f;
#pragma GCC unroll 16
    for (std::size_t row = 0; row < rows; ++row) {
      float* c_row = c + row * params.ldc;
#pragma GCC unroll 8
      for (std::size_t v = 0; v < vectors; ++v) {
        if (accumulate) {
          acc[row][v].store_unaligned(c_row + v * batch::size);
          continue;
        }
        batch result = alpha * acc[row][v];
        if (read_c) result = result + beta * batch::load_unaligned(c_row + v * batch::size);
        result.store_unaligned(c_row + v * batch::size);
      }
    }
  }
}

// clang-format 14 splits an immediately invoked template lambda:
// clang-format off
template <class Arch, std::size_t MR, std::size_t NR>
const microkernel_function* gemm_kernels<Arch, MR, NR>::microkernels(kv_dtype element) {
  static constexpr auto table = []<std::size_t... Index>(std::index_sequence<Index...>) {
    return std::array<std::array<microkernel_function, MR>, stored_dtype_count>{{
        {&microkernel<float, Index + 1>...},
        {&microkernel<bf16_bits, Index + 1>...},
        {&microkernel<f16_bits, Index + 1>...},
        {&microkernel<std::int8_t, Index + 1>...}}};
  }(std::make_index_sequence<MR>{});
  return table[static_cast<std::size_t>(element)].data();
}

template <class Arch, std::size_t MR, std::size_t NR>
const microkernel_function* gemm_kernels<Arch, MR, NR>::wide_microkernels(kv_dtype element) {
  static constexpr auto table = []<std::size_t... Index>(std::index_sequence<Index...>) {
    return std::array<std::array<microkernel_function, wide_max_rows>, stored_dtype_count>{{
        {&microkernel<float, Index + 1, wide_panels(Index + 1)>...},
        {&microkernel<bf16_bits, Index + 1, wide_panels(Index + 1)>...},
        {&microkernel<f16_bits, Index + 1, wide_panels(Index + 1)>...},
        {&microkernel<std::int8_t, Index + 1, wide_panels(Index + 1)>...}}};
  }(std::make_index_sequence<wide_max_rows>{});
  return table[static_cast<std::size_t>(element)].data();
}

template <class Arch, std::size_t MR, std::size_t NR>
const microkernel_function* gemm_kernels<Arch, MR, NR>::half_microkernels(kv_dtype element) {
  static constexpr auto table = []<std::size_t... Index>(std::index_sequence<Index...>) {
    return std::array<std::array<microkernel_function, MR>, stored_dtype_count>{{
        {&microkernel<float, Index + 1, 1, NR / 2>...},
        {&microkernel<bf16_bits, Index + 1, 1, NR / 2>...},
        {&microkernel<f16_bits, Index + 1, 1, NR / 2>...},
        {&microkernel<std::int8_t, Index + 1, 1, NR / 2>...}}};
  }(std::make_index_sequence<MR>{});
  return table[static_cast<std::size_t>(element)].data();
}
// clang-format on

template <class Arch>
template <std::size_t Rows>
void row_stream_kernels<Arch>::row_stream(const row_stream_params& params) {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::size_t width = batch::size;
  // Locals, not params fields: stores through acc could alias them otherwise.
  const std::size_t cols = params.cols, ldb = params.ldb;
  float* const acc = params.acc;
  for (std::size_t i = 0; i < Rows * cols; i += width) batch(0.0f).store_aligned(acc + i);

  for (std::size_t k = 0; k < params.k_depth; ++k) {
    const float* b_row = params.b + k * ldb;
    batch a_values[Rows];
#pragma GCC unroll 4
    for (std::size_t row = 0; row < Rows; ++row)
      a_values[row] = batch(params.a[row * params.a_row_stride + k * params.a_k_stride]);
    for (std::size_t col = 0; col < cols; col += width) {
      const batch b_value = batch::load_unaligned(b_row + col);
#pragma GCC unroll 4
      for (std::size_t row = 0; row < Rows; ++row) {
        float* target = acc + row * cols + col;
        multiply_add(a_values[row], b_value, batch::load_aligned(target)).store_aligned(target);
      }
    }
  }

  const batch alpha(params.alpha);
  const batch beta(params.beta);
  const bool read_c = params.beta != 0.0f;
  for (std::size_t row = 0; row < Rows; ++row) {
    float* c_row = params.c + row * params.ldc;
    for (std::size_t col = 0; col < cols; col += width) {
      batch result = alpha * batch::load_aligned(acc + row * cols + col);
      if (read_c) result = result + beta * batch::load_unaligned(c_row + col);
      result.store_unaligned(c_row + col);
    }
  }
}

// clang-format 14 splits an immediately invoked template lambda:
// clang-format off
template <class Arch>
const row_stream_function* row_stream_kernels<Arch>::row_streams() {
  static constexpr auto table = []<std::size_t... Index>(std::index_sequence<Index...>) {
    return std::array<row_stream_function, sizeof...(Index)>{&row_stream<Index + 1>...};
  }(std::make_index_sequence<row_stream_max_rows>{});
  return table.data();
}
// clang-format on

}  // namespace kvhead::engine
