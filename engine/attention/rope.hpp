// Rotary position embedding, Hugging Face Llama convention (rotate_half):
// for i < d/2, with angle = position * theta^(-2i/d),
//   x'[i]       = x[i] * cos - x[i + d/2] * sin
//   x'[i + d/2] = x[i + d/2] * cos + x[i] * sin
// cos and sin are computed in double and rounded to float; the rotation is
// then done in float (products rounded, then the sum: no FMA), so a row's
// result depends only on its values and its position.
//
// The cos and sin of every position come from one table per (head_dim,
// theta), shared by every layer and every call of the process (rope.cpp):
// computed once, as above, and grown geometrically when a larger position is
// asked for, so a growing sequence regrows it O(log n) times and steady-state
// calls allocate nothing. The table stops at 2^17 positions (64 MiB at
// head_dim 128); a row at a later position computes its cos and sin on the
// spot, with the same arithmetic and so the same bits, allocating nothing.
#pragma once

#include <cstddef>

namespace kvhead::engine {

class rope_table_source;  // the shared table of one (head_dim, theta), in rope.cpp

class rope {
 public:
  /// theta = 0: no rotation.
  rope(std::size_t head_dim, double theta);

  /// Rotates, in each of `rows` rows, `heads` consecutive heads of head_dim
  /// floats: row r starts at x + r * row_stride and is at absolute position
  /// positions[r]. Runs in parallel over rows on the caller's task arena
  /// when there are enough of them.
  void apply(float* x, std::size_t rows, std::size_t row_stride, std::size_t heads, const std::size_t* positions) const;

 private:
  std::size_t head_dim_;
  rope_table_source* table_;  // null: no rotation; owned by the process-wide registry
};

}  // namespace kvhead::engine
