// RoPE in float exactly as the engine documents it (engine/attention/rope.hpp),
// computed directly per position: cos and sin in double, rounded to float,
// then the rotation in float (products rounded, then the sum). Shares no code
// with the engine; tests compare the engine's bits against it.
#pragma once

#include <cmath>
#include <cstddef>

namespace kvhead::reference {

/// Rotates `heads` consecutive heads of head_dim floats at `position`.
inline void rope_float(float* x, std::size_t heads, std::size_t head_dim, double theta, std::size_t position) {
  const std::size_t half = head_dim / 2;
  for (std::size_t i = 0; i < half; ++i) {
    const double angle = double(position) * std::pow(theta, -2.0 * double(i) / double(head_dim));
    const float cos = float(std::cos(angle)), sin = float(std::sin(angle));
    for (std::size_t head = 0; head < heads; ++head) {
      float* row = x + head * head_dim;
      const float first = row[i], second = row[i + half];
      row[i] = first * cos - second * sin;
      row[i + half] = second * cos + first * sin;
    }
  }
}

}  // namespace kvhead::reference
