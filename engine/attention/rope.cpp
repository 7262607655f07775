#include "engine/attention/rope.hpp"

#include <cmath>

namespace kvhead::engine {

rope_table::rope_table(std::size_t head_dim, double theta, std::size_t first_position, std::size_t count)
    : half_(head_dim / 2), cos_(count * half_), sin_(count * half_) {
  for (std::size_t i = 0; i < half_; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * double(i) / double(head_dim));
    for (std::size_t p = 0; p < count; ++p) {
      const double angle = double(first_position + p) * inv_freq;
      cos_[p * half_ + i] = float(std::cos(angle));
      sin_[p * half_ + i] = float(std::sin(angle));
    }
  }
}

void rope_table::apply(float* x, std::size_t heads, std::size_t head_stride, std::size_t index) const {
  const float* cos = cos_.data() + index * half_;
  const float* sin = sin_.data() + index * half_;
  for (std::size_t head = 0; head < heads; ++head) {
    float* row = x + head * head_stride;
    for (std::size_t i = 0; i < half_; ++i) {
      const float first = row[i], second = row[i + half_];
      row[i] = first * cos[i] - second * sin[i];
      row[i + half_] = second * cos[i] + first * sin[i];
    }
  }
}

}  // namespace kvhead::engine
