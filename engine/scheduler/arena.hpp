// The thread count set with kvhead::set_num_threads (kvhead/config.hpp): every
// public call runs its work through run_in_arena.
#pragma once

#include <memory>

#include <tbb/task_arena.h>

namespace kvhead::engine {

/// The arena public calls run in, or null: the caller's own.
std::shared_ptr<tbb::task_arena> configured_arena();

/// Runs `work` in the configured arena (or directly, in the caller's).
template <class Work>
void run_in_arena(const Work& work) {
  const std::shared_ptr<tbb::task_arena> arena = configured_arena();
  if (arena == nullptr) {
    work();
    return;
  }
  arena->execute(work);
}

}  // namespace kvhead::engine
