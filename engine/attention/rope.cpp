#include "engine/attention/rope.hpp"

#include <cmath>

namespace kvhead::engine {

rope::rope(std::size_t head_dim, double theta) {
  if (theta == 0.0) return;
  for (std::size_t i = 0; i < head_dim / 2; ++i)
    inv_freq_.push_back(std::pow(theta, -2.0 * double(i) / double(head_dim)));
}

void rope::apply(float* x, std::size_t heads, std::size_t head_stride, std::size_t position) const {
  const std::size_t half = inv_freq_.size();
  for (std::size_t i = 0; i < half; ++i) {
    const double angle = double(position) * inv_freq_[i];
    const float cos = float(std::cos(angle)), sin = float(std::sin(angle));
    for (std::size_t head = 0; head < heads; ++head) {
      float* row = x + head * head_stride;
      const float first = row[i], second = row[i + half];
      row[i] = first * cos - second * sin;
      row[i + half] = second * cos + first * sin;
    }
  }
}

}  // namespace kvhead::engine
