// The table of kernel configurations: CPU detection, the row chosen for a
// CPU, cache blocks derived from its caches, and that no blocking a row may
// get changes a GEMM result (KC alone orders the sum).
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/arch/cpu_info.hpp"
#include "engine/arch/kernel_config.hpp"
#include "engine/gemm/gemm.hpp"
#include "kvhead/config.hpp"

namespace {

using kvhead::simd_path;
using namespace kvhead::engine;

cpu_info synthetic_cpu(const char* vendor, unsigned family, unsigned model, std::size_t l2_bytes, std::size_t l3_bytes,
                       std::size_t l3_sharing) {
  cpu_info cpu;
  cpu.vendor = vendor;
  cpu.family = family;
  cpu.model = model;
  cpu.l1d_bytes = 32 << 10;
  cpu.l2_bytes = l2_bytes;
  cpu.l3_bytes = l3_bytes;
  cpu.l3_sharing = l3_sharing;
  return cpu;
}

// The CPUs this project's machines have been seen with, and one that reports no caches.
const cpu_info zen3 = synthetic_cpu("AuthenticAMD", 0x19, 0x01, 512 << 10, 32 << 20, 2);
const cpu_info zen4 = synthetic_cpu("AuthenticAMD", 0x19, 0x11, 1 << 20, 32 << 20, 8);
const cpu_info zen5 = synthetic_cpu("AuthenticAMD", 0x1a, 0x02, 1 << 20, 32 << 20, 8);
const cpu_info xeon = synthetic_cpu("GenuineIntel", 6, 0x8f, 2 << 20, 105 << 20, 112);
const cpu_info xeon_amx = [] {
  cpu_info cpu = xeon;
  cpu.amx_tile = true;
  return cpu;
}();
const cpu_info silent = synthetic_cpu("", 0, 0, 0, 0, 1);

std::size_t sysfs_size(int index) {
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
  std::size_t value = 0;
  char unit = 0;
  if (!(file >> value >> unit)) return 0;
  return unit == 'M' ? value << 20 : unit == 'K' ? value << 10 : value;
}

}  // namespace

TEST_CASE("host_cpu reads the vendor, family and caches the OS reports") {
  const cpu_info& cpu = host_cpu();
  MESSAGE("CPU: " << cpu.model_name << " (" << cpu.vendor << ", family " << cpu.family << ", model " << cpu.model
                  << "), L1d " << cpu.l1d_bytes << ", L2 " << cpu.l2_bytes << ", L3 " << cpu.l3_bytes << " from "
                  << std::string(cpu.cache_source));
  CHECK(!cpu.vendor.empty());
  CHECK(cpu.family > 0);
  // Linux fills sysfs from the same CPUID leaves: both must agree where both exist.
  if (const std::size_t sysfs_l2 = sysfs_size(2); sysfs_l2 != 0) CHECK(cpu.l2_bytes == sysfs_l2);
  if (const std::size_t sysfs_l1 = sysfs_size(0); sysfs_l1 != 0) CHECK(cpu.l1d_bytes == sysfs_l1);
  // A hypervisor may hide every source; then the blocks take a 512 KiB L2 (below).
  if (cpu.l2_bytes == 0) MESSAGE("no source reports this CPU's L2 size");
  CHECK((std::string(cpu.cache_source) == "none") == (cpu.l2_bytes == 0));
}

TEST_CASE("the extended cache leaves decode to L1d and L2 bytes") {
  // A Zen 5 guest whose leaf 0x8000001D is empty (2026-12-04): 48 KiB L1d, 1 MiB L2.
  const extended_cache_sizes zen5_guest = decode_extended_cache_leaves(0x300c0140, 0x04006140);
  CHECK(zen5_guest.l1d_bytes == 48 << 10);
  CHECK(zen5_guest.l2_bytes == 1 << 20);
  // A Zen 3's 32 KiB and 512 KiB; a leaf that reports nothing stays unknown (0).
  CHECK(decode_extended_cache_leaves(0x20080140, 0x02006140).l1d_bytes == 32 << 10);
  CHECK(decode_extended_cache_leaves(0x20080140, 0x02006140).l2_bytes == 512 << 10);
  // An Intel CPU's leaf 0x80000005 is zero (L1d unknown); its 0x80000006 gives 2 MiB of L2.
  CHECK(decode_extended_cache_leaves(0, 0x08007040).l1d_bytes == 0);
  CHECK(decode_extended_cache_leaves(0, 0x08007040).l2_bytes == 2 << 20);
  CHECK(decode_extended_cache_leaves(0, 0).l2_bytes == 0);
}

