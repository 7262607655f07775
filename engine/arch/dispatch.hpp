// Run-time ISA dispatch: turns a kvhead::simd_path into an xsimd arch tag.
//
// xsimd::dispatch always picks the best architecture the CPU reports, reads
// CPUID only (never XCR0), and cannot be lowered; kvhead needs both the OS
// check and the KVHEAD_ISA override, so the choice is made in isa.cpp and this
// switch turns it into a tag. The callable is a generic lambda that calls a
// kernel template explicitly instantiated in engine/arch/<isa>.cpp; this header
// is safe to include in code built without ISA flags.
#pragma once

#include <xsimd/xsimd.hpp>

#include "kvhead/config.hpp"

namespace kvhead::engine {

using avx512_arch = xsimd::avx512bw;
using avx2_arch = xsimd::fma3<xsimd::avx2>;
using sse2_arch = xsimd::sse2;

/// Whether `path` runs on this CPU and OS (its instructions in CPUID, its
/// register state saved per XCR0): the test behind supported_simd_paths(),
/// KVHEAD_ISA aside (isa.cpp).
bool simd_path_runs_here(simd_path path);

template <class Function>
decltype(auto) dispatch(simd_path path, Function&& function) {
  switch (path) {
    case simd_path::avx512:
      return function(avx512_arch{});
    case simd_path::avx2:
      return function(avx2_arch{});
    case simd_path::sse2:
      break;
  }
  return function(sse2_arch{});
}

}  // namespace kvhead::engine
