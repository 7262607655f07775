// The GEMM driver: BLIS's five loops around the micro-kernel.
//
//   JC (NC columns of C) -> PC (KC-deep slice of k, in order) -> B block packed
//   -> IC (MC rows, in parallel) -> pack A block -> JR (NR) -> IR (MR) -> kernel
//
// Threads split the (IC block, group of JR panels) grid of one (JC, PC) step;
// every C element is still summed over k in the same order (gemm.hpp).
#include "engine/gemm/gemm.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <tbb/task_arena.h>

#include "engine/arch/require.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/gemm/driver_support.hpp"
#include "engine/gemm/pack.hpp"

namespace kvhead::engine {

void validate_operand(const char* name, gemm_operand operand, std::size_t rows, std::size_t cols) {
  // op(X) is rows x cols; X in memory is that or its transpose, row-major.
  if (rows == 0 || cols == 0) return;
  engine::require(operand.data != nullptr, [&] { return std::string("gemm: ") + std::string(name) + " is null"; });
  const std::size_t row_length = operand.trans == transpose::no ? cols : rows;
  engine::require(operand.ld >= row_length, [&] {
    return std::string("gemm: leading dimension of ") + name + " (" + std::to_string(operand.ld) +
           ") is smaller than its row length (" + std::to_string(row_length) + ")";
  });
}

void validate_c(const float* c, std::size_t ldc, std::size_t m, std::size_t n) {
  if (m == 0 || n == 0) return;
  engine::require(c != nullptr, [&] { return std::string("gemm: C is null"); });
  engine::require(ldc >= n, [&] {
    return std::string("gemm: ldc (") + std::to_string(ldc) + ") is smaller than n (" + std::to_string(n) + ")";
  });
}

namespace {

std::size_t& serial_depth() {
  thread_local std::size_t depth = 0;  // open gemm_serial_scopes on this thread
  return depth;
}

// A block of op(B), depth x cols, as NR-wide panels: row k of panel p at
// panels + p * panel_stride + k * row_stride. Packed blocks hold every panel
// (zero-padded); a block read in place from an untransposed B has its partial
// last panel packed separately in `tail_panel`.
// Strides in elements; panels may hold another element type than fp32 (the
// tail panel is always fp32).
// Paged blocks (paged_b_view): panel p's address comes from a page table.
// Column pages (page_columns != 0): the block's columns are pages of
// page_columns columns from page first_page on (the last may be short), each
// of panels_per_page panels of NR columns (NR / 2 with half_panels), its last
// panel possibly narrower: panel p of the block is panel p % panels_per_page
// of page first_page + p / panels_per_page, at page_offset + (p %
// panels_per_page) * panel_stride elements into the page.
// Row pages: every panel is split along k over the pages, page_depth rows
// each (panel first_panel + p of page i at pages[i] + (first_panel + p) *
// page_depth * NR elements: panel_stride is page_depth * NR).
struct b_block {
  const void* panels;
  std::size_t panel_stride, row_stride;
  const float* tail_panel;  // null when the last panel is in `panels`
  kv_dtype element = kv_dtype::f32;
  const void* const* pages = nullptr;
  std::size_t first_page = 0, page_columns = 0, panels_per_page = 0, page_offset = 0;  // column pages
  std::size_t first_panel = 0, page_depth = 0;                                         // row pages (depth 0: none)
  bool half_panels = false;  // panels of at most NR / 2 columns: the half kernels (microkernel.hpp)
  // Packed as read (source not null): the calls of the first A panel read
  // panel p where it lies, at source + p * NR with rows source_ld apart, and
  // when other A panels follow, store it packed at packing + p *
  // panel_stride (= panels) for their calls (microkernel.hpp's b_copy). The
  // block is then one row block, so those calls come first in each sweep.
  // A last panel narrower than NR is packed beforehand (tail_panel).
  const float* source = nullptr;
  std::size_t source_ld = 0;
  float* packing = nullptr;
};

// Columns [col, col + width) of a block.
struct column_span {
  std::size_t col, width;
};

// params by reference: a by-value copy, built field by field and reloaded
// whole, stalls on store forwarding (Zen 4, S1 decode at block 16, 3
// alternations: 2.02-2.64 ms by value, 1.88-1.94 by reference).
void run_tile(const gemm_config& config, kv_dtype element, const microkernel_params& params, std::size_t rows,
              std::size_t cols, bool half = false) {
  const microkernel_function kernel =
      (half ? config.half_microkernels : config.microkernels)[static_cast<std::size_t>(element)][rows - 1];
  if (cols == (half ? config.nr / 2 : config.nr)) {
    kernel(params);
    return;
  }
  // Column edge: the same kernel on a padded copy of C.
  alignas(aligned_buffer::alignment) float tile[max_tile_floats] = {};
  float* const c = params.c;
  const std::size_t ldc = params.ldc;
  if (params.beta != 0.0f || params.accumulate)
    for (std::size_t row = 0; row < rows; ++row) std::copy(c + row * ldc, c + row * ldc + cols, tile + row * config.nr);
  microkernel_params padded = params;
  padded.c = tile;
  padded.ldc = config.nr;
  padded.c_from_lanes = padded.c_to_lanes = false;  // only `cols` columns of C are kept: in memory order
  kernel(padded);
  for (std::size_t row = 0; row < rows; ++row)
    std::copy(tile + row * config.nr, tile + row * config.nr + cols, c + row * ldc);
}

// The rows of A panel `panel` of m rows: whole MR-row panels, except that a
// short remainder (at most MR / 2 rows) and the full panel before it are
// split into two near-equal panels. A kernel of r rows keeps r * NR / W
// accumulator chains, and the FMA pipes need latency x pipes of them (8 on
// every path here): 32 rows at MR 6 run as 6, 6, 6, 6, 4, 4 instead of
// 6, 6, 6, 6, 6, 2, whose 2-row kernel would run at half speed. Rows never
// change a row's arithmetic (microkernel.hpp), only which kernel runs it.
struct panel_rows {
  std::size_t row0, rows;
};
panel_rows a_panel(std::size_t m, std::size_t mr, std::size_t panel) {
  const std::size_t panels = ceil_div(m, mr), remainder = m % mr;
  if (remainder == 0 || 2 * remainder > mr || panels < 2 || panel + 2 < panels)
    return {panel * mr, std::min(mr, m - panel * mr)};
  const std::size_t pair0 = (panels - 2) * mr, first = (mr + remainder + 1) / 2;
  return panel + 2 == panels ? panel_rows{pair0, first} : panel_rows{pair0 + first, mr + remainder - first};
}

// A task of at most this many A panels over pages runs in loops of its own
// (multiply_block): a decode step's GQA group (one panel), MQA's 32 query
// rows (6 panels at MR 6, 3 at MR 12).
constexpr std::size_t lean_a_panels = 8;

// One (JC, PC) step: C[:, col0 : col0+cols] (+)= alpha * op(A)[:, k0 : k0+depth] * block.
// Tasks over (block of A panels x group of NR panels), each reading its
// packed A block (L2) against its B panels (L1). Packed A panel p, of the
// rows a_panel(m, MR, p), is MR wide (zero rows past its own) at p * MR * depth.
// Each kernel call is told the B of the call after it (prefetched as it runs).
void multiply_block(const gemm_config& config, std::size_t m, float alpha, gemm_operand a, a_rounding rounding,
                    std::size_t k0, std::size_t depth, const b_block& block, std::size_t col0, std::size_t cols,
                    float beta, float* c, std::size_t ldc) {
  const std::size_t element_size = element_bytes(block.element);
  const std::size_t a_panels = ceil_div(m, config.mr);
  // The block's panels, and the columns of each.
  const std::size_t panel_width = block.half_panels ? config.nr / 2 : config.nr;
  const std::size_t panels = block.page_columns == 0 ? ceil_div(cols, config.nr)
                                                     : cols / block.page_columns * block.panels_per_page +
                                                           ceil_div(cols % block.page_columns, panel_width);
  auto panel_span = [&](std::size_t panel) {
    if (block.page_columns == 0) return column_span{panel * config.nr, std::min(config.nr, cols - panel * config.nr)};
    const std::size_t in_page = panel % block.panels_per_page * panel_width;
    const std::size_t col = panel / block.panels_per_page * block.page_columns + in_page;
    return column_span{col, std::min({panel_width, block.page_columns - in_page, cols - col})};
  };
  // Tasks: equal blocks of A panels (at most MC rows: the A block stays in
  // L2) times groups of panels. With several threads, aim for ~4 tasks
  // each, cutting rows first, then columns, into near-equal parts. Where MC
  // needs more blocks than that, a multiple of the thread count of them, so
  // that no thread runs a last block alone (Zen 3, MC 252, 2048^3 at 2
  // threads: 9 blocks, one thread's 5 against the other's 4; as 10, its time
  // over OpenBLAS's in the same process 1.06-1.19, median 1.10 -> 0.80-1.22,
  // median 1.02, 7 alternations on a host moving both by 30%).
  const std::size_t wanted = wanted_tasks();
  const std::size_t fewest_row_blocks = std::min(round_up(ceil_div(m, config.mc), arena_threads()), a_panels);
  const std::size_t row_blocks =
      block.source != nullptr ? 1 : std::clamp<std::size_t>(wanted, fewest_row_blocks, a_panels);
  // Row block r holds A panels [r * a_panels / row_blocks, (r + 1) * a_panels
  // / row_blocks): sizes within one panel of each other, so that no thread's
  // share of them runs long (as ceil_div-sized blocks, 512^3 at 2 threads cut
  // 43 panels into seven of 6 and one of 1).
  auto row_block_begin = [&](std::size_t row_block) { return row_block * a_panels / row_blocks; };
  const std::size_t panel_groups = std::clamp<std::size_t>(ceil_div(wanted, row_blocks), 1, panels);
  const std::size_t panels_per_group = ceil_div(panels, panel_groups);
  const std::size_t groups = ceil_div(panels, panels_per_group);

  // Packed A of this k-slice. An untransposed A that is not to be rounded is
  // read where it is (the kernel takes its strides: same values, same bits)
  // when it is a single panel, or when each of its panels meets few enough
  // panels of B that packing would cost more than it saves
  // (kernel_config_row::a_in_place_panels).
  // Otherwise, when each task owns whole rows (one column group), it packs
  // its own panels; else the panels are packed first, in parallel, and
  // shared by the column groups.
  const bool a_in_place =
      (a_panels == 1 || panels <= config.a_in_place_panels) && a.trans == transpose::no && rounding == a_rounding::none;
  scratch_lease a_packed(a_in_place ? 0 : a_panels * config.mr * depth);
  auto pack_a_panels = [&](std::size_t first, std::size_t end) {
    if (a_in_place) return;
    for (std::size_t panel = first; panel < end; ++panel) {
      const panel_rows span = a_panel(m, config.mr, panel);
      float* const packed = a_packed.data() + panel * config.mr * depth;
      pack_a(a, span.row0, span.rows, k0, depth, config.mr, packed);
      if (rounding == a_rounding::bf16)
        for (std::size_t i = 0; i < config.mr * depth; ++i) packed[i] = round_to_bf16(packed[i]);
    }
  };
  if (groups > 1) {
    constexpr std::size_t a_panels_per_task = 8;
    for_each_index(ceil_div(a_panels, a_panels_per_task),
                   flops_per_byte_moved * sizeof(float) * double(m) * double(depth), [&](std::size_t task) {
                     pack_a_panels(task * a_panels_per_task, std::min(a_panels, (task + 1) * a_panels_per_task));
                   });
  }
  const std::size_t a_row_stride = a_in_place ? a.ld : 1, a_k_stride = a_in_place ? 1 : config.mr;
  // A panel a_index (its rows `span`) from the block's first k.
  auto a_start = [&](std::size_t a_index, const panel_rows& span) {
    return a_in_place ? a.data + span.row0 * a.ld + k0 : a_packed.data() + a_index * config.mr * depth;
  };

  // Where panel `panel` of the block starts (row pages: its rows in page `page`).
  auto b_panel_at = [&](std::size_t panel, std::size_t page) -> const void* {
    if (block.page_depth != 0)
      return static_cast<const std::byte*>(block.pages[page]) +
             (block.first_panel + panel) * block.page_depth * config.nr * element_size;
    if (block.tail_panel != nullptr && panel + 1 == panels) return block.tail_panel;
    if (block.pages != nullptr)
      return static_cast<const std::byte*>(block.pages[block.first_page + panel / block.panels_per_page]) +
             (block.page_offset + panel % block.panels_per_page * block.panel_stride) * element_size;
    return static_cast<const std::byte*>(block.panels) + panel * block.panel_stride * element_size;
  };
  const std::size_t pages = block.page_depth != 0 ? ceil_div(depth, block.page_depth) : 1;

  auto run_task = [&](std::size_t task) {
    const std::size_t row_block = task / groups, group = task % groups;
    const std::size_t first_panel = row_block_begin(row_block), end_panel = row_block_begin(row_block + 1);
    if (groups == 1) pack_a_panels(first_panel, end_panel);
    const std::size_t panel_begin = group * panels_per_group;
    const std::size_t panel_end = std::min(panels, (group + 1) * panels_per_group);
    // The task's calls, one per (NR panel, A panel, row page), pages
    // innermost: each element's FMA chain runs from page to page in order.
    // A dense B goes in sweeps of b_sweep_panels panels: each A panel meets
    // a sweep's panels in turn, then the next A panel the same ones
    // (kernel_config.cpp says why); pages (a KV cache's blocks, their next
    // panel prefetched below) go one panel at a time, unless the block is
    // in one page (below); under at most lean_a_panels A panels, pages go
    // in loops of their own (below).
    // A call carries the first panel of its sweep: found from its panel, it
    // cost a division per call. (With the kernel called here for whole
    // panels, below: Zen 3, perf, the driver's samples 7.2% of the kernels'
    // -> 4.8% in S3_mha_layer, 3.3% -> 2.1% in gemm 1024^3.)
    struct call {
      std::size_t panel, a_index, page, sweep_begin;
    };
    // A paged block in a single page (a product over one chunk of a B laid
    // out beforehand: scaled_dot_product's K and V) is as contiguous as a
    // dense one, and goes the same way.
    const bool one_page = block.pages != nullptr && (block.page_depth != 0 ? pages == 1 : cols <= block.page_columns);
    const std::size_t sweep = block.pages == nullptr || one_page ? config.b_sweep_panels : 1;
    auto after = [&](call i) {
      if (++i.page < pages) return i;
      const std::size_t sweep_end = std::min(panel_end, i.sweep_begin + sweep);
      if (++i.panel < sweep_end) return call{i.panel, i.a_index, 0, i.sweep_begin};
      return ++i.a_index < end_panel ? call{i.sweep_begin, i.a_index, 0, i.sweep_begin}
                                     : call{sweep_end, first_panel, 0, sweep_end};
    };
    auto done = [&](call i) { return i.panel == panel_end; };
    // A short single A panel (a matrix-vector product) runs wide tiles of
    // whole in-block panels first (microkernel.hpp); every element keeps its
    // arithmetic. Paged blocks, whose panels are not evenly spaced, do not.
    std::size_t narrow_begin = panel_begin;
    const panel_rows first_span = a_panel(m, config.mr, first_panel);
    if (end_panel == first_panel + 1 && first_span.rows <= wide_max_rows && block.pages == nullptr &&
        block.source == nullptr) {
      const std::size_t width = wide_panels(first_span.rows);
      const std::size_t full_end =
          std::min({panel_end, cols / config.nr, block.tail_panel != nullptr ? panels - 1 : panels});
      const microkernel_function kernel =
          config.wide_microkernels[static_cast<std::size_t>(block.element)][first_span.rows - 1];
      for (; narrow_begin + width <= full_end; narrow_begin += width) {
        microkernel_params params{a_start(first_panel, first_span),
                                  a_row_stride,
                                  a_k_stride,
                                  b_panel_at(narrow_begin, 0),
                                  block.row_stride,
                                  depth,
                                  alpha,
                                  beta,
                                  c + first_span.row0 * ldc + col0 + narrow_begin * config.nr,
                                  ldc};
        params.b_panel_stride = block.panel_stride;
        kernel(params);
      }
    }
    // One params for all the task's calls, their changing fields set per
    // call: built whole per call, it was zeroed by a rep stos whose stores
    // the kernel's loads of the same bytes then waited on (no store
    // forwarding from string stores). Xeon, S1 over a bf16 cache at block
    // 16 (16-row pages: 5 calls per 16 keys and kv head): a quarter of the
    // driver's samples were on the load after it; the step 2-3% faster
    // without (2 alternations).
    microkernel_params params{};
    params.a_row_stride = a_row_stride;
    params.a_k_stride = a_k_stride;
    params.alpha = alpha;
    params.beta = beta;
    params.ldc = ldc;
    // The kernels of the block's element and panel width, by rows - 1.
    const microkernel_function* const kernels =
        (block.half_panels ? config.half_microkernels : config.microkernels)[static_cast<std::size_t>(block.element)];
    // A few A panels over pages (a decode step's q kᵀ and p v over a cache's
    // blocks: a GQA group's rows, or MQA's 32) run in loops of their own,
    // with what their calls share looked up once: the general loop after
    // them reloads every field of block and config it reads after each
    // kernel call (an opaque call, for all the compiler knows, may change
    // them), divides to find each A panel's rows and each column page's
    // panel, which small pages' short calls felt (Zen 3, S1 at block 16 over
    // block 256's time, 4 alternations: bf16 1.28-1.32 -> 1.11-1.20, int8
    // 1.31-1.35 -> 1.14-1.17, f32 1.09-1.14 -> 1.05-1.06; S4_decode_mqa,
    // perf: the driver's samples 11% of the kernels' -> 3.4%). Each
    // element's sum is the one the general loop makes: the same kernel over
    // the same rows, its chain running from page to page in order.
    if (block.pages != nullptr && end_panel - first_panel <= lean_a_panels) {
      const std::size_t element = static_cast<std::size_t>(block.element), nr = config.nr;
      const bool half = block.half_panels;
      const std::size_t panel_width = half ? nr / 2 : nr, a_step = a_k_stride;
      // The task's A panels: where each starts (from the block's first k),
      // where its C rows start, its rows and their kernel.
      struct a_tile {
        const float* a;
        float* c;
        std::size_t rows;
        microkernel_function kernel;
      };
      std::array<a_tile, lean_a_panels> a_tiles;
      const std::size_t a_count = end_panel - first_panel;
      for (std::size_t i = 0; i < a_count; ++i) {
        const panel_rows rows = a_panel(m, config.mr, first_panel + i);
        a_tiles[i] = {a_start(first_panel + i, rows), c + rows.row0 * ldc + col0, rows.rows, kernels[rows.rows - 1]};
      }
      // A single A panel streams B at DRAM speed: the next panel's
      // prefetches would only compete with the hardware's (S1_decode_gqa on
      // Zen 4: 1.72-1.96 ms with them, 1.48-1.67 without); where the
      // configuration says (fp32_paged_prefetch_bytes over f32,
      // widened_paged_prefetch_bytes over the others; kernel_config.hpp)
      // each step prefetches its own row that far ahead in the stream
      // instead (Zen 5, 3 alternations: S1 over an f16 cache 0.703 -> 0.578
      // ms, S5 6.21 -> 5.23, at 8 KiB; 4 KiB then took 5% off f32 and f16 as
      // well), and further ahead into L2 where it says too. The last call of
      // the product as well: its prefetches run past the page's end (a
      // prefetch never faults) into what the cache stores next, a chunk's V
      // after its K. Without them that call streamed on the hardware
      // prefetchers alone, 30% slower per byte (Xeon, S1's geometry over an
      // f32 cache, 3 alternations: 2.41-2.55 -> 2.25-2.31 ms).
      // Under several A panels every call of a B panel prefetches the next
      // panel, not only the last one, so it has all the A panels' calls to
      // arrive (S4_decode_mqa, 32 rows: 9% faster on Zen 3, 4-6% on Zen 4).
      const void* const* const page_list = block.pages;
      params.b_row_stride = block.row_stride;
      params.b_next_to_l2 = config.paged_prefetch_to_l2;
      // The loops, instantiated for one A panel and for several: with the
      // count a constant 1, the single panel's calls keep no loop over A
      // panels around them (Zen 3, block 16 over a bf16 cache, perf: the
      // driver's samples 9% of the kernel's with one, 6.5% without).
      auto run_pages = [&](auto several_a_panels) {
        constexpr bool several = decltype(several_a_panels)::value;
        const std::size_t count = several ? a_count : 1;
        const stream_prefetch ahead = several ? stream_prefetch{} : config.paged_prefetch[element];
        params.b_next_l2_offset = ahead.l2_bytes != 0 ? ahead.l2_bytes - ahead.l1_bytes : 0;
        // Every A panel's tile against the panel at b from row k, columns
        // [col, col + width) of the block; following(): the B panel after it.
        auto tiles = [&](const std::byte* b, auto following, std::size_t k, std::size_t col, std::size_t width) {
          params.b_panel = b;
          if constexpr (several)
            params.b_next = following();
          else
            params.b_next = ahead.l1_bytes != 0 ? b + ahead.l1_bytes : nullptr;
          for (std::size_t i = 0; i < count; ++i) {
            params.a = a_tiles[i].a + k * a_step;
            params.c = a_tiles[i].c + col;
            if (width == panel_width)
              a_tiles[i].kernel(params);
            else
              run_tile(config, block.element, params, a_tiles[i].rows, width, half);
          }
        };
        if (block.page_depth != 0) {
          // Row pages: the pages go outermost, each page's panels, contiguous
          // in it, read as one stream before the next page, and every
          // element's chain still runs from page to page in order (Zen 4,
          // S1's geometry, f32 cache, 7 alternations: block 64 2.93 -> 2.27
          // ms, 32 3.18 -> 2.62-3.13, 16 4.93 -> 4.71, medians). Whole
          // panels' C stays in their kernel's lane order from page to page
          // (microkernel.hpp, c_to_lanes).
          const std::size_t page_depth = block.page_depth, panel_bytes = page_depth * nr * element_size;
          const std::size_t first_page_panel = block.first_panel;
          auto page_panels = [&](std::size_t page) {
            return static_cast<const std::byte*>(page_list[page]) + first_page_panel * panel_bytes;
          };
          // A single A panel takes a page's whole panels in one call
          // (microkernel.hpp, sequences), not a call per 16-step tile at
          // block 16, 8 a page at head_dim 128 (Zen 3, S1 over a bf16 cache
          // at block 16, perf: this driver's samples 7.5% of the kernel's ->
          // 4.2%; block 16 over the best block, 3 alternations: bf16
          // 1.14-1.17 -> 1.11-1.12, int8 1.16-1.25 -> 1.10-1.13).
          params.b_panel_stride = block.panel_stride;
          const std::size_t whole_end = several ? panel_begin : std::max(panel_begin, std::min(panel_end, cols / nr));
          for (std::size_t page = 0; page < pages; ++page) {
            const std::byte* const panels_here = page_panels(page);
            params.k_depth = std::min(page_depth, depth - page * page_depth);
            params.accumulate = params.c_from_lanes = page > 0;
            params.c_to_lanes = page + 1 < pages;
            if (whole_end > panel_begin) {
              params.panel_sequence = whole_end - panel_begin;
              tiles(
                  panels_here + panel_begin * panel_bytes, [] { return nullptr; }, page * page_depth, panel_begin * nr,
                  nr);
              params.panel_sequence = 1;
            }
            for (std::size_t panel = whole_end; panel < panel_end; ++panel)
              tiles(
                  panels_here + panel * panel_bytes,
                  [&] {
                    return panel + 1 < panel_end ? panels_here + (panel + 1) * panel_bytes
                           : page + 1 < pages    ? page_panels(page + 1) + panel_begin * panel_bytes
                                                 : nullptr;
                  },
                  page * page_depth, panel * nr, std::min(nr, cols - panel * nr));
          }
          return;
        }
        // Column pages: panel by panel, page by page.
        const std::size_t per_page = block.panels_per_page, page_columns = block.page_columns;
        const std::size_t first_page = block.first_page, panel_bytes = block.panel_stride * element_size;
        const std::size_t page_offset_bytes = block.page_offset * element_size;
        auto panel_at = [&](std::size_t page, std::size_t in_page) {
          return static_cast<const std::byte*>(page_list[first_page + page]) + page_offset_bytes +
                 in_page * panel_bytes;
        };
        params.k_depth = depth;
        std::size_t page = panel_begin / per_page, in_page = panel_begin % per_page;
        for (std::size_t panel = panel_begin; panel < panel_end; ++panel) {
          const std::size_t col = page * page_columns + in_page * panel_width;
          const std::byte* const b = panel_at(page, in_page);
          const std::size_t width = std::min({panel_width, page_columns - in_page * panel_width, cols - col});
          if (++in_page == per_page) {
            in_page = 0;
            ++page;
          }
          tiles(
              b, [&] { return panel + 1 < panel_end ? panel_at(page, in_page) : nullptr; }, 0, col, width);
        }
      };
      if (a_count == 1)
        run_pages(std::false_type{});
      else
        run_pages(std::true_type{});
      return;
    }
    call i{narrow_begin, first_panel, 0, panel_begin + (narrow_begin - panel_begin) / sweep * sweep};
    panel_rows span = a_panel(m, config.mr, i.a_index);  // of A panel i.a_index
    // Over a dense B (or one page), an A panel's whole panels of a sweep go
    // in one call (a sequence, microkernel.hpp), each call's bookkeeping
    // here paid once.
    const bool sequences = (block.pages == nullptr && block.source == nullptr) || one_page;
    const std::size_t whole_panels = std::min(cols / panel_width, block.tail_panel != nullptr ? panels - 1 : panels);
    params.b_panel_stride = block.panel_stride;
    for (const void* b = done(i) ? nullptr : b_panel_at(i.panel, i.page); !done(i);) {
      call last = i;  // the call's last panel, its sequence's
      const std::size_t run_end = std::min({panel_end, i.sweep_begin + sweep, whole_panels});
      if (sequences && i.panel == i.sweep_begin && run_end > i.panel + 1) last.panel = run_end - 1;
      params.panel_sequence = last.panel - i.panel + 1;
      const call next = after(last);
      const void* const b_next = done(next) ? nullptr : b_panel_at(next.panel, next.page);
      // Only pages (a KV cache's blocks, scattered) need the next B named
      // (here, under more A panels than the loops above take), as there:
      // every call of a B panel prefetches the next one.
      // Contiguous panels stream in by the hardware prefetchers, and the
      // prefetch per k step would cost compute-bound GEMMs ~8% instructions.
      const call next_b = pages > 1 ? next : call{i.panel + 1, first_panel, 0, 0};
      const void* b_prefetch = nullptr;
      std::size_t b_prefetch_l2_offset = 0;
      if (block.pages != nullptr && !done(next_b)) b_prefetch = b_panel_at(next_b.panel, next_b.page);
      const bool packed_tail = block.tail_panel != nullptr && i.panel + 1 == panels;
      const column_span columns = panel_span(i.panel);
      const std::size_t k = i.page * block.page_depth;
      params.a = a_start(i.a_index, span) + k * a_k_stride;
      params.b_panel = b;
      params.b_row_stride = packed_tail ? config.nr : block.row_stride;
      params.b_copy = nullptr;
      if (block.source != nullptr && i.a_index == first_panel && !packed_tail) {
        // The panel where it lies, packed as read when later A panels read
        // it. At step k, row k of the next panel (the same row of B: its
        // page's TLB entry is warm) is prefetched into L1 and the one after
        // it into L2: the hardware streams no further than a row piece of a
        // panel, each in a page of its own when rows are 4 KiB or more apart.
        const float* const source = block.source + columns.col;
        params.b_panel = source;
        params.b_row_stride = block.source_ld;
        if (end_panel > first_panel + 1) params.b_copy = block.packing + i.panel * block.panel_stride;
        b_prefetch = source + config.nr;
        b_prefetch_l2_offset = config.nr * sizeof(float);
      }
      params.k_depth = block.page_depth != 0 ? std::min(block.page_depth, depth - k) : depth;
      params.c = c + span.row0 * ldc + col0 + columns.col;
      params.accumulate = params.c_from_lanes = i.page > 0;  // row pages: continue the chain
      params.c_to_lanes = i.page + 1 < pages;
      params.b_next = b_prefetch;
      params.b_next_l2_offset = b_prefetch_l2_offset;
      params.b_next_to_l2 = block.pages != nullptr && config.paged_prefetch_to_l2;
      // A whole panel's kernel is called here (through run_tile, a function
      // call of its own per tile, it took 1.1% of S3's samples); a column
      // edge or the packed tail goes through run_tile.
      if (!packed_tail && columns.width == panel_width)
        kernels[span.rows - 1](params);
      else
        run_tile(config, packed_tail ? kv_dtype::f32 : block.element, params, span.rows, columns.width,
                 block.half_panels);
      if (next.a_index != i.a_index && !done(next)) span = a_panel(m, config.mr, next.a_index);
      i = next;
      b = b_next;
    }
  };
  // Each B element of the block is read once (from DRAM when B streams).
  for_each_index(row_blocks * groups,
                 (2.0 * double(m) + flops_per_byte_moved * double(element_size)) * double(cols) * double(depth),
                 run_task);
}

// The JC and PC loops; block(col0, cols, k0, depth) yields op(B)'s block.
template <class BlockSource>
void multiply(const gemm_config& config, std::size_t m, std::size_t n, std::size_t k, float alpha, gemm_operand a,
              a_rounding rounding, float beta, float* c, std::size_t ldc, const BlockSource& block) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t row = 0; row < m; ++row)
      for (std::size_t col = 0; col < n; ++col) c[row * ldc + col] = beta == 0.0f ? 0.0f : beta * c[row * ldc + col];
    return;
  }
  for (std::size_t col0 = 0; col0 < n; col0 += config.nc) {
    const std::size_t cols = std::min(config.nc, n - col0);
    for (std::size_t k0 = 0; k0 < k; k0 += config.kc) {
      const std::size_t depth = std::min(config.kc, k - k0);
      multiply_block(config, m, alpha, a, rounding, k0, depth, block(col0, cols, k0, depth), col0, cols,
                     k0 == 0 ? beta : 1.0f, c, ldc);
    }
  }
}

