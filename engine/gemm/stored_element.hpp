// The element types a packed B operand may be stored in (a KV cache's
// kv_dtype: fp32, bf16_bits, f16_bits or std::int8_t): the micro-kernel
// widens each to fp32 in registers as it loads
// B (microkernel_impl.hpp), so a compressed operand is never copied out.
// Also the one rounding of fp32 to bf16.
#pragma once

#include <bit>
#include <cmath>
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

/// x rounded to nearest even bfloat16; NaN stays NaN (made quiet), +-Inf
/// stays +-Inf, finite values past bf16's largest round to +-Inf. The one
/// fp32 -> bf16 rounding of kvhead (KV cache writes, bf16 weights and GEMM
/// operands; its vector form below): scalar and ISA-free, so every path
/// rounds alike.
inline bf16_bits encode_bf16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) return {static_cast<std::uint16_t>((bits >> 16) | 0x0040)};
  // Round to nearest even on the 16 bits dropped; a carry may reach the
  // exponent (and give Inf past the largest bf16), as IEEE rounding does.
  const std::uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return {static_cast<std::uint16_t>((bits + rounding) >> 16)};
}

/// The fp32 value of a bf16 pattern (exact: its 16 bits above 16 zero bits).
inline float widen_bf16(bf16_bits x) { return std::bit_cast<float>(std::uint32_t{x.bits} << 16); }

/// x rounded to the nearest even bf16 value, as an fp32 (encode_bf16, widened).
/// Its vector form, with the same bits on every path, is
/// round_floats_to_bf16 (engine/softmax/softmax.hpp): how bf16 precision
/// rounds attention's q, k, v and p.
inline float round_to_bf16(float x) { return widen_bf16(encode_bf16(x)); }

/// kv_dtype values index tables of kernels: f32, bf16, f16, int8 = 0..3.
inline constexpr std::size_t stored_dtype_count = 4;
static_assert(static_cast<std::size_t>(kv_dtype::f32) == 0 && static_cast<std::size_t>(kv_dtype::bf16) == 1 &&
              static_cast<std::size_t>(kv_dtype::f16) == 2 && static_cast<std::size_t>(kv_dtype::int8) == 3);

/// Bytes of one element of `dtype`.
constexpr std::size_t element_bytes(kv_dtype dtype) {
  return dtype == kv_dtype::f32 ? 4 : dtype == kv_dtype::int8 ? 1 : 2;
}

}  // namespace kvhead::engine
