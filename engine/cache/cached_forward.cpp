// attention_layer::forward over a KV cache: write the new tokens' K and V into
// their blocks, then attend over each sequence's blocks with the same tile
// kernel as the cache-free forward.
//
// Block contents (one (layer, kv head) region pair per block, sizes in
// kv_cache_internals): the K region holds the block's keys as a packed GEMM B
// operand Kᵀ (head_dim x block_size), the V region its values as a packed
// V (block_size x head_dim), both in the layout of the active SIMD path
// (gemm.hpp: packed_b_view), except that a block with fewer key columns
// than the path's panels holds Kᵀ as one narrow panel (kv_narrow_key_row_stride,
// paged_b_view::narrow_row_stride), in elements of the cache's dtype; an int8
// region's per-token fp32 scales follow its elements. Every block is read in
// place as one segment of its chunk (flash_attention.hpp: kv_segment).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <stdexcept>
#include <string>
#include <vector>

#include <tbb/parallel_for.h>

#include "engine/arch/require.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/attention/flash_attention.hpp"
#include "engine/attention/kv_encode.hpp"
#include "engine/attention/layer_impl.hpp"
#include "engine/cache/cached_attention.hpp"
#include "engine/cache/kv_cache_internals.hpp"
#include "engine/scheduler/arena.hpp"

namespace kvhead {
namespace engine {
namespace {

// A block is one segment of a chunk: kv_chunk is a multiple of every block size.
static_assert(kv_chunk % kv_max_block_size == 0 && kv_max_block_size <= kv_chunk &&
                  kv_chunk / kv_min_block_size <= max_segments_per_chunk,
              "every block size must cut a chunk into at most max_segments_per_chunk whole blocks");
// A region's int8 scales (block_size floats, then padding) are whole lines, as kv_segment promises.
static_assert(kv_min_block_size % scale_line_floats == 0, "a block's int8 scales must fill whole lines");

// The chunks of one (sequence, layer, kv head) of a cache, block by block.
class cache_kv_source final : public kv_chunk_source {
 public:
  cache_kv_source(const kv_cache& cache, const std::uint32_t* table, std::size_t layer, std::size_t kv_head,
                  simd_path path)
      : table_(table),
        pool_(kv_cache_internals::pool(cache)),
        geometry_(kv_cache_internals::geometry(cache)),
        key_region_(region_geometry::key_region(layer, cache.config().num_kv_heads, kv_head)),
        scales_offset_(kv_cache_internals::scales_offset(cache)),
        block_size_(cache.config().block_size) {
    const std::size_t head_dim = cache.config().head_dim;
    const kv_dtype dtype = cache.dtype();
    blank_.keys = {nullptr, head_dim, block_size_, path, dtype};
    blank_.values = {nullptr, block_size_, head_dim, path, dtype};
    blank_.key_row_stride = kv_narrow_key_row_stride(gemm_config_for(path).nr, block_size_);
  }

  std::size_t segment_keys() const override { return block_size_; }
  kv_dtype element() const override { return blank_.keys.element; }

  void segments(std::size_t chunk, std::size_t first, std::size_t end, kv_segment* views) const override {
    const std::uint32_t* const blocks = table_ + chunk * (kv_chunk / block_size_);
    const bool scaled = blank_.keys.element == kv_dtype::int8;
    for (std::size_t s = first; s < end; ++s) {
      const std::byte* key = pool_ + geometry_.offset(blocks[s], key_region_);
      const std::byte* value = pool_ + geometry_.offset(blocks[s], key_region_ + 1);
      kv_segment& view = views[s];
      view = blank_;
      view.keys.panels = key;
      view.values.panels = value;
      if (scaled) {
        view.key_scales = reinterpret_cast<const float*>(key + scales_offset_);
        view.value_scales = reinterpret_cast<const float*>(value + scales_offset_);
      }
    }
  }

