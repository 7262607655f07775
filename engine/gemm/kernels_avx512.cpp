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

// A bf16 panel row (NR = 32 elements, 64 bytes) in one load, as on avx2
// (kernels_avx2.cpp): each 32-bit lane holds columns 2i (low half) and
// 2i + 1 (high half); shifting left by 16 widens the even columns, masking
// the low half off the odd ones: 1 load and 2 ALU instructions for 2
// vectors instead of 2 widening loads (a shuffle each) and 2 shifts. Each
// element's value is widen()'s. C's rows go to and from that order with
// one two-source permute per vector. Zen 4, a decode tile (4 rows, 256
// keys, B in L2): 75 -> 90 GFLOP/s.
template <>
struct panel_order<avx512_arch, bf16_bits, 2> {
  [[gnu::always_inline]] static void widen_row(const bf16_bits* row, batch* lanes) {
    const __m512i pairs = _mm512_loadu_si512(row);
    lanes[0] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    lanes[1] = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  // lanes[0] = c0 c2 .. c30, lanes[1] = c1 c3 .. c31  <->  c0 .. c15, c16 .. c31.
  [[gnu::always_inline]] static void to_memory(batch* lanes) {
    permute(lanes, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
            _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
  }
  [[gnu::always_inline]] static void from_memory(batch* lanes) {
    permute(lanes, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
            _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
  }

 private:
  // lanes[0] and lanes[1] := the pair's lanes at `first` and at `second` (0-15: lanes[0], 16-31: lanes[1]).
  [[gnu::always_inline]] static void permute(batch* lanes, __m512i first, __m512i second) {
    const __m512 low = lanes[0], high = lanes[1];
    lanes[0] = _mm512_permutex2var_ps(low, first, high);
    lanes[1] = _mm512_permutex2var_ps(low, second, high);
  }
};

template struct gemm_kernels<avx512_arch, 12, 32>;  // compiled_tiles<avx512_arch> (blocking.hpp)
template struct row_stream_kernels<avx512_arch>;

}  // namespace kvhead::engine
