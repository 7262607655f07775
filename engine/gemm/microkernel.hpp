// The GEMM micro-kernel contract (the BLIS kernel contract, row-major).
//
//   C[0:MR, 0:NR] := alpha * A_panel * B_panel + beta * C[0:MR, 0:NR]
//
// A        element (row r, step k) at a[r * a_row_stride + k * a_k_stride]:
//          a packed panel (a_row_stride 1, a_k_stride MR; rows past the
//          matrix edge zero padding) or, for a single panel, A where it is
//          (a_row_stride lda, a_k_stride 1). Only rows 0..ROWS-1 are read.
// B_panel  k_depth rows of NR elements, row k at b_panel + k * b_row_stride
//          elements (b_row_stride = NR for a packed panel). The elements are
//          fp32, or bf16, f16 or int8 (stored_element.hpp), widened to fp32
//          exactly as they are loaded (int8 as its integer value; its scale
//          is the caller's). Columns past the matrix edge are padding: their
//          results are never used.
// C        a ROWS x NR row-major tile, rows ldc floats apart. The kernel
//          always reads (when beta != 0) and writes the whole tile. There is
//          one kernel per row count ROWS = 1..MR (short edges and small m waste
//          no FMAs); column edges (n < NR) are run by the caller on a padded
//          copy of C through the same kernel, so edge elements get the same
//          arithmetic.
// beta     beta == 0 means overwrite: C is never read, so NaN or garbage in
//          the old C cannot leak into the result.
//
// b_next   the next B panel a later call reads (same row stride), or null (no
//          prefetch): row k of it (both cache lines of a 128-byte fp32 row of
//          32) is prefetched at step k, so while this tile computes
//          the next one's B streams in from memory, also across pages of a
//          paged operand that the hardware prefetchers cannot follow; or this
//          panel's own rows a fixed distance ahead in its page (a decode
//          step's stream, gemm.cpp). A hint only: it never changes a result.
//          b_next_l2_offset: when not 0, row k of b_next plus that many
//          bytes is also prefetched at step k, into L2 only (prefetcht1):
//          the same stream further ahead (kernel_config_row::paged_l2_lead_bytes).
//          b_next_to_l2 (with b_next_l2_offset 0): b_next's rows go into L2
//          only, not L1 (kernel_config_row::fp32_paged_prefetch_to_l2).
// b_copy   when not null (fp32 B, one panel of NR columns; b_next and
//          b_next_l2_offset then both name rows to prefetch): each row k of
//          B read is also stored at b_copy + k * NR, so the call that first
//          reads a panel where it lies (rows b_row_stride apart) also packs
//          it for the calls after it, its loads among the FMAs instead of in
//          a copy pass of their own (gemm.cpp). The values are the same
//          either way, so no result changes.
// Arithmetic, fixed on each path: acc = 0; for k in order: acc = fma(a, b, acc)
// (mul then add on sse2); then C = alpha * acc + beta * C. Every element of the
// tile gets exactly this sequence, whatever its row or column, so a row of C
// does not depend on which other rows were computed with it.
// Wide tiles: a kernel of ROWS <= wide_max_rows rows may also cover PANELS
// consecutive B panels (panel j at b_panel + j * b_panel_stride elements,
// its columns at C + j * NR): one row alone keeps only NR / W accumulator
// chains, too few for the FMA latency, and a matrix-vector product (a decode
// step's projections) would wait on them (Zen 3, AVX2, B in L1: one row ran
// at 13 GFLOP/s narrow, 41 wide, of a 92 GFLOP/s peak). Each element's
// arithmetic is the narrow kernel's.
// Half panels: a kernel of COLUMNS = NR / 2 reads and writes only the first
// NR / 2 columns of its panel (B rows b_row_stride >= NR / 2 apart, C a
// ROWS x NR / 2 tile): a narrow panel of 16 columns on a 32-wide path (a KV
// cache's 16-key blocks, paged_b_view::narrow_row_stride), without the FMAs
// of 16 unused columns. Each element's arithmetic is the narrow kernel's.
// Sequences: a kernel one panel wide (PANELS 1) runs panel_sequence tiles
// one after another, the jth over the panel at b_panel + j * b_panel_stride
// (b_next, when named, that much further too) into C's columns from
// j * COLUMNS: the calls it stands for in one (an A panel's over a sweep
// of B panels, or over a KV cache page's panels, whose small blocks make
// short calls: 16 k steps a page at block 16), the caller's bookkeeping and
// the call paid once. Each tile's arithmetic is a call's. Never with b_copy.
// accumulate (alpha and beta unused): acc = C; the same k loop; C = acc. The
// chain of FMAs continues where the last call left it, so a depth cut into
// pieces (the first one with alpha 1, beta 0; the rest accumulating) gives
// exactly the bits of one call over the whole depth (1 * acc == acc). C is
// then in L1 (the last call wrote it): not prefetched.
// c_to_lanes, c_from_lanes: between the calls of such a chain C may stay in
// the kernel's lane order (microkernel_impl.hpp, panel_order: bf16 widens
// into even and odd columns), each call but the last leaving it so and each
// but the first reading it so: the shuffles to and from memory order ran
// once per call, and a chain over 16-row pages (a KV cache's 16-token
// blocks) made of 16-step calls spent a fifth of its kernel's samples on
// them (Zen 3, S1 over a bf16 cache). Lane order moves values, never
// changes one: the chain's bits are the same.
#pragma once

