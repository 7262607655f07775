// The row encoders of kv_encode.hpp for one ISA: their whole vectors (the
// ISA-free callers in kv_encode.cpp encode the rest, and an int8 row whose
// scale stores zeros, with the scalar functions). Each lane runs
// encode_f16's or encode_int8's operations (the same integer and fp32
// arithmetic, selects for its branches), so every element gets the scalar
// function's bits. The 32-bit results go to a buffer of block_floats, which
// a plain loop then narrows (vectorized by the compiler; each vector
// narrowed through lane extracts, S1's K/V took 14.0-15.3 ms to write into
// an f16 cache against 10.6-11.9, Zen 3, cache_write_f16). Templated on Arch
// throughout and calling no inline function of other headers: this header
// is compiled with different ISA flags in several TUs (softmax_impl.hpp
// says why). Included only by engine/arch/<isa>.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include <xsimd/xsimd.hpp>

#include "engine/attention/kv_encode.hpp"

namespace kvhead::engine {

namespace kv_encode_detail {

/// Values encoded into 32-bit lanes before they narrow: whole vectors of every path.
inline constexpr std::size_t block_floats = 64;

// out[0:whole] = narrow(encode(in)) for the whole vectors of in[0:count]
// (whole, returned, a multiple of the vector width): `encode_vector` writes
// the 32-bit encodings of a vector of `in` to its target; blocks of
// block_floats.
template <class Arch, class Element, class EncodeVector>
[[gnu::always_inline]] inline std::size_t encode_vectors(const float* in, std::size_t count, Element* out,
                                                         EncodeVector&& encode_vector) {
  constexpr std::size_t width = xsimd::batch<float, Arch>::size;
  static_assert(block_floats % width == 0);
  alignas(64) std::int32_t encoded[block_floats];
  const std::size_t whole = count / width * width;
  for (std::size_t first = 0; first < whole; first += block_floats) {
    const std::size_t values = whole - first < block_floats ? whole - first : block_floats;
    for (std::size_t i = 0; i < values; i += width) encode_vector(in + first + i, encoded + i);
    for (std::size_t i = 0; i < values; ++i) out[first + i] = static_cast<Element>(encoded[i]);
  }
  return whole;
}

}  // namespace kv_encode_detail

// f16: encode_f16 on every lane. The magnitudes are below 2^31, so the
// comparisons run on signed lanes (exact; xsimd 8.1's unsigned ones are not
// native on every path); `normal` is only selected where the rebias cannot
// wrap, as in the scalar function.
template <class Arch>
std::size_t kv_encode_kernels<Arch>::f16_vectors(const float* in, std::size_t count, f16_bits* out) {
  using batch = xsimd::batch<float, Arch>;
  using pattern = xsimd::batch<std::int32_t, Arch>;
  constexpr float magic = kv_encoding::round_magic;
  auto encode_vector = [](const float* values, std::int32_t* encoded) {
    // kv_encoding's constants as signed lanes (all below 2^31).
    const auto lanes = [](std::uint32_t value) { return pattern(static_cast<std::int32_t>(value)); };
    const pattern bits = xsimd::bitwise_cast<pattern>(batch::load_unaligned(values));
    const pattern sign = (bits >> 16) & pattern(0x8000);
    const pattern magnitude = bits & pattern(0x7fffffff);
    const pattern rebased = magnitude - lanes(kv_encoding::f16_rebias);
    const pattern normal = (rebased + pattern(0xfff) + ((rebased >> 13) & pattern(1))) >> 13;
    const batch units = xsimd::bitwise_cast<batch>(xsimd::min(magnitude, lanes(kv_encoding::f16_smallest_normal))) *
                        batch(kv_encoding::f16_units);
    const pattern subnormal = xsimd::to_int((units + batch(magic)) - batch(magic));
    const pattern nan = pattern(0x7e00) | ((magnitude >> 13) & pattern(0x3ff));
    const pattern value = xsimd::select(
        magnitude > lanes(kv_encoding::f32_inf), nan,
        xsimd::select(magnitude >= lanes(kv_encoding::f16_overflow), pattern(0x7c00),
                      xsimd::select(magnitude >= lanes(kv_encoding::f16_smallest_normal), normal, subnormal)));
    (sign | value).store_aligned(encoded);
  };
  // The narrowing loop's element: a plain 16-bit integer, which the compiler vectorizes.
  static_assert(sizeof(f16_bits) == sizeof(std::uint16_t));
  return kv_encode_detail::encode_vectors<Arch>(in, count, reinterpret_cast<std::uint16_t*>(out), encode_vector);
}

// int8: encode_int8 on every lane, for a scale > 0 (the caller stores the
// zeros of any other): every x / scale is then finite or, for a subnormal
// scale, +-Inf, which the clamp takes as the scalar function does; the
// clamp and round give integers in [-127, 127], which the conversion keeps
// exactly.
template <class Arch>
std::size_t kv_encode_kernels<Arch>::int8_vectors(const float* in, std::size_t count, float scale, std::int8_t* out) {
  using batch = xsimd::batch<float, Arch>;
  constexpr float magic = kv_encoding::round_magic;
  auto encode_vector = [scale](const float* values, std::int32_t* encoded) {
    const batch quotient = batch::load_unaligned(values) / batch(scale);
    const batch clamped = xsimd::max(xsimd::min(quotient, batch(127.0f)), batch(-127.0f));
    xsimd::to_int((clamped + batch(magic)) - batch(magic)).store_aligned(encoded);
  };
  return kv_encode_detail::encode_vectors<Arch>(in, count, out, encode_vector);
}

}  // namespace kvhead::engine