// With few rows of A, each B panel is used only a few times: reading an
// untransposed B in place beats copying it first (same arithmetic either way),
// unless its rows are a multiple of 256 bytes apart: the KC rows of a panel
// then fall in at most 1/4 of L1's 64 sets, more lines than their ways hold,
// and every micro-kernel call re-reads the panel from L2. Measured on Zen 3,
// 32 x 4096 x 128: in place 34 GFLOP/s, packed 54, OpenBLAS 61-66; with rows
// 4000 bytes apart, in place 68, packed 47.
constexpr std::size_t in_place_b_max_rows = 48;
constexpr std::size_t set_conflict_row_bytes = 256;

// m <= row_stream_max_rows, B untransposed: stream B row by row through the
// row-streaming kernel, columns cut into chunks whose accumulators fit in L1.
// Covers the columns up to the last multiple of NR; the caller does the rest.
void multiply_streaming(const gemm_config& config, gemm_shape shape, float alpha, gemm_operand a, gemm_operand b,
                        float beta, float* c, std::size_t ldc) {
  // Accumulators of one chunk: at most 16 KiB, half of L1, whatever the row
  // count; with several threads, at least wanted_tasks() chunks (a column's
  // sum is the same in any chunk).
  const std::size_t cols = shape.n / config.nr * config.nr;
  const std::size_t thread_cols = round_up(ceil_div(cols, wanted_tasks()), config.nr);
  const std::size_t chunk_cols = std::max(config.nr, std::min(thread_cols, 4096 / shape.m / config.nr * config.nr));
  const std::size_t a_row_stride = a.trans == transpose::no ? a.ld : 1;
  const std::size_t a_k_stride = a.trans == transpose::no ? 1 : a.ld;
  const double work = (2.0 * double(shape.m) + flops_per_byte_moved * sizeof(float)) * double(cols) * double(shape.k);
  for_each_index(ceil_div(cols, chunk_cols), work, [&](std::size_t chunk) {
    const std::size_t col = chunk * chunk_cols;
    const std::size_t chunk_width = std::min(chunk_cols, cols - col);
    scratch_lease acc(shape.m * chunk_width);
    for (std::size_t k0 = 0; k0 < shape.k; k0 += config.kc) {
      config.row_streams[shape.m - 1]({a.data + k0 * a_k_stride, a_row_stride, a_k_stride, b.data + k0 * b.ld + col,
                                       b.ld, std::min(config.kc, shape.k - k0), chunk_width, alpha,
                                       k0 == 0 ? beta : 1.0f, c + col, ldc, acc.data()});
    }
  });
}

}  // namespace

