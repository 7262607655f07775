// The element types a packed B operand may be stored in (a KV cache's
// kv_dtype): the micro-kernel widens each to fp32 in registers as it loads
// B (microkernel_impl.hpp), so a compressed operand is never copied out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvhead/config.hpp"

namespace kvhead::engine {

/// bfloat16 and IEEE binary16, as their bit patterns (GCC 12 has no
/// arithmetic on either type).
struct bf16_bits {
  std::uint16_t bits;
};
struct f16_bits {
  std::uint16_t bits;
};

/// The C++ type of one stored element of `dtype`.
template <kv_dtype dtype>
struct stored_element;
template <>
struct stored_element<kv_dtype::f32> {
  using type = float;
};
template <>
struct stored_element<kv_dtype::bf16> {
  using type = bf16_bits;
};
template <>
struct stored_element<kv_dtype::f16> {
  using type = f16_bits;
};
template <>
struct stored_element<kv_dtype::int8> {
  using type = std::int8_t;
};

static_assert(sizeof(bf16_bits) == 2 && sizeof(f16_bits) == 2);

inline constexpr kv_dtype stored_dtypes[] = {kv_dtype::f32, kv_dtype::bf16, kv_dtype::f16, kv_dtype::int8};
inline constexpr std::size_t stored_dtype_count = 4;

/// Bytes of one element of `dtype`.
constexpr std::size_t element_bytes(kv_dtype dtype) {
  return dtype == kv_dtype::f32 ? 4 : dtype == kv_dtype::int8 ? 1 : 2;
}

}  // namespace kvhead::engine
