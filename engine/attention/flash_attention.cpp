#include "engine/attention/flash_attention.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "engine/arch/kernel_config.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "engine/gemm/gemm_int8.hpp"
#include "engine/gemm/pack.hpp"
#include "engine/gemm/stored_element.hpp"
#include "engine/scheduler/split_schedule.hpp"
#include "engine/softmax/softmax.hpp"

namespace kvhead::engine {
namespace {

std::size_t ceil_div(std::size_t value, std::size_t divisor) { return (value + divisor - 1) / divisor; }

// Which kernels run q kᵀ and p v, for K/V stored as `element`:
//   bf16  the bf16 unit's products (gemm_bf16_paged: q and p rounded to bf16
//         as the kernel reads them, fp32 sums), in bf16 precision and over a
//         bf16 KV cache in either precision (its K and V are bf16 already),
//         where the paged kernels run and are chosen (amx: in bf16
//         precision; else the kernel configuration's choice,
//         bf16_paged_products_chosen);
//   int8  the int8 paged kernels (gemm_int8_paged: q quantized to int8 per
//         row where the kernels take int8 A, else to int16, p to int16,
//         exact integer sums), over an int8 KV cache where they run;
//   fp32  the fp32 kernels over the (rounded or widened) values otherwise.
// Decided by the problem alone (precision, path, element type, head_dim), so
// every tile, chunk and row of it, prefill or decode, takes the same one.
enum class product_kind { fp32, bf16, int8 };
product_kind attention_products(kvhead::precision precision, simd_path path, kv_dtype element, std::size_t head_dim) {
  if (head_dim > gemm_kc) return product_kind::fp32;
  if ((precision == kvhead::precision::bf16 || element == kv_dtype::bf16) &&
      bf16_paged_products_chosen(path, element, precision))
    return product_kind::bf16;
  if (element == kv_dtype::int8 && gemm_int8_paged_runs(path, element)) return product_kind::int8;
  return product_kind::fp32;
}

// The attention products C = alpha * A * B over a paged B, on the kernels
// `kind` names. The int8 kernels take q (the scores' A) in int8 where they
// can (int8_scores_quantization: else int16), whose rounding is of the
// order of K's own, and p (for p v) in int16: at 8 bits
// the probabilities below 1/510 of their row's largest would vanish, and
// thousands of them can carry most of the weight.
enum class attention_product { scores, values };
// prepared_a (the scores' A only, or null): A's rows as prepare_queries
// made them for the kind's kernels (the tile's queries).
void paged_product(product_kind kind, attention_product product, gemm_shape shape, float alpha, gemm_operand a,
                   const paged_b_view& b, float* c, std::size_t ldc, const float* prepared_a = nullptr) {
  switch (kind) {
    case product_kind::bf16: {
      if (prepared_a == nullptr) return gemm_bf16_paged(shape, alpha, a, b, c, ldc);
      const bf16_rows converted = bf16_rows_at(shape.m, shape.k, prepared_a);
      return gemm_bf16_paged(shape, alpha, a, b, c, ldc, &converted);
    }
    case product_kind::int8: {
      const a_quantization quantization =
          product == attention_product::scores ? int8_scores_quantization(b.path) : a_quantization::int16;
      if (prepared_a == nullptr) return gemm_int8_paged(quantization, shape, alpha, a, b, c, ldc);
      const quantized_rows quantized = quantized_rows_at(quantization, shape.m, shape.k, prepared_a);
      return gemm_int8_paged(quantization, shape, alpha, a, b, c, ldc, &quantized);
    }
    case product_kind::fp32:
      return gemm(shape, alpha, a, b, 0.0f, c, ldc);
  }
}

// Whether one stored element is finite, from its bits: the exponent field all
// ones is Inf or NaN (int8 always is finite: a non-finite row of an int8
// cache has a NaN scale instead, applied to visible keys only). Integer
// compares, so that a run of them vectorizes (all_finite_run).
bool finite_element(float x) { return (std::bit_cast<std::uint32_t>(x) & 0x7f800000u) != 0x7f800000u; }
bool finite_element(bf16_bits x) { return (x.bits & 0x7f80) != 0x7f80; }
bool finite_element(f16_bits x) { return (x.bits & 0x7c00) != 0x7c00; }

// Element offset of (row, col) of a packed V (k x n) in its layout.
std::size_t packed_offset(const packed_b_view& values, std::size_t row, std::size_t col) {
  if (values.layout == panel_layout::tile_pairs) return tile_pairs_offset(values.k, row, col);
  return pack_b_offset(gemm_config_for(values.path), values.k, values.n, row, col);
}

// True when elements [0, count) are all finite: one pass with no early exit,
// which the compiler vectorizes (V is checked once per chunk it packs, and a
// non-finite value is the rare case).
template <class Element>
bool all_finite_run(const Element* elements, std::size_t count) {
  unsigned special = 0;
  for (std::size_t i = 0; i < count; ++i) special |= unsigned(!finite_element(elements[i]));
  return special == 0;
}

// True when the first `rows` rows of every panel of a packed V (k x n) are
// finite (padding lanes included: they are written as zeros). Whole rows
// (rows layout) or pairs of rows (tile_pairs) lie one after the other.
template <class Element>
bool all_finite_elements(const packed_b_view& values, std::size_t rows) {
  const std::size_t nr = gemm_config_for(values.path).nr;
  const bool pairs = values.layout == panel_layout::tile_pairs;
  const std::size_t leading = pairs ? rows / 2 * 2 : rows;  // rows in whole pairs
  for (std::size_t col = 0; col < values.n; col += nr) {
    const Element* start = static_cast<const Element*>(values.panels) + packed_offset(values, 0, col);
    if (!all_finite_run(start, leading * nr)) return false;
    for (std::size_t lane = 0; lane < (rows > leading ? nr : 0); ++lane)  // the even row of the last pair
      if (!finite_element(start[packed_offset(values, leading, lane)])) return false;
  }
  return true;
}

bool all_finite(const packed_b_view& values, std::size_t rows) {
  switch (values.element) {
    case kv_dtype::f32:
      return all_finite_elements<float>(values, rows);
    case kv_dtype::bf16:
      return all_finite_elements<bf16_bits>(values, rows);
    case kv_dtype::f16:
      return all_finite_elements<f16_bits>(values, rows);
    case kv_dtype::int8:
      break;
  }
  return true;
}

// True when rows [0, rows) of a V read in place (cols floats each) are finite.
bool all_finite(const gemm_operand& values, std::size_t rows, std::size_t cols) {
  for (std::size_t row = 0; row < rows; ++row)
    if (!all_finite_run(values.data + row * values.ld, cols)) return false;
  return true;
}

// User K and V of one (batch, kv head), chunk c's Kᵀ packed at keys +
// c * key_floats (flash_attention packs them); V packed likewise, or read in
// place when `values` is null.
// Packed as fp32 panels (rounded in bf16 precision), or in bf16 precision,
// with several query tiles per (batch, kv head), as bf16: in the amx tiles'
// layout (tile_pairs) on amx, as bf16 panels on avx512bf16.
struct user_kv_layout {
  const float* keys;
  std::size_t key_floats;
  const float* values;
  std::size_t value_floats;
  std::size_t first_chunk;    // the chunk packed first (none before it is read)
  const char* values_finite;  // per packed chunk: its V holds no NaN or Inf (with `values`)
  kv_dtype element;
  panel_layout layout;
};

class user_kv_source final : public kv_chunk_source {
 public:
  user_kv_source(const user_kv_layout& packed, std::size_t keys, const float* v, std::size_t v_seq_stride,
                 std::size_t head_dim, simd_path path)
      : packed_(packed), keys_(keys), v_(v), v_seq_stride_(v_seq_stride), head_dim_(head_dim), path_(path) {}