void gemm(gemm_shape shape, float alpha, gemm_operand a, gemm_operand b, float beta, float* c, std::size_t ldc,
          simd_path path) {
  gemm(shape, alpha, a, b, beta, c, ldc, gemm_config_for(path));
}

void gemm(gemm_shape shape, float alpha, gemm_operand a, gemm_operand b, float beta, float* c, std::size_t ldc,
          const gemm_config& config) {
  validate_operand("A", a, shape.m, shape.k);
  validate_operand("B", b, shape.k, shape.n);
  validate_c(c, ldc, shape.m, shape.n);
  const std::size_t nr = config.nr;
  if (b.trans == transpose::no && shape.m <= row_stream_max_rows && shape.n >= nr && shape.k > 0) {
    multiply_streaming(config, shape, alpha, a, b, beta, c, ldc);
    const std::size_t done = shape.n / nr * nr;
    if (done < shape.n)
      gemm({shape.m, shape.n - done, shape.k}, alpha, a, {b.data + done, b.ld, b.trans}, beta, c + done, ldc, config);
    return;
  }
  const bool in_place =
      b.trans == transpose::no && shape.m <= in_place_b_max_rows && b.ld * sizeof(float) % set_conflict_row_bytes != 0;
  // Few rows over an untransposed B whose rows conflict in L1 (above): the
  // first A panel's calls read each panel where it lies and pack it as they
  // go, for the A panels after (b_block::source), so its loads run among the
  // FMAs instead of in a copy pass before them, and each call brings the
  // next two panels' rows in. Xeon, 3 alternations in one binary: 32 x 4096
  // x 128 356-360 -> 255-263 us at 1 thread (OpenBLAS 328-347), 186-192 ->
  // 130-132 at 2; from DRAM (B rotated over 256 MiB) 444-477 -> 309-312 us;
  // 8 x 4096 x 1024 1.49 -> 0.96 ms; 8 x 11008 x 4096 from DRAM, one A panel
  // over 43 KiB rows, the one loss seen: 24.8-26.2 -> 26.1-28.3 ms.
  const bool pack_as_read = !in_place && b.trans == transpose::no && shape.m <= in_place_b_max_rows;
  // Few rows over a B to be packed go in chunks of columns, each packed (as
  // read, when untransposed) and multiplied: on several threads, each task its own chunk, so no core
  // reads panels another core has just written (shared panels made 32 x 4096
  // x 128 at 2 threads slower than at 1, Zen 5: 310 us against 240; packed
  // ahead of time, 98); and at most a sweep's columns (a quarter of L2 of
  // packed B, kernel_config.cpp), so a chunk is still in L2 when multiplied,
  // not packed whole through L3 first (Xeon, 1 thread, 32 x 4096 x 128, 2
  // rounds: 0.402-0.406 -> 0.355-0.367 ms; OpenBLAS 0.336-0.360).
  // Every element keeps its arithmetic: chunks are whole NR panels.
  const std::size_t wanted = wanted_tasks(), sweep_cols = config.b_sweep_panels * nr;
  if (!in_place && shape.m <= in_place_b_max_rows && (wanted > 1 || shape.n > sweep_cols) &&
      !gemm_serial_scope::active() && shape.n > nr) {
    const std::size_t chunk_cols = round_up(std::min(ceil_div(shape.n, wanted), sweep_cols), nr);
    const double work = (2.0 * double(shape.m) + 2 * flops_per_byte_moved * sizeof(float)) * double(shape.n * shape.k);
    for_each_index(ceil_div(shape.n, chunk_cols), work, [&](std::size_t chunk) {
      const gemm_serial_scope serial;
      const std::size_t col = chunk * chunk_cols;
      const gemm_operand b_chunk = b.trans == transpose::no ? gemm_operand{b.data + col, b.ld, b.trans}
                                                            : gemm_operand{b.data + col * b.ld, b.ld, b.trans};
      gemm({shape.m, std::min(chunk_cols, shape.n - col), shape.k}, alpha, a, b_chunk, beta, c + col, ldc, config);
    });
    return;
  }
  const std::size_t packed_cols = in_place ? nr : round_up(std::min(shape.n, config.nc), nr);
  scratch_lease b_packed(packed_cols * std::min(shape.k, config.kc));

  auto block = [&](std::size_t col0, std::size_t cols, std::size_t k0, std::size_t depth) {
    if (in_place || pack_as_read) {
      // B read where it lies; a last panel narrower than NR packed now (in
      // place: alone in b_packed; packed as read: where the packed block puts it).
      const std::size_t tail_cols = cols % nr, full_cols = cols - tail_cols;
      float* const tail = b_packed.data() + (in_place ? 0 : full_cols * depth);
      if (tail_cols != 0) pack_b(b, k0, depth, col0 + full_cols, tail_cols, nr, tail);
      const float* const tail_panel = tail_cols != 0 ? tail : nullptr;
      const float* const source = b.data + k0 * b.ld + col0;
      if (in_place) return b_block{source, nr, b.ld, tail_panel};
      b_block packed_as_read{b_packed.data(), depth * nr, nr, tail_panel};
      packed_as_read.source = source;
      packed_as_read.source_ld = b.ld;
      packed_as_read.packing = b_packed.data();
      return packed_as_read;
    }
    // Each task packs up to 16 panels: an untransposed B is then read 1 KiB of a
    // row at a time (measured 2-4x faster than one 64-byte panel row per row on
    // Zen 3); fewer where that leaves a thread without a task (at most 16
    // panels, 512 columns at NR 32, were packed by one thread while the others
    // waited), but at least 4.
    const std::size_t panels_per_task = std::clamp<std::size_t>(ceil_div(ceil_div(cols, nr), arena_threads()), 4, 16);
    const std::size_t columns_per_task = panels_per_task * nr;
    for_each_index(ceil_div(cols, columns_per_task),
                   flops_per_byte_moved * sizeof(float) * double(cols) * double(depth), [&](std::size_t task) {
                     const std::size_t col = task * columns_per_task;
                     pack_b(b, k0, depth, col0 + col, std::min(columns_per_task, cols - col), nr,
                            b_packed.data() + col * depth);
                   });
    return b_block{b_packed.data(), depth * nr, nr, nullptr};
  };
  multiply(config, shape.m, shape.n, shape.k, alpha, a, a_rounding::none, beta, c, ldc, block);
}

