// Plain references for the KV cache's element types (no code shared with the
// engine): bf16 and f16 values decoded with ldexp, fp32 rounded to them by
// picking the nearer of the two neighbours in double (ties to the even bit
// pattern), and the int8 quantization rule of kv_cache.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kvhead::reference {

/// The value of an IEEE binary16 bit pattern.
inline double f16_value(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  if (exponent == 0x1f)
    return mantissa != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -24);
  return sign * std::ldexp(double(1024 + mantissa), exponent - 25);
}

/// The value of a bfloat16 bit pattern.
inline double bf16_value(std::uint16_t bits) {
  const int exponent = (bits >> 7) & 0xff, mantissa = bits & 0x7f;
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  if (exponent == 0xff)
    return mantissa != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -133);
  return sign * std::ldexp(double(128 + mantissa), exponent - 134);
}

/// x rounded to nearest (ties to even) among the non-negative finite
/// patterns of a 16-bit format whose patterns order like their values, with
/// `infinity` the pattern past the largest finite one (its value for
/// rounding: one step of the largest binade past the largest finite).
template <class Value>
std::uint16_t round_to_16_bits(float x, Value value, std::uint16_t infinity, std::uint16_t quiet_nan) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | quiet_nan;
  const double magnitude = std::fabs(double(x));
  // The largest pattern whose value is <= magnitude (binary search).
  std::uint16_t low = 0, high = infinity;  // value(low) <= magnitude < value(high), value(infinity) = inf
  if (magnitude >= value(infinity - 1)) {
    const double beyond = 2.0 * value(infinity - 1) - value(infinity - 2);
    if (magnitude == std::numeric_limits<double>::infinity()) return sign | infinity;
    const double middle = (value(infinity - 1) + beyond) / 2;
    return sign | (magnitude >= middle ? infinity : std::uint16_t(infinity - 1));
  }
  while (high - low > 1) {
    const std::uint16_t middle = std::uint16_t((low + high) / 2);
    (value(middle) <= magnitude ? low : high) = middle;
  }
  const double below = magnitude - value(low), above = value(high) - magnitude;
  if (below < above) return sign | low;
  if (above < below) return sign | high;
  return sign | ((low & 1) == 0 ? low : high);
}

inline std::uint16_t round_to_f16(float x) { return round_to_16_bits(x, f16_value, 0x7c00, 0x7e00); }
inline std::uint16_t round_to_bf16(float x) { return round_to_16_bits(x, bf16_value, 0x7f80, 0x7fc0); }

/// int8 rule: scale = max|x| / 127 in fp32 (NaN when a value is not
/// finite), q = x / scale in fp32, rounded to nearest even, within [-127,
/// 127] (only a subnormal scale, rounded down, puts x / scale past it).
inline float int8_scale(const float* row, std::size_t count) {
  float largest = 0.0f;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::isnan(row[i]) || std::isinf(row[i])) return std::numeric_limits<float>::quiet_NaN();
    if (std::fabs(row[i]) > largest) largest = std::fabs(row[i]);
  }
  return largest / 127.0f;
}

inline int int8_value(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  const float ratio = x / scale;
  if (ratio >= 127.0f) return 127;
  if (ratio <= -127.0f) return -127;
  const float floor = std::floor(ratio), fraction = ratio - floor;
  const int below = int(floor);
  if (fraction != 0.5f) return fraction < 0.5f ? below : below + 1;
  return below % 2 == 0 ? below : below + 1;
}

}  // namespace kvhead::reference
