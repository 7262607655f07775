// Seeded normal test inputs, shared by the tests that need them.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

namespace kvhead::testing {

/// `count` draws of N(0, scale²) from `generator`.
inline std::vector<float> random_values(std::size_t count, std::mt19937& generator, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& x : values) x = normal(generator);
  return values;
}

}  // namespace kvhead::testing
