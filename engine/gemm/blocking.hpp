// GEMM register and cache blocking, one table per ISA (as BLIS's
// bli_cntx_init_<arch>.c), and the run-time lookup of the active one.
//
// MR x NR is the register tile: MR rows of A are broadcast, NR columns of B
// are NR / W vectors. MC x KC is the packed A block (kept in L2), KC x NR the
// B micro-panel (kept in L1 while the IR loop sweeps the A block), KC x NC the
// packed B block (L3). KC is fixed per ISA: it fixes the order of the sum over
// k (see gemm.hpp), so it never depends on the shape or the thread count.
#pragma once

#include <cstddef>

#include "engine/arch/dispatch.hpp"
#include "engine/gemm/microkernel.hpp"

namespace kvhead::engine {

template <class Arch>
struct gemm_blocking;

// Zen 4 / AVX-512: 32 zmm registers. 12 x 32 keeps 24 accumulators + 2 B
// vectors + 1 broadcast = 27 live (14 x 32 would use 31 and gave no gain);
// 24 independent FMA chains cover the 4-cycle latency of the two FMA pipes.
// KC = 256: the B micro-panel is 256 x 32 x 4 B = 32 KiB, streamed from L2
// (Zen 4 L2 feeds 64 B/cycle, twice what the kernel needs); MC = 480: the A
// block is 480 KiB, half the 1 MiB L2. NC = 4096: a 4 MiB B block in L3.
template <>
struct gemm_blocking<avx512_arch> {
  static constexpr std::size_t mr = 12, nr = 32, mc = 480, kc = 256, nc = 4096;
};

// AVX2 + FMA: 16 ymm registers. 6 x 16 = 12 accumulators + 2 B + 1 broadcast
// = 15 (the BLIS haswell kernel). KC = 256: B micro-panel 16 KiB, half of L1.
template <>
struct gemm_blocking<avx2_arch> {
  static constexpr std::size_t mr = 6, nr = 16, mc = 480, kc = 256, nc = 4096;
};

// SSE2: 16 xmm registers, no FMA. 6 x 8 = 12 accumulators + 2 B + 1 broadcast
// + 1 product temporary = 16. B micro-panel 8 KiB.
template <>
struct gemm_blocking<sse2_arch> {
  static constexpr std::size_t mr = 6, nr = 8, mc = 480, kc = 256, nc = 4096;
};

/// The largest MR x NR tile of any path (for edge tiles kept on the stack).
inline constexpr std::size_t max_tile_floats = gemm_blocking<avx512_arch>::mr * gemm_blocking<avx512_arch>::nr;

/// The blocking and micro-kernel of one path, as plain run-time values for
/// the untemplated driver.
struct gemm_config {
  std::size_t mr, nr, mc, kc, nc;
  const microkernel_function* microkernels;  // [rows - 1], rows in 1..mr
  const row_stream_function* row_streams;    // [rows - 1], rows in 1..row_stream_max_rows
};

gemm_config gemm_config_for(simd_path path);

}  // namespace kvhead::engine
