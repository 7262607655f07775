// The bf16 GEMM (gemm_bf16.hpp): packing of B per unit, and the driver of
// the bf16 units' micro-kernels (bf16_microkernel.hpp); the portable
// fallback goes through the fp32 driver (gemm.cpp).
//
//   PC (bf16_kc-deep block of k, in order) -> pack the A block (rounded to
//   bf16, the unit's layout) -> tasks over (MR-row A panel x group of 32-column
//   B panels) -> kernel
//
// B is packed once for the whole matrix, so the PC loop reads it in place.
#include "engine/gemm/gemm_bf16.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/arch/cpu_info.hpp"
#include "engine/arch/require.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/gemm/bf16_microkernel.hpp"
#include "engine/gemm/driver_support.hpp"
#include "engine/gemm/pack.hpp"

namespace kvhead::engine {
namespace {

// Pairs of k a block of `depth` is padded to for a unit: whole pairs, and
// for AMX whole tile steps of 16 pairs.
std::size_t block_pairs(bf16_unit unit, std::size_t depth) {
  return round_up(ceil_div(depth, 2), unit == bf16_unit::amx ? 16 : 1);
}

void validate_b(const void* data, std::size_t ld, transpose trans, std::size_t k, std::size_t n) {
  if (k == 0 || n == 0) return;
  engine::require(data != nullptr, [] { return std::string("packed_bf16_b: B is null"); });
  const std::size_t row_length = trans == transpose::no ? n : k;
  engine::require(ld >= row_length, [&] {
    return "packed_bf16_b: leading dimension of B (" + std::to_string(ld) + ") is smaller than its row length (" +
           std::to_string(row_length) + ")";
  });
}

}  // namespace

packed_bf16_b::packed_bf16_b(std::size_t k, std::size_t n, const bf16_bits* b, std::size_t ldb, transpose trans,
                             bf16_unit unit, simd_path fallback_path)
    : k_(k), n_(n), unit_(unit), path_(fallback_path) {
  validate_b(b, ldb, trans, k, n);
  const std::size_t row_stride = trans == transpose::no ? ldb : 1, col_stride = trans == transpose::no ? 1 : ldb;
  pack([&](std::size_t row, std::size_t col) { return b[row * row_stride + col * col_stride]; },
       trans == transpose::yes);
}

packed_bf16_b::packed_bf16_b(std::size_t k, std::size_t n, gemm_operand b_fp32, bf16_unit unit, simd_path fallback_path)
    : k_(k), n_(n), unit_(unit), path_(fallback_path) {
  validate_b(b_fp32.data, b_fp32.ld, b_fp32.trans, k, n);
  const std::size_t row_stride = b_fp32.trans == transpose::no ? b_fp32.ld : 1;
  const std::size_t col_stride = b_fp32.trans == transpose::no ? 1 : b_fp32.ld;
  pack([&](std::size_t row, std::size_t col) { return encode_bf16(b_fp32.data[row * row_stride + col * col_stride]); },
       b_fp32.trans == transpose::yes);
}

// element(row, col) gives op(B)'s bf16 element. Both layouts are blocks of
// KC rows (in order), each cut into panels of NR columns (zero past n);
// within a panel, the fallback stores [depth][NR], the bf16 units
// [pairs][NR][2] (zero rows past the depth, block_pairs). The source is read
// along its rows (contiguous_in_k: a transposed B, as weights [out][in]
// usually are), the writes staying within one panel of a block.
template <class Element>
void packed_bf16_b::pack(const Element& element, bool contiguous_in_k) {
  const bool pairs = unit_ != bf16_unit::fp32_fallback;
  const std::size_t nr = pairs ? bf16_nr : gemm_config_for(path_).nr;
  const std::size_t kc = pairs ? bf16_kc : gemm_config_for(path_).kc;
  auto padded_depth = [&](std::size_t depth) { return pairs ? 2 * block_pairs(unit_, depth) : depth; };
  const std::size_t padded_n = round_up(n_, nr);
  const std::size_t last_k0 = k_ == 0 ? 0 : (k_ - 1) / kc * kc;
  elements_ = (last_k0 + padded_depth(k_ - last_k0)) * padded_n;
  // Whole floats of storage, at least one (an empty operand has a valid pointer).
  const std::size_t floats = std::max<std::size_t>(1, ceil_div(elements_, 2));
  float* const storage = panels_.reserve(floats);
  std::memset(storage, 0, floats * sizeof(float));
  bf16_bits* const packed = reinterpret_cast<bf16_bits*>(storage);
  for (std::size_t k0 = 0; k0 < k_; k0 += kc) {
    const std::size_t depth = std::min(kc, k_ - k0), panel_elements = padded_depth(depth) * nr;
    bf16_bits* const block = packed + k0 * padded_n;
    auto store = [&](std::size_t row, std::size_t col) {
      const std::size_t panel = col / nr, lane = col % nr;
      const std::size_t within = pairs ? ((row / 2) * nr + lane) * 2 + row % 2 : row * nr + lane;
      block[panel * panel_elements + within] = element(k0 + row, col);
    };
    if (contiguous_in_k) {
      for (std::size_t col = 0; col < n_; ++col)
        for (std::size_t row = 0; row < depth; ++row) store(row, col);
    } else {
      for (std::size_t row = 0; row < depth; ++row)
        for (std::size_t col = 0; col < n_; ++col) store(row, col);
    }
  }
}

namespace {

void validate_bf16_gemm(gemm_shape shape, gemm_operand a, const packed_bf16_b& b, const float* c, std::size_t ldc) {
  engine::require(shape.k == b.k() && shape.n <= b.n(), [&] {
    return "gemm_bf16: the shape's k x n (" + std::to_string(shape.k) + " x " + std::to_string(shape.n) +
           ") does not fit B (" + std::to_string(b.k()) + " x " + std::to_string(b.n()) +
           "): k must be equal, n at most B's";
  });
  validate_operand("A", a, shape.m, shape.k);
  validate_c(c, ldc, shape.m, shape.n);
}

// Packs rows [row0, row0 + rows) of op(A)[:, k0 : k0 + depth], rounded to
// bf16 by the unit's conversion (kernels.convert_rows, vectorized on the
// hardware), as one A panel of the kernels' layout (MR rows, zero past
// `rows` and past the depth, up to 2 * pairs). A transposed A's rows are
// gathered first. tile_rows: each row converted into its place. pairs: the
// rows converted side by side, then their 32-bit pairs transposed into
// [pair][row] by pack_a's SSE transposer (pack_a_words). A pair at a time,
// with the panel cleared first, the scatter took as long as the conversion
// (Zen 4, gemm_bf16 1024 x 128 x 1024: 20% of the GEMM's samples, 7% after;
// 3 alternations, 1 thread: that shape 10-13% faster, 256^3 and 512^3 5-7%,
// 1024^3 and 2048^3 3%, 1 x 4096 x 128 0.2 us slower, 12.0 -> 12.25 us).
void pack_a_panel(const bf16_kernels& kernels, gemm_operand a, std::size_t row0, std::size_t rows, std::size_t k0,
                  std::size_t depth, std::size_t pairs, bf16_bits* panel) {
  static_assert(bf16_kc % 2 == 0);
  float gathered[bf16_kc];
  auto row_source = [&](std::size_t r) {
    if (a.trans == transpose::no) return a.data + (row0 + r) * a.ld + k0;
    for (std::size_t k = 0; k < depth; ++k) gathered[k] = a.data[(k0 + k) * a.ld + row0 + r];
    return static_cast<const float*>(gathered);
  };
  if (kernels.a_layout == bf16_a_layout::tile_rows) {
    std::memset(panel, 0, kernels.mr * 2 * pairs * sizeof(bf16_bits));
    for (std::size_t r = 0; r < rows; ++r)
      kernels.convert_rows(row_source(r), depth, 1, depth, panel + r * 2 * pairs, 2 * pairs);
    return;
  }
  engine::require(kernels.mr <= avx512bf16_mr && 2 * pairs <= bf16_kc,
                  [] { return std::string("gemm_bf16: a pairs panel larger than its packing buffer"); });
  alignas(64) bf16_bits converted[avx512bf16_mr * bf16_kc];
  const std::size_t converted_pairs = (depth + 1) / 2;  // convert_rows zeroes a last odd element's partner
  for (std::size_t r = 0; r < rows; ++r) {
    bf16_bits* const target = converted + r * bf16_kc;
    kernels.convert_rows(row_source(r), depth, 1, depth, target, bf16_kc);
    std::fill(target + 2 * converted_pairs, target + 2 * pairs, bf16_bits{});
  }
  pack_a_words(converted, bf16_kc / 2, rows, pairs, kernels.mr, panel);
}

// Runs `kernel` on C[0:rows, 0:cols] of a tile `width` columns wide (cols <
// width: on a padded copy of C, so edge elements get the same arithmetic).
void run_tile(bf16_microkernel_function kernel, const bf16_microkernel_params& params, std::size_t rows,
              std::size_t cols, std::size_t width) {
  if (cols == width) {
    kernel(params);
    return;
  }
  alignas(64) float tile[amx_mr * bf16_nr * bf16_skinny_panels];
  static_assert(avx512bf16_mr <= amx_mr && bf16_skinny_rows <= amx_mr);
  float* const c = params.c;
  const std::size_t ldc = params.ldc;
  for (std::size_t row = 0; row < rows; ++row)
    if (params.beta != 0.0f) std::copy(c + row * ldc, c + row * ldc + cols, tile + row * width);
  bf16_microkernel_params padded = params;
  padded.c = tile;
  padded.ldc = width;
  kernel(padded);
  for (std::size_t row = 0; row < rows; ++row) std::copy(tile + row * width, tile + row * width + cols, c + row * ldc);
}

}  // namespace

void gemm_bf16_with(const bf16_kernels& kernels, gemm_shape shape, gemm_operand a, const packed_bf16_b& b, float beta,
                    float* c, std::size_t ldc) {
  validate_bf16_gemm(shape, a, b, c, ldc);
  engine::require(b.unit() == kernels.unit, [&] {
    return std::string("gemm_bf16: B is packed for ") + to_string(b.unit()) + ", the kernels are " +
           to_string(kernels.unit) + "'s";
  });
  const std::size_t m = shape.m, n = shape.n, k = shape.k, mr = kernels.mr;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t row = 0; row < m; ++row)
      for (std::size_t col = 0; col < n; ++col) c[row * ldc + col] = beta == 0.0f ? 0.0f : beta * c[row * ldc + col];
    return;
  }
  // Few rows: the skinny kernels over groups of panels; else one panel per call.
  const bool skinny = kernels.skinny != nullptr && m <= kernels.skinny_rows;
  const std::size_t group_panels = skinny ? kernels.skinny_panels : 1;
  const std::size_t panels = ceil_div(n, bf16_nr), a_panels = ceil_div(m, mr);
  // Tasks: an A panel times a run of panels of B (8 groups: 256 or 1024 columns).
  const std::size_t task_panels = 8 * group_panels, column_tasks = ceil_div(panels, task_panels);
  const std::size_t padded_n = round_up(b.n(), bf16_nr);
  const std::size_t l2_bytes = host_cpu().l2_bytes != 0 ? host_cpu().l2_bytes : std::size_t{512} << 10;
  for (std::size_t k0 = 0; k0 < k; k0 += bf16_kc) {
    const std::size_t depth = std::min(bf16_kc, k - k0), pairs = block_pairs(kernels.unit, depth);
    const std::size_t a_panel_elements = mr * 2 * pairs, b_panel_elements = 2 * pairs * bf16_nr;
    scratch_lease a_packed(ceil_div(a_panels * a_panel_elements, 2));
    bf16_bits* const a_block = reinterpret_cast<bf16_bits*>(a_packed.data());
    for_each_index(a_panels, flops_per_byte_moved * sizeof(float) * double(m) * double(depth), [&](std::size_t panel) {
      pack_a_panel(kernels, a, panel * mr, std::min(mr, m - panel * mr), k0, depth, pairs,
                   a_block + panel * a_panel_elements);
    });
    const bf16_bits* const b_block = b.panels() + k0 * padded_n;
    const float block_beta = k0 == 0 ? beta : 1.0f;
    const double work = (2.0 * double(m) + flops_per_byte_moved * sizeof(bf16_bits)) * double(n) * double(depth);
    // A B block of more than 3/4 of L2 would be read from L3 again by every
    // A panel: then the runs of B panels go outermost, each staying in L2
    // while all the A panels pass; else the A panels, each read once (B
    // stays in L2). Xeon (2 MiB L2), in GFLOP/s at 1 / 2 threads: 2048^3
    // 609-662 -> 848-973 / 1432 -> 2092, 512 x 4096 x 4096 707 -> 966 / 1532
    // -> 2062, 1024^3 765-802 -> 879-894 / within the noise; a 1.5 MiB B
    // (2048 x 1536 x 512) 3-4% slower with its runs outermost.
    const bool runs_outermost = padded_n * 2 * pairs * sizeof(bf16_bits) > l2_bytes / 4 * 3;
    for_each_index(a_panels * column_tasks, work, [&](std::size_t task) {
      const std::size_t a_panel = runs_outermost ? task % a_panels : task / column_tasks;
      const std::size_t first = (runs_outermost ? task / a_panels : task % column_tasks) * task_panels;
      const std::size_t row0 = a_panel * mr, rows = std::min(mr, m - row0);
      if (kernels.begin_task != nullptr) kernels.begin_task();
      // One params for the task's calls, the B panel and C set per call: a
      // params built whole per call and passed by value was copied with
      // 16-byte loads over its 8-byte stores, a failed store forwarding that
      // waited behind the previous call's C stores (Zen 5, gemm_bf16 1024^3
      // at 1 thread: the driver's own samples 5.7% of the kernel's, three
      // quarters on that load; 1.4% after. Old and new alternated 3 times, 2
      // threads: 1024 x 1024 x 128 0.407-0.424 -> 0.368-0.383 ms,
      // S3_mha_layer_bf16 12.6-12.8 -> 11.3-12.4 ms; 1 thread within the noise).
      bf16_microkernel_params params{
          a_block + a_panel * a_panel_elements, nullptr, b_panel_elements, pairs, block_beta, nullptr, ldc};
      for (std::size_t panel = first; panel < std::min(panels, first + task_panels);) {
        // A whole group when it fits within n, else single panels.
        const bool group = skinny && panel + group_panels <= panels && (panel + group_panels) * bf16_nr <= n;
        const std::size_t count = group ? group_panels : 1, col = panel * bf16_nr;
        const bf16_microkernel_function kernel = group ? kernels.skinny[rows - 1] : kernels.kernels[rows - 1];
        params.b_panels = b_block + panel * b_panel_elements;
        params.c = c + row0 * ldc + col;
        run_tile(kernel, params, rows, std::min(count * bf16_nr, n - col), count * bf16_nr);
        panel += count;
      }
      if (kernels.end_task != nullptr) kernels.end_task();
    });
  }
}

void gemm_bf16(gemm_shape shape, gemm_operand a, const packed_bf16_b& b, float beta, float* c, std::size_t ldc) {
  validate_bf16_gemm(shape, a, b, c, ldc);
  engine::require(bf16_unit_runs_here(b.unit()), [&] {
    return std::string("gemm_bf16: B is packed for the bf16 unit ") + to_string(b.unit()) +
           ", which this CPU cannot run";
  });
  switch (b.unit()) {
    case bf16_unit::amx:
      return gemm_bf16_with(amx_kernels(), shape, a, b, beta, c, ldc);
    case bf16_unit::avx512bf16:
      return gemm_bf16_with(avx512bf16_kernels(), shape, a, b, beta, c, ldc);
    case bf16_unit::fp32_fallback:
      break;
  }
  // The fallback: the fp32 driver over B's bf16 panels, A rounded as packed.
  gemm(shape, 1.0f, a, packed_b_view{b.panels(), b.k(), b.n(), b.fallback_path(), kv_dtype::bf16}, beta, c, ldc,
       a_rounding::bf16);
}

}  // namespace kvhead::engine
