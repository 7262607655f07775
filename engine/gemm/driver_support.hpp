// What the GEMM drivers (gemm.cpp, gemm_bf16.cpp) share: the argument checks
// of their public entry points and the split of a step's work over threads.
#pragma once

#include <algorithm>
#include <cstddef>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "engine/arch/checked_size.hpp"
#include "engine/gemm/gemm.hpp"

namespace kvhead::engine {

/// op(X) is rows x cols: throws std::invalid_argument ("gemm: ...") for a
/// null X or a leading dimension below its row length (nothing when empty).
void validate_operand(const char* name, gemm_operand operand, std::size_t rows, std::size_t cols);

/// C is m x n: throws for a null C or ldc < n (nothing when empty).
void validate_c(const float* c, std::size_t ldc, std::size_t m, std::size_t n);

/// The work of moving one byte through memory, in flops for for_each_index:
/// a float read from DRAM takes about as long as 26 fp32 flops at one core's
/// FMA peak (Zen 5: 37-46 GB/s against 260 GFLOP/s; Xeon: 17 GB/s against
/// 245). A step that streams a matrix is weighed by its bytes as well as its
/// flops: a decode step's projection (one row of A against a KC x 3072 slice
/// of fp32 weights) is 1.6 Mflop but 3 MiB read.
constexpr double flops_per_byte_moved = 8.0;

/// The threads of the current arena (at least 1).
inline std::size_t arena_threads() {
  return static_cast<std::size_t>(std::max(1, tbb::this_task_arena::max_concurrency()));
}

/// How many tasks to cut a step into: about 4 per thread of the current
/// arena (work stealing evens out the rest), 1 on a single thread.
inline std::size_t wanted_tasks() {
  const std::size_t threads = arena_threads();
  return threads < 2 ? 1 : 4 * threads;
}

/// Runs body(i) for i in [0, count): in parallel when the step is worth it
/// (and no gemm_serial_scope is open on this thread). Which thread runs an
/// index never changes what it computes.
template <class Body>
void for_each_index(std::size_t count, double flops, const Body& body) {
  constexpr double serial_below_flops = 2e6;  // ~20 us: below this, task overhead dominates
  if (count < 2 || flops < serial_below_flops || gemm_serial_scope::active() ||
      tbb::this_task_arena::max_concurrency() < 2) {
    for (std::size_t i = 0; i < count; ++i) body(i);
    return;
  }
  tbb::parallel_for(std::size_t{0}, count, body);
}

}  // namespace kvhead::engine
