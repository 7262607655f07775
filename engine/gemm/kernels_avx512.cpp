// The GEMM kernels for avx512_arch (AVX-512 F/CD/DQ/BW): this TU alone is
// built with that ISA's flags (engine/CMakeLists.txt). The widening loads
// turn W = 16 stored elements of B into one fp32 vector, exactly:
//   bf16  zero-extend each 16-bit pattern to 32 bits, shift left by 16;
//   f16   vcvtph2ps (AVX-512F);
//   int8  sign-extend to 32-bit integers, convert (exact below 2^24).
#include <immintrin.h>

#include <xsimd/xsimd.hpp>

#include "engine/arch/dispatch.hpp"
#include "engine/gemm/stored_element.hpp"

namespace kvhead::engine {
namespace {

using batch = xsimd::batch<float, avx512_arch>;

__m256i load_32_bytes(const void* elements) { return _mm256_loadu_si256(static_cast<const __m256i*>(elements)); }

}  // namespace

[[gnu::always_inline]] inline batch widen(avx512_arch, const bf16_bits* elements) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load_32_bytes(elements)), 16));
}

[[gnu::always_inline]] inline batch widen(avx512_arch, const f16_bits* elements) {
  return _mm512_cvtph_ps(load_32_bytes(elements));
}

[[gnu::always_inline]] inline batch widen(avx512_arch, const std::int8_t* elements) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(elements))));
}

}  // namespace kvhead::engine

#include "engine/gemm/microkernel_impl.hpp"

namespace kvhead::engine {

template struct gemm_kernels<avx512_arch, 12, 32>;  // compiled_tiles<avx512_arch> (blocking.hpp)
template struct row_stream_kernels<avx512_arch>;

}  // namespace kvhead::engine
