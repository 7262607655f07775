// Step 2 of the fixed reduction order (flash_attention.hpp): one chunk's
// partial (max, sum, acc) of every row of a tile, its q kᵀ and p v on the
// kernels the problem chooses (fp32, bf16 or int8, read in place over the
// chunk's segments), and the tile's query rows prepared for them.
#include "engine/attention/chunk_partial.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "engine/arch/checked_size.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/attention/alibi.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "engine/gemm/gemm_int8.hpp"
#include "engine/gemm/stored_element.hpp"
#include "engine/softmax/softmax.hpp"

namespace kvhead::engine {
namespace {

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

// True when rows [0, rows) of a V read in place (cols floats each) are finite.
bool all_finite(const gemm_operand& values, std::size_t rows, std::size_t cols) {
  for (std::size_t row = 0; row < rows; ++row)
    if (!all_finite_run(values.data + row * values.ld, cols)) return false;
  return true;
}

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

// The kernels of the tile's products over K/V stored as `element` (attention_products).
product_kind tile_products(const attention_tile& tile, kv_dtype element) {
  return attention_products(tile.precision, tile.path, element, tile.head_dim);
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

}  // namespace

product_kind attention_products(kvhead::precision precision, simd_path path, kv_dtype element, std::size_t head_dim) {
  if (head_dim > gemm_kc) return product_kind::fp32;
  if ((precision == kvhead::precision::bf16 || element == kv_dtype::bf16) &&
      bf16_paged_products_chosen(path, element, precision))
    return product_kind::bf16;
  if (element == kv_dtype::int8 && gemm_int8_paged_runs(path, element)) return product_kind::int8;
  return product_kind::fp32;
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

std::size_t prepared_query_floats(const attention_tile& tile, kv_dtype element) {
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
  if (tile.variants.alibi_slopes != nullptr)  // likewise, after the cap
    for (std::size_t row = 0; row < rows; ++row) {
      const key_span keys = visible(row / group);
      const std::size_t position = tile.q_offset + tile.position0 + row / group;
      add_alibi(scores + row * kv_chunk + keys.begin, keys.count(),
                tile.variants.alibi_slopes[tile.kv_head * group + row % group],
                std::int64_t(key0 + keys.begin) - std::int64_t(position));
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

}  // namespace kvhead::engine
