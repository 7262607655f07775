// The row encoders of kv_encode.hpp for one ISA. Each lane runs
// encode_f16's or encode_int8's operations (the same integer and fp32
// arithmetic, selects for its branches), so every element gets the scalar
// function's bits. The 32-bit results go to a buffer of block_floats, which
// a plain loop then narrows (vectorized by the compiler; each vector
// narrowed through lane extracts, S1's K/V took 14.0-15.3 ms to write into
// an f16 cache against 10.6-11.9, Zen 3, cache_write_f16); a row's last
// values short of a vector take the scalar functions. Included only by
// engine/arch/<isa>.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <xsimd/xsimd.hpp>

#include "engine/attention/kv_encode.hpp"

namespace kvhead::engine {

// f16: encode_f16 on every lane. The magnitudes are below 2^31, so the
// comparisons run on signed lanes (exact; xsimd 8.1's unsigned ones are not
// native on every path); `normal` is only selected where the rebias cannot
// wrap, as in the scalar function.
namespace kv_encode_detail {

/// Values encoded into 32-bit lanes before they narrow: whole vectors of every path.
inline constexpr std::size_t block_floats = 64;

// out[0:count] = narrow(encode(in)): `encode_vector` writes the 32-bit
// encodings of a whole vector of `in` to its target, `encode_one` gives one
// value's element; blocks of block_floats.
template <class Arch, class Element, class EncodeVector, class EncodeOne>
[[gnu::always_inline]] inline void encode_blocks(const float* in, std::size_t count, Element* out,
                                                 EncodeVector&& encode_vector, EncodeOne&& encode_one) {
  constexpr std::size_t width = xsimd::batch<float, Arch>::size;
  static_assert(block_floats % width == 0);
  alignas(64) std::int32_t encoded[block_floats];
  for (std::size_t first = 0; first < count; first += block_floats) {
    const std::size_t values = std::min(block_floats, count - first), vectors = values / width * width;
    for (std::size_t i = 0; i < vectors; i += width) encode_vector(in + first + i, encoded + i);
    for (std::size_t i = 0; i < vectors; ++i) out[first + i] = Element(encoded[i]);
    for (std::size_t i = vectors; i < values; ++i) out[first + i] = encode_one(in[first + i]);
  }
}

}  // namespace kv_encode_detail

template <class Arch>
void kv_encode_kernels<Arch>::f16_row(const float* in, std::size_t count, f16_bits* out) {
  using batch = xsimd::batch<float, Arch>;
  using pattern = xsimd::batch<std::int32_t, Arch>;
  constexpr std::int32_t f32_inf = 0x7f800000, overflow = 0x477ff000, smallest_normal = 0x38800000;
  constexpr std::int32_t rebias = (127 - 15) << 23;
  constexpr float magic = 12582912.0f;  // round_small_to_even's 1.5 * 2^23
  auto encode_vector = [](const float* values, std::int32_t* encoded) {
    const pattern bits = xsimd::bitwise_cast<pattern>(batch::load_unaligned(values));
    const pattern sign = (bits >> 16) & pattern(0x8000);
    const pattern magnitude = bits & pattern(0x7fffffff);
    const pattern rebased = magnitude - pattern(rebias);
    const pattern normal = (rebased + pattern(0xfff) + ((rebased >> 13) & pattern(1))) >> 13;
    const batch units =
        xsimd::bitwise_cast<batch>(xsimd::min(magnitude, pattern(smallest_normal))) * batch(16777216.0f);
    const pattern subnormal = xsimd::to_int((units + batch(magic)) - batch(magic));
    const pattern nan = pattern(0x7e00) | ((magnitude >> 13) & pattern(0x3ff));
    const pattern value =
        xsimd::select(magnitude > pattern(f32_inf), nan,
                      xsimd::select(magnitude >= pattern(overflow), pattern(0x7c00),
                                    xsimd::select(magnitude >= pattern(smallest_normal), normal, subnormal)));
    (sign | value).store_aligned(encoded);
  };
  // The narrowing loop's element: a plain 16-bit integer, which the compiler vectorizes.
  static_assert(sizeof(f16_bits) == sizeof(std::uint16_t));
  kv_encode_detail::encode_blocks<Arch>(in, count, reinterpret_cast<std::uint16_t*>(out), encode_vector,
                                        [](float x) { return encode_f16(x).bits; });
}

// int8: encode_int8 on every lane. Only a scale > 0 stores anything but 0
// (then every x / scale is finite or, for a subnormal scale, +-Inf, which
// the clamp takes as the scalar function does); the clamp and round give
// integers in [-127, 127], which the conversion keeps exactly.
template <class Arch>
void kv_encode_kernels<Arch>::int8_row(const float* in, std::size_t count, float scale, std::int8_t* out) {
  using batch = xsimd::batch<float, Arch>;
  constexpr float magic = 12582912.0f;  // round_small_to_even's 1.5 * 2^23
  if (!(scale > 0.0f)) {
    std::fill(out, out + count, std::int8_t{0});
    return;
  }
  auto encode_vector = [scale](const float* values, std::int32_t* encoded) {
    const batch quotient = batch::load_unaligned(values) / batch(scale);
    const batch clamped = xsimd::max(xsimd::min(quotient, batch(127.0f)), batch(-127.0f));
    xsimd::to_int((clamped + batch(magic)) - batch(magic)).store_aligned(encoded);
  };
  kv_encode_detail::encode_blocks<Arch>(in, count, out, encode_vector,
                                        [scale](float x) { return encode_int8(x, scale); });
}

}  // namespace kvhead::engine
