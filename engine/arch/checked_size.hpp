// Size arithmetic that reports overflow instead of wrapping: for validating
// sizes at the public boundary before anything is allocated or indexed; and
// the roundings of sizes every layer uses.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>

namespace kvhead::engine {

/// The product of `factors`, or nullopt when it does not fit std::size_t.
/// (A zero factor makes 0, whatever the others are.)
inline std::optional<std::size_t> checked_product(std::initializer_list<std::size_t> factors) {
  std::size_t product = 1;
  bool overflow = false;
  for (const std::size_t factor : factors) {
    if (factor == 0) return 0;
    overflow = overflow || __builtin_mul_overflow(product, factor, &product);
  }
  if (overflow) return std::nullopt;
  return product;
}

/// a + b, or nullopt when it does not fit std::size_t.
inline std::optional<std::size_t> checked_sum(std::size_t a, std::size_t b) {
  std::size_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

/// value / divisor rounded up (divisor > 0); never overflows.
inline constexpr std::size_t ceil_div(std::size_t value, std::size_t divisor) {
  return value / divisor + (value % divisor != 0);
}

/// value rounded up to a multiple of `multiple` (> 0), which must fit.
inline constexpr std::size_t round_up(std::size_t value, std::size_t multiple) {
  return ceil_div(value, multiple) * multiple;
}

}  // namespace kvhead::engine
