// Conversion of fp32 keys and values to a KV cache's stored element types,
// done once per token as it is written (kv_cache.hpp, "Element types").
// One element's encoding is a few integer and fp32 operations with selects,
// inline, and no libm call (std::nearbyint was one call per int8 element: a
// prefill's int8 cache writes took 2.7x as long, Zen 5, bench
// cache_write_int8). The row encoders run the same operations lane by lane
// on the SIMD path they are given (kv_encode_impl.hpp), so a row's bits are
// the scalar functions' on every path: the scalar loops, which g++ 12
// vectorizes neither of (f16's selects become branches), made f16 and int8
// cache writes 2.0-2.6x slower than f32's (Zen 3, cache_write_<dtype>).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "engine/gemm/stored_element.hpp"
#include "kvhead/config.hpp"

namespace kvhead::engine {

// bf16: encode_bf16 (stored_element.hpp), shared with the bf16 GEMM.

/// The constants of the encoders below, which their vector forms
/// (kv_encode_impl.hpp) read too.
namespace kv_encoding {
inline constexpr float round_magic = 12582912.0f;                 // 1.5 * 2^23 (round_small_to_even)
inline constexpr std::uint32_t f32_inf = 0x7f800000;              // the bits of +Inf
inline constexpr std::uint32_t f16_overflow = 0x477ff000;         // 65520: rounds to 2^16, past f16's 65504
inline constexpr std::uint32_t f16_smallest_normal = 0x38800000;  // 2^-14
inline constexpr std::uint32_t f16_rebias = (127 - 15) << 23;     // f32's exponent bias minus f16's, in place
inline constexpr float f16_units = 16777216.0f;                   // 2^24: f16's subnormals in units of 2^-24
}  // namespace kv_encoding

/// round(y) to nearest even for |y| <= 2^22, in the default rounding mode:
/// adding 1.5 * 2^23 leaves no fraction bits (std::nearbyint's result
/// without its libm call).
inline float round_small_to_even(float y) { return (y + kv_encoding::round_magic) - kv_encoding::round_magic; }

/// x rounded to nearest even IEEE binary16 (subnormals kept); NaN stays NaN
/// (made quiet), +-Inf stays +-Inf, |x| >= 65520 becomes +-Inf.
inline f16_bits encode_f16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (bits >> 16) & 0x8000;
  const std::uint32_t magnitude = bits & 0x7fffffff;
  using namespace kv_encoding;
  // Normal in f16: rebias the exponent, round the 13 dropped mantissa bits
  // to nearest even (a carry moves into the exponent, as it should).
  const std::uint32_t rebased = magnitude - f16_rebias;  // wraps below the smallest normal: not selected then
  const std::uint32_t normal = (rebased + 0xfff + ((rebased >> 13) & 1)) >> 13;
  // Subnormal (or zero) in f16: a multiple of 2^-24. |x| * 2^24 is exact
  // and at most 1024 (f16's smallest normal) once clamped there.
  const float units = std::bit_cast<float>(std::min(magnitude, f16_smallest_normal)) * f16_units;
  const auto subnormal = static_cast<std::uint32_t>(round_small_to_even(units));
  const std::uint32_t nan = 0x7e00 | ((magnitude >> 13) & 0x3ff);
  const std::uint32_t encoded = magnitude > f32_inf                ? nan
                                : magnitude >= f16_overflow        ? 0x7c00
                                : magnitude >= f16_smallest_normal ? normal
                                                                   : subnormal;
  return {static_cast<std::uint16_t>(sign | encoded)};
}

/// The int8 scale of a row of `count` values: max |x| / 127 (fp32
/// division; one ulp less where 127 times it would overflow: a max of
/// FLT_MAX), 0 for an all-zero row, NaN when the row holds
/// a NaN or an Inf.
float int8_scale(const float* row, std::size_t count);

/// x / scale (fp32 division) rounded to nearest even, for the scale of x's
/// row (int8_scale), clamped to [-127, 127] (only a subnormal scale can
/// reach past it); 0 when the scale is 0 or NaN. Clamping first rounds the
/// same: the bounds are integers.
inline std::int8_t encode_int8(float x, float scale) {
  const float quotient = x / scale;  // NaN or Inf when the scale is 0 or NaN: not selected then
  const float clamped = quotient > 127.0f ? 127.0f : quotient >= -127.0f ? quotient : -127.0f;
  const auto value = static_cast<std::int8_t>(round_small_to_even(clamped));
  return scale > 0.0f ? value : std::int8_t{0};
}

/// out[i] = encode_f16(in[i]) for i < count.
void encode_f16_row(const float* in, std::size_t count, f16_bits* out, simd_path path = active_simd_path());

/// out[i] = encode_int8(in[i], scale) for i < count.
void encode_int8_row(const float* in, std::size_t count, float scale, std::int8_t* out,
                     simd_path path = active_simd_path());

/// Per-ISA parts of the two above: each encodes the whole vectors of
/// in[0:count] as they do (int8: for a scale > 0) and returns how many
/// values that was (a multiple of the vector width); defined in
/// kv_encode_impl.hpp and explicitly instantiated in engine/arch/<isa>.cpp.
template <class Arch>
struct kv_encode_kernels {
  static std::size_t f16_vectors(const float* in, std::size_t count, f16_bits* out);
  static std::size_t int8_vectors(const float* in, std::size_t count, float scale, std::int8_t* out);
};

}  // namespace kvhead::engine
