// The GEMM kernels for avx2_arch (AVX2 + FMA + F16C): this TU alone is built
// with -mavx2 -mfma -mf16c (engine/CMakeLists.txt). The widening loads turn
// W = 8 stored elements of B into one fp32 vector, exactly:
//   bf16  zero-extend each 16-bit pattern to 32 bits, shift left by 16;
//   f16   F16C vcvtph2ps;
//   int8  sign-extend to 32-bit integers, convert (exact below 2^24).
#include <immintrin.h>

#include <cstring>

#include <xsimd/xsimd.hpp>

#include "engine/arch/dispatch.hpp"
#include "engine/gemm/stored_element.hpp"

namespace kvhead::engine {
namespace {

using batch = xsimd::batch<float, avx2_arch>;

__m128i load_16_bytes(const void* elements) { return _mm_loadu_si128(static_cast<const __m128i*>(elements)); }

}  // namespace

[[gnu::always_inline]] inline batch widen(avx2_arch, const bf16_bits* elements) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_16_bytes(elements)), 16));
}

[[gnu::always_inline]] inline batch widen(avx2_arch, const f16_bits* elements) {
  return _mm256_cvtph_ps(load_16_bytes(elements));
}

[[gnu::always_inline]] inline batch widen(avx2_arch, const std::int8_t* elements) {
  long long eight = 0;
  std::memcpy(&eight, elements, sizeof(eight));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight)));
}

}  // namespace kvhead::engine

#include "engine/gemm/microkernel_impl.hpp"

namespace kvhead::engine {

template struct gemm_kernels<avx2_arch, 6, 16>;  // compiled_tiles<avx2_arch> (blocking.hpp)
template struct row_stream_kernels<avx2_arch>;

}  // namespace kvhead::engine
