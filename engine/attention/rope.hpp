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

class rope {
 public:
  /// theta = 0: no rotation.
  rope(std::size_t head_dim, double theta);

  /// Rotates `heads` rows of head_dim floats, head_stride apart, all at
  /// absolute position `position` (cos and sin computed once for them).
  void apply(float* x, std::size_t heads, std::size_t head_stride, std::size_t position) const;

 private:
  std::vector<double> inv_freq_;  // theta^(-2i/d), i < d/2
};

}  // namespace kvhead::engine
