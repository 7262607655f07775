#include "engine/attention/flash_attention.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <tbb/parallel_for.h>

#include "engine/arch/checked_size.hpp"
#include "engine/arch/kernel_config.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/attention/alibi.hpp"
#include "engine/attention/chunk_partial.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "engine/gemm/pack.hpp"
#include "engine/gemm/stored_element.hpp"
#include "engine/scheduler/split_schedule.hpp"
#include "engine/softmax/softmax.hpp"

namespace kvhead::engine {
namespace {

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
      if (variants.alibi_slopes != nullptr)
        add_alibi(row, dims.kv_len, variants.alibi_slopes[head], -std::int64_t(problem.q_offset + i));
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
