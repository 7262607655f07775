// Chooses the SIMD path once: CPUID (through xsimd), the OS register-state
// check (XCR0), then the KVHEAD_ISA override, or the path of the kernel
// configuration KVHEAD_CONFIG names (engine/arch/kernel_config.hpp).
#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include <xsimd/xsimd.hpp>

#include "engine/arch/kernel_config.hpp"
#include "kvhead/config.hpp"
#include "kvhead/version.h"

namespace kvhead {
namespace {

// XCR0 as the OS set it, or 0 when the OS did not enable XSAVE (then no
// AVX state is saved and neither AVX2 nor AVX-512 may be used).
std::uint64_t os_enabled_state() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  constexpr unsigned osxsave_bit = 1u << 27;
  if ((ecx & osxsave_bit) == 0) return 0;
  std::uint32_t low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (std::uint64_t{high} << 32) | low;
}

bool path_runs_here(simd_path path) {
  const auto cpu = xsimd::available_architectures();
  const std::uint64_t xcr0 = os_enabled_state();
  constexpr std::uint64_t sse_avx_state = 0b110;       // XMM, YMM upper halves
  constexpr std::uint64_t avx512_state = 0b1110'0000;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool avx_enabled = (xcr0 & sse_avx_state) == sse_avx_state;
  switch (path) {
    case simd_path::avx512:
      return cpu.avx512bw && avx_enabled && (xcr0 & avx512_state) == avx512_state;
    case simd_path::avx2:
      return cpu.fma3_avx2 && avx_enabled;
    case simd_path::sse2:
      return true;
  }
  return false;
}

std::string supported_list() {
  std::string list;
  for (simd_path path : supported_simd_paths()) {
    if (!list.empty()) list += ", ";
    list += to_string(path);
  }
  return list;
}

simd_path path_named_by_isa_variable() {
  const char* forced = std::getenv("KVHEAD_ISA");
  if (forced == nullptr || *forced == '\0') return supported_simd_paths().front();
  const std::string_view name(forced);
  for (simd_path path : {simd_path::avx512, simd_path::avx2, simd_path::sse2}) {
    if (name != to_string(path)) continue;
    if (!path_runs_here(path))
      throw std::runtime_error("KVHEAD_ISA=" + std::string(name) +
                               ": this CPU (or its OS) cannot run that path; it supports " + supported_list());
    return path;
  }
  throw std::runtime_error("KVHEAD_ISA=" + std::string(name) + ": unknown SIMD path; use one of avx512, avx2, sse2");
}

simd_path choose_path() {
  const simd_path path = path_named_by_isa_variable();
  const engine::kernel_config_row* forced = engine::forced_kernel_config();
  if (forced == nullptr) return path;
  const char* isa = std::getenv("KVHEAD_ISA");
  if (isa != nullptr && *isa != '\0' && forced->path != path)
    throw std::runtime_error(std::string("KVHEAD_CONFIG=") + forced->name + " is for SIMD path " +
                             to_string(forced->path) + ", but KVHEAD_ISA=" + isa + " asks for " + to_string(path));
  return forced->path;
}

}  // namespace

const char* version() { return KVHEAD_VERSION_STRING; }

const char* to_string(simd_path path) {
  switch (path) {
    case simd_path::avx512:
      return "avx512";
    case simd_path::avx2:
      return "avx2";
    case simd_path::sse2:
      return "sse2";
  }
  return "unknown";
}

std::vector<simd_path> supported_simd_paths() {
  std::vector<simd_path> paths;
  for (simd_path path : {simd_path::avx512, simd_path::avx2, simd_path::sse2})
    if (path_runs_here(path)) paths.push_back(path);
  return paths;
}

simd_path active_simd_path() {
  static const simd_path chosen = choose_path();  // retried if it threw
  return chosen;
}

}  // namespace kvhead
