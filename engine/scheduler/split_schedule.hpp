// The scheduler: how a call's work is cut into tasks, and running them on
// oneTBB in the caller's task arena (nothing here spawns threads).
//
// Work arrives as units ("tiles"), each a left-to-right reduction over
// `chunks` steps of known cost (attention: a query tile over its key chunks).
// A unit is either one task, or, when it alone would be too large a share of
// the call, split into tasks over contiguous chunk ranges whose per-chunk
// partial results are merged afterwards, in chunk order.
//
// Determinism rule. The plan only decides WHO computes a chunk's partial and
// WHEN; every chunk's partial is computed by the same code from the same
// inputs, and every unit's partials are merged strictly left to right, one
// chunk at a time, starting from the empty partial. An unsplit unit merges
// each as it goes; so does a split unit's first task, over its range, and
// its other tasks store their per-chunk partials, which a later pass merges
// onto the first range's. Merging a partial into the empty one leaves it
// as it is, bit for bit (merge_partials passes it through), so all
// perform the identical sequence of floating-point operations: results are
// bit-identical for any thread count, any split, and any order in which
// tasks run.
#pragma once

#include <cstddef>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

namespace kvhead::engine {

struct work_unit {
  std::size_t chunks;  // reduction steps, merged left to right
  double cost;         // whole unit, any consistent unit (e.g. flops)
};

struct work_task {
  std::size_t unit;
  std::size_t chunk_begin, chunk_end;
  double cost;
};

struct work_plan {
  std::vector<work_task> tasks;  // largest first
  std::vector<bool> split;       // per unit: computed as several tasks
  double total_cost = 0.0;
  double largest_share() const;  // the largest task's cost / total_cost
};

/// Plans `units` for `threads` workers: a unit larger than total / (4 *
/// threads) is split into that many near-equal chunk ranges (at most one per
/// chunk), so the largest task stays a small share of the call and work
/// stealing keeps every worker busy; tasks are ordered largest first. Fills
/// `plan`, reusing its storage.
void plan_work(const std::vector<work_unit>& units, std::size_t threads, work_plan& plan);

/// Runs body(i) for i in [0, count) in parallel on the current task arena,
/// one index per task, in order (so the largest tasks of a plan start first).
template <class Body>
void run_indices(std::size_t count, const Body& body) {
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, count, 1),
      [&](const tbb::blocked_range<std::size_t>& range) {
        for (std::size_t index = range.begin(); index != range.end(); ++index) body(index);
      },
      tbb::simple_partitioner());
}

}  // namespace kvhead::engine
