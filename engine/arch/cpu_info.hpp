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
  // Cache sizes in bytes, 0 when unknown: CPUID leaf 4 (Intel) or 0x8000001D
  // (AMD), else /sys/devices/system/cpu/cpu0/cache. l3_bytes is one L3
  // instance, shared by l3_sharing logical CPUs (1 when unknown).
  std::size_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  std::size_t l3_sharing = 1;

  bool is_amd() const { return vendor == "AuthenticAMD"; }
  bool is_intel() const { return vendor == "GenuineIntel"; }
};

/// The CPU this process runs on.
const cpu_info& host_cpu();

}  // namespace kvhead::engine
