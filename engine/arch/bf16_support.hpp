// What the CPU and OS offer for the bf16 GEMM units (engine/gemm/gemm_bf16.hpp),
// and the limit KVHEAD_ISA puts on them (kvhead/config.hpp). The AMX
// permission request and the units' self-tests come on top of this
// (engine/gemm/bf16_units.cpp).
#pragma once

#include <string>

namespace kvhead::engine {

/// "" when CPUID reports the unit's instructions and the OS saves their
/// register state (XCR0), else why not, in words.
struct bf16_hardware {
  std::string avx512bf16_missing;  // AVX512-BF16 (CPUID.(7,1):EAX[5]) on top of the avx512 path and AVX512VL
  std::string amx_missing;         // AMX-TILE, AMX-BF16 (CPUID.(7,0):EDX[24, 22]), XCR0[17, 18], the avx512 path
  // AVX512-VNNI and AVX512-VBMI (CPUID.(7,0):ECX[11, 1]) on top of the
  // avx512 path: the int8 paged kernels (engine/gemm/gemm_int8.hpp).
  std::string int8_kernels_missing;
};

/// This CPU's (read once).
const bf16_hardware& host_bf16_hardware();

/// The best bf16 unit KVHEAD_ISA allows.
enum class bf16_isa_limit { amx, avx512bf16, fp32_fallback };

struct bf16_isa_request {
  bf16_isa_limit limit;
  bool named;  // KVHEAD_ISA names the unit itself (amx or avx512bf16): it must then work
};

/// amx when KVHEAD_ISA is unset (the fp32 fallback when KVHEAD_CONFIG names a
/// configuration of a path below avx512 on an AVX-512 CPU); the unit it names
/// (amx, avx512bf16); the fp32 fallback when it names an fp32 path (avx512,
/// avx2, sse2). Throws
/// std::runtime_error as active_simd_path() does (an unknown name, a path or
/// unit this CPU cannot run).
bf16_isa_request bf16_request_from_isa_variable();

}  // namespace kvhead::engine
