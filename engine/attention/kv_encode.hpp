// Conversion of fp32 keys and values to a KV cache's stored element types,
// done once per token as it is written (kv_cache.hpp, "Element types").
// Scalar and ISA-free: a decode step writes one token per sequence.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/gemm/stored_element.hpp"

namespace kvhead::engine {

// bf16: encode_bf16 (stored_element.hpp), shared with the bf16 GEMM.

/// x rounded to nearest even IEEE binary16 (subnormals kept); NaN stays NaN
/// (made quiet), +-Inf stays +-Inf, |x| >= 65520 becomes +-Inf.
f16_bits encode_f16(float x);

/// The int8 scale of a row of `count` values: max |x| / 127 (fp32
/// division), 0 for an all-zero row, NaN when the row holds a NaN or an Inf.
float int8_scale(const float* row, std::size_t count);

/// x / scale (fp32 division) rounded to nearest even, for the scale of x's
/// row (int8_scale), clamped to [-127, 127] (only a subnormal scale can
/// reach past it); 0 when the scale is 0 or NaN.
std::int8_t encode_int8(float x, float scale);

}  // namespace kvhead::engine