std::size_t pack_b_offset(const gemm_config& config, std::size_t k, std::size_t n, std::size_t row, std::size_t col) {
  const std::size_t k0 = row / config.kc * config.kc;
  const std::size_t depth = std::min(config.kc, k - k0);
  return k0 * round_up(n, config.nr) + col / config.nr * depth * config.nr + (row - k0) * config.nr + col % config.nr;
}

std::size_t packed_b_floats(const gemm_config& config, std::size_t k, std::size_t n) {
  return k * round_up(n, config.nr);
}

packed_b::packed_b(std::size_t k, std::size_t n, gemm_operand b, simd_path path) : k_(k), n_(n), path_(path) {
  validate_operand("B", b, k, n);
  const gemm_config& config = gemm_config_for(path);
  const std::size_t padded_n = round_up(n, config.nr);
  float* panels = panels_.reserve(std::max<std::size_t>(1, packed_b_floats(config, k, n)));
  for (std::size_t k0 = 0; k0 < k; k0 += config.kc)
    pack_b(b, k0, std::min(config.kc, k - k0), 0, n, config.nr, panels + k0 * padded_n);
}

namespace {

// The checks of a GEMM whose B (b_k x b_n) was laid out beforehand.
void validate_fixed_b(const char* kind, gemm_shape shape, gemm_operand a, std::size_t b_k, std::size_t b_n,
                      panel_layout layout, const float* c, std::size_t ldc) {
  engine::require(layout == panel_layout::rows, [&] {
    return std::string("gemm: the ") + kind + " B is in the amx tiles' pair layout, which only gemm_bf16_paged reads";
  });
  engine::require(shape.k <= b_k && shape.n <= b_n, [&] {
    return std::string("gemm: the block ") + std::to_string(shape.k) + " x " + std::to_string(shape.n) +
           " exceeds the " + kind + " B (" + std::to_string(b_k) + " x " + std::to_string(b_n) + ")";
  });
  validate_operand("A", a, shape.m, shape.k);
  validate_c(c, ldc, shape.m, shape.n);
}

}  // namespace

