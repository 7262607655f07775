// The element types a packed B operand may be stored in (a KV cache's
// kv_dtype: fp32, bf16_bits, f16_bits or std::int8_t): the micro-kernel
// widens each to fp32 in registers as it loads
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

static_assert(sizeof(bf16_bits) == 2 && sizeof(f16_bits) == 2);

/// kv_dtype values index tables of kernels: f32, bf16, f16, int8 = 0..3.
inline constexpr std::size_t stored_dtype_count = 4;
static_assert(static_cast<std::size_t>(kv_dtype::f32) == 0 && static_cast<std::size_t>(kv_dtype::bf16) == 1 &&
              static_cast<std::size_t>(kv_dtype::f16) == 2 && static_cast<std::size_t>(kv_dtype::int8) == 3);

/// Bytes of one element of `dtype`.
constexpr std::size_t element_bytes(kv_dtype dtype) {
  return dtype == kv_dtype::f32 ? 4 : dtype == kv_dtype::int8 ? 1 : 2;
}

}  // namespace kvhead::engine
