// The register-blocked micro-kernel (contract in microkernel.hpp), written
// once with xsimd for every ISA. Include only from engine/arch/<isa>.cpp.
//
// Blocking: MR x NR accumulators live in registers for the whole k loop
// (sizes and register budget in blocking.hpp). Each k step loads NR / W
// vectors of B, broadcasts MR scalars of A and issues MR * NR / W FMAs.
#pragma once

#include <cstddef>

#include <xsimd/xsimd.hpp>

#include "engine/arch/multiply_add.hpp"
#include "engine/gemm/blocking.hpp"
#include "engine/gemm/microkernel.hpp"

namespace kvhead::engine {

template <class Arch>
void gemm_kernels<Arch>::microkernel(const microkernel_params& params) {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::size_t mr = gemm_blocking<Arch>::mr;
  constexpr std::size_t vectors = gemm_blocking<Arch>::nr / batch::size;
  static_assert(gemm_blocking<Arch>::nr % batch::size == 0);

  batch acc[mr][vectors];
#pragma GCC unroll 16
  for (std::size_t row = 0; row < mr; ++row)
#pragma GCC unroll 4
    for (std::size_t v = 0; v < vectors; ++v) acc[row][v] = batch(0.0f);

  const float* a = params.a_panel;
  const float* b = params.b_panel;
  for (std::size_t k = 0; k < params.k_depth; ++k, a += mr, b += params.b_row_stride) {
    batch b_row[vectors];
#pragma GCC unroll 4
    for (std::size_t v = 0; v < vectors; ++v) b_row[v] = batch::load_unaligned(b + v * batch::size);
#pragma GCC unroll 16
    for (std::size_t row = 0; row < mr; ++row) {
      const batch a_value(a[row]);
#pragma GCC unroll 4
      for (std::size_t v = 0; v < vectors; ++v)
        acc[row][v] = multiply_add(a_value, b_row[v], acc[row][v]);
    }
  }

  const batch alpha(params.alpha);
  const batch beta(params.beta);
  const bool read_c = params.beta != 0.0f;
#pragma GCC unroll 16
  for (std::size_t row = 0; row < mr; ++row) {
    float* c_row = params.c + row * params.ldc;
#pragma GCC unroll 4
    for (std::size_t v = 0; v < vectors; ++v) {
      batch result = alpha * acc[row][v];
      if (read_c) result = result + beta * batch::load_unaligned(c_row + v * batch::size);
      result.store_unaligned(c_row + v * batch::size);
    }
  }
}

}  // namespace kvhead::engine