TEST_CASE("each CPU kind gets its row, every path has a row for any CPU") {
  CHECK(std::string(kernel_config_row_for(simd_path::avx512, zen4).name) == "avx512-zen4");
  CHECK(std::string(kernel_config_row_for(simd_path::avx512, zen5).name) == "avx512-zen5");
  CHECK(std::string(kernel_config_row_for(simd_path::avx512, xeon).name) == "avx512-2x512");
  CHECK(std::string(kernel_config_row_for(simd_path::avx512, xeon_amx).name) == "avx512-xeon");
  CHECK(std::string(kernel_config_row_for(simd_path::avx512, silent).name) == "avx512-2x512");
  CHECK(std::string(kernel_config_row_for(simd_path::avx2, zen3).name) == "avx2-zen3");
  for (const cpu_info* cpu : {&zen4, &zen5, &xeon, &xeon_amx, &silent})
    CHECK(std::string(kernel_config_row_for(simd_path::avx2, *cpu).name) == "avx2");
  for (const cpu_info* cpu : {&zen3, &zen4, &zen5, &xeon, &xeon_amx, &silent}) {
    CHECK(std::string(kernel_config_row_for(simd_path::sse2, *cpu).name) == "sse2");
  }
  for (const unsigned zen3_model : {0x00u, 0x01u, 0x0fu, 0x21u, 0x44u, 0x50u, 0x5fu}) {
    cpu_info cpu = zen3;
    cpu.model = zen3_model;
    CHECK(cpu_matches(cpu_class::amd_zen3, cpu));
  }
  for (const unsigned zen4_model : {0x10u, 0x11u, 0x1fu, 0x61u, 0x74u, 0xa0u}) {
    cpu_info cpu = zen4;
    cpu.model = zen4_model;
    CHECK_FALSE(cpu_matches(cpu_class::amd_zen3, cpu));
  }
  CHECK_FALSE(cpu_matches(cpu_class::amd_zen3, zen5));
  CHECK_FALSE(cpu_matches(cpu_class::amd_zen3, xeon));
  CHECK(cpu_matches(cpu_class::amd_zen4, zen4));
  CHECK_FALSE(cpu_matches(cpu_class::amd_zen4, xeon));
  CHECK_FALSE(cpu_matches(cpu_class::amd_zen4, zen5));
  CHECK(cpu_matches(cpu_class::amd_zen5, zen5));
  CHECK_FALSE(cpu_matches(cpu_class::amd_zen5, zen4));
  CHECK_FALSE(cpu_matches(cpu_class::amd_zen5, xeon));
  CHECK(cpu_matches(cpu_class::intel_amx, xeon_amx));
  CHECK_FALSE(cpu_matches(cpu_class::intel_amx, xeon));
  const cpu_info amd_with_amx_bit = [] {  // the class is Intel's: a vendor's other CPUs never match it
    cpu_info cpu = zen5;
    cpu.amx_tile = true;
    return cpu;
  }();
  CHECK_FALSE(cpu_matches(cpu_class::intel_amx, amd_with_amx_bit));
  CHECK(std::string(kvhead::kernel_config_name()) == kernel_config_for(kvhead::active_simd_path()).row->name);
}

