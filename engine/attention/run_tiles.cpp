// Steps 2-4 of the fixed reduction order (flash_attention.hpp) for every
// tile, as the scheduler cuts them (engine/scheduler/split_schedule.hpp):
// whole tiles, alone or bundled, merge their chunks' partials as they come;
// split tiles store them and a merge pass joins them in chunk order.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include <tbb/task_arena.h>

#include "engine/arch/kernel_config.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/attention/chunk_partial.hpp"
#include "engine/attention/flash_attention.hpp"
#include "engine/scheduler/split_schedule.hpp"
#include "engine/softmax/softmax.hpp"

namespace kvhead::engine {
namespace {

// Per-task buffers of `tiles` tiles of one shape (row = position * R + head
// in group): the running partial and the query rows of each (tile i's at i
// times one tile's size), one chunk's scores and partial. Every task of
// run_tiles — whole tiles, a range of a split one, a merge of some of its
// rows — leases all of them, in this order, used or not: each level of a
// thread's scratch stack (engine/arch/scratch.hpp) then always serves the
// same buffer of a tile shape and stops growing once the shape has been seen,
// whichever kind of task the thread happens to run first.
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
};

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
  const std::size_t prepared_floats = prepared_query_floats(shape, element);
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

}  // namespace kvhead::engine
