// A fused multiply-add that really fuses on every path that has FMA.
//
// Include only from code compiled for one ISA (engine/arch/<isa>.cpp).
// xsimd 8.1 maps fma() to vfmadd for fma3<avx2>, but on avx512bw it is a
// plain a*b+c, which the build (-ffp-contract=off) keeps unfused; the AVX-512
// case calls the intrinsic. sse2 has no FMA: a*b+c, two roundings.
#pragma once

#include <type_traits>

#include <xsimd/xsimd.hpp>

namespace kvhead::engine {

template <class Arch>
inline xsimd::batch<float, Arch> multiply_add(const xsimd::batch<float, Arch>& a, const xsimd::batch<float, Arch>& b,
                                              const xsimd::batch<float, Arch>& c) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<Arch, xsimd::avx512bw>) {
    return _mm512_fmadd_ps(a, b, c);
  } else {
    return xsimd::fma(a, b, c);
  }
#else
  return xsimd::fma(a, b, c);
#endif
}

}  // namespace kvhead::engine
