// The walk over a paged B's NR-column panels that the paged-product drivers
// share (gemm_bf16_paged.cpp, gemm_int8_paged.cpp): which rows of which pages
// make up each panel, in the order the panels are computed. A panel is as
// wide as the path's NR (paged_panel_width): 32 on the avx512 path (the bf16
// and the AVX512-VNNI kernels), 16 on avx2 (its int8 kernels).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "engine/arch/kernel_config.hpp"
#include "engine/arch/require.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/gemm/driver_support.hpp"
#include "engine/gemm/gemm.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "engine/gemm/pack.hpp"
#include "engine/gemm/stored_element.hpp"

namespace kvhead::engine {

/// The width of b's panels: its path's NR.
inline std::size_t paged_panel_width(const paged_b_view& b) { return gemm_config_for(b.path).nr; }

/// Along k, pages hold an even number of rows (or one page holds all k <= KC).
inline constexpr std::size_t max_pages_along_k = gemm_kc / 2;

/// The checks of a paged product `name` (C m x n = A m x k times B): A
/// valid and not transposed, C valid, k x n within B, a path whose NR is
/// `panel_columns` (the width of the kernels' panels), k
/// at most KC, pages along k of a multiple of `page_rows_multiple` rows (2
/// or 4: the rows the kernels take per step; or one page holding all k),
/// narrow pages (paged_b_view::narrow_row_stride) only as column pages of
/// fewer than 32 columns, their stride at least the page's width, and
/// `element_ok` (B's element type is one the kernels take, as `elements`
/// says); B in the tile_pairs layout only where `tile_pairs_read`, bf16,
/// in one page along k and with no narrow pages. Throws
/// std::invalid_argument naming the problem.
inline void check_paged_product(const char* name, gemm_shape shape, gemm_operand a, const paged_b_view& b,
                                const float* c, std::size_t ldc, std::size_t panel_columns,
                                std::size_t page_rows_multiple, bool element_ok, const char* elements,
                                bool tile_pairs_read = false) {
  const std::size_t m = shape.m, n = shape.n, k = shape.k;
  validate_operand("A", a, m, k);
  validate_c(c, ldc, m, n);
  engine::require(b.layout == panel_layout::rows || (tile_pairs_read && b.element == kv_dtype::bf16 &&
                                                     b.narrow_row_stride == 0 && (!b.along_k || k <= b.page)),
                  [&] {
                    return std::string(name) +
                           ": B in the amx tiles' pair layout needs the amx unit, bf16 elements, all of k (" +
                           std::to_string(k) + ") in one page (" + std::to_string(b.page) + ") and no narrow pages";
                  });
  const gemm_config& config = gemm_config_for(b.path);
  engine::require(
      a.trans == transpose::no && k <= b.k && n <= b.n && config.nr == panel_columns && config.kc == gemm_kc &&
          (b.along_k ? k <= gemm_kc && (b.page % page_rows_multiple == 0 || k <= b.page) : b.k <= gemm_kc) &&
          narrow_pages_valid(b, panel_columns) && element_ok,
      [&] {
        const std::string pages = page_rows_multiple == 2
                                      ? std::string("an even number of rows")
                                      : "a multiple of " + std::to_string(page_rows_multiple) + " rows";
        return std::string(name) + ": needs A not transposed, k x n (" + std::to_string(k) + " x " + std::to_string(n) +
               ") within B (" + std::to_string(b.k) + " x " + std::to_string(b.n) + "), a path with NR " +
               std::to_string(panel_columns) + " (this one's: " + std::to_string(config.nr) +
               "), k at most KC, pages along k of " + pages + " (" + std::to_string(b.page) +
               "), narrow pages only along n, fewer than " + std::to_string(panel_columns) +
               " columns within their row stride (" + std::to_string(b.narrow_row_stride) + ") and " + elements + " B";
      });
}

/// The row stride, in elements, of the panels for_each_paged_panel yields.
inline std::size_t paged_row_stride(const paged_b_view& b) {
  return b.narrow_row_stride != 0 ? b.narrow_row_stride : paged_panel_width(b);
}

/// Bytes each column of a page of b takes in its panels (the rows layout):
/// the page's rows along k, at most KC, of one element.
inline std::size_t paged_column_bytes(const paged_b_view& b) {
  return std::min(gemm_kc, b.along_k ? b.page : b.k) * element_bytes(b.element);
}

/// Row 0 of the panel from column `col` (a multiple of the panel width) of
/// page `page` of `b` (along k: of b.page rows x b.n; else of b.k x b.page,
/// col within the page), in b's packed_b layout (one panel per narrow page:
/// col 0).
inline const void* paged_panel(const paged_b_view& b, std::size_t page, std::size_t col) {
  if (b.layout == panel_layout::tile_pairs)
    return static_cast<const bf16_bits*>(b.pages[page]) + tile_pairs_offset(b.along_k ? b.page : b.k, 0, col);
  return static_cast<const std::byte*>(b.pages[page]) + col * paged_column_bytes(b);
}

/// Bytes from a panel of one of b's pages to the next panel of that page
/// (the rows layout).
inline std::size_t paged_panel_stride(const paged_b_view& b) { return paged_panel_width(b) * paged_column_bytes(b); }

/// Where a tile's sums wait between the calls of for_each_page_and_panel:
/// `sums` (the kernel's tile, in its own layout), with `in` the sums go on
/// from it, with `out` they are left in it (the product's last page not yet
/// reached) and C is not written.
template <class Sum>
struct page_carry {
  Sum* sums;
  bool in, out;
};

/// For a b paged along k, pages outermost (a single row block of
/// `tile_rows` rows: each page's panels, contiguous in it, read as one
/// stream before the next page), `pages_per_call` pages at a time:
/// panel(rows_of_panel, row0, rows, col, cols, carry, panels) for each group
/// of pages, from row row0 of k with `rows` of them, and each of its panels
/// in column order (rows_of_panel: the group's pages' rows of the panel,
/// b.page rows each). Each panel's tile_rows x NR sums (fp32 or int32) are
/// carried from group to group in a scratch leased here, so the sums run in
/// the order of one call over all the pages. With `whole_panels_together`,
/// a group's whole panels come in one call (panels of them from col, each
/// NR wide, their carries one after the other), a narrower last one in a
/// call of its own; else panels is 1.
template <class Sum, class Panel>
void for_each_page_and_panel(const paged_b_view& b, std::size_t k, std::size_t n, std::size_t tile_rows,
                             std::size_t pages_per_call, bool whole_panels_together, Panel&& panel) {
  static_assert(sizeof(Sum) == sizeof(float), "the carry lives in a scratch of floats");
  const std::size_t width = paged_panel_width(b), tile_sums = tile_rows * width;
  scratch_lease storage(ceil_div(n, width) * tile_sums);
  Sum* const sums = reinterpret_cast<Sum*>(storage.data());
  const std::size_t group_pages = std::clamp<std::size_t>(pages_per_call, 1, max_pages_along_k);
  const void* rows_of_panel[max_pages_along_k];
  for (std::size_t page = 0, row0 = 0; row0 < k; page += group_pages, row0 += group_pages * b.page)
    for (std::size_t col = 0, panels = 1; col < n; col += panels * width) {
      panels = whole_panels_together ? std::max<std::size_t>((n - col) / width, 1) : 1;
      const std::size_t rows = std::min(group_pages * b.page, k - row0);
      for (std::size_t i = 0; i * b.page < rows; ++i) rows_of_panel[i] = paged_panel(b, page + i, col);
      panel(static_cast<const void* const*>(rows_of_panel), row0, rows, col, std::min(width, n - col),
            page_carry<Sum>{sums + col / width * tile_sums, row0 > 0, row0 + rows < k}, panels);
    }
}

/// For each panel of the first k rows and n columns of `b`, in
/// column order: panel(rows_of_panel, page_rows, col, cols) with the panel's
/// row 0 in each page along k (or in its column page: one page of k rows),
/// its first column and its width (at most NR, within its column page).
/// b's layout is the packed_b one of its path, or narrow column
/// pages (one panel each, row stride b.narrow_row_stride: paged_row_stride).
template <class Panel>
void for_each_paged_panel(const paged_b_view& b, std::size_t k, std::size_t n, Panel&& panel) {
  const void* rows_of_panel[max_pages_along_k];
  const std::size_t width = paged_panel_width(b);
  if (b.along_k) {
    const std::size_t pages = ceil_div(k, b.page);  // <= max_pages_along_k: the drivers check
    for (std::size_t col = 0; col < n; col += width) {
      for (std::size_t page = 0; page < pages; ++page) rows_of_panel[page] = paged_panel(b, page, col);
      panel(static_cast<const void* const*>(rows_of_panel), b.page, col, std::min(width, n - col));
    }
    return;
  }
  for (std::size_t page = 0, page_col = 0; page_col < n; ++page, page_col += b.page)
    for (std::size_t col = 0; col < std::min(b.page, n - page_col); col += width) {
      rows_of_panel[0] = paged_panel(b, page, col);
      panel(static_cast<const void* const*>(rows_of_panel), std::max<std::size_t>(k, 1), page_col + col,
            std::min({width, b.page - col, n - page_col - col}));
    }
}

}  // namespace kvhead::engine
