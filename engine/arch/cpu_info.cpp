#include "engine/arch/cpu_info.hpp"

#include <cpuid.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

namespace kvhead::engine {
namespace {

struct registers {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

registers cpuid(unsigned leaf, unsigned subleaf = 0) {
  registers r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

std::string trimmed(std::string text) {
  const auto first = text.find_first_not_of(' ');
  const auto last = text.find_last_not_of(' ');
  return first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
}

// Leaves 4 and 0x8000001D share one format: subleaf i describes cache i
// (EAX[4:0] type, 0 = no more; EAX[7:5] level; EAX[25:14] + 1 logical CPUs
// sharing it; EBX ways, partitions and line size, ECX sets, each minus 1).
void read_cache_leaf(unsigned leaf, cpu_info& cpu) {
  constexpr unsigned data = 1, unified = 3;
  for (unsigned index = 0; index < 16; ++index) {
    const registers r = cpuid(leaf, index);
    const unsigned type = r.eax & 0x1f;
    if (type == 0) break;
    if (type != data && type != unified) continue;
    const unsigned level = (r.eax >> 5) & 0x7;
    const std::size_t bytes = std::size_t((r.ebx >> 22) + 1) * (((r.ebx >> 12) & 0x3ff) + 1) *
                              ((r.ebx & 0xfff) + 1) * (std::size_t(r.ecx) + 1);
    if (level == 1) cpu.l1d_bytes = bytes;
    if (level == 2) cpu.l2_bytes = bytes;
    if (level == 3) {
      cpu.l3_bytes = bytes;
      cpu.l3_sharing = ((r.eax >> 14) & 0xfff) + 1;
    }
  }
}

// "32K", "512K", "32768K", "2M" from sysfs, in bytes; 0 when absent.
std::size_t sysfs_cache_bytes(int index) {
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
  std::size_t value = 0;
  char unit = 0;
  if (!(file >> value)) return 0;
  file >> unit;
  return unit == 'M' ? value << 20 : unit == 'K' ? value << 10 : value;
}

cpu_info detect() {
  cpu_info cpu;
  const registers vendor = cpuid(0);
  char vendor_text[13] = {};
  std::memcpy(vendor_text, &vendor.ebx, 4);
  std::memcpy(vendor_text + 4, &vendor.edx, 4);
  std::memcpy(vendor_text + 8, &vendor.ecx, 4);
  cpu.vendor = vendor_text;

  const registers signature = cpuid(1);
  const unsigned base_family = (signature.eax >> 8) & 0xf, base_model = (signature.eax >> 4) & 0xf;
  cpu.family = base_family == 0xf ? base_family + ((signature.eax >> 20) & 0xff) : base_family;
  cpu.model = base_family == 0x6 || base_family == 0xf ? (((signature.eax >> 16) & 0xf) << 4) | base_model : base_model;

  constexpr unsigned amx_tile_bit = 1u << 24;  // CPUID.(7,0):EDX
  cpu.amx_tile = vendor.eax >= 7 && (cpuid(7, 0).edx & amx_tile_bit) != 0;

  const unsigned max_extended = cpuid(0x80000000).eax;
  if (max_extended >= 0x80000004) {
    char brand[49] = {};
    for (unsigned part = 0; part < 3; ++part) {
      const registers r = cpuid(0x80000002 + part);
      std::memcpy(brand + 16 * part, &r, 16);
    }
    cpu.model_name = trimmed(brand);
  }

  constexpr unsigned amd_topology_extensions = 1u << 22;  // CPUID 0x80000001 ECX: leaf 0x8000001D exists
  if (cpu.is_amd() && max_extended >= 0x8000001d && (cpuid(0x80000001).ecx & amd_topology_extensions) != 0) {
    read_cache_leaf(0x8000001d, cpu);
    if (cpu.l2_bytes != 0) cpu.cache_source = "CPUID leaf 0x8000001D";
  } else if (vendor.eax >= 4) {
    read_cache_leaf(4, cpu);
    if (cpu.l2_bytes != 0) cpu.cache_source = "CPUID leaf 4";
  }
  if (cpu.l1d_bytes == 0) cpu.l1d_bytes = sysfs_cache_bytes(0);
  if (cpu.l3_bytes == 0) cpu.l3_bytes = sysfs_cache_bytes(3);
  if (cpu.l2_bytes == 0) {
    cpu.l2_bytes = sysfs_cache_bytes(2);
    if (cpu.l2_bytes != 0) cpu.cache_source = "sysfs";
  }
  if (cpu.l2_bytes == 0 && max_extended >= 0x80000006) {
    const extended_cache_sizes extended = decode_extended_cache_leaves(cpuid(0x80000005).ecx, cpuid(0x80000006).ecx);
    if (cpu.l1d_bytes == 0) cpu.l1d_bytes = extended.l1d_bytes;
    cpu.l2_bytes = extended.l2_bytes;
    if (cpu.l2_bytes != 0) cpu.cache_source = "CPUID leaves 0x80000005/6 (no L3)";
  }
  return cpu;
}

}  // namespace

extended_cache_sizes decode_extended_cache_leaves(unsigned leaf_80000005_ecx, unsigned leaf_80000006_ecx) {
  return {std::size_t(leaf_80000005_ecx >> 24) << 10, std::size_t(leaf_80000006_ecx >> 16) << 10};
}

const cpu_info& host_cpu() {
  static const cpu_info cpu = detect();
  return cpu;
}

}  // namespace kvhead::engine