TEST_CASE("cache blocks follow the caches: A block within its share of L2, B block within L3, whole panels") {
  for (const kernel_config_row& row : kernel_config_rows) {
    for (const cpu_info* cpu : {&zen3, &zen4, &zen5, &xeon, &silent}) {
      CAPTURE(row.name);
      CAPTURE(cpu->l2_bytes);
      const kernel_config config = resolve_kernel_config(row, *cpu);
      CHECK(config.kc == gemm_kc);
      CHECK(config.mr == row.mr);
      CHECK(config.nr == row.nr);
      CHECK(config.mc % config.mr == 0);
      CHECK(config.mc >= 4 * config.mr);
      const std::size_t l2 = cpu->l2_bytes != 0 ? cpu->l2_bytes : 512 << 10;
      CHECK(config.mc * config.kc * sizeof(float) <= l2 / row.a_block_share);
      // Within one panel of the share: the block is as large as the share allows.
      CHECK((config.mc + config.mr) * config.kc * sizeof(float) > l2 / row.a_block_share);
      CHECK(config.nc % config.nr == 0);
      CHECK(config.nc >= 512);
      CHECK(config.nc <= 4096);
      CHECK(config.b_sweep_panels >= 1);
      CHECK(config.b_sweep_panels * config.kc * config.nr * sizeof(float) <=
            std::max(l2 / 4, config.kc * config.nr * sizeof(float)));
      CHECK(!config.blocking_why.empty());
    }
  }
  // Examples, by hand: Zen 3 (512 KiB L2) half of L2 = 256 rows of 1 KiB -> 252 (42 panels of 6);
  // a Xeon's 2 MiB L2 -> 1024 rows -> 1020 (85 panels of 12); its 105 MiB L3 over 112 CPUs
  // leaves 960 KiB a core: half of it is 480 columns of 1 KiB -> the floor of 512; a Zen 4 CCD's
  // 32 MiB over 8 cores leaves 4 MiB: half is 2048 columns.
  CHECK(resolve_kernel_config(kernel_config_row_for(simd_path::avx2, zen3), zen3).mc == 252);
  CHECK(resolve_kernel_config(kernel_config_row_for(simd_path::avx512, xeon), xeon).mc == 1020);
  CHECK(resolve_kernel_config(kernel_config_row_for(simd_path::avx512, xeon), xeon).nc == 512);
  CHECK(resolve_kernel_config(kernel_config_row_for(simd_path::avx512, zen4), zen4).nc == 2048);
  // The sweep: a quarter of L2 in packed B panels of KC x NR floats (32 KiB at NR 32, 16 KiB at 16):
  // Zen 5's 1 MiB -> 8, the Xeon's 2 MiB -> 16, Zen 3's 512 KiB at NR 16 -> 8, an unknown L2 -> 4.
  CHECK(resolve_kernel_config(kernel_config_row_for(simd_path::avx512, zen5), zen5).b_sweep_panels == 8);
  CHECK(resolve_kernel_config(kernel_config_row_for(simd_path::avx512, xeon), xeon).b_sweep_panels == 16);
  CHECK(resolve_kernel_config(kernel_config_row_for(simd_path::avx2, zen3), zen3).b_sweep_panels == 8);
  CHECK(resolve_kernel_config(kernel_config_row_for(simd_path::avx512, silent), silent).b_sweep_panels == 4);
}

TEST_CASE(
    "paged prefetch: the L2 lead only under a single row block over compressed K/V, beyond the L1 distance, the bf16 "
    "kernels none under one where the row says so") {
  using kvhead::kv_dtype;
  for (const kernel_config_row& row : kernel_config_rows) {
    CAPTURE(row.name);
    for (const std::size_t l1 :
         {row.paged_prefetch_bytes, row.fp32_paged_prefetch_bytes, row.widened_paged_prefetch_bytes})
      for (const kv_dtype element : {kv_dtype::f32, kv_dtype::bf16, kv_dtype::f16, kv_dtype::int8})
        for (const bool single_row_block : {false, true}) {
          const stream_prefetch ahead = paged_stream_prefetch(row, l1, single_row_block, element);
          CHECK(ahead.l1_bytes == l1);
          const bool lead = single_row_block && element != kv_dtype::f32 && l1 != 0 && row.paged_l2_lead_bytes != 0;
          CHECK(ahead.l2_bytes == (lead ? l1 + row.paged_l2_lead_bytes : 0));
          const stream_prefetch bf16_ahead = bf16_paged_stream_prefetch(row, single_row_block, element);
          const bool bf16_prefetches = !single_row_block || row.bf16_single_row_block_prefetch;
          const stream_prefetch bf16_expected =
              bf16_prefetches ? paged_stream_prefetch(row, row.paged_prefetch_bytes, single_row_block, element)
                              : stream_prefetch{};
          CHECK(bf16_ahead.l1_bytes == bf16_expected.l1_bytes);
          CHECK(bf16_ahead.l2_bytes == bf16_expected.l2_bytes);
        }
  }
  // The Xeon row: bf16 K/V in the fp32 GEMM 3 KiB ahead into L1 and 7 KiB into L2; f32 K/V and S4's
  // several row blocks L1 only.
  const kernel_config_row& xeon_row = kernel_config_row_for(simd_path::avx512, xeon_amx);
  CHECK(paged_stream_prefetch(xeon_row, xeon_row.widened_paged_prefetch_bytes, true, kvhead::kv_dtype::bf16).l2_bytes ==
        7168);
  CHECK(paged_stream_prefetch(xeon_row, xeon_row.fp32_paged_prefetch_bytes, true, kvhead::kv_dtype::f32).l2_bytes == 0);
  CHECK(paged_stream_prefetch(xeon_row, xeon_row.paged_prefetch_bytes, false, kvhead::kv_dtype::int8).l2_bytes == 0);
  // The Zen 4 row: the bf16 kernels 8 KiB ahead under several row blocks (S4), nothing under one (S1, S5);
  // the int8 kernels 8 KiB ahead under either, and 20 KiB into L2 under one; f16 K/V in the fp32 GEMM
  // 4 KiB ahead and 16 KiB into L2; f32 K/V not prefetched.
  const kernel_config_row& zen4_row = kernel_config_row_for(simd_path::avx512, zen4);
  CHECK(bf16_paged_stream_prefetch(zen4_row, false, kvhead::kv_dtype::bf16).l1_bytes == 8192);
  CHECK(bf16_paged_stream_prefetch(zen4_row, true, kvhead::kv_dtype::bf16).l1_bytes == 0);
  CHECK(paged_stream_prefetch(zen4_row, zen4_row.paged_prefetch_bytes, true, kvhead::kv_dtype::int8).l1_bytes == 8192);
  CHECK(paged_stream_prefetch(zen4_row, zen4_row.paged_prefetch_bytes, true, kvhead::kv_dtype::int8).l2_bytes == 20480);
  CHECK(paged_stream_prefetch(zen4_row, zen4_row.widened_paged_prefetch_bytes, true, kvhead::kv_dtype::f16).l2_bytes ==
        16384);
  CHECK(zen4_row.fp32_paged_prefetch_bytes == 0);
}

