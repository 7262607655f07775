#include "engine/attention/kv_encode.hpp"

#include <cmath>
#include <limits>

#include "engine/arch/dispatch.hpp"

namespace kvhead::engine {

// The largest magnitude as a bit pattern: for |x| the patterns order as the
// values do, and every NaN and Inf lies at 0x7f800000 or above (an integer
// max, which vectorizes, where a float one would not without -ffast-math).
float int8_scale(const float* row, std::size_t count) {
  std::uint32_t largest = 0;
  for (std::size_t i = 0; i < count; ++i)
    largest = std::max(largest, std::bit_cast<std::uint32_t>(row[i]) & 0x7fffffff);
  if (largest >= 0x7f800000) return NAN;
  const float scale = std::bit_cast<float>(largest) / 127.0f;
  // A largest of FLT_MAX rounds its scale up past FLT_MAX / 127:
  // one ulp down, so that 127 * scale, the largest value read back, stays finite.
  return 127.0f * scale <= std::numeric_limits<float>::max() ? scale : std::nextafter(scale, 0.0f);
}

void encode_f16_row(const float* in, std::size_t count, f16_bits* out, simd_path path) {
  const std::size_t done =
      dispatch(path, [&](auto arch) { return kv_encode_kernels<decltype(arch)>::f16_vectors(in, count, out); });
  for (std::size_t i = done; i < count; ++i) out[i] = encode_f16(in[i]);
}

void encode_int8_row(const float* in, std::size_t count, float scale, std::int8_t* out, simd_path path) {
  if (!(scale > 0.0f)) {  // an all-zero row, or a NaN scale: zeros (encode_int8)
    std::fill(out, out + count, std::int8_t{0});
    return;
  }
  const std::size_t done =
      dispatch(path, [&](auto arch) { return kv_encode_kernels<decltype(arch)>::int8_vectors(in, count, scale, out); });
  for (std::size_t i = done; i < count; ++i) out[i] = encode_int8(in[i], scale);
}

}  // namespace kvhead::engine
