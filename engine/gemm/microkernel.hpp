// The GEMM micro-kernel contract (the BLIS kernel contract, row-major).
//
//   C[0:MR, 0:NR] := alpha * A_panel * B_panel + beta * C[0:MR, 0:NR]
//
// A_panel  packed, k_depth steps of MR floats: element (row r, step k) at
//          a_panel[k * MR + r]. Rows past the matrix edge are zero padding.
// B_panel  k_depth rows of NR floats, row k at b_panel + k * b_row_stride
//          (b_row_stride = NR for a packed panel). Columns past the matrix edge
//          are zero padding.
// C        a full MR x NR row-major tile, rows ldc floats apart. The kernel
//          always reads (when beta != 0) and writes the whole tile: edges
//          (m < MR or n < NR) are run by the caller on a padded copy of C
//          through this same kernel, so edge elements get the same arithmetic.
// beta     beta == 0 means overwrite: C is never read, so NaN or garbage in
//          the old C cannot leak into the result.
//
// Arithmetic, fixed on each path: acc = 0; for k in order: acc = fma(a, b, acc)
// (mul then add on sse2); then C = alpha * acc + beta * C. Every element of the
// tile gets exactly this sequence, whatever its row or column, so a row of C
// does not depend on which other rows were computed with it.
#pragma once

#include <cstddef>

namespace kvhead::engine {

struct microkernel_params {
  const float* a_panel;
  const float* b_panel;
  std::size_t b_row_stride;
  std::size_t k_depth;
  float alpha;
  float beta;
  float* c;
  std::size_t ldc;
};

using microkernel_function = void (*)(const microkernel_params&);

/// Per-ISA GEMM kernels; defined in microkernel_impl.hpp and explicitly
/// instantiated in engine/arch/<isa>.cpp (the only TUs built with ISA flags).
template <class Arch>
struct gemm_kernels {
  static void microkernel(const microkernel_params& params);
};

}  // namespace kvhead::engine