TEST_CASE("paged prefetch: the fp32 GEMM takes the f32 distance over f32 K/V, the widened one over the others") {
  using kvhead::kv_dtype;
  for (simd_path path : kvhead::supported_simd_paths()) {
    CAPTURE(kvhead::to_string(path));
    const kernel_config_row& row = *kernel_config_for(path).row;
    const gemm_config& config = gemm_config_for(path);
    for (const kv_dtype element : {kv_dtype::f32, kv_dtype::bf16, kv_dtype::f16, kv_dtype::int8}) {
      CAPTURE(kvhead::to_string(element));
      const std::size_t l1 =
          element == kv_dtype::f32 ? row.fp32_paged_prefetch_bytes : row.widened_paged_prefetch_bytes;
      const stream_prefetch ahead = config.paged_prefetch[static_cast<std::size_t>(element)];
      CHECK(ahead.l1_bytes == l1);
      CHECK(ahead.l2_bytes == paged_stream_prefetch(row, l1, true, element).l2_bytes);
    }
  }
}

TEST_CASE("gemm: the same bits under any cache blocking of a path (MC, NC and the sweep never order a sum)") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    CAPTURE(kvhead::to_string(path));
    const gemm_config base = gemm_config_for(path);
    const std::size_t m = 3 * base.mr * 4 + 5, n = 9 * base.nr + 3, k = 2 * base.kc + 17;
    std::mt19937 generator(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> a(m * k), b(k * n);
    for (float& x : a) x = uniform(generator);
    for (float& x : b) x = uniform(generator);
    // The shapes of the blockings the table can produce: the smallest MC and NC
    // it allows, the largest, and odd ones in between.
    // Sweeps of one B panel, an odd count, this machine's, and all of them.
    for (std::size_t mc : {4 * base.mr, 7 * base.mr, base.mc, 1020 / base.mr * base.mr}) {
      for (std::size_t nc : {std::size_t{512}, 3 * base.nr, base.nc}) {
        for (std::size_t sweep : {std::size_t{1}, std::size_t{3}, base.b_sweep_panels, std::size_t{64}}) {
          for (bool trans_b : {false, true}) {
            CAPTURE(mc);
            CAPTURE(nc);
            CAPTURE(sweep);
            gemm_config blocking = base;
            blocking.mc = mc;
            blocking.nc = nc;
            blocking.b_sweep_panels = sweep;
            const gemm_operand b_op =
                trans_b ? gemm_operand{b.data(), k, transpose::yes} : gemm_operand{b.data(), n, transpose::no};
            std::vector<float> expected(m * n), got(m * n);
            gemm({m, n, k}, 1.0f, {a.data(), k, transpose::no}, b_op, 0.0f, expected.data(), n, path);
            gemm({m, n, k}, 1.0f, {a.data(), k, transpose::no}, b_op, 0.0f, got.data(), n, blocking);
            CHECK(std::memcmp(expected.data(), got.data(), got.size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}