  std::size_t segment_keys() const override { return kv_chunk; }
  kv_dtype element() const override { return packed_.element; }

  void segments(std::size_t chunk, std::size_t first, std::size_t end, kv_segment* views) const override {
    if (first >= end) return;
    assert(first == 0 && end == 1);  // one segment a chunk
    const std::size_t key0 = chunk * kv_chunk, width = std::min(kv_chunk, keys_ - key0);
    const std::size_t slot = chunk - packed_.first_chunk;
    const packed_b_view keys{
        packed_.keys + slot * packed_.key_floats, head_dim_, width, path_, packed_.element, packed_.layout};
    if (packed_.values != nullptr)
      views[0] = {
          keys,
          {packed_.values + slot * packed_.value_floats, width, head_dim_, path_, packed_.element, packed_.layout},
          {},
          nullptr,
          nullptr,
          packed_.values_finite[slot] != 0};
    else
      views[0] = {keys, {}, {v_ + key0 * v_seq_stride_, v_seq_stride_, transpose::no}};
  }

 private:
  user_kv_layout packed_;
  std::size_t keys_;
  const float* v_;
  std::size_t v_seq_stride_, head_dim_;
  simd_path path_;
};

// op(B) (k x n) in the packed_b layout (gemm.hpp): KC-deep blocks of NR-wide
// panels, columns past n zero.
void pack_operand(gemm_operand b, std::size_t k, std::size_t n, const gemm_config& config, float* packed) {
  for (std::size_t k0 = 0; k0 < k; k0 += config.kc)
    pack_b(b, k0, std::min(config.kc, k - k0), 0, n, config.nr, packed + pack_b_offset(config, k, n, k0, 0));
}

}  // namespace

std::size_t attention_tile::visible_begin(std::size_t row) const {
  const std::size_t position = q_offset + row;
  return window == 0 || position < window ? 0 : position + 1 - window;
}

std::size_t attention_tile::visible_end(std::size_t row) const {
  return causal ? std::min(key_limit, q_offset + row + 1) : key_limit;
}

std::size_t tile_positions(std::size_t group, simd_path path) {
  return std::max<std::size_t>(1, kernel_config_for(path).attention_rows / group);
}

namespace {

// Keys [begin, end) of a chunk, relative to its first key ({0, 0}: none).
struct key_span {
  std::size_t begin, end;
  std::size_t count() const { return end - begin; }
  bool operator==(const key_span&) const = default;
};

// The keys of chunk `chunk` that query row `position` of the tile sees.
key_span visible_in_chunk(const attention_tile& tile, std::size_t chunk, std::size_t position) {
  const std::size_t key0 = chunk * kv_chunk, row = tile.position0 + position;
  const std::size_t begin = std::max(tile.visible_begin(row), key0);
  const std::size_t end = std::min(tile.visible_end(row), key0 + kv_chunk);
  return end > begin ? key_span{begin - key0, end - key0} : key_span{0, 0};
}

}  // namespace

// Both ends of a row's visible keys grow with its position, so the rows that
// see a key are a prefix of the tile, the first of them has the lowest begin
// and the last the highest end.
chunk_range tile_chunks(const attention_tile& tile) {
  std::size_t last = tile.position0 + tile.positions;
  while (last > tile.position0 && tile.visible_begin(last - 1) >= tile.visible_end(last - 1)) --last;
  if (last == tile.position0) return {0, 0};
  return {tile.visible_begin(tile.position0) / kv_chunk, ceil_div(tile.visible_end(last - 1), kv_chunk)};
}

namespace {

// A partial of every row of a tile: max [rows], sum [rows], then acc [rows x d].
std::size_t partial_floats(const attention_tile& tile) { return tile.positions * tile.group * (tile.head_dim + 2); }

// Per-task buffers of `tiles` tiles of one shape (row = position * R + head
// in group): the running partial and the query rows of each (tile i's at i
// times one tile's size), one chunk's scores and partial. Every task of
// run_tiles — whole tiles, a range of a split one, a merge of some of its
// rows — leases all of them, in this order, used or not: each level of a
// thread's scratch stack (engine/arch/scratch.hpp) then always serves the
// same buffer of a tile shape and stops growing once the shape has been seen,
// whichever kind of task the thread happens to run first.
// The kernels of the tile's products over K/V stored as `element` (attention_products).
product_kind tile_products(const attention_tile& tile, kv_dtype element) {
  return attention_products(tile.precision, tile.path, element, tile.head_dim);
}

// q_prepared: each tile's query rows as the scores' A of its products' kernels
// (prepare_queries; none for the fp32 kernels, which read q_rows), over K/V
// stored as `element`.
struct tile_scratch {
  scratch_lease running, q_rows, scores, partial, q_prepared;
  tile_scratch(const attention_tile& tile, kv_dtype element, std::size_t tiles = 1)
      : running(tiles * partial_floats(tile)),
        q_rows(tiles * query_floats(tile)),
        scores(tile.positions * tile.group * kv_chunk),
        partial(partial_floats(tile)),
        q_prepared(tiles * prepared_query_floats(tile, element)) {}
  static std::size_t query_floats(const attention_tile& tile) { return tile.positions * tile.group * tile.head_dim; }
  static std::size_t prepared_query_floats(const attention_tile& tile, kv_dtype element) {
    const std::size_t rows = tile.positions * tile.group;
    switch (tile_products(tile, element)) {
      case product_kind::bf16:
        return bf16_rows_floats(rows, tile.head_dim);
      case product_kind::int8:
        return quantized_rows_floats(int8_scores_quantization(tile.path), rows, tile.head_dim);
      case product_kind::fp32:
        break;
    }
    return 0;
  }
};

// Where the bf16 or int8 products run, the tile's query rows converted to
// bf16 rows or quantized once into `storage` (tile_scratch::q_prepared), for
// every chunk's q kᵀ: per chunk, the int8 quantization and its scratch lease
// took 3.8% and 2.5% of a decode step's samples over an int8 cache (Xeon,
// S1's geometry, perf); the bf16 conversion about 2% of a bf16 prefill
// (S2_prefill_gqa_causal_bf16).
void prepare_queries(const attention_tile& tile, const kv_chunk_source& source, const float* q_rows, float* storage) {
  const gemm_operand queries{q_rows, tile.head_dim, transpose::no};
  const std::size_t rows = tile.positions * tile.group;
  switch (tile_products(tile, source.element())) {
    case product_kind::bf16:
      convert_rows_bf16(queries, rows, tile.head_dim, storage);
      return;
    case product_kind::int8:
      quantize_rows(tile.path, int8_scores_quantization(tile.path), queries, rows, tile.head_dim, storage);
      return;
    case product_kind::fp32:
      return;
  }
}

// The tile's query rows, stacked: row i * R + r is position i of head r of
// the group; in bf16 precision rounded to bf16 as they are gathered (the
// queries' one rounding: scaled_dot_product leaves them as they came).
void gather_queries(const attention_tile& tile, float* q_rows) {
  for (std::size_t i = 0; i < tile.positions; ++i)
    for (std::size_t r = 0; r < tile.group; ++r) {
      const float* row =
          tile.q + (tile.kv_head * tile.group + r) * tile.q_head_stride + (tile.position0 + i) * tile.q_seq_stride;
      float* const target = q_rows + (i * tile.group + r) * tile.head_dim;
      if (tile.precision == precision::bf16 && !tile.queries_rounded)
        round_floats_to_bf16(row, target, tile.head_dim, tile.path);
      else
        std::copy(row, row + tile.head_dim, target);
    }
}

// A copy of one packed V page (values.k rows x head_dim) whose rows outside
// `kept` are zeros (+0 in every element type), leased from `copy`: a P·V
// over `kept` then meets p = 0 with v = 0 elsewhere in the page (before its
// keys, and after them up to a whole tile in the tiles' layout), whatever V
// holds there. With nothing kept, a page of zeros (the page is not read).
const void* page_keeping_rows(const packed_b_view& values, key_span kept, std::optional<scratch_lease>& copy) {
  const gemm_config& config = gemm_config_for(values.path);
  const std::size_t bytes = element_bytes(values.element);
  const std::size_t elements = values.layout == panel_layout::tile_pairs ? tile_pairs_elements(values.k, values.n)
                                                                         : packed_b_floats(config, values.k, values.n);
  copy.emplace(ceil_div(elements * bytes, sizeof(float)));
  auto* const target = reinterpret_cast<std::byte*>(copy->data());
  if (kept.count() == 0) {
    std::memset(target, 0, elements * bytes);
    return target;
  }
  std::memcpy(target, values.panels, elements * bytes);
  for (std::size_t col = 0; col < values.n; col += config.nr)
    for (std::size_t row = 0; row < values.k; ++row)
      if (row < kept.begin || row >= kept.end)
        for (std::size_t lane = 0; lane < config.nr; ++lane)
          std::memset(target + packed_offset(values, row, col + lane) * bytes, 0, bytes);
  return target;
}

// V scales below this make a row of p times them subnormal (chunk_partial).
constexpr float tiny_value_scale = 0x1p-100f;

// 2. Chunk `chunk`'s partial of every row: (max, sum) and acc [rows x d].
// Rows that see no key of the chunk are left as they are (never merged). The
// chunk's keys come in segments read in place (one per KV cache block);
// every element's sums run in the same order whatever the segment size.
// Segments before the first key any row sees (the tile's first row's window
// begin) are neither asked for nor read.
// q_prepared: the rows prepare_queries made of q_rows (read where the
// bf16 or int8 products run).
void chunk_partial(const attention_tile& tile, const kv_chunk_source& source, std::size_t chunk, const float* q_rows,
                   const float* q_prepared, float* scores, float* partial) {
  const std::size_t group = tile.group, head_dim = tile.head_dim, positions = tile.positions;
  const std::size_t rows = positions * group, key0 = chunk * kv_chunk;
  auto visible = [&](std::size_t position) { return visible_in_chunk(tile, chunk, position); };
  std::size_t width = 0;  // keys [0, width) of the chunk span every row's visible ones
  bool uniform = true;    // every row sees the same keys
  for (std::size_t position = 0; position < positions; ++position) {
    width = std::max(width, visible(position).end);
    uniform = uniform && visible(position) == visible(0);
  }
  const std::size_t segment_keys = source.segment_keys();
  const std::size_t segments = ceil_div(width, segment_keys);
  const std::size_t lowest = std::max(tile.visible_begin(tile.position0), key0) - key0;  // no row sees a key before
  const std::size_t first_segment = std::min(lowest, width) / segment_keys;
  const std::size_t first_key = first_segment * segment_keys;  // keys [first_key, width) are computed
  kv_segment views[max_segments_per_chunk];
  source.segments(chunk, first_segment, segments, views);
  // int8: the per-key scales of K and V (one line per 16 keys at the end of
  // each region). V's are prefetched now: they are read before V's stream
  // reaches them, a DRAM miss per line otherwise (Zen 5: S1 and S5 over an
  // int8 cache 3-6% faster in 7 alternations); K's come in with K's stream.
  const bool scaled = views[first_segment].key_scales != nullptr;
  if (scaled)
    for (std::size_t s = first_segment; s < segments; ++s)
      for (std::size_t line = 0; line < segment_keys * sizeof(float); line += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(views[s].value_scales) + line);
  float* const max = partial;
  float* const sum = partial + rows;
  float* const acc = partial + 2 * rows;

  // 2a. scores = scale * q kᵀ (+ mask), the segments' Kᵀ as the column pages
  // of one GEMM (each column is computed alone: the same bits as one packed
  // Kᵀ); int8: times each key's K scale; then soft-capped, when configured
  // (elementwise, so chunking cannot change it), before the mask.
  const void* key_pages[max_segments_per_chunk];
  const void* value_pages[max_segments_per_chunk];
  for (std::size_t s = first_segment; s < segments; ++s) {
    key_pages[s] = views[s].keys.panels;
    value_pages[s] = views[s].values.panels;
  }
  const packed_b_view& first_keys = views[first_segment].keys;
  const product_kind kind = tile_products(tile, source.element());
  const paged_b_view keys_view{key_pages + first_segment,
                               first_keys.n,
                               false,
                               head_dim,
                               width - first_key,
                               first_keys.path,
                               first_keys.element,
                               views[first_segment].key_row_stride,
                               first_keys.layout};
  const gemm_operand queries{q_rows, head_dim, transpose::no};
  paged_product(kind, attention_product::scores, {rows, width - first_key, head_dim}, tile.scale, queries, keys_view,
                scores + first_key, kv_chunk, kind != product_kind::fp32 ? q_prepared : nullptr);
  // int8: the scales gathered into one row per chunk, so each query row takes
  // one multiply per chunk, not one per segment (Zen 5: 4-5% off S1 and S5
  // over an int8 cache, 11% at block 16, in 5 alternations). Only now, with
  // K's stream read: gathered before q kᵀ, K's scales at block 16 were 16
  // DRAM misses in a row per chunk (Xeon: 3% of a decode step there).
  alignas(64) float gathered_scales[2][kv_chunk];
  const float* key_scales = nullptr;    // key_scales[j - first_key]: key j of the chunk, j in [first_key, width)
  const float* value_scales = nullptr;  // likewise
  if (scaled) {
    key_scales = views[first_segment].key_scales;
    value_scales = views[first_segment].value_scales;
    if (segments - first_segment > 1) {
      // Whole lines of scales (kv_segment): copies of a fixed size, inlined,
      // not a memmove call per segment (int8 at block 16 spent 4% of a
      // decode step in them, Zen 5).
      for (std::size_t s = first_segment; s < segments; ++s) {
        const std::size_t first = s * segment_keys, keys = std::min(segment_keys, width - first);
        for (std::size_t j = 0; j < keys; j += scale_line_floats) {
          std::memcpy(gathered_scales[0] + (first - first_key) + j, views[s].key_scales + j,
                      sizeof(float) * scale_line_floats);
          std::memcpy(gathered_scales[1] + (first - first_key) + j, views[s].value_scales + j,
                      sizeof(float) * scale_line_floats);
        }
      }
      key_scales = gathered_scales[0];
      value_scales = gathered_scales[1];
    }
    for (std::size_t row = 0; row < rows; ++row)
      multiply_floats(scores + row * kv_chunk + first_key, key_scales, width - first_key, tile.path);
  }
  if (tile.variants.logit_softcap > 0.0f)  // in place over each row's visible keys
    for (std::size_t row = 0; row < rows; ++row) {
      const key_span keys = visible(row / group);
      softcap_floats(scores + row * kv_chunk + keys.begin, keys.count(), tile.variants.logit_softcap, tile.path);
    }
  if (tile.additive_mask != nullptr)
    for (std::size_t row = 0; row < rows; ++row) {
      const float* mask_row = tile.additive_mask + (tile.position0 + row / group) * tile.mask_ld + key0;
      for (std::size_t j = first_key; j < width; ++j) scores[row * kv_chunk + j] += mask_row[j];
    }

  // int8: V's scales below 2^-100 (V's values below about 2^-93) would make
  // p times a scale, and the int16 quantum of a row of them (int8 products),
  // subnormal: bits lost, or the whole row quantized to zeros. A row whose
  // visible keys' largest V scale is that small takes its scales times 2^e
  // (the largest then in [1, 2)) and its output times 2^-e: powers of two, so
  // the integers quantized and summed are those of the row at any magnitude.
  // e follows from the row's own keys, so a row gets it in any tile; a row
  // with one scale of 2^-100 or more (in practice its first) keeps e = 0.
  auto value_exponent = [&](std::size_t row) {
    const key_span keys = visible(row / group);
    if (keys.count() == 0) return 0;  // {0, 0}: no offset from first_key to take
    const float* const scales = value_scales + (keys.begin - first_key);
    float largest = 0.0f;
    for (std::size_t j = 0; j < keys.count(); ++j) {
      if (scales[j] >= tiny_value_scale) return 0;
      largest = std::max(largest, scales[j]);  // a NaN scale is skipped
    }
    return largest > 0.0f ? -std::ilogb(largest) : 0;
  };
  alignas(64) float raised_scales[kv_chunk];

  // 2b. Each row's partial from an empty state over its visible keys; int8:
  // each visible probability times its key's V scale (after the sum, which
  // stays the softmax's).
  for (std::size_t row = 0; row < rows; ++row) {
    softmax_partial state;
    float* const p = scores + row * kv_chunk;
    const key_span keys = visible(row / group);
    online_softmax_block(p + keys.begin, keys.count(), state, tile.path);
    max[row] = state.max;
    sum[row] = state.sum;
    if (tile.precision == precision::bf16 && kind != product_kind::bf16)  // the bf16 products round p as they read it
      round_floats_to_bf16(p + keys.begin, p + keys.begin, keys.count(), tile.path);
    if (scaled && keys.count() > 0) {
      const float* row_scales = value_scales + (keys.begin - first_key);
      if (const int exponent = value_exponent(row); exponent != 0) {
        for (std::size_t j = 0; j < keys.count(); ++j) raised_scales[j] = std::ldexp(row_scales[j], exponent);
        row_scales = raised_scales;
      }
      multiply_floats(p + keys.begin, row_scales, keys.count(), tile.path);
    }
  }

  // 2c. acc = p v. Off the causal diagonal and the window's edge every
  // position sees the whole chunk: one GEMM, the segments' V as its row pages
  // (each element's FMA chain runs on across them). Elsewhere positions see
  // different ranges. When V's rows there are all finite, hidden
  // probabilities are set to 0 and the GEMMs still run over the union of the
  // ranges: fma(0, v, acc) == acc exactly for finite v (acc starts at +0 and
  // is never -0), so each row's bits are those of a GEMM over its own range.
  // Otherwise (NaN or Inf in V) runs of positions with equal ranges get their
  // own GEMMs, so a hidden non-finite value never meets a zero probability;
  // a range starting inside a page with non-finite rows before it reads a
  // copy of that page whose rows before the range are zeros.
  const bool in_place = views[first_segment].values_in_place.data != nullptr;  // user V: one segment
  const packed_b_view& first_values = views[first_segment].values;
  auto multiply_pv = [&](std::size_t first_position, std::size_t end_position, key_span keys) {
    const std::size_t row0 = first_position * group, start = in_place ? keys.begin : keys.begin / segment_keys;
    // The bf16 kernels sum k in groups from the product's first key
    // (gemm_bf16_paged_k_group: pairs, or 32 keys on amx tiles), so the
    // product starts at a multiple of the group from the chunk's first key
    // whatever row's range it serves: then a row's bits are the same in any
    // tile. Keys before the segment `start` are then zero pages (16-key
    // blocks under 32-key groups), never read from the cache.
    const std::size_t lead_pages =
        in_place || kind != product_kind::bf16 ? 0 : start * segment_keys % gemm_bf16_paged_k_group() / segment_keys;
    const std::size_t from = in_place ? keys.begin : (start - lead_pages) * segment_keys;  // p[from, keys.begin) is 0
    for (std::size_t row = row0; row < end_position * group; ++row)
      std::fill(scores + row * kv_chunk + from, scores + row * kv_chunk + keys.begin, 0.0f);
    const gemm_shape shape{(end_position - first_position) * group, head_dim, keys.end - from};
    const gemm_operand probabilities{scores + row0 * kv_chunk + from, kv_chunk, transpose::no};
    float* const target = acc + row0 * head_dim;
    if (in_place) {
      const gemm_operand& values = views[first_segment].values_in_place;
      gemm(shape, 1.0f, probabilities, {values.data + from * values.ld, values.ld, values.trans}, 0.0f, target,
           head_dim, tile.path);
      return;
    }
    std::optional<scratch_lease> zeros, copy;
    const void* pages[max_segments_per_chunk];
    if (lead_pages > 0) std::fill(pages, pages + lead_pages, page_keeping_rows(views[start].values, {0, 0}, zeros));
    std::copy(value_pages + start, value_pages + segments, pages + lead_pages);
    // Rows of page `start` the product reads outside the range: those
    // before it, and in the tiles' layout (one page) those after it up to
    // a whole tile.
    const std::size_t page_first = start * segment_keys, hidden = keys.begin - page_first;
    const bool reads_past_range = first_values.layout == panel_layout::tile_pairs;
    if (!views[start].values_finite && (reads_past_range || (hidden > 0 && !all_finite(views[start].values, hidden))))
      pages[lead_pages] =
          page_keeping_rows(views[start].values, {hidden, std::min(first_values.k, keys.end - page_first)}, copy);
    const paged_b_view values{
        pages, first_values.k,     true, keys.end - from, head_dim, first_values.path, first_values.element,
        0,     first_values.layout};
    paged_product(kind, attention_product::values, shape, 1.0f, probabilities, values, target, head_dim);
    for (std::size_t row = row0; scaled && row < row0 + shape.m; ++row)
      if (const int exponent = value_exponent(row); exponent != 0)  // back to the row's magnitude
        for (float& element : std::span(target + (row - row0) * head_dim, head_dim))
          element = std::ldexp(element, -exponent);
  };
  auto values_finite = [&] {
    if (in_place) return all_finite(views[first_segment].values_in_place, width, head_dim);
    for (std::size_t s = first_segment; s * segment_keys < width; ++s)
      if (!views[s].values_finite && !all_finite(views[s].values, std::min(segment_keys, width - s * segment_keys)))
        return false;
    return true;
  };
  if (uniform) {
    if (width > 0) multiply_pv(0, positions, visible(0));
  } else if (values_finite()) {
    for (std::size_t row = 0; row < rows; ++row) {
      const key_span keys = visible(row / group);
      float* const p = scores + row * kv_chunk;
      std::fill(p + first_key, p + (keys.count() > 0 ? keys.begin : width), 0.0f);
      std::fill(p + (keys.count() > 0 ? keys.end : width), p + width, 0.0f);
    }
    multiply_pv(0, positions, {first_key, width});
  } else {
    for (std::size_t run_start = 0; run_start < positions;) {
      const key_span keys = visible(run_start);
      std::size_t run_end = run_start + 1;
      while (run_end < positions && visible(run_end) == keys) ++run_end;
      if (keys.count() > 0) multiply_pv(run_start, run_end, keys);
      run_start = run_end;
    }
  }
}

// A range of a tile's rows (row = position * R + head in group).
struct row_range {
  std::size_t begin, end;
};

row_range all_rows(const attention_tile& tile) { return {0, tile.positions * tile.group}; }

// The empty partial (max -inf, sum 0, acc 0) for a range of rows.
void clear_partial(const attention_tile& tile, float* partial, row_range range) {
  const std::size_t rows = tile.positions * tile.group;
  std::fill(partial + range.begin, partial + range.end, -INFINITY);
  std::fill(partial + rows + range.begin, partial + rows + range.end, 0.0f);
  std::fill(partial + 2 * rows + range.begin * tile.head_dim, partial + 2 * rows + range.end * tile.head_dim, 0.0f);
}

// Whether query row `position` of the tile sees a key of chunks [chunks.first, chunks.end).
bool sees_chunks(const attention_tile& tile, chunk_range chunks, std::size_t position) {
  const std::size_t row = tile.position0 + position;
  return std::max(tile.visible_begin(row), chunks.first * kv_chunk) <
         std::min(tile.visible_end(row), chunks.end * kv_chunk);
}

// 3. Merges the partial of chunks `chunks` (one chunk, or a range merged
// left to right) into the running one, row by row, skipping the rows that
// see none of their keys.
void merge_into(const attention_tile& tile, chunk_range chunks, float* running, const float* partial, row_range range) {
  const std::size_t rows = tile.positions * tile.group;
  for (std::size_t row = range.begin; row < range.end; ++row) {
    if (!sees_chunks(tile, chunks, row / tile.group)) continue;
    softmax_partial merged{running[row], running[rows + row]};
    merge_partials(merged, running + 2 * rows + row * tile.head_dim, softmax_partial{partial[row], partial[rows + row]},
                   partial + 2 * rows + row * tile.head_dim, tile.head_dim, tile.path);
    running[row] = merged.max;
    running[rows + row] = merged.sum;
  }
}

// 3, for a running partial's first chunk: the chunk's partial computed into
// `running` itself, the rows that see none of its keys then set empty. The
// same bits as merging it into the empty partial (merge_partials passes each
// row that sees the chunk through bit for bit, merge_into leaves the others
// empty), without the clear and the merge pass: the one chunk of every tile
// of a short prefill (prefill_sweep at 64 tokens, Zen 4, perf: the merge and
// the clear's memset 14% of the micro-kernel's samples, 2.4% after).
void start_running(const attention_tile& tile, const kv_chunk_source& source, std::size_t chunk, const float* q_rows,
                   const float* q_prepared, float* scores, float* running) {
  chunk_partial(tile, source, chunk, q_rows, q_prepared, scores, running);
  for (std::size_t row = 0; row < all_rows(tile).end; ++row)
    if (!sees_chunks(tile, {chunk, chunk + 1}, row / tile.group)) clear_partial(tile, running, {row, row + 1});
}

// 4. out = acc / sum, the sink (when configured) joining the sum.
void write_output(const attention_tile& tile, const float* running, row_range range) {
  const std::size_t rows = tile.positions * tile.group;
  for (std::size_t row = range.begin; row < range.end; ++row) {
    const std::size_t i = row / tile.group, r = row % tile.group, head = tile.kv_head * tile.group + r;
    float* target = tile.out + head * tile.out_head_stride + (tile.position0 + i) * tile.out_seq_stride;
    const float* acc = running + 2 * rows + row * tile.head_dim;
    if (tile.variants.sinks != nullptr)
      normalize_row_with_sink(acc, {running[row], running[rows + row]}, tile.variants.sinks[head], target,
                              tile.head_dim, tile.path);
    else
      normalize_row(acc, running[rows + row], target, tile.head_dim, tile.path);
  }
}

// Computes the partials of chunks [begin, end) (a split tile's task: at
// least one, plan_work): merged into `running` (from empty) as they come
// when `stored` is null, else each kept at stored + (c - begin) * size.
void process_chunks(const attention_tile& tile, const kv_chunk_source& source, std::size_t begin, std::size_t end,
                    float* running, float* stored, tile_scratch& scratch) {
  assert(begin < end);
  gather_queries(tile, scratch.q_rows.data());
  prepare_queries(tile, source, scratch.q_rows.data(), scratch.q_prepared.data());
  const float* const q_rows = scratch.q_rows.data();
  const float* const q_prepared = scratch.q_prepared.data();
  for (std::size_t chunk = begin; chunk < end; ++chunk) {
    if (stored != nullptr) {
      chunk_partial(tile, source, chunk, q_rows, q_prepared, scratch.scores.data(),
                    stored + (chunk - begin) * partial_floats(tile));
    } else if (chunk == begin) {
      start_running(tile, source, chunk, q_rows, q_prepared, scratch.scores.data(), running);
    } else {
      chunk_partial(tile, source, chunk, q_rows, q_prepared, scratch.scores.data(), scratch.partial.data());
      merge_into(tile, {chunk, chunk + 1}, running, scratch.partial.data(), all_rows(tile));
    }
  }
}

// The whole tiles of tasks[0 .. count) (one, or a bundle of one shape and
// chunk range), chunk by chunk: each chunk of every tile in turn, then the
// next chunk, each tile's partials merged left to right as they come (the
// same bits whatever the bundle); what the bundle changes is the order of
// the reads: a cache stores a block's kv heads side by side, so a decode
// step's consecutive kv heads read one stream per block instead of one per
// head and block.
void process_bundle(const std::vector<attention_tile>& tiles, const std::vector<const kv_chunk_source*>& sources,
                    const work_task* tasks, std::size_t count, chunk_range chunks) {
  const attention_tile& shape = tiles[tasks[0].unit];
  const kv_dtype element = sources[tasks[0].unit]->element();
  tile_scratch scratch(shape, element, count);
  const std::size_t running_floats = partial_floats(shape), query_floats = tile_scratch::query_floats(shape);
  const std::size_t prepared_floats = tile_scratch::prepared_query_floats(shape, element);
  for (std::size_t i = 0; i < count; ++i) {
    if (chunks.first == chunks.end)
      clear_partial(tiles[tasks[i].unit], scratch.running.data() + i * running_floats, all_rows(shape));
    gather_queries(tiles[tasks[i].unit], scratch.q_rows.data() + i * query_floats);
    prepare_queries(tiles[tasks[i].unit], *sources[tasks[i].unit], scratch.q_rows.data() + i * query_floats,
                    scratch.q_prepared.data() + i * prepared_floats);
  }
  for (std::size_t chunk = chunks.first; chunk < chunks.end; ++chunk)
    for (std::size_t i = 0; i < count; ++i) {
      const attention_tile& tile = tiles[tasks[i].unit];
      const float* const q_rows = scratch.q_rows.data() + i * query_floats;
      const float* const q_prepared = scratch.q_prepared.data() + i * prepared_floats;
      float* const running = scratch.running.data() + i * running_floats;
      if (chunk == chunks.first) {
        start_running(tile, *sources[tasks[i].unit], chunk, q_rows, q_prepared, scratch.scores.data(), running);
        continue;
      }
      chunk_partial(tile, *sources[tasks[i].unit], chunk, q_rows, q_prepared, scratch.scores.data(),
                    scratch.partial.data());
      merge_into(tile, {chunk, chunk + 1}, running, scratch.partial.data(), all_rows(tile));
    }
  for (std::size_t i = 0; i < count; ++i)
    write_output(tiles[tasks[i].unit], scratch.running.data() + i * running_floats, all_rows(shape));
}

}  // namespace

void tile_work_units(const std::vector<attention_tile>& tiles, std::vector<work_unit>& units) {
  units.clear();
  for (const attention_tile& tile : tiles) {
    double cost = 0.0;  // multiply-adds of q kᵀ and p v over the visible keys
    for (std::size_t i = tile.position0; i < tile.position0 + tile.positions; ++i)
      if (tile.visible_end(i) > tile.visible_begin(i))
        cost += 2.0 * double(tile.group * tile.head_dim) * double(tile.visible_end(i) - tile.visible_begin(i));
    const chunk_range chunks = tile_chunks(tile);
    units.push_back({chunks.end - chunks.first, cost});
  }
}

namespace {

// run_tiles' bookkeeping, reused across calls on a thread.
struct run_workspace {
  std::vector<work_unit> units;
  work_plan plan;
  std::vector<std::size_t> offset, first_slot, split_tiles;
  std::vector<char> range_start;                             // per chunk slot of split tiles: it holds a partial
  std::vector<std::pair<std::size_t, row_range>> merges;     // (split tile, rows) of the merge pass
  std::vector<std::pair<std::size_t, std::size_t>> bundles;  // (first task, tasks) of the plan
};

// Whole tiles that run as one task, chunk by chunk (process_bundle): tiles
// of one shape and chunk range whose rows are one A panel (a decode step's
// GQA group: its products stream K and V at DRAM speed), consecutive in the
// plan (largest first: a sequence's kv heads, in order), at most
// ceil(tiles / threads) to a bundle so that every thread still gets one.
// A block's regions of one layer are its kv heads' K and V in turn ("Block
// layout", kv_cache.hpp), so a bundle reads each block as one stream where
// one tile at a time restarted the prefetchers at every head's K and V
// (Xeon, kvhead_bench, 2 runs of old and new: S1_decode_gqa 2.44-2.53 ->
// 2.17-2.21 ms at 1 thread and 1.76 -> 1.13-1.14 ms at 2; over a bf16 cache
// 1.33 -> 1.06-1.10 and 0.90-0.92 -> 0.56-0.58; int8 0.82-0.83 -> 0.69;
// S5_decode_ragged16 21.3-21.8 -> 18.7-19.0 ms and 14.6-15.0 -> 9.5-10.1).
void plan_bundles(const std::vector<attention_tile>& tiles, const std::vector<work_unit>& units, const work_plan& plan,
                  std::size_t threads, run_workspace& work) {
  work.bundles.clear();
  const std::size_t most = std::max<std::size_t>(1, (tiles.size() + threads - 1) / threads);
  auto streams = [&](const work_task& task) {
    const attention_tile& tile = tiles[task.unit];
    return !plan.split[task.unit] && units[task.unit].chunks > 0 &&
           tile.positions * tile.group <= kernel_config_for(tile.path).mr;
  };
  auto joins = [&](const work_task& first, const work_task& task) {
    const attention_tile &a = tiles[first.unit], &b = tiles[task.unit];
    const chunk_range range_a = tile_chunks(a), range_b = tile_chunks(b);
    return streams(task) && a.positions == b.positions && a.group == b.group && a.head_dim == b.head_dim &&
           range_a.first == range_b.first && range_a.end == range_b.end;
  };
  for (std::size_t index = 0; index < plan.tasks.size();) {
    std::size_t end = index + 1;
    if (streams(plan.tasks[index]))
      while (end < plan.tasks.size() && end - index < most && joins(plan.tasks[index], plan.tasks[end])) ++end;
    work.bundles.push_back({index, end - index});
    index = end;
  }
}

}  // namespace

void run_tiles(const std::vector<attention_tile>& tiles, const std::vector<const kv_chunk_source*>& sources) {
  const reusable<run_workspace> work;
  tile_work_units(tiles, work->units);
  const std::size_t threads = static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());
  plan_work(work->units, threads, work->plan);
  const work_plan& plan = work->plan;
  const bool fixed_order = current_reduction_order() == reduction_order::fixed;
  // Split tiles keep one partial slot per chunk. A task merges its chunks
  // left to right as they come and stores the result in the slot of its
  // first chunk when that is the tile's first chunk (the start of the left
  // to right merge the fixed order promises) or in the fastest order; else
  // (fixed order) it stores each chunk's partial in its own slot. Each slot
  // written is marked in `range_start`: it holds the partial of its chunks
  // up to the next marked one, and the merge pass skips a row only where it
  // sees none of them. (Folding the first range in place halves what a
  // 2-thread merge pass reads from the other core; S1, S4 and S5 at 2
  // threads measured within the noise of storing every chunk, Zen 5.)
  work->offset.assign(tiles.size(), 0);
  work->split_tiles.clear();
  std::size_t stored_floats = 0, slots = 0;
  for (std::size_t t = 0; t < tiles.size(); ++t)
    if (plan.split[t]) {
      work->offset[t] = stored_floats;
      work->first_slot.resize(t + 1);
      work->first_slot[t] = slots;
      work->split_tiles.push_back(t);
      stored_floats += work->units[t].chunks * partial_floats(tiles[t]);
      slots += work->units[t].chunks;
    }
  work->range_start.assign(slots, 0);
  scratch_lease stored(stored_floats);
  plan_bundles(tiles, work->units, plan, threads, *work);
  run_indices(work->bundles.size(), [&](std::size_t bundle) {
    const auto [index, count] = work->bundles[bundle];
    const work_task& task = plan.tasks[index];
    const attention_tile& tile = tiles[task.unit];
    const gemm_serial_scope serial;  // one task per tile, bundle or range already keeps the threads busy
    if (!plan.split[task.unit]) {    // whole tiles: one, or a bundle
      process_bundle(tiles, sources, plan.tasks.data() + index, count, tile_chunks(tile));
      return;
    }
    tile_scratch scratch(tile, sources[task.unit]->element());
    const std::size_t first = tile_chunks(tile).first;  // the unit's chunk u is the tile's first + u
    float* slot = stored.data() + work->offset[task.unit] + task.chunk_begin * partial_floats(tile);
    const std::size_t begin = first + task.chunk_begin, end = first + task.chunk_end;
    char* const marks = work->range_start.data() + work->first_slot[task.unit];
    if (fixed_order && task.chunk_begin > 0) {
      process_chunks(tile, *sources[task.unit], begin, end, nullptr, slot, scratch);
      std::fill(marks + task.chunk_begin, marks + task.chunk_end, 1);
    } else {
      process_chunks(tile, *sources[task.unit], begin, end, slot, nullptr, scratch);
      marks[task.chunk_begin] = 1;
    }
  });
  // Split tiles: merge the stored partials left to right, then normalize;
  // rows are independent, so blocks of rows run in parallel.
  constexpr std::size_t merge_rows = 8;
  work->merges.clear();
  for (std::size_t t : work->split_tiles)
    for (std::size_t row = 0; row < all_rows(tiles[t]).end; row += merge_rows)
      work->merges.push_back({t, {row, std::min(row + merge_rows, all_rows(tiles[t]).end)}});
  run_indices(work->merges.size(), [&](std::size_t index) {
    const auto& [t, range] = work->merges[index];
    const attention_tile& tile = tiles[t];
    const float* partials = stored.data() + work->offset[t];
    const tile_scratch scratch(tile, sources[t]->element());
    float* const running = scratch.running.data();  // these rows' running partial, from empty
    clear_partial(tile, running, range);
    const std::size_t first = tile_chunks(tile).first, chunks = work->units[t].chunks;
    const char* const marks = work->range_start.data() + work->first_slot[t];
    for (std::size_t slot = 0; slot < chunks;) {
      const std::size_t next = std::find(marks + slot + 1, marks + chunks, 1) - marks;
      merge_into(tile, {first + slot, first + next}, running, partials + slot * partial_floats(tile), range);
      slot = next;
    }
    write_output(tile, running, range);
  });
}

