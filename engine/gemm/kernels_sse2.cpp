// The GEMM kernels for sse2_arch (the x86-64 baseline: no ISA flags). The
// widening loads turn W = 4 stored elements of B into one fp32 vector,
// exactly, with SSE2 integer operations only:
//   bf16  interleave each 16-bit pattern below 16 zero bits;
//   f16   no conversion instruction: exponent and mantissa shifted into
//         place (bits << 13) and the exponent rebased by multiplying by 2^112
//         (exact; f16 subnormals become normal floats that way), Inf and NaN
//         (exponent all ones) given float's all-ones exponent, then the sign;
//   int8  sign-extend by interleaving and an arithmetic shift, convert.
#include <emmintrin.h>

#include <cstring>

#include <xsimd/xsimd.hpp>

#include "engine/arch/dispatch.hpp"
#include "engine/gemm/stored_element.hpp"

namespace kvhead::engine {
namespace {

using batch = xsimd::batch<float, sse2_arch>;

__m128i load_8_bytes(const void* elements) { return _mm_loadl_epi64(static_cast<const __m128i*>(elements)); }

}  // namespace

[[gnu::always_inline]] inline batch widen(sse2_arch, const bf16_bits* elements) {
  return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), load_8_bytes(elements)));
}

[[gnu::always_inline]] inline batch widen(sse2_arch, const f16_bits* elements) {
  const __m128i halves = _mm_unpacklo_epi16(load_8_bytes(elements), _mm_setzero_si128());
  const __m128i sign = _mm_slli_epi32(_mm_and_si128(halves, _mm_set1_epi32(0x8000)), 16);
  const __m128i magnitude = _mm_slli_epi32(_mm_and_si128(halves, _mm_set1_epi32(0x7fff)), 13);
  const __m128 rebased = _mm_mul_ps(_mm_castsi128_ps(magnitude), _mm_castsi128_ps(_mm_set1_epi32(0x77800000)));
  const __m128i special = _mm_cmpgt_epi32(magnitude, _mm_set1_epi32(0x0f7fffff));  // f16 exponent 31
  const __m128i inf_nan = _mm_or_si128(magnitude, _mm_set1_epi32(0x7f800000));
  const __m128i bits =
      _mm_or_si128(_mm_and_si128(special, inf_nan), _mm_andnot_si128(special, _mm_castps_si128(rebased)));
  return _mm_castsi128_ps(_mm_or_si128(bits, sign));
}

[[gnu::always_inline]] inline batch widen(sse2_arch, const std::int8_t* elements) {
  int four = 0;
  std::memcpy(&four, elements, sizeof(four));
  const __m128i bytes = _mm_cvtsi32_si128(four);
  const __m128i words = _mm_unpacklo_epi8(bytes, bytes);
  return _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(words, words), 24));
}

}  // namespace kvhead::engine

#include "engine/gemm/microkernel_impl.hpp"

namespace kvhead::engine {

template struct gemm_kernels<sse2_arch, 6, 8>;  // compiled_tiles<sse2_arch> (blocking.hpp)
template struct row_stream_kernels<sse2_arch>;

}  // namespace kvhead::engine
