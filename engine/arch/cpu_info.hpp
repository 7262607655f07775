// What the CPU is, as CPUID reports it: vendor, family and model, brand
// string, and the data caches one core sees. Read once per process; the
// kernel configuration (kernel_config.hpp) is chosen from it.
#pragma once

#include <cstddef>
#include <string>

namespace kvhead::engine {

struct cpu_info {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", ... (CPUID leaf 0)
  std::string model_name;  // the brand string (leaves 0x80000002..4), trimmed
  unsigned family = 0;     // display family: base + extended when base is 0xF (leaf 1)
  unsigned model = 0;      // display model: extended:base for families 6 and >= 0xF
  bool amx_tile = false;   // CPUID.(7,0):EDX[24]: the CPU has AMX tiles (whether the OS enables them aside)
  // Cache sizes in bytes, 0 when unknown: CPUID leaf 4 (Intel) or 0x8000001D
  // (AMD), else /sys/devices/system/cpu/cpu0/cache, else (L1d and L2 only)
  // the extended leaves 0x80000005/6, which some hypervisors fill when they
  // leave the others empty. l3_bytes is one L3 instance, shared by
  // l3_sharing logical CPUs (1 when unknown). cache_source says which.
  std::size_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  std::size_t l3_sharing = 1;
  const char* cache_source = "none";

  bool is_amd() const { return vendor == "AuthenticAMD"; }
  bool is_intel() const { return vendor == "GenuineIntel"; }
};

/// L1d and L2 in bytes from the extended cache leaves: 0x80000005 ECX[31:24]
/// (L1d KiB; AMD only, Intel leaves the leaf zero: unknown) and 0x80000006
/// ECX[31:16] (L2 KiB; AMD and Intel). The L3 field (0x80000006 EDX, AMD) is
/// not used: it gives no sharing, and a Zen 5 guest was seen reporting the
/// whole socket's 508 MiB there.
struct extended_cache_sizes {
  std::size_t l1d_bytes, l2_bytes;
};
extended_cache_sizes decode_extended_cache_leaves(unsigned leaf_80000005_ecx, unsigned leaf_80000006_ecx);

/// The CPU this process runs on.
const cpu_info& host_cpu();

}  // namespace kvhead::engine
