#include "engine/arch/kernel_config.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "engine/arch/dispatch.hpp"

namespace kvhead::engine {
namespace {

std::size_t round_down(std::size_t value, std::size_t multiple) { return value / multiple * multiple; }

std::string kib(std::size_t bytes) { return bytes == 0 ? "unknown" : std::to_string(bytes >> 10) + " KiB"; }

std::string row_names() {
  std::string names;
  for (const kernel_config_row& row : kernel_config_rows) {
    if (!names.empty()) names += ", ";
    names += row.name;
  }
  return names;
}

}  // namespace

// MC: the packed A block (MC x KC floats) takes 1 / a_block_share of L2,
// whole MR panels, at least 4 panels. NC: the packed B block (KC x NC) takes
// at most half of this core's share of L3, whole NR panels, at most 4096
// columns (enough to amortize the A packing over a block) and at least 512.
// The sweep: each A panel of a block meets b_sweep_panels B panels in turn
// (then the next A panel the same ones), a quarter of L2 of packed B, which
// stays there beside the A block; so C is read and written a sweep's
// columns at a time along each row, not one NR panel per row per call (Zen
// 5, 1 MiB L2, 8 panels; in one process, 15 rounds, against one panel:
// 2048^3 102 -> 95 ms at 1 thread and 49.2 -> 45.6 ms at 2, 1024^3 1-2%
// faster, the other gemm shapes and S2, S3 unchanged).

kernel_config resolve_kernel_config(const kernel_config_row& row, const cpu_info& cpu, std::string chosen_why) {
  constexpr std::size_t fallback_l2 = 512 << 10, most_columns = 4096, fewest_columns = 512;
  const std::size_t l2 = cpu.l2_bytes != 0 ? cpu.l2_bytes : fallback_l2;
  const std::size_t a_block_floats = l2 / row.a_block_share / sizeof(float);
  const std::size_t mc = std::max(4 * row.mr, round_down(a_block_floats / gemm_kc, row.mr));
  const std::size_t l3_per_core = cpu.l3_bytes / std::max<std::size_t>(1, cpu.l3_sharing);
  const std::size_t nc =
      cpu.l3_bytes == 0
          ? most_columns
          : std::clamp(round_down(l3_per_core / 2 / sizeof(float) / gemm_kc, row.nr), fewest_columns, most_columns);
  const std::size_t b_panel_bytes = gemm_kc * row.nr * sizeof(float);
  const std::size_t b_sweep_panels = std::max<std::size_t>(1, l2 / 4 / b_panel_bytes);
  std::string blocking_why =
      "KC " + std::to_string(gemm_kc) + " (fixed for every configuration); MC " + std::to_string(mc) +
      ": packed A block " + kib(mc * gemm_kc * sizeof(float)) + " = 1/" + std::to_string(row.a_block_share) +
      " of L2 (" + kib(cpu.l2_bytes) + (cpu.l2_bytes == 0 ? ", taken as 512 KiB" : "") + "), whole " +
      std::to_string(row.mr) + "-row panels; NC " + std::to_string(nc) + ": packed B block " +
      kib(nc * gemm_kc * sizeof(float)) + ", at most half of one core's L3 share (" + kib(l3_per_core) +
      "), capped at 4096 columns; each A panel meets " + std::to_string(b_sweep_panels) + " B panels in turn (" +
      kib(b_sweep_panels * b_panel_bytes) + ", 1/4 of L2)";
  return {&row,
          row.mr,
          row.nr,
          mc,
          gemm_kc,
          nc,
          b_sweep_panels,
          row.attention_rows,
          std::move(blocking_why),
          std::move(chosen_why)};
}

const kernel_config_row& kernel_config_row_for(simd_path path, const cpu_info& cpu) {
  for (const kernel_config_row& row : kernel_config_rows)
    if (row.path == path && cpu_matches(row.cpu, cpu)) return row;
  throw std::logic_error(std::string("kernel_config: no row for path ") + to_string(path));
}

namespace {

kernel_config choose(simd_path path) {
  const cpu_info& cpu = host_cpu();
  if (const kernel_config_row* forced = forced_kernel_config(); forced != nullptr && forced->path == path)
    return resolve_kernel_config(*forced, cpu, std::string("forced by KVHEAD_CONFIG=") + forced->name);
  const kernel_config_row& row = kernel_config_row_for(path, cpu);
  return resolve_kernel_config(row, cpu,
                               std::string("first row of path ") + to_string(path) + " for " + to_string(row.cpu));
}

}  // namespace

bool cpu_matches(cpu_class wanted, const cpu_info& cpu) {
  switch (wanted) {
    case cpu_class::any:
      return true;
    case cpu_class::amd_zen3:  // Zen 3's models of family 0x19; Zen 4 has 0x10-0x1f, 0x60-0x7f, 0xa0-0xaf
      return cpu.is_amd() && cpu.family == 0x19 &&
             (cpu.model <= 0x0f || (cpu.model >= 0x20 && cpu.model <= 0x2f) ||
              (cpu.model >= 0x40 && cpu.model <= 0x5f));
    case cpu_class::amd_zen4:
      return cpu.is_amd() && cpu.family == 0x19;
    case cpu_class::amd_zen5:
      return cpu.is_amd() && cpu.family == 0x1a;
    case cpu_class::intel_amx:
      return cpu.is_intel() && cpu.amx_tile;
  }
  return false;
}

const char* to_string(cpu_class wanted) {
  switch (wanted) {
    case cpu_class::any:
      return "any CPU";
    case cpu_class::amd_zen3:
      return "AMD family 0x19, models 0x00-0x0f, 0x20-0x2f, 0x40-0x5f (Zen 3)";
    case cpu_class::amd_zen4:
      return "AMD family 0x19 (Zen 4 when it has AVX-512)";
    case cpu_class::amd_zen5:
      return "AMD family 0x1a (Zen 5)";
    case cpu_class::intel_amx:
      return "Intel with AMX tiles (Sapphire Rapids and later Xeons)";
  }
  return "unknown";
}

const kernel_config_row* forced_kernel_config() {
  const char* forced = std::getenv("KVHEAD_CONFIG");
  if (forced == nullptr || *forced == '\0') return nullptr;
  const std::string_view name(forced);
  for (const kernel_config_row& row : kernel_config_rows) {
    if (name != row.name) continue;
    if (!simd_path_runs_here(row.path))
      throw std::runtime_error("KVHEAD_CONFIG=" + std::string(name) + ": its SIMD path " + to_string(row.path) +
                               " does not run on this CPU (or its OS)");
    return &row;
  }
  throw std::runtime_error("KVHEAD_CONFIG=" + std::string(name) + ": unknown configuration; use one of " +
                           row_names());
}

const kernel_config& kernel_config_for(simd_path path) {
  // One per path, fixed at first use: packed operands (weights, the KV
  // cache) are laid out for it and must never meet another NR.
  static const std::array<kernel_config, 3> configs = {choose(simd_path::avx512), choose(simd_path::avx2),
                                                      choose(simd_path::sse2)};
  return configs[static_cast<std::size_t>(path)];
}

}  // namespace kvhead::engine

namespace kvhead {

const char* kernel_config_name() { return engine::kernel_config_for(active_simd_path()).row->name; }

}  // namespace kvhead
