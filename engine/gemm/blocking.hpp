// GEMM register and cache blocking as the untemplated driver sees it: the
// numbers of this machine's kernel configuration (engine/arch/kernel_config.hpp,
// one table of rows per kind of CPU, each number with its reason) and the
// micro-kernels compiled for its register tile.
//
// MR x NR is the register tile: MR rows of A are broadcast, NR columns of B
// are NR / W vectors. MC x KC is the packed A block (kept in L2), KC x NR the
// B micro-panel (kept in L1 while the IR loop sweeps the A block), KC x NC the
// packed B block (L3). KC is the same for every configuration: it fixes the
// order of the sum over k (see gemm.hpp), so it never depends on the shape,
// the thread count or the CPU.
#pragma once

#include <array>
#include <cstddef>
#include <tuple>

#include "engine/arch/dispatch.hpp"
#include "engine/arch/kernel_config.hpp"
#include "engine/gemm/microkernel.hpp"

namespace kvhead::engine {

// The register tiles engine/arch/<isa>.cpp instantiates for each path; every
// row of the configuration table names one of them (checked in blocking.cpp).
template <>
struct compiled_tiles<avx512_arch> {
  using shapes = std::tuple<tile_shape<12, 32>>;
};
template <>
struct compiled_tiles<avx2_arch> {
  using shapes = std::tuple<tile_shape<6, 16>>;
};
template <>
struct compiled_tiles<sse2_arch> {
  using shapes = std::tuple<tile_shape<6, 8>>;
};

/// The blocking and micro-kernel of one path, as plain run-time values for
/// the untemplated driver.
struct gemm_config {
  std::size_t mr, nr, mc, kc, nc;
  // microkernels[element][rows - 1], rows in 1..mr, B stored as kv_dtype `element`.
  std::array<const microkernel_function*, stored_dtype_count> microkernels;
  // wide_microkernels[element][rows - 1], rows in 1..wide_max_rows (microkernel.hpp).
  std::array<const microkernel_function*, stored_dtype_count> wide_microkernels;
  // half_microkernels[element][rows - 1], rows in 1..mr: the first NR / 2 columns only (microkernel.hpp).
  std::array<const microkernel_function*, stored_dtype_count> half_microkernels;
  const row_stream_function* row_streams;  // [rows - 1], rows in 1..row_stream_max_rows
  // paged_prefetch[element]: under a single A panel, kernel_config_row::fp32_paged_prefetch_bytes (f32) or
  // widened_paged_prefetch_bytes (the others) and the L2 lead.
  std::array<stream_prefetch, stored_dtype_count> paged_prefetch;
  bool paged_prefetch_to_l2 = false;       // kernel_config_row::fp32_paged_prefetch_to_l2
  std::size_t a_in_place_panels = 0;       // kernel_config_row::a_in_place_panels
  std::size_t b_sweep_panels = 1;          // kernel_config::b_sweep_panels (dense B)
};

/// This process's GEMM configuration for `path` (kernel_config_for(path)),
/// resolved at first use.
const gemm_config& gemm_config_for(simd_path path);

}  // namespace kvhead::engine