namespace {

// flash_attention's bookkeeping, reused across calls on a thread.
struct flash_workspace {
  std::vector<attention_tile> tiles;
  std::vector<std::size_t> source_index;  // per tile: its (batch, kv head)
  std::vector<std::size_t> keys_seen;     // per (batch, kv head): keys its last query sees
  std::vector<std::size_t> chunk_from;    // per (batch, kv head): the first chunk a query sees
  std::vector<std::size_t> first_chunk;   // per (batch, kv head): its first chunk slot of packed keys
  // Per packing task: (batch * G + kv head, chunk).
  std::vector<std::pair<std::size_t, std::size_t>> packs;
  std::vector<char> values_finite;  // per packing task: its packed V is finite
  std::vector<user_kv_source> sources;
  std::vector<const kv_chunk_source*> tile_sources;
};

}  // namespace

void flash_attention(const attention_problem& problem) {
  const attention_dims& dims = problem.dims;
  const std::size_t group = dims.num_heads / dims.num_kv_heads;
  const std::size_t positions = tile_positions(group, problem.path);
  const reusable<flash_workspace> work;
  std::vector<attention_tile>& tiles = work->tiles;
  tiles.clear();
  work->source_index.clear();
  for (std::size_t batch = 0; batch < dims.batch; ++batch)
    for (std::size_t kv_head = 0; kv_head < dims.num_kv_heads; ++kv_head)
      for (std::size_t position0 = 0; position0 < dims.q_len; position0 += positions) {
        tiles.push_back({problem.q.data + batch * problem.q.batch_stride,
                         problem.q.head_stride,
                         problem.q.seq_stride,
                         problem.out.data + batch * problem.out.batch_stride,
                         problem.out.head_stride,
                         problem.out.seq_stride,
                         kv_head,
                         group,
                         dims.head_dim,
                         position0,
                         std::min(positions, dims.q_len - position0),
                         problem.q_offset,
                         problem.valid_len != nullptr ? problem.valid_len[batch] : dims.kv_len,
                         problem.causal,
                         problem.additive_mask,
                         dims.kv_len,
                         problem.scale,
                         problem.path,
                         problem.window,
                         problem.variants,
                         problem.precision,
                         problem.inputs_rounded});
        work->source_index.push_back(batch * dims.num_kv_heads + kv_head);
      }
  // 1. K and V of every (batch, kv head), from the first chunk a query sees
  // (a sliding window hides the ones before) as far as its last query sees: Kᵀ
  // packed, one task per chunk. V is read in place when each (batch, kv head)
  // has one query tile: each chunk of it then meets one P·V, which reads it
  // once either way. With several tiles, each chunk's V is packed here once
  // and shared, instead of the GEMM packing it again for every tile.
  const std::size_t sources = dims.batch * dims.num_kv_heads;
  work->keys_seen.assign(sources, 0);
  work->chunk_from.assign(sources, SIZE_MAX);
  for (std::size_t t = 0; t < tiles.size(); ++t) {
    const std::size_t index = work->source_index[t];
    work->keys_seen[index] = std::max(work->keys_seen[index], tiles[t].visible_end(dims.q_len - 1));
    const chunk_range chunks = tile_chunks(tiles[t]);
    if (chunks.end > chunks.first) work->chunk_from[index] = std::min(work->chunk_from[index], chunks.first);
  }
  work->first_chunk.resize(sources);
  work->packs.clear();
  for (std::size_t index = 0; index < sources; ++index) {
    work->first_chunk[index] = work->packs.size();
    if (work->chunk_from[index] == SIZE_MAX) work->chunk_from[index] = 0;
    for (std::size_t chunk = work->chunk_from[index]; chunk < ceil_div(work->keys_seen[index], kv_chunk); ++chunk)
      work->packs.push_back({index, chunk});
  }
  // In bf16 precision V is packed (and K and V rounded to bf16 as they are
  // packed, once per call, unless they come rounded): the bf16 products
  // read V packed (gemm_bf16_paged), whose pairs of keys then start at even
  // positions of the chunk whatever a row sees. Rounding K, V and q again
  // after a layer's rounding took about 3% of S3_mha_layer_bf16 (Xeon, perf).
  // On amx tiles, with several query tiles per (batch, kv head), the fp32
  // panels are then staged here once into the tiles' own layout
  // (pack_tile_pairs), not by every tile's products again: the same bits.
  // Xeon, S2_prefill_gqa_causal_bf16: staging took about a fifth of the run.
  // On the other bf16 unit (avx512bf16) they are held as bf16 panels, as a
  // bf16 KV cache holds them: the same values, so the same bits, at half
  // the bytes, read without a conversion per tile. Zen 4, 1 thread, 6
  // alternations (medians of 5): S2_prefill_gqa_causal_bf16 58.7-69.8 ->
  // 56.1-60.0 ms, faster in each; S3_mha_layer_bf16 (head_dim 64, its
  // attention a third of its flops) within the noise.
  const bool bf16_precision = problem.precision == kvhead::precision::bf16;
  const bool round_kv = bf16_precision && !problem.inputs_rounded;
  const bool pack_values = dims.q_len > positions || bf16_precision;
  const bool held_in_bf16 =
      bf16_precision && dims.q_len > positions &&
      attention_products(problem.precision, problem.path, kv_dtype::bf16, dims.head_dim) == product_kind::bf16;
  const bool tile_pairs = held_in_bf16 && gemm_bf16_paged_reads_tile_pairs();
  const bool bf16_panels = held_in_bf16 && !tile_pairs;
  const gemm_config& config = gemm_config_for(problem.path);
  auto slot_floats = [&](std::size_t k, std::size_t n) {
    return tile_pairs    ? ceil_div(tile_pairs_elements(k, n), 2)
           : bf16_panels ? ceil_div(packed_b_floats(config, k, n), 2)
                         : packed_b_floats(config, k, n);
  };
  const std::size_t key_floats = slot_floats(dims.head_dim, kv_chunk);
  const std::size_t value_floats = pack_values ? slot_floats(kv_chunk, dims.head_dim) : 0;
  const scratch_lease packed_keys(work->packs.size() * key_floats), packed_values(work->packs.size() * value_floats);
  // (K and V may be null when there are no keys: no offset then.)
  auto head_rows = [&](const head_tensor<const float>& tensor, std::size_t index) {
    if (tensor.data == nullptr) return tensor.data;
    return tensor.data + index / dims.num_kv_heads * tensor.batch_stride +
           index % dims.num_kv_heads * tensor.head_stride;
  };
  // op(B) (k x n) packed into a slot, rounded when asked; the view of it.
  auto pack_slot = [&](gemm_operand from, std::size_t k, std::size_t n, float* slot) {
    const std::size_t fp32_floats = packed_b_floats(config, k, n);
    const scratch_lease staging(held_in_bf16 ? fp32_floats : 0);
    float* const fp32 = held_in_bf16 ? staging.data() : slot;
    pack_operand(from, k, n, config, fp32);
    if (round_kv) round_floats_to_bf16(fp32, fp32, fp32_floats, problem.path);
    if (!held_in_bf16) return packed_b_view{slot, k, n, problem.path};
    auto* const held = reinterpret_cast<bf16_bits*>(slot);
    if (tile_pairs) {
      pack_tile_pairs({fp32, k, n, problem.path}, held);
      return packed_b_view{slot, k, n, problem.path, kv_dtype::bf16, panel_layout::tile_pairs};
    }
    std::transform(fp32, fp32 + fp32_floats, held, encode_bf16);  // exact: the values are bf16 already
    return packed_b_view{slot, k, n, problem.path, kv_dtype::bf16};
  };
  work->values_finite.assign(work->packs.size(), 0);
  run_indices(work->packs.size(), [&](std::size_t task) {
    const auto [index, chunk] = work->packs[task];
    const std::size_t key0 = chunk * kv_chunk, width = std::min(kv_chunk, work->keys_seen[index] - key0);
    pack_slot({head_rows(problem.k, index) + key0 * problem.k.seq_stride, problem.k.seq_stride, transpose::yes},
              dims.head_dim, width, packed_keys.data() + task * key_floats);
    if (pack_values) {
      const packed_b_view values =
          pack_slot({head_rows(problem.v, index) + key0 * problem.v.seq_stride, problem.v.seq_stride, transpose::no},
                    width, dims.head_dim, packed_values.data() + task * value_floats);
      // Once here, not per tile: the P·V of the causal diagonal asks.
      work->values_finite[task] = all_finite(values, width);
    }
  });
  work->sources.clear();
  for (std::size_t index = 0; index < sources; ++index) {
    const std::size_t slot = work->first_chunk[index];
    const user_kv_layout packed{packed_keys.data() + slot * key_floats,
                                key_floats,
                                pack_values ? packed_values.data() + slot * value_floats : nullptr,
                                value_floats,
                                work->chunk_from[index],
                                work->values_finite.data() + slot,
                                held_in_bf16 ? kv_dtype::bf16 : kv_dtype::f32,
                                tile_pairs ? panel_layout::tile_pairs : panel_layout::rows};
    work->sources.emplace_back(packed, work->keys_seen[index], head_rows(problem.v, index), problem.v.seq_stride,
                               dims.head_dim, problem.path);
  }
  // 2-4. Every tile, as the scheduler cuts them.
  work->tile_sources.clear();
  for (std::size_t index : work->source_index) work->tile_sources.push_back(&work->sources[index]);
  run_tiles(tiles, work->tile_sources);
}