void gemm(gemm_shape shape, float alpha, gemm_operand a, packed_b_view b, float beta, float* c, std::size_t ldc,
          a_rounding rounding) {
  validate_fixed_b("packed", shape, a, b.k, b.n, b.layout, c, ldc);
  const gemm_config& config = gemm_config_for(b.path);
  const std::size_t element_size = element_bytes(b.element);
  // Packed block k0 / KC starts at element k0 * round_up(b.n, NR); its
  // panels hold that block's full depth of b.k.
  auto prepacked_block = [&](std::size_t col0, std::size_t, std::size_t k0, std::size_t) {
    const std::size_t panel_stride = std::min(config.kc, b.k - k0) * config.nr;
    const std::size_t offset = k0 * round_up(b.n, config.nr) + (col0 / config.nr) * panel_stride;
    return b_block{static_cast<const std::byte*>(b.panels) + offset * element_size, panel_stride, config.nr, nullptr,
                   b.element};
  };
  multiply(config, shape.m, shape.n, shape.k, alpha, a, rounding, beta, c, ldc, prepacked_block);
}

void gemm(gemm_shape shape, float alpha, gemm_operand a, const paged_b_view& b, float beta, float* c, std::size_t ldc,
          a_rounding rounding) {
  validate_fixed_b("paged", shape, a, b.k, b.n, b.layout, c, ldc);
  const gemm_config& config = gemm_config_for(b.path);
  engine::require(narrow_pages_valid(b, config.nr), [&] {
    return "gemm: narrow pages need to be column pages of fewer than NR (" + std::to_string(config.nr) +
           ") columns per page (" + std::to_string(b.page) + ") and a row stride of at least that (" +
           std::to_string(b.narrow_row_stride) + ")";
  });
  if (b.along_k) {
    engine::require(shape.k <= config.kc && alpha == 1.0f && beta == 0.0f, [&] {
      return std::string("gemm: a B paged along k needs k <= KC (") + std::to_string(shape.k) + "), alpha 1 and beta 0";
    });
    auto row_pages = [&](std::size_t col0, std::size_t, std::size_t, std::size_t) {
      b_block block{nullptr, b.page * config.nr, config.nr, nullptr, b.element};
      block.pages = b.pages;
      block.first_panel = col0 / config.nr;
      block.page_depth = b.page;
      return block;
    };
    multiply(config, shape.m, shape.n, shape.k, alpha, a, rounding, beta, c, ldc, row_pages);
    return;
  }
  // Column pages, in JC blocks of whole pages. A page is packed_b panels
  // (the last zero-padded to NR columns), or one narrow panel (a 16-key
  // block on a 32-wide path: the half kernels).
  const bool narrow = b.narrow_row_stride != 0, half = narrow && 2 * b.page <= config.nr;
  const std::size_t row_stride = narrow ? b.narrow_row_stride : config.nr;
  gemm_config whole_pages = config;
  whole_pages.nc = std::max(b.page, config.nc / b.page * b.page);
  auto column_pages = [&](std::size_t col0, std::size_t, std::size_t k0, std::size_t) {
    b_block block{nullptr, std::min(config.kc, b.k - k0) * row_stride, row_stride, nullptr, b.element};
    block.pages = b.pages;
    block.first_page = col0 / b.page;
    block.page_columns = b.page;
    block.panels_per_page = ceil_div(b.page, half ? config.nr / 2 : config.nr);
    block.page_offset = k0 * (narrow ? row_stride : round_up(b.page, config.nr));
    block.half_panels = half;
    return block;
  };
  multiply(whole_pages, shape.m, shape.n, shape.k, alpha, a, rounding, beta, c, ldc, column_pages);
}

gemm_serial_scope::gemm_serial_scope() { ++serial_depth(); }
gemm_serial_scope::~gemm_serial_scope() { --serial_depth(); }
bool gemm_serial_scope::active() { return serial_depth() > 0; }

}  // namespace kvhead::engine
