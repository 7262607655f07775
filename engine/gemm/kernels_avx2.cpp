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

// A bf16 panel row (NR = 16 elements, 32 bytes) in one load: each 32-bit
// lane holds columns 2i (low half) and 2i + 1 (high half), so shifting left
// by 16 widens the even columns and masking the low half off widens the odd
// ones: lanes [c0 c2 c4 c6 | c8 c10 c12 c14] and [c1 c3 c5 c7 | c9 .. c15],
// 3 instructions for 2 vectors instead of 4 (each element's value as widen()
// gives it). C's rows go to and from that order with 4 shuffles per panel.
template <>
struct panel_order<avx2_arch, bf16_bits, 2> {
  [[gnu::always_inline]] static void widen_row(const bf16_bits* row, batch* lanes) {
    const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
    lanes[0] = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
    lanes[1] = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  [[gnu::always_inline]] static void to_memory(batch* lanes) {
    const __m256 low = _mm256_unpacklo_ps(lanes[0], lanes[1]);   // c0-c3 | c8-c11
    const __m256 high = _mm256_unpackhi_ps(lanes[0], lanes[1]);  // c4-c7 | c12-c15
    lanes[0] = _mm256_permute2f128_ps(low, high, 0x20);
    lanes[1] = _mm256_permute2f128_ps(low, high, 0x31);
  }
  [[gnu::always_inline]] static void from_memory(batch* lanes) {
    const __m256 first = _mm256_permute2f128_ps(lanes[0], lanes[1], 0x20);   // c0-c3 | c8-c11
    const __m256 second = _mm256_permute2f128_ps(lanes[0], lanes[1], 0x31);  // c4-c7 | c12-c15
    lanes[0] = _mm256_shuffle_ps(first, second, _MM_SHUFFLE(2, 0, 2, 0));
    lanes[1] = _mm256_shuffle_ps(first, second, _MM_SHUFFLE(3, 1, 3, 1));
  }
};

template struct gemm_kernels<avx2_arch, 6, 16>;  // compiled_tiles<avx2_arch> (blocking.hpp)
template struct row_stream_kernels<avx2_arch>;

}  // namespace kvhead::engine
