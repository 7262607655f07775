// Rotary position embedding, Hugging Face Llama convention (rotate_half):
// for i < d/2, with angle = position * theta^(-2i/d),
//   x'[i]       = x[i] * cos - x[i + d/2] * sin
//   x'[i + d/2] = x[i + d/2] * cos + x[i] * sin
// cos and sin are computed in double and rounded to float; the rotation is
// then done in float (products rounded, then the sum: no FMA), so a row's
// result depends only on its values and its position.
#pragma once

#include <cstddef>
#include <vector>

namespace kvhead::engine {

class rope_table {
 public:
  /// Angles for positions [first_position, first_position + count).
  rope_table(std::size_t head_dim, double theta, std::size_t first_position, std::size_t count);

  /// Rotates `heads` rows of head_dim floats, rows head_stride apart, all at
  /// position first_position + index.
  void apply(float* x, std::size_t heads, std::size_t head_stride, std::size_t index) const;

 private:
  std::size_t half_;
  std::vector<float> cos_, sin_;  // [count][half]
};

}  // namespace kvhead::engine