void attention_probabilities(const attention_problem& problem, float* probabilities) {
  const attention_dims& dims = problem.dims;
  const std::size_t group = dims.num_heads / dims.num_kv_heads;
  tbb::parallel_for(std::size_t{0}, dims.batch * dims.num_heads, [&](std::size_t task) {
    const std::size_t batch = task / dims.num_heads, head = task % dims.num_heads;
    float* rows = probabilities + task * dims.q_len * dims.kv_len;
    const float* q = problem.q.data + batch * problem.q.batch_stride + head * problem.q.head_stride;
    const float* k = problem.k.data + batch * problem.k.batch_stride + head / group * problem.k.head_stride;
    gemm({dims.q_len, dims.kv_len, dims.head_dim}, problem.scale, {q, problem.q.seq_stride, transpose::no},
         {k, problem.k.seq_stride, transpose::yes}, 0.0f, rows, dims.kv_len, problem.path);
    const std::size_t key_limit = problem.valid_len != nullptr ? problem.valid_len[batch] : dims.kv_len;
    const score_variants& variants = problem.variants;
    for (std::size_t i = 0; i < dims.q_len; ++i) {
      float* row = rows + i * dims.kv_len;
      if (variants.logit_softcap > 0.0f) softcap_floats(row, dims.kv_len, variants.logit_softcap, problem.path);
      if (problem.additive_mask != nullptr)
        for (std::size_t j = 0; j < dims.kv_len; ++j) row[j] += problem.additive_mask[i * dims.kv_len + j];
      const std::size_t position = problem.q_offset + i;
      const std::size_t end = problem.causal ? std::min(key_limit, position + 1) : key_limit;
      const std::size_t begin =
          problem.window == 0 || position < problem.window ? 0 : std::min(position + 1 - problem.window, end);
      std::fill(row, row + begin, -INFINITY);
      std::fill(row + end, row + dims.kv_len, -INFINITY);
      if (variants.sinks != nullptr)
        softmax_row_with_sink(row, dims.kv_len, variants.sinks[head], problem.path);
      else
        softmax_row(row, dims.kv_len, problem.path);
    }
  });
}

}  // namespace kvhead::engine
