#include "engine/attention/kv_encode.hpp"

#include <cmath>

#include "engine/arch/dispatch.hpp"

namespace kvhead::engine {

// The largest magnitude as a bit pattern: for |x| the patterns order as the
// values do, and every NaN and Inf lies at 0x7f800000 or above (an integer
// max, which vectorizes, where a float one would not without -ffast-math).
float int8_scale(const float* row, std::size_t count) {
  std::uint32_t largest = 0;
  for (std::size_t i = 0; i < count; ++i)
    largest = std::max(largest, std::bit_cast<std::uint32_t>(row[i]) & 0x7fffffff);
  return largest >= 0x7f800000 ? NAN : std::bit_cast<float>(largest) / 127.0f;
}

void encode_f16_row(const float* in, std::size_t count, f16_bits* out, simd_path path) {
  dispatch(path, [&](auto arch) { kv_encode_kernels<decltype(arch)>::f16_row(in, count, out); });
}

void encode_int8_row(const float* in, std::size_t count, float scale, std::int8_t* out, simd_path path) {
  dispatch(path, [&](auto arch) { kv_encode_kernels<decltype(arch)>::int8_row(in, count, scale, out); });
}

}  // namespace kvhead::engine