#include <cstddef>

#include "engine/gemm/stored_element.hpp"

namespace kvhead::engine {

struct microkernel_params {
  const float* a;
  std::size_t a_row_stride, a_k_stride;  // in floats
  const void* b_panel;                   // elements of the kernel's stored type
  std::size_t b_row_stride;              // in elements
  std::size_t k_depth;
  float alpha;
  float beta;
  float* c;
  std::size_t ldc;
  bool accumulate = false;  // C holds the running acc (see above)
  // With accumulate, C holds it in the kernel's lane order (c_to_lanes below):
  // read as is, not mapped from memory order.
  bool c_from_lanes = false;
  // C = acc left in the kernel's lane order, for the next call of the chain
  // (c_from_lanes); alpha 1 and beta 0 unless accumulating.
  bool c_to_lanes = false;
  const void* b_next = nullptr;
  std::size_t b_next_l2_offset = 0;  // with b_next: bytes beyond it also prefetched into L2 (0: not)
  bool b_next_to_l2 = false;         // with b_next and no L2 offset: its rows into L2 only (prefetcht1)
  std::size_t b_panel_stride = 0;    // elements between the panels of a wide tile or a sequence
  std::size_t panel_sequence = 1;    // one-panel kernels: panels run in turn (see above)
  float* b_copy = nullptr;         // fp32, one NR-column panel: B's rows also stored here, NR apart
};

using microkernel_function = void (*)(const microkernel_params&);

// The row-streaming kernel, for m so small that reading B dominates (GEMV-like):
//
//   C[0:rows, 0:cols] := alpha * A[0:rows, 0:k_depth] * B[0:k_depth, 0:cols] + beta * C
//
// A unpacked, element (r, k) at a[r * a_row_stride + k * a_k_stride]; B read
// in place, row k at b + k * ldb, cols a multiple of NR; C rows
// ldc apart; acc is 64-byte aligned scratch of ROWS * cols floats. B is streamed row by row
// (prefetch-friendly) while the accumulators live in L1 instead of registers.
// The arithmetic per element is the micro-kernel's exactly (acc = 0; acc =
// fma(a, b, acc) in increasing k; C = alpha * acc + beta * C), so a row of C
// is bit-identical whichever kernel computed it.
struct row_stream_params {
  const float* a;
  std::size_t a_row_stride, a_k_stride;
  const float* b;
  std::size_t ldb;
  std::size_t k_depth;
  std::size_t cols;
  float alpha;
  float beta;
  float* c;
  std::size_t ldc;
  float* acc;
};

using row_stream_function = void (*)(const row_stream_params&);

/// The most rows the row-streaming kernel takes (its A values per k step
/// stay in registers).
inline constexpr std::size_t row_stream_max_rows = 4;

/// Per-ISA GEMM micro-kernels for one MR x NR register tile (the rows of
/// engine/arch/kernel_config.hpp choose it); defined in microkernel_impl.hpp
/// and explicitly instantiated in engine/gemm/kernels_<isa>.cpp (each built
/// with its ISA's flags, with that ISA's widening loads of stored B
/// elements), one instantiation per entry of compiled_tiles<Arch>.
template <class Arch, std::size_t MR, std::size_t NR>
struct gemm_kernels {
  template <class Element, std::size_t Rows, std::size_t Panels = 1, std::size_t Columns = NR>
  static void microkernel(const microkernel_params& params);
  /// microkernels(e)[rows - 1] is the kernel for a tile of `rows` rows,
  /// 1..MR, with B stored as e.
  static const microkernel_function* microkernels(kv_dtype element);
  /// wide_microkernels(e)[rows - 1]: rows 1..wide_max_rows, wide_panels(rows) panels.
  static const microkernel_function* wide_microkernels(kv_dtype element);
  /// half_microkernels(e)[rows - 1]: rows 1..MR over the first NR / 2 columns.
  static const microkernel_function* half_microkernels(kv_dtype element);
};

/// Wide tiles (above): rows 1..wide_max_rows, each with wide_panels(rows) B
/// panels, so rows x panels = 4: 8 accumulator chains of 2-vector panels,
/// which the FMA pipes of every path here need (latency 4 x 2 pipes).
inline constexpr std::size_t wide_max_rows = 2;
constexpr std::size_t wide_panels(std::size_t rows) { return 4 / rows; }
static_assert(wide_panels(1) * 1 == 4 && wide_panels(wide_max_rows) * wide_max_rows == 4);

/// The register tiles compiled for each path: a std::tuple of tile_shape.
template <std::size_t MR, std::size_t NR>
struct tile_shape {
  static constexpr std::size_t mr = MR, nr = NR;
};
template <class Arch>
struct compiled_tiles;

/// Per-ISA row-streaming kernels (any NR that is a multiple of the vector width).
template <class Arch>
struct row_stream_kernels {
  template <std::size_t Rows>
  static void row_stream(const row_stream_params& params);
  /// row_streams()[rows - 1] streams `rows` rows, 1..row_stream_max_rows.
  static const row_stream_function* row_streams();
};

}  // namespace kvhead::engine
