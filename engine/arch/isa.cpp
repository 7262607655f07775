// Chooses the SIMD path once: CPUID (through xsimd), the OS register-state
// check (XCR0), then the KVHEAD_ISA override, or the path of the kernel
// configuration KVHEAD_CONFIG names (engine/arch/kernel_config.hpp). Also
// what the CPU offers for the bf16 units (bf16_support.hpp): KVHEAD_ISA's
// levels amx and avx512bf16 sit above avx512 and run the fp32 kernels of
// the avx512 path.
#include <cpuid.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include <xsimd/xsimd.hpp>

#include "engine/arch/bf16_support.hpp"
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

// F16C (CPUID.1:ECX bit 29): the avx2 path's GEMM kernels widen f16 with it.
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  constexpr unsigned f16c_bit = 1u << 29;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & f16c_bit) != 0;
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
      return cpu.fma3_avx2 && has_f16c() && avx_enabled;
    case simd_path::sse2:
      return true;
  }
  return false;
}

struct registers {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};
registers cpuid_leaf(unsigned leaf, unsigned subleaf) {
  registers r;
  if (static_cast<unsigned>(__get_cpuid_max(0, nullptr)) >= leaf)
    __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

engine::bf16_hardware detect_bf16_hardware() {
  engine::bf16_hardware hardware;
  const bool avx512 = path_runs_here(simd_path::avx512);
  const registers leaf7 = cpuid_leaf(7, 0), leaf7_1 = cpuid_leaf(7, 1);
  constexpr unsigned avx512vl_bit = 1u << 31, avx512bf16_bit = 1u << 5;  // (7,0).EBX, (7,1).EAX
  constexpr unsigned amx_bf16_bit = 1u << 22;                            // (7,0).EDX; AMX-TILE: cpu_info
  constexpr std::uint64_t tile_state = std::uint64_t{3} << 17;           // XCR0: XTILECFG, XTILEDATA
  if ((leaf7_1.eax & avx512bf16_bit) == 0)
    hardware.avx512bf16_missing = "CPUID reports no AVX512-BF16";
  else if (!avx512 || (leaf7.ebx & avx512vl_bit) == 0)
    hardware.avx512bf16_missing = "AVX512-BF16 without a working avx512 path and AVX512VL";
  constexpr unsigned avx512vnni_bit = 1u << 11, avx512vbmi_bit = 1u << 1;  // (7,0).ECX
  if ((leaf7.ecx & avx512vnni_bit) == 0)
    hardware.int8_kernels_missing = "CPUID reports no AVX512-VNNI";
  else if ((leaf7.ecx & avx512vbmi_bit) == 0)
    hardware.int8_kernels_missing = "CPUID reports AVX512-VNNI but no AVX512-VBMI";
  else if (!avx512)
    hardware.int8_kernels_missing = "AVX512-VNNI without a working avx512 path";
  if (!engine::host_cpu().amx_tile || (leaf7.edx & amx_bf16_bit) == 0)
    hardware.amx_missing = "CPUID reports no AMX-TILE and AMX-BF16";
  else if ((os_enabled_state() & tile_state) != tile_state)
    hardware.amx_missing = "the OS does not enable the AMX tile state (XCR0 bits 17-18)";
  else if (!avx512)
    hardware.amx_missing = "AMX without a working avx512 path";
  else if (!hardware.avx512bf16_missing.empty())  // the amx unit converts A with vcvtne2ps2bf16
    hardware.amx_missing = "AMX without AVX512-BF16 (" + hardware.avx512bf16_missing + ")";
  return hardware;
}

std::string supported_list() {
  std::string list;
  for (simd_path path : supported_simd_paths()) {
    if (!list.empty()) list += ", ";
    list += to_string(path);
  }
  return list;
}

// The bf16 units KVHEAD_ISA may name, and the fp32 path they run beside.
struct bf16_level {
  const char* name;
  engine::bf16_isa_limit limit;
};
constexpr bf16_level bf16_levels[] = {{"amx", engine::bf16_isa_limit::amx},
                                      {"avx512bf16", engine::bf16_isa_limit::avx512bf16}};

simd_path path_named_by_isa_variable() {
  const char* forced = std::getenv("KVHEAD_ISA");
  if (forced == nullptr || *forced == '\0') return supported_simd_paths().front();
  const std::string_view name(forced);
  if (std::any_of(std::begin(bf16_levels), std::end(bf16_levels),
                  [&](const bf16_level& level) { return name == level.name; })) {
    engine::bf16_request_from_isa_variable();  // throws when the unit's hardware is missing
    return simd_path::avx512;
  }
  for (simd_path path : {simd_path::avx512, simd_path::avx2, simd_path::sse2}) {
    if (name != to_string(path)) continue;
    if (!path_runs_here(path))
      throw std::runtime_error("KVHEAD_ISA=" + std::string(name) +
                               ": this CPU (or its OS) cannot run that path; it supports " + supported_list());
    return path;
  }
  throw std::runtime_error("KVHEAD_ISA=" + std::string(name) +
                           ": unknown SIMD path; use one of amx, avx512bf16, avx512, avx2, sse2");
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

namespace engine {

bool simd_path_runs_here(simd_path path) { return path_runs_here(path); }

const bf16_hardware& host_bf16_hardware() {
  static const bf16_hardware hardware = detect_bf16_hardware();
  return hardware;
}

bf16_isa_request bf16_request_from_isa_variable() {
  const char* forced = std::getenv("KVHEAD_ISA");
  if (forced == nullptr || *forced == '\0') {
    // The bf16 units run on the avx512 path's registers: a configuration of a
    // lower path (KVHEAD_CONFIG) on an AVX-512 CPU takes the fp32 fallback, as
    // that path's CPUs do, so that it reproduces their bits in bf16 too.
    const bool lowered = active_simd_path() != simd_path::avx512 && path_runs_here(simd_path::avx512);
    return {lowered ? bf16_isa_limit::fp32_fallback : bf16_isa_limit::amx, false};
  }
  const std::string_view name(forced);
  for (const bf16_level& level : bf16_levels) {
    if (name != level.name) continue;
    const std::string& missing =
        level.limit == bf16_isa_limit::amx ? host_bf16_hardware().amx_missing : host_bf16_hardware().avx512bf16_missing;
    if (!missing.empty())
      throw std::runtime_error("KVHEAD_ISA=" + std::string(name) +
                               ": this CPU (or its OS) cannot run that bf16 unit (" + missing +
                               "); the SIMD paths it supports: " + supported_list());
    return {level.limit, true};
  }
  active_simd_path();  // an unknown name or a path this CPU cannot run throws here
  return {bf16_isa_limit::fp32_fallback, false};
}

}  // namespace engine

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
