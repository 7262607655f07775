// bf16 products over a paged B (gemm_bf16_paged, gemm_bf16.hpp): the driver
// of the paged kernels (bf16_microkernel.hpp).
//
//   A's rows to bf16 rows (once per call) -> for each 32-column panel of B
//   (per column page) -> for each MR-row block of A -> kernel over the
//   panel's rows in all pages (avx512bf16, a single row block over row
//   pages: the pages outermost, one call per page and panel)
//
// One B panel (at most KC rows of 32 fp32: 32 KiB) is read by every row
// block in turn while it is in L1/L2; A's bf16 rows stay in L2. amx: more
// than mr rows run on tiles, in blocks of amx_mr rows, the first block
// staging the panel in L1 for the others; at most mr rows run its FMA form.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "engine/arch/kernel_config.hpp"
#include "engine/arch/require.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/gemm/bf16_microkernel.hpp"
#include "engine/gemm/driver_support.hpp"
#include "engine/gemm/paged_panels.hpp"

namespace kvhead::engine {

bool gemm_bf16_paged_runs(simd_path path, kv_dtype element) {
  return active_bf16_unit() != bf16_unit::fp32_fallback && bf16_unit_runs_here(bf16_unit::avx512bf16) &&
         gemm_config_for(path).nr == bf16_nr && element != kv_dtype::int8;
}

bool bf16_paged_products_chosen(simd_path path, kv_dtype element, kvhead::precision precision) {
  if (!gemm_bf16_paged_runs(path, element)) return false;
  if (active_bf16_unit() == bf16_unit::amx && precision == kvhead::precision::bf16) return true;
  return kernel_config_for(path).row->bf16_paged_products;
}

namespace {

const bf16_paged_kernels& active_bf16_paged_kernels() {
  return active_bf16_unit() == bf16_unit::amx ? amx_paged_kernels() : avx512bf16_paged_kernels();
}

}  // namespace

std::size_t gemm_bf16_paged_k_group() { return 2 * active_bf16_paged_kernels().pair_multiple; }

namespace {

// A's bf16 rows as the kernels read them: a_ld = the depth rounded up to a
// whole group of the unit's k, zero past the depth; `held` rows (the staged
// kernels' tiles read whole tiles of rows: zero rows up to a whole block of
// amx_mr).
std::size_t converted_ld(const bf16_paged_kernels& kernels, std::size_t k) {
  return round_up(std::max<std::size_t>(k, 1), 2 * kernels.pair_multiple);
}

void convert_a_rows(const bf16_paged_kernels& kernels, gemm_operand a, std::size_t m, std::size_t k, std::size_t held,
                    bf16_bits* rows) {
  const std::size_t a_ld = converted_ld(kernels, k);
  kernels.convert_rows(a.data, a.ld, m, k, rows, a_ld);
  const std::size_t converted = k + k % 2;  // convert_rows zeroes up to a whole pair
  for (std::size_t row = 0; row < held && a_ld > converted; ++row) {
    const std::size_t from = row < m ? converted : 0;
    std::memset(static_cast<void*>(rows + row * a_ld + from), 0, (a_ld - from) * sizeof(bf16_bits));
  }
}

// Rows converted ahead for products of any row count: whole tile blocks on amx.
std::size_t rows_held_ahead(const bf16_paged_kernels& kernels, std::size_t m) {
  return kernels.staged[0] != nullptr ? round_up(m, amx_mr) : m;
}

}  // namespace

std::size_t bf16_rows_floats_with(const bf16_paged_kernels& kernels, std::size_t m, std::size_t k) {
  return ceil_div(rows_held_ahead(kernels, m) * converted_ld(kernels, k), 2);
}

bf16_rows convert_rows_bf16_with(const bf16_paged_kernels& kernels, gemm_operand a, std::size_t m, std::size_t k,
                                 float* storage) {
  validate_operand("A", a, m, k);
  engine::require(a.trans == transpose::no, [] { return std::string("convert_rows_bf16: needs A not transposed"); });
  auto* const rows = reinterpret_cast<bf16_bits*>(storage);
  const std::size_t held = rows_held_ahead(kernels, m);
  if (m > 0) convert_a_rows(kernels, a, m, k, held, rows);
  return {rows, m, k, converted_ld(kernels, k), held};
}

std::size_t bf16_rows_floats(std::size_t m, std::size_t k) {
  return bf16_rows_floats_with(active_bf16_paged_kernels(), m, k);
}

bf16_rows bf16_rows_at(std::size_t m, std::size_t k, const float* storage) {
  const bf16_paged_kernels& kernels = active_bf16_paged_kernels();
  return {reinterpret_cast<const bf16_bits*>(storage), m, k, converted_ld(kernels, k), rows_held_ahead(kernels, m)};
}

bf16_rows convert_rows_bf16(gemm_operand a, std::size_t m, std::size_t k, float* storage) {
  return convert_rows_bf16_with(active_bf16_paged_kernels(), a, m, k, storage);
}

void gemm_bf16_paged_with(const bf16_paged_kernels& kernels, gemm_shape shape, float alpha, gemm_operand a,
                          const paged_b_view& b, float* c, std::size_t ldc, const bf16_rows* converted) {
  const std::size_t m = shape.m, n = shape.n, k = shape.k, element = static_cast<std::size_t>(b.element);
  check_paged_product("gemm_bf16_paged", shape, a, b, c, ldc, bf16_nr, 2, kernels.by_element[element] != nullptr,
                      "f32, bf16 or f16", kernels.staged[element] != nullptr);
  // amx: products of many rows on the tiles, of few on their FMA form (the
  // same bits), but B packed in the tiles' layout always on the tiles.
  const bool tile_pairs = b.layout == panel_layout::tile_pairs;
  const bf16_staged_function* const staged = m > kernels.mr || tile_pairs ? kernels.staged[element] : nullptr;
  const std::size_t a_ld = converted_ld(kernels, k);
  const std::size_t a_rows_held = staged != nullptr ? round_up(m, amx_mr) : m;
  engine::require(converted == nullptr || (converted->m == m && converted->k == k && converted->ld == a_ld &&
                                           converted->held >= a_rows_held),
                  [&] {
                    return "gemm_bf16_paged: the converted rows given (" + std::to_string(converted->m) + " x " +
                           std::to_string(converted->k) + ", " + std::to_string(converted->held) + " held " +
                           std::to_string(converted->ld) + " apart) are not A's (" + std::to_string(m) + " x " +
                           std::to_string(k) + ") for these kernels";
                  });
  if (m == 0 || n == 0) return;
  // A's bf16 rows (convert_a_rows), converted here unless given.
  scratch_lease a_storage(converted != nullptr ? 0 : ceil_div(a_rows_held * a_ld, 2));
  if (converted == nullptr)
    convert_a_rows(kernels, a, m, k, a_rows_held, reinterpret_cast<bf16_bits*>(a_storage.data()));
  const bf16_bits* const a_rows =
      converted != nullptr ? converted->rows : reinterpret_cast<const bf16_bits*>(a_storage.data());
  const bf16_paged_function* const by_rows = kernels.by_element[element];
  const std::size_t mr = kernels.mr;
  const kernel_config_row& row = *kernel_config_for(b.path).row;
  const stream_prefetch prefetch = bf16_paged_stream_prefetch(row, m <= mr, b.element);
  // amx: MXCSR and the tiles set for the product (bf16_paged_kernels).
  struct product_scope {
    const bf16_paged_kernels& kernels;
    bool on_tiles;
    unsigned int state = kernels.begin_product != nullptr ? kernels.begin_product(on_tiles) : 0;
    ~product_scope() {
      if (kernels.end_product != nullptr) kernels.end_product(on_tiles, state);
    }
  } scope{kernels, staged != nullptr};
  if (staged != nullptr) {
    // Each panel staged (in L1) by its first row block's call as it goes,
    // read from there by the other row blocks' calls; or read where it was
    // packed in the tiles' layout.
    const std::size_t pairs = a_ld / 2;
    scratch_lease staging(tile_pairs ? 0 : pairs * bf16_nr);  // [pairs][32][2] bf16
    auto* const staging_panel = reinterpret_cast<bf16_bits*>(staging.data());
    for_each_paged_panel(
        b, k, n, [&](const void* const* rows_of_panel, std::size_t page_rows, std::size_t col, std::size_t cols) {
          const bf16_bits* const panel = tile_pairs ? static_cast<const bf16_bits*>(rows_of_panel[0]) : staging_panel;
          for (std::size_t row0 = 0; row0 < m; row0 += amx_mr)
            staged[std::min(amx_mr, m - row0) - 1](
                {a_rows + row0 * a_ld, panel, !tile_pairs && row0 == 0 ? staging_panel : nullptr, pairs, cols, alpha,
                 c + row0 * ldc + col, ldc, rows_of_panel, page_rows, k, paged_row_stride(b), prefetch});
        });
    return;
  }
  if (b.along_k && k > b.page && m <= mr && kernels.pair_multiple == 1) {  // (amx's FMA form carries no sums)
    // One row block over several row pages (a decode step's p v over a
    // cache's blocks): the pages outermost, each page's panels (contiguous
    // in it) read as one stream before the next page; each tile's sums run
    // on from page to page in `carry`, so the bits are those of the
    // panel-major walk.
    // Measured on Zen 4 (S1's geometry, bf16 cache, block 16, 6
    // alternations): panel-major 1.83-1.99 ms (median 1.88), page-major
    // 1.49-2.05 (median 1.63). One page per call: groups of pages, as the
    // int8 driver takes them, made blocks 16 and 32 14% slower here (Zen 5,
    // 4 alternations).
    for_each_page_and_panel<float>(
        b, k, n, m, 1, false,
        [&](const void* const* rows_of_panel, std::size_t row0, std::size_t rows, std::size_t col, std::size_t cols,
            page_carry<float> carry, std::size_t) {
          by_rows[m - 1]({a_rows + row0, a_ld, rows_of_panel, b.page, rows, paged_row_stride(b), cols, alpha, c + col,
                          ldc, carry.sums, carry.in, carry.out, prefetch});
        });
    return;
  }
  for_each_paged_panel(b, k, n,
                       [&](const void* const* rows_of_panel, std::size_t page_rows, std::size_t col, std::size_t cols) {
                         for (std::size_t row0 = 0; row0 < m; row0 += mr) {
                           const std::size_t rows = std::min(mr, m - row0);
                           by_rows[rows - 1]({a_rows + row0 * a_ld, a_ld, rows_of_panel, page_rows, k,
                                              paged_row_stride(b), cols, alpha, c + row0 * ldc + col, ldc, nullptr,
                                              false, false, prefetch});
                         }
                       });
}

bool gemm_bf16_paged_reads_tile_pairs() { return active_bf16_unit() == bf16_unit::amx; }

void pack_tile_pairs_with(const bf16_paged_kernels& kernels, const packed_b_view& from, bf16_bits* to) {
  const gemm_config& config = gemm_config_for(from.path);
  engine::require(kernels.stage_panel != nullptr && from.layout == panel_layout::rows &&
                      from.element == kv_dtype::f32 && config.nr == bf16_nr && from.k <= config.kc,
                  [&] {
                    return "pack_tile_pairs: needs the amx unit's kernels and f32 panels of 32 columns (NR " +
                           std::to_string(config.nr) + ") and k at most KC (" + std::to_string(from.k) + ")";
                  });
  const std::size_t pairs = tile_pairs_depth(from.k) / 2;
  for (std::size_t col = 0; col < from.n; col += bf16_nr)
    kernels.stage_panel(static_cast<const float*>(from.panels) + pack_b_offset(config, from.k, from.n, 0, col), from.k,
                        pairs, to + tile_pairs_offset(from.k, 0, col));
}

void pack_tile_pairs(const packed_b_view& from, bf16_bits* to) {
  engine::require(gemm_bf16_paged_reads_tile_pairs(), [] {
    return std::string("pack_tile_pairs: the active bf16 unit is ") + to_string(active_bf16_unit()) + ", not amx";
  });
  pack_tile_pairs_with(amx_paged_kernels(), from, to);
}

void gemm_bf16_paged(gemm_shape shape, float alpha, gemm_operand a, const paged_b_view& b, float* c, std::size_t ldc,
                     const bf16_rows* converted) {
  engine::require(gemm_bf16_paged_runs(b.path, b.element), [&] {
    return std::string("gemm_bf16_paged: this CPU's bf16 unit is ") + to_string(active_bf16_unit()) +
           " and the path's NR " + std::to_string(gemm_config_for(b.path).nr) +
           ": the paged kernels need avx512bf16 (or amx), NR 32 and f32, bf16 or f16 B";
  });
  gemm_bf16_paged_with(active_bf16_paged_kernels(), shape, alpha, a, b, c, ldc, converted);
}

}  // namespace kvhead::engine