 private:
  const std::uint32_t* table_;
  const std::byte* pool_;
  region_geometry geometry_;
  std::size_t key_region_, scales_offset_, block_size_;  // scales_offset_: bytes
  kv_segment blank_{};                                   // every segment's fields but its addresses
};

// Element i of `count` contiguous values x, as the writer below reads them:
// f32 and bf16 converted as they are read (a copy, a few integer
// operations), f16 and int8 encoded into `piece` first by the row encoders
// of kv_encode.hpp (int8: with the row's scale), whose vector forms made
// those writes 1.6-2.2x faster (Zen 3, cache_write_<dtype>, 3
// alternations); bf16 through a piece too was 1.2-1.4x slower than in place.
template <class Element>
auto piece_elements(const float* x, std::size_t count, float scale, Element* piece, simd_path path) {
  if constexpr (std::is_same_v<Element, float>) {
    return [x](std::size_t i) { return x[i]; };
  } else if constexpr (std::is_same_v<Element, bf16_bits>) {
    return [x](std::size_t i) { return encode_bf16(x[i]); };
  } else {
    if constexpr (std::is_same_v<Element, f16_bits>)
      encode_f16_row(x, count, piece, path);
    else
      encode_int8_row(x, count, scale, piece, path);
    return [piece](std::size_t i) { return piece[i]; };
  }
}

// Values of a token's K or V converted at a time: one KC block of Kᵀ
// (config.kc is gemm_kc on every path), whole panels of V.
constexpr std::size_t encode_piece = gemm_kc;
static_assert(encode_piece % kv_panel_multiple == 0, "a piece of V is whole panels");

// Writes one token's k and v (head_dim floats each) into slot `slot` of a
// block's region pair, converted to Element, V padding lanes zeroed. Kᵀ:
// the token is column `slot`, one element every NR within each KC block
// (every narrow_key_row_stride elements in a narrow panel, when nonzero:
// kv_narrow_key_row_stride); V: row `slot`, NR consecutive elements per
// panel. Each is converted a piece at a time (piece_elements, on `path`),
// K's piece then scattered down its column, V's copied panel by panel.
// int8: the rows' scales at scales_offset bytes into each region.
template <class Element>
void write_token(std::byte* key_region, std::byte* value_region, std::size_t scales_offset, const gemm_config& config,
                 std::size_t block_size, std::size_t narrow_key_row_stride, std::size_t head_dim, std::size_t slot,
                 const float* k, const float* v, simd_path path) {
  auto* const keys = reinterpret_cast<Element*>(key_region);
  auto* const values = reinterpret_cast<Element*>(value_region);
  float key_scale = 0.0f, value_scale = 0.0f;
  if constexpr (std::is_same_v<Element, std::int8_t>) {
    key_scale = int8_scale(k, head_dim);
    value_scale = int8_scale(v, head_dim);
    reinterpret_cast<float*>(key_region + scales_offset)[slot] = key_scale;
    reinterpret_cast<float*>(value_region + scales_offset)[slot] = value_scale;
  }
  Element piece[encode_piece];
  const std::size_t key_row_stride = narrow_key_row_stride != 0 ? narrow_key_row_stride : config.nr;
  for (std::size_t e0 = 0; e0 < head_dim; e0 += encode_piece) {
    const std::size_t count = std::min(encode_piece, head_dim - e0);
    const auto element = piece_elements(k + e0, count, key_scale, piece, path);
    Element* const column = keys + (narrow_key_row_stride != 0 ? e0 * narrow_key_row_stride + slot
                                                               : pack_b_offset(config, head_dim, block_size, e0, slot));
    for (std::size_t e = 0; e < count; ++e) column[e * key_row_stride] = element(e);
  }
  Element* const row = values + pack_b_offset(config, block_size, head_dim, slot, 0);
  const std::size_t panel_stride = pack_b_offset(config, block_size, head_dim, slot, config.nr) - (row - values);
  for (std::size_t col0 = 0; col0 < head_dim; col0 += encode_piece) {
    const std::size_t count = std::min(encode_piece, head_dim - col0);
    const auto element = piece_elements(v + col0, count, value_scale, piece, path);
    for (std::size_t col = 0; col < count; col += config.nr) {
      Element* const panel_row = row + (col0 + col) / config.nr * panel_stride;
      const std::size_t lanes = std::min(config.nr, count - col);
      for (std::size_t lane = 0; lane < lanes; ++lane) panel_row[lane] = element(col + lane);
      std::fill(panel_row + lanes, panel_row + config.nr, Element{});  // +0, as every element type stores 0.0f
    }
  }
}

// How many tokens ahead write_cached_kv prefetches its fp32 K and V rows: a
// task walks one kv head's rows, row_stride floats apart (4 KiB and more),
// which the hardware prefetchers do not follow. Zen 5 (cache_write_<dtype>,
// 3 alternations): f32 9.0 -> 4.4 ms, bf16 8.3 -> 5.0, f16 23.4 -> 11.9,
// int8 33.4 -> 15.2 at 4; 2 the same, 8 slower (6.7-22 ms).
constexpr std::size_t source_prefetch_tokens = 4;

using token_writer = void (*)(std::byte*, std::byte*, std::size_t, const gemm_config&, std::size_t, std::size_t,
                              std::size_t, std::size_t, const float*, const float*, simd_path);

token_writer writer_for(kv_dtype dtype) {
  switch (dtype) {
    case kv_dtype::bf16:
      return &write_token<bf16_bits>;
    case kv_dtype::f16:
      return &write_token<f16_bits>;
    case kv_dtype::int8:
      return &write_token<std::int8_t>;
    case kv_dtype::f32:
      break;
  }
  return &write_token<float>;
}

// The forward's bookkeeping, reused across calls on a thread.
struct forward_workspace {
  std::vector<sequence_id> ids;
  std::vector<cached_rows> entries;
  std::vector<std::size_t> positions, lengths;  // per row: its position, its sequence's length after the call
};

struct attention_workspace {
  std::vector<attention_tile> tiles;
  std::vector<cache_kv_source> sources;
  std::vector<const kv_chunk_source*> tile_sources;
};

}  // namespace

void write_cached_kv(kv_cache& cache, std::size_t layer, const std::vector<cached_rows>& batch, const float* k,
                     const float* v, std::size_t row_stride, simd_path path) {
  const kv_cache_config& geometry = cache.config();
  const std::size_t kv_heads = geometry.num_kv_heads, head_dim = geometry.head_dim, block_size = geometry.block_size;
  const gemm_config& config = gemm_config_for(path);
  const token_writer write = writer_for(cache.dtype());
  const std::size_t scales_offset = kv_cache_internals::scales_offset(cache);
  const std::size_t narrow_key_row_stride = kv_narrow_key_row_stride(config.nr, block_size);
  tbb::parallel_for(std::size_t{0}, batch.size() * kv_heads, [&](std::size_t task) {
    const cached_rows& e = batch[task / kv_heads];
    const std::size_t kv_head = task % kv_heads;
    std::byte *key = nullptr, *value = nullptr;  // the regions of the block holding `position`
    for (std::size_t position = e.past; position < e.length; ++position) {
      if (key == nullptr || position % block_size == 0) {
        const std::uint32_t block = e.table[position / block_size];
        key = kv_cache_internals::region(cache, block, layer, kv_head, false);
        value = kv_cache_internals::region(cache, block, layer, kv_head, true);
      }
      const std::size_t row = e.row0 + position - e.past;
      if (position + source_prefetch_tokens < e.length) {
        const std::size_t ahead = (row + source_prefetch_tokens) * row_stride + kv_head * head_dim;
        for (std::size_t line = 0; line < head_dim * sizeof(float); line += 64) {
          __builtin_prefetch(reinterpret_cast<const char*>(k + ahead) + line);
          __builtin_prefetch(reinterpret_cast<const char*>(v + ahead) + line);
        }
      }
      write(key, value, scales_offset, config, block_size, narrow_key_row_stride, head_dim, position % block_size,
            k + row * row_stride + kv_head * head_dim, v + row * row_stride + kv_head * head_dim, path);
    }
  });
}

void cached_attention(const kv_cache& cache, std::size_t layer, const std::vector<cached_rows>& batch,
                      std::size_t num_heads, const float* q, std::size_t q_row_stride, float* out, float scale,
                      std::size_t window, simd_path path, const score_variants& variants, kvhead::precision precision) {
  const std::size_t kv_heads = cache.config().num_kv_heads, head_dim = cache.config().head_dim;
  const std::size_t group = num_heads / kv_heads;
  const std::size_t tile_rows = tile_positions(group, path);
  const std::size_t out_row_stride = num_heads * head_dim;
  const reusable<attention_workspace> work;
  std::vector<attention_tile>& tiles = work->tiles;
  tiles.clear();
  work->sources.clear();
  work->sources.reserve(batch.size() * kv_heads);  // tiles point into it: no reallocation below
  work->tile_sources.clear();
  for (const cached_rows& e : batch)
    for (std::size_t kv_head = 0; kv_head < kv_heads; ++kv_head) {
      const cache_kv_source& source = work->sources.emplace_back(cache, e.table, layer, kv_head, path);
      for (std::size_t p = 0; p < e.length - e.past; p += tile_rows) {
        tiles.push_back({q + e.row0 * q_row_stride,
                         head_dim,
                         q_row_stride,
                         out + e.row0 * out_row_stride,
                         head_dim,
                         out_row_stride,
                         kv_head,
                         group,
                         head_dim,
                         p,
                         std::min(tile_rows, e.length - e.past - p),
                         e.past,
                         e.length,
                         true,
                         nullptr,
                         0,
                         scale,
                         path,
                         window,
                         variants,
                         precision});
        work->tile_sources.push_back(&source);
      }
    }
  run_tiles(tiles, work->tile_sources);
}

}  // namespace engine

void attention_layer::forward(kv_cache& cache, std::size_t layer, const std::vector<sequence_tokens>& batch,
                              const float* x, float* y) const {
  using namespace engine;
  const char* const call = "attention_layer::forward (cache)";  // no allocation unless it fails
  const attention_config& config = impl::of(impl_, call).config;
  const kv_cache_config& geometry = cache.config();
  const char* const where = "attention_layer::forward (cache): ";
  require(geometry.num_kv_heads == config.num_kv_heads && geometry.head_dim == config.head_dim, [&] {
    return where + ("the cache holds " + std::to_string(geometry.num_kv_heads) + " kv heads of dim " +
                    std::to_string(geometry.head_dim) + ", the layer " + std::to_string(config.num_kv_heads) +
                    " of dim " + std::to_string(config.head_dim));
  });
  require(layer < geometry.num_layers, [&] {
    return where + ("layer " + std::to_string(layer) + " is out of range (the cache has " +
                    std::to_string(geometry.num_layers) + ")");
  });
  const reusable<forward_workspace> work;
  work->ids.clear();
  for (const sequence_tokens& item : batch) work->ids.push_back(item.sequence);
  std::sort(work->ids.begin(), work->ids.end());
  const auto repeated = std::adjacent_find(work->ids.begin(), work->ids.end());
  require(repeated == work->ids.end(),
          [&] { return where + ("sequence " + std::to_string(*repeated) + " is listed twice"); });
  std::vector<cached_rows>& entries = work->entries;
  entries.clear();
  std::size_t rows = 0;
  // Isolation: a call writes exactly the positions [written, length) of each
  // sequence for this layer, all in blocks no other sequence holds, so it
  // never overwrites a shared block and attention never reads a slot this
  // layer did not write (a recycled block's old contents).
  const std::size_t block_size = geometry.block_size;
  for (const sequence_tokens& item : batch) {
    const kv_cache_internals::layer_state state = kv_cache_internals::state(cache, item.sequence, layer, call);
    const auto sequence = [&] { return "sequence " + std::to_string(item.sequence); };
    require(item.tokens > 0 && item.tokens <= state.length, [&] {
      return where + (sequence() + ": " + std::to_string(item.tokens) + " new tokens, but it has " +
                      std::to_string(state.length) + " (append them first)");
    });
    require(state.length - item.tokens == state.written, [&] {
      return where + (sequence() + ", layer " + std::to_string(layer) + ": " + std::to_string(item.tokens) +
                      " new tokens, but it is written up to " + std::to_string(state.written) + " of length " +
                      std::to_string(state.length) + ": a forward writes exactly the positions from the first to " +
                      "the second (append before each forward, one forward per layer)");
    });
    for (std::size_t block = state.written / block_size; block < state.blocks; ++block) {
      const std::size_t holders = kv_cache_internals::references(cache, state.table[block]);
      require(holders == 1, [&] {
        return where +
               (sequence() + ", layer " + std::to_string(layer) + ": positions from " + std::to_string(state.written) +
                " to " + std::to_string(state.length) + " lie in block " + std::to_string(block) + ", shared by " +
                std::to_string(holders) + " sequences (forked after append, before this forward): truncate to " +
                std::to_string(state.written) + " and append again");
      });
    }
    // Dropped positions (kv_cache::drop_outside_window) must lie outside the
    // window of every new query (the first is at the mark): never read.
    const std::size_t window = config.sliding_window;
    const std::size_t first_seen = window != 0 && state.written + 1 > window ? state.written + 1 - window : 0;
    require(state.dropped <= first_seen, [&] {
      return where + (sequence() + ": positions 0 to " + std::to_string(state.dropped - 1) +
                      " were dropped (kv_cache::drop_outside_window), but layer " + std::to_string(layer) +
                      "'s query at position " + std::to_string(state.written) +
                      (window == 0 ? " sees every earlier position (no sliding window)"
                                   : " sees positions from " + std::to_string(first_seen) + " (sliding window " +
                                         std::to_string(window) + ")"));
    });
    entries.push_back({state.table, state.length, state.written, rows});
    rows += item.tokens;
  }
  if (rows == 0) return;
  require(x != nullptr && y != nullptr, [&] { return std::string(where) + "x or y is null"; });

  const std::size_t head_dim = config.head_dim, heads = config.num_heads, kv_heads = config.num_kv_heads;
  const simd_path path = active_simd_path();
  // qkv [rows, H + 2G heads, d]: the new rows' q, k and v side by side.
  const std::size_t width = impl_->qkv_width();
  const scratch_lease qkv(rows * width), attended(rows * heads * head_dim);
  const float* const k = qkv.data() + heads * head_dim;
  const float* const v = qkv.data() + (heads + kv_heads) * head_dim;
  work->positions.resize(rows);
  work->lengths.resize(rows);
  for (const cached_rows& e : entries)
    for (std::size_t i = 0; i < e.length - e.past; ++i) {
      work->positions[e.row0 + i] = e.past + i;
      work->lengths[e.row0 + i] = e.length;
    }
  run_in_arena([&] {
    // 1-2. Projections and RoPE at each row's absolute position (bf16
    // precision: q, k and v then rounded to bf16, so a cache of any dtype
    // stores rounded values).
    impl_->project(x, rows, work->positions.data(), work->lengths.data(), qkv.data());
    // 3. The new K and V into their blocks (each exclusively owned after
    // append, so sequences never race); 4. attention over each whole past.
    write_cached_kv(cache, layer, entries, k, v, width, path);
    cached_attention(cache, layer, entries, heads, qkv.data(), width, attended.data(), *config.scale,
                     config.sliding_window, path, impl_->variants(), config.precision);
    // 5. Output projection.
    impl_->o_proj.apply(attended.data(), rows, y);
  });
  // 6. Only now, with nothing left to fail, the positions count as written:
  // a call that threw can be repeated.
  for (std::size_t i = 0; i < batch.size(); ++i)
    kv_cache_internals::set_written(cache, batch[i].sequence, layer, entries[i].length);
}

}  // namespace kvhead
