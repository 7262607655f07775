#include "engine/attention/flash_attention.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "engine/arch/kernel_config.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/gemm/stored_element.hpp"
#include "engine/gemm/pack.hpp"
#include "engine/scheduler/split_schedule.hpp"
#include "engine/softmax/softmax.hpp"

namespace kvhead::engine {
namespace {

std::size_t ceil_div(std::size_t value, std::size_t divisor) { return (value + divisor - 1) / divisor; }

// Whether one stored element is finite (int8 always is: a non-finite row of
// an int8 cache has a NaN scale instead, applied to visible keys only).
bool finite_element(float x) { return std::isfinite(x); }
bool finite_element(bf16_bits x) { return (x.bits & 0x7f80) != 0x7f80; }
bool finite_element(f16_bits x) { return (x.bits & 0x7c00) != 0x7c00; }

// True when the first `rows` rows of every panel of a packed V (k x n) are
// finite (padding lanes included: they are written as zeros).
template <class Element>
bool all_finite_elements(const packed_b_view& values, std::size_t rows) {
  const std::size_t nr = gemm_config_for(values.path).nr;
  for (std::size_t panel = 0; panel < ceil_div(values.n, nr); ++panel) {
    const Element* start = static_cast<const Element*>(values.panels) + panel * values.k * nr;
    for (std::size_t i = 0; i < rows * nr; ++i)
      if (!finite_element(start[i])) return false;
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
    for (std::size_t col = 0; col < cols; ++col)
      if (!std::isfinite(values.data[row * values.ld + col])) return false;
  return true;
}

// User K and V of one (batch, kv head), chunk c's Kᵀ packed at keys +
// c * key_floats (flash_attention packs them); V packed likewise, or read in
// place when `values` is null.
struct user_kv_layout {
  const float* keys;
  std::size_t key_floats;
  const float* values;
  std::size_t value_floats;
};

class user_kv_source final : public kv_chunk_source {
 public:
  user_kv_source(const user_kv_layout& packed, std::size_t keys, const float* v, std::size_t v_seq_stride,
                 std::size_t head_dim, simd_path path)
      : packed_(packed), keys_(keys), v_(v), v_seq_stride_(v_seq_stride), head_dim_(head_dim), path_(path) {}

  std::size_t segment_keys() const override { return kv_chunk; }

  kv_segment segment(std::size_t chunk, std::size_t) const override {
    const std::size_t key0 = chunk * kv_chunk, width = std::min(kv_chunk, keys_ - key0);
    const packed_b_view keys{packed_.keys + chunk * packed_.key_floats, head_dim_, width, path_};
    if (packed_.values != nullptr)
      return {keys, {packed_.values + chunk * packed_.value_floats, width, head_dim_, path_}, {}};
    return {keys, {}, {v_ + key0 * v_seq_stride_, v_seq_stride_, transpose::no}};
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

std::size_t attention_tile::visible_end(std::size_t row) const {
  return causal ? std::min(key_limit, q_offset + row + 1) : key_limit;
}

std::size_t tile_positions(std::size_t group, simd_path path) {
  return std::max<std::size_t>(1, kernel_config_for(path).attention_rows / group);
}

namespace {

// Keys of chunk `chunk` that query row `position` of the tile sees.
std::size_t visible_in_chunk(const attention_tile& tile, std::size_t chunk, std::size_t position) {
  const std::size_t key0 = chunk * kv_chunk;
  const std::size_t end = tile.visible_end(tile.position0 + position);
  return end <= key0 ? 0 : std::min(kv_chunk, end - key0);
}

std::size_t tile_chunks(const attention_tile& tile) {
  return ceil_div(tile.visible_end(tile.position0 + tile.positions - 1), kv_chunk);
}

// A partial of every row of a tile: max [rows], sum [rows], then acc [rows x d].
std::size_t partial_floats(const attention_tile& tile) { return tile.positions * tile.group * (tile.head_dim + 2); }

// Per-task buffers of one tile (row = position * R + head in group). Every
// task of run_tiles — a whole tile, a range of a split one, a merge of some
// of its rows — leases all of them, in this order, used or not: each level of
// a thread's scratch stack (engine/arch/scratch.hpp) then always serves the
// same buffer of a tile shape and stops growing once the shape has been seen,
// whichever kind of task the thread happens to run first.
struct tile_scratch {
  scratch_lease running, q_rows, scores, partial;
  explicit tile_scratch(const attention_tile& tile)
      : running(partial_floats(tile)),
        q_rows(tile.positions * tile.group * tile.head_dim),
        scores(tile.positions * tile.group * kv_chunk),
        partial(partial_floats(tile)) {}
};

// The tile's query rows, stacked: row i * R + r is position i of head r of the group.
void gather_queries(const attention_tile& tile, float* q_rows) {
  for (std::size_t i = 0; i < tile.positions; ++i)
    for (std::size_t r = 0; r < tile.group; ++r) {
      const float* row =
          tile.q + (tile.kv_head * tile.group + r) * tile.q_head_stride + (tile.position0 + i) * tile.q_seq_stride;
      std::copy(row, row + tile.head_dim, q_rows + (i * tile.group + r) * tile.head_dim);
    }
}

// 2. Chunk `chunk`'s partial of every row: (max, sum) and acc [rows x d].
// Rows that see no key of the chunk are left as they are (never merged). The
// chunk's keys come in segments read in place (one per KV cache block);
// every element's sums run in the same order whatever the segment size.
void chunk_partial(const attention_tile& tile, const kv_chunk_source& source, std::size_t chunk, tile_scratch& scratch,
                   float* partial) {
  const std::size_t group = tile.group, head_dim = tile.head_dim, positions = tile.positions;
  const std::size_t rows = positions * group, key0 = chunk * kv_chunk;
  const std::size_t width = std::min(kv_chunk, tile.visible_end(tile.position0 + positions - 1) - key0);
  auto visible = [&](std::size_t position) { return visible_in_chunk(tile, chunk, position); };
  const std::size_t segment_keys = source.segment_keys();
  const std::size_t segments = ceil_div(width, segment_keys);
  kv_segment views[max_segments_per_chunk];
  for (std::size_t s = 0; s < segments; ++s) views[s] = source.segment(chunk, s);
  float* const scores = scratch.scores.data();
  float* const max = partial;
  float* const sum = partial + rows;
  float* const acc = partial + 2 * rows;

  // 2a. scores = scale * q kᵀ (+ mask), the segments' Kᵀ as the column pages
  // of one GEMM (each column is computed alone: the same bits as one packed
  // Kᵀ); int8: times each key's K scale.
  const void* key_pages[max_segments_per_chunk];
  const void* value_pages[max_segments_per_chunk];
  for (std::size_t s = 0; s < segments; ++s) {
    key_pages[s] = views[s].keys.panels;
    value_pages[s] = views[s].values.panels;
  }
  const packed_b_view& first_keys = views[0].keys;
  gemm({rows, width, head_dim}, tile.scale, {scratch.q_rows.data(), head_dim, transpose::no},
       paged_b_view{key_pages, first_keys.n, false, head_dim, width, first_keys.path, first_keys.element}, 0.0f, scores,
       kv_chunk);
  for (std::size_t s = 0; s < segments && views[s].key_scales != nullptr; ++s) {
    const std::size_t first = s * segment_keys, keys = std::min(segment_keys, width - first);
    for (std::size_t row = 0; row < rows; ++row)
      for (std::size_t j = 0; j < keys; ++j) scores[row * kv_chunk + first + j] *= views[s].key_scales[j];
  }
  if (tile.additive_mask != nullptr)
    for (std::size_t row = 0; row < rows; ++row) {
      const float* mask_row = tile.additive_mask + (tile.position0 + row / group) * tile.mask_ld + key0;
      for (std::size_t j = 0; j < width; ++j) scores[row * kv_chunk + j] += mask_row[j];
    }

  // 2b. Each row's partial from an empty state over its visible keys; int8:
  // each visible probability times its key's V scale (after the sum, which
  // stays the softmax's).
  for (std::size_t row = 0; row < rows; ++row) {
    softmax_partial state;
    float* const p = scores + row * kv_chunk;
    online_softmax_block(p, visible(row / group), state, tile.path);
    max[row] = state.max;
    sum[row] = state.sum;
    if (tile.precision == precision::bf16)
      for (std::size_t j = 0; j < visible(row / group); ++j) p[j] = round_to_bf16(p[j]);
    if (views[0].value_scales != nullptr)
      for (std::size_t first = 0, s = 0; first < visible(row / group); first += segment_keys, ++s)
        for (std::size_t j = 0; j < std::min(segment_keys, visible(row / group) - first); ++j)
          p[first + j] *= views[s].value_scales[j];
  }

  // 2c. acc = p v. Off the causal diagonal every position sees the whole
  // chunk: one GEMM, the segments' V as its row pages (each element's FMA
  // chain runs on across them). On it, positions see different prefixes.
  // When V's rows there are all finite, hidden probabilities are set to 0
  // and the GEMMs still run over the widest prefix: fma(0, v, acc) == acc exactly for finite v (acc starts at +0 and
  // is never -0), so each row's bits are those of a GEMM over its own
  // prefix. Otherwise (NaN or Inf in V) runs of positions with equal
  // prefixes get their own GEMMs, so a hidden non-finite value never meets a
  // zero probability.
  const std::size_t widest = visible(positions - 1);
  const bool in_place = views[0].values_in_place.data != nullptr;  // user V: one segment
  const packed_b_view& first_values = views[0].values;
  const paged_b_view paged_values{value_pages,       first_values.k,      true, width, head_dim,
                                  first_values.path, first_values.element};
  auto multiply_pv = [&](std::size_t first_position, std::size_t end_position, std::size_t depth) {
    const std::size_t row0 = first_position * group;
    const gemm_shape shape{(end_position - first_position) * group, head_dim, depth};
    const gemm_operand probabilities{scores + row0 * kv_chunk, kv_chunk, transpose::no};
    float* const target = acc + row0 * head_dim;
    if (in_place)
      gemm(shape, 1.0f, probabilities, views[0].values_in_place, 0.0f, target, head_dim, tile.path);
    else
      gemm(shape, 1.0f, probabilities, paged_values, 0.0f, target, head_dim);
  };
  auto values_finite = [&] {
    if (in_place) return all_finite(views[0].values_in_place, widest, head_dim);
    for (std::size_t s = 0; s * segment_keys < widest; ++s)
      if (!all_finite(views[s].values, std::min(segment_keys, widest - s * segment_keys))) return false;
    return true;
  };
  if (visible(0) == widest || values_finite()) {
    for (std::size_t row = 0; row < rows; ++row)
      std::fill(scores + row * kv_chunk + visible(row / group), scores + row * kv_chunk + widest, 0.0f);
    if (widest > 0) multiply_pv(0, positions, widest);
  } else {
    for (std::size_t run_start = 0; run_start < positions;) {
      const std::size_t depth = visible(run_start);
      std::size_t run_end = run_start + 1;
      while (run_end < positions && visible(run_end) == depth) ++run_end;
      if (depth > 0) multiply_pv(run_start, run_end, depth);
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

// 3. Merges chunk `chunk`'s partial into the running one, row by row.
void merge_into(const attention_tile& tile, std::size_t chunk, float* running, const float* partial, row_range range) {
  const std::size_t rows = tile.positions * tile.group;
  for (std::size_t row = range.begin; row < range.end; ++row) {
    if (visible_in_chunk(tile, chunk, row / tile.group) == 0) continue;
    softmax_partial merged{running[row], running[rows + row]};
    merge_partials(merged, running + 2 * rows + row * tile.head_dim, softmax_partial{partial[row], partial[rows + row]},
                   partial + 2 * rows + row * tile.head_dim, tile.head_dim, tile.path);
    running[row] = merged.max;
    running[rows + row] = merged.sum;
  }
}

// 4. out = acc / sum.
void write_output(const attention_tile& tile, const float* running, row_range range) {
  const std::size_t rows = tile.positions * tile.group;
  for (std::size_t row = range.begin; row < range.end; ++row) {
    const std::size_t i = row / tile.group, r = row % tile.group;
    float* target =
        tile.out + (tile.kv_head * tile.group + r) * tile.out_head_stride + (tile.position0 + i) * tile.out_seq_stride;
    normalize_row(running + 2 * rows + row * tile.head_dim, running[rows + row], target, tile.head_dim, tile.path);
  }
}

// Computes the partials of chunks [begin, end): merged into `running` as they
// come when `stored` is null, else each kept at stored + (c - begin) * size.
void process_chunks(const attention_tile& tile, const kv_chunk_source& source, std::size_t begin, std::size_t end,
                    float* running, float* stored, tile_scratch& scratch) {
  gather_queries(tile, scratch.q_rows.data());
  for (std::size_t chunk = begin; chunk < end; ++chunk) {
    float* partial = stored != nullptr ? stored + (chunk - begin) * partial_floats(tile) : scratch.partial.data();
    chunk_partial(tile, source, chunk, scratch, partial);
    if (stored == nullptr) merge_into(tile, chunk, running, partial, all_rows(tile));
  }
}

}  // namespace

void tile_work_units(const std::vector<attention_tile>& tiles, std::vector<work_unit>& units) {
  units.clear();
  for (const attention_tile& tile : tiles) {
    double cost = 0.0;  // multiply-adds of q kᵀ and p v over the visible keys
    for (std::size_t i = 0; i < tile.positions; ++i)
      cost += 2.0 * double(tile.group * tile.head_dim) * double(tile.visible_end(tile.position0 + i));
    units.push_back({tile_chunks(tile), cost});
  }
}

namespace {

// run_tiles' bookkeeping, reused across calls on a thread.
struct run_workspace {
  std::vector<work_unit> units;
  work_plan plan;
  std::vector<std::size_t> offset, first_slot, split_tiles;
  std::vector<char> range_start;                          // per chunk slot of split tiles (fastest order)
  std::vector<std::pair<std::size_t, row_range>> merges;  // (split tile, rows) of the merge pass
};

}  // namespace

void run_tiles(const std::vector<attention_tile>& tiles, const std::vector<const kv_chunk_source*>& sources) {
  const reusable<run_workspace> work;
  tile_work_units(tiles, work->units);
  plan_work(work->units, static_cast<std::size_t>(tbb::this_task_arena::max_concurrency()), work->plan);
  const work_plan& plan = work->plan;
  const bool fixed_order = current_reduction_order() == reduction_order::fixed;
  // Split tiles keep one partial slot per chunk: fixed order stores every
  // chunk's partial there; the fastest order stores each task's own merged
  // range in the slot of its first chunk (and marks it in `range_start`).
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
  run_indices(plan.tasks.size(), [&](std::size_t index) {
    const work_task& task = plan.tasks[index];
    const attention_tile& tile = tiles[task.unit];
    const gemm_serial_scope serial;  // one task per tile or range already keeps the threads busy
    tile_scratch scratch(tile);
    if (plan.split[task.unit]) {
      float* slot = stored.data() + work->offset[task.unit] + task.chunk_begin * partial_floats(tile);
      if (fixed_order) {
        process_chunks(tile, *sources[task.unit], task.chunk_begin, task.chunk_end, nullptr, slot, scratch);
      } else {
        clear_partial(tile, slot, all_rows(tile));
        process_chunks(tile, *sources[task.unit], task.chunk_begin, task.chunk_end, slot, nullptr, scratch);
        work->range_start[work->first_slot[task.unit] + task.chunk_begin] = 1;
      }
      return;
    }
    float* const running = scratch.running.data();
    clear_partial(tile, running, all_rows(tile));
    process_chunks(tile, *sources[task.unit], 0, work->units[task.unit].chunks, running, nullptr, scratch);
    write_output(tile, running, all_rows(tile));
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
    const tile_scratch scratch(tile);
    float* const running = scratch.running.data();  // these rows' running partial, from empty
    clear_partial(tile, running, range);
    for (std::size_t chunk = 0; chunk < work->units[t].chunks; ++chunk)
      if (fixed_order || work->range_start[work->first_slot[t] + chunk] != 0)
        merge_into(tile, chunk, running, partials + chunk * partial_floats(tile), range);
    write_output(tile, running, range);
  });
}

namespace {

// flash_attention's bookkeeping, reused across calls on a thread.
struct flash_workspace {
  std::vector<attention_tile> tiles;
  std::vector<std::size_t> source_index;  // per tile: its (batch, kv head)
  std::vector<std::size_t> keys_seen;     // per (batch, kv head): keys its last query sees
  std::vector<std::size_t> first_chunk;   // per (batch, kv head): its first chunk slot of packed keys
  // Per packing task: (batch * G + kv head, chunk).
  std::vector<std::pair<std::size_t, std::size_t>> packs;
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
        tiles.push_back({problem.q.data + batch * problem.q.batch_stride, problem.q.head_stride, problem.q.seq_stride,
                         problem.out.data + batch * problem.out.batch_stride, problem.out.head_stride,
                         problem.out.seq_stride, kv_head, group, dims.head_dim, position0,
                         std::min(positions, dims.q_len - position0), problem.q_offset,
                         problem.valid_len != nullptr ? problem.valid_len[batch] : dims.kv_len, problem.causal,
                         problem.additive_mask, dims.kv_len, problem.scale, problem.path, problem.precision});
        work->source_index.push_back(batch * dims.num_kv_heads + kv_head);
      }
  // 1. K and V of every (batch, kv head), as far as its last query sees: Kᵀ
  // packed, one task per chunk. V is read in place when each (batch, kv head)
  // has one query tile: each chunk of it then meets one P·V, which reads it
  // once either way. With several tiles, each chunk's V is packed here once
  // and shared, instead of the GEMM packing it again for every tile.
  const std::size_t sources = dims.batch * dims.num_kv_heads;
  work->keys_seen.assign(sources, 0);
  for (std::size_t t = 0; t < tiles.size(); ++t)
    work->keys_seen[work->source_index[t]] =
        std::max(work->keys_seen[work->source_index[t]], tiles[t].visible_end(dims.q_len - 1));
  work->first_chunk.resize(sources);
  work->packs.clear();
  for (std::size_t index = 0; index < sources; ++index) {
    work->first_chunk[index] = work->packs.size();
    for (std::size_t chunk = 0; chunk < ceil_div(work->keys_seen[index], kv_chunk); ++chunk)
      work->packs.push_back({index, chunk});
  }
  const bool pack_values = dims.q_len > positions;
  const gemm_config config = gemm_config_for(problem.path);
  const std::size_t key_floats = packed_b_floats(config, dims.head_dim, kv_chunk);
  const std::size_t value_floats = pack_values ? packed_b_floats(config, kv_chunk, dims.head_dim) : 0;
  const scratch_lease packed_keys(work->packs.size() * key_floats), packed_values(work->packs.size() * value_floats);
  auto head_rows = [&](const head_tensor<const float>& tensor, std::size_t index) {
    return tensor.data + index / dims.num_kv_heads * tensor.batch_stride +
           index % dims.num_kv_heads * tensor.head_stride;
  };
  run_indices(work->packs.size(), [&](std::size_t task) {
    const auto [index, chunk] = work->packs[task];
    const std::size_t key0 = chunk * kv_chunk, width = std::min(kv_chunk, work->keys_seen[index] - key0);
    pack_operand({head_rows(problem.k, index) + key0 * problem.k.seq_stride, problem.k.seq_stride, transpose::yes},
                 dims.head_dim, width, config, packed_keys.data() + task * key_floats);
    if (pack_values)
      pack_operand({head_rows(problem.v, index) + key0 * problem.v.seq_stride, problem.v.seq_stride, transpose::no},
                   width, dims.head_dim, config, packed_values.data() + task * value_floats);
  });
  work->sources.clear();
  for (std::size_t index = 0; index < sources; ++index) {
    const std::size_t slot = work->first_chunk[index];
    const user_kv_layout packed{packed_keys.data() + slot * key_floats, key_floats,
                                pack_values ? packed_values.data() + slot * value_floats : nullptr, value_floats};
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
    for (std::size_t i = 0; i < dims.q_len; ++i) {
      float* row = rows + i * dims.kv_len;
      if (problem.additive_mask != nullptr)
        for (std::size_t j = 0; j < dims.kv_len; ++j) row[j] += problem.additive_mask[i * dims.kv_len + j];
      const std::size_t end = problem.causal ? std::min(key_limit, problem.q_offset + i + 1) : key_limit;
      std::fill(row + end, row + dims.kv_len, -INFINITY);
      softmax_row(row, dims.kv_len, problem.path);
    }
  });
}

}  // namespace kvhead::engine
