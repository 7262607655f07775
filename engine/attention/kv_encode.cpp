#include "engine/attention/kv_encode.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace kvhead::engine {

f16_bits encode_f16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (bits >> 16) & 0x8000;
  const std::uint32_t magnitude = bits & 0x7fffffff;
  constexpr std::uint32_t f32_inf = 0x7f800000;
  constexpr std::uint32_t overflow = 0x477ff000;         // 65520: rounds to 2^16, past f16's 65504
  constexpr std::uint32_t smallest_normal = 0x38800000;  // 2^-14
  constexpr std::uint32_t rebias = (127 - 15) << 23;
  if (magnitude > f32_inf) return {static_cast<std::uint16_t>(sign | 0x7e00 | ((magnitude >> 13) & 0x3ff))};
  if (magnitude >= overflow) return {static_cast<std::uint16_t>(sign | 0x7c00)};
  if (magnitude >= smallest_normal) {
    // Rebias the exponent, round the 13 dropped mantissa bits to nearest even
    // (a carry moves into the exponent, as it should).
    const std::uint32_t rebased = magnitude - rebias;
    return {static_cast<std::uint16_t>(sign | ((rebased + 0xfff + ((rebased >> 13) & 1)) >> 13))};
  }
  // Subnormal (or zero) in f16: a multiple of 2^-24. |x| * 2^24 is exact, and
  // nearbyint rounds it to nearest even (1024 is f16's smallest normal).
  const float units = std::fabs(x) * 16777216.0f;
  return {static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(units)))};
}

float int8_scale(const float* row, std::size_t count) {
  float largest = 0.0f;
  for (std::size_t i = 0; i < count; ++i) {
    if (!std::isfinite(row[i])) return NAN;
    largest = std::fmax(largest, std::fabs(row[i]));
  }
  return largest / 127.0f;
}

std::int8_t encode_int8(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  // Within [-127, 127] already unless the scale is subnormal (rows below
  // ~1.5e-36 lose precision in it): clamp.
  return static_cast<std::int8_t>(std::clamp(std::nearbyint(x / scale), -127.0f, 127.0f));
}

}  // namespace kvhead::engine
