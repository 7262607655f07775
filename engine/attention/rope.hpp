// Rotary position embedding, Hugging Face Llama convention (rotate_half) on
// the first r = rotary_dim floats of each head (r = head_dim unless partial
// rotary): for i < r/2, with angle = position * inv_freq_i,
//   x'[i]       = x[i] * cos - x[i + r/2] * sin
//   x'[i + r/2] = x[i + r/2] * cos + x[i] * sin
// and x[r, head_dim) unchanged. inv_freq_i = theta^(-2i/r), scaled per
// rope_scaling (engine/attention/rope_scaling.hpp; longrope: one set of
// frequencies for the rows of short sequences, another for those of long
// ones, as rope_scaling::longrope_factors says). cos and sin are
// computed in double (times the attention factor of yarn and longrope, 1
// otherwise: an exact no-op) and
// rounded to float; the rotation is then done in float (products rounded,
// then the sum: no FMA), so a row's result depends only on its values and its
// position.
//
// The cos and sin of every position come from one table per (rotary_dim,
// inverse frequencies, attention factor; longrope: two), shared by every layer and every call
// of the process that use it and freed with the last such layer (rope.cpp):
// computed once, as above, and grown geometrically when a larger position is
// asked for, so a growing sequence regrows it O(log n) times and steady-state
// calls allocate nothing. The table stops at 2^17 positions (64 MiB at
// rotary_dim 128); a row at a later position computes its cos and sin on the
// spot, with the same arithmetic and so the same bits, allocating nothing.
#pragma once

#include <cstddef>
#include <memory>

#include "kvhead/attention.hpp"

namespace kvhead::engine {

class rope_table_source;  // the shared table of one set of frequencies, in rope.cpp

class rope {
 public:
  /// theta = 0: no rotation. Plain RoPE over the whole head.
  rope(std::size_t head_dim, double theta);
  /// rotary_dim: even, in [2, head_dim]; `scaling` checked by the caller
  /// (rope_scaling_problem).
  rope(std::size_t head_dim, std::size_t rotary_dim, double theta, const rope_scaling& scaling);

  /// Rotates, in each of `rows` rows, `heads` consecutive heads of head_dim
  /// floats: row r starts at x + r * row_stride and is at absolute position
  /// positions[r]. longrope per call: lengths[r] is the length of row r's
  /// sequence at the end of the call (null: positions[r] + 1, as when
  /// tokens come one call at a time); the other kinds ignore `lengths`.
  /// Runs in parallel over rows on the caller's task arena when there are
  /// enough of them.
  void apply(float* x, std::size_t rows, std::size_t row_stride, std::size_t heads, const std::size_t* positions,
             const std::size_t* lengths = nullptr) const;

 private:
  std::size_t head_dim_;
  std::size_t rotary_dim_;
  std::shared_ptr<rope_table_source> table_;  // null: no rotation; shared through the process-wide registry
  // longrope per call: the table of the rows of sequences of long_length_
  // tokens and more (long_factor; table_ short_factor's); else null (and
  // long_length_ SIZE_MAX).
  std::shared_ptr<rope_table_source> long_table_;
  std::size_t long_length_;
};

}  // namespace kvhead::engine
