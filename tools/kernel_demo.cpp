#include "tools/kernel_demo.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include "engine/arch/bf16_support.hpp"
#include "engine/arch/cpu_info.hpp"
#include "engine/arch/kernel_config.hpp"
#include "engine/gemm/bf16_microkernel.hpp"
#include "engine/gemm/gemm.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "engine/gemm/gemm_int8.hpp"
#include "kvhead/config.hpp"
#include "tools/cli_args.hpp"

namespace kvhead::tools {

namespace {

std::string cache_text(std::size_t bytes) { return bytes == 0 ? "?" : std::to_string(bytes >> 10) + " KiB"; }

// The CPU as CPUID reports it, the table of configurations with the chosen
// row marked, and why it was chosen and how its blocks follow from the caches.
void print_configuration() {
  const engine::cpu_info& cpu = engine::host_cpu();
  std::printf("CPU: %s (%s, family 0x%x, model 0x%x); L1d %s, L2 %s, L3 %s shared by %zu CPU(s), from %s\n",
              cpu.model_name.empty() ? "unnamed" : cpu.model_name.c_str(), cpu.vendor.c_str(), cpu.family, cpu.model,
              cache_text(cpu.l1d_bytes).c_str(), cache_text(cpu.l2_bytes).c_str(), cache_text(cpu.l3_bytes).c_str(),
              cpu.l3_sharing, cpu.cache_source);
  const engine::kernel_config& chosen = engine::kernel_config_for(active_simd_path());
  std::printf("configurations (KVHEAD_CONFIG=<name> forces one):\n");
  for (const engine::kernel_config_row& row : engine::kernel_config_rows) {
    const std::string int8_pv = row.int8_pv_rows_per_call == 0
                                    ? std::string("a page")
                                    : "pages up to " + std::to_string(row.int8_pv_rows_per_call) + " rows";
    std::printf(
        "  %c %-13s %-6s %2zu x %-2zu  attention tiles of %3zu rows  paged prefetch %4zu B (fp32 GEMM %4zu B, "
        "widening %4zu B%s, L2 %5zu B further%s)  A in place up to %zu B panels  int8 p v: %s a call  for %s\n",
        &row == chosen.row ? '*' : ' ', row.name, to_string(row.path), row.mr, row.nr, row.attention_rows,
        row.paged_prefetch_bytes, row.fp32_paged_prefetch_bytes, row.widened_paged_prefetch_bytes,
        row.fp32_paged_prefetch_to_l2 ? " into L2 with no lead" : "", row.paged_l2_lead_bytes,
        row.bf16_single_row_block_prefetch ? "" : "; bf16 kernels: none under a single row block",
        row.a_in_place_panels, int8_pv.c_str(), engine::to_string(row.cpu));
  }
  std::printf("configuration %s: %s\n  tile %zu x %zu, attention tiles of %zu rows: %s\n  blocks: %s\n",
              chosen.row->name, chosen.chosen_why.c_str(), chosen.mr, chosen.nr, chosen.attention_rows, chosen.row->why,
              chosen.blocking_why.c_str());
  // The bf16 GEMM units, best first: which runs, and why the others do not.
  const engine::bf16_unit unit = engine::active_bf16_unit();
  std::printf("bf16 GEMM unit: %s%s%s\n", engine::to_string(unit),
              engine::bf16_unit_reason().empty() ? "" : " because ", engine::bf16_unit_reason().c_str());
  for (engine::bf16_unit each : {engine::bf16_unit::amx, engine::bf16_unit::avx512bf16})
    std::printf("  %c %-13s %s\n", each == unit ? '*' : ' ', engine::to_string(each),
                engine::bf16_unit_runs_here(each) ? "runs here" : engine::bf16_unit_refusal(each).c_str());
  std::printf("  %c %-13s runs everywhere (fp32 kernels of the SIMD path on rounded inputs)\n",
              unit == engine::bf16_unit::fp32_fallback ? '*' : ' ', "fp32_fallback");
  // bf16 attention's q kᵀ and p v (engine/attention/flash_attention.hpp):
  // in bf16 precision, and over a bf16 KV cache in f32 precision.
  const kvhead::simd_path path = kvhead::active_simd_path();
  auto attention_products = [&](kvhead::precision precision) -> std::string {
    if (engine::bf16_paged_products_chosen(path, kvhead::kv_dtype::bf16, precision))
      return unit == engine::bf16_unit::amx
                 ? "amx paged kernels (tdpbf16ps tiles for products of more than " +
                       std::to_string(engine::amx_fma_mr) +
                       " query rows, their order on fp32 FMAs for fewer: a decode step; K/V as stored: f32, bf16, f16)"
                 : "avx512bf16 paged kernels (vdpbf16ps over K/V as stored: f32, bf16, f16)";
    return std::string("fp32 kernels of ") + kvhead::to_string(path) + " on the rounded values (" +
           (unit == engine::bf16_unit::fp32_fallback                    ? "no bf16 unit"
            : engine::gemm_bf16_paged_runs(path, kvhead::kv_dtype::f32) ? "the kernel configuration's choice"
                                                                        : "the path's NR is not 32") +
           ")";
  };
  std::printf("bf16 attention (q k^T, p v) in bf16 precision: %s\n",
              attention_products(kvhead::precision::bf16).c_str());
  std::printf("attention over a bf16 KV cache in f32 precision: %s; int8 caches: the line below\n",
              attention_products(kvhead::precision::f32).c_str());
  // Attention over int8 KV caches (engine/gemm/gemm_int8.hpp).
  if (engine::gemm_int8_paged_runs(path, kvhead::kv_dtype::int8) && path == kvhead::simd_path::avx2)
    std::printf(
        "int8 KV cache attention (q k^T, p v): avx2 paged kernels (vpmaddwd + vpaddd: q and p quantized to int16 "
        "per row; exact int32 sums)\n");
  else if (engine::gemm_int8_paged_runs(path, kvhead::kv_dtype::int8))
    std::printf(
        "int8 KV cache attention (q k^T, p v): avx512vnni paged kernels (vpdpbusd: q quantized to int8 per row; "
        "vpdpwssd: p to int16 per row; exact int32 sums)\n");
  else
    std::printf("int8 KV cache attention (q k^T, p v): fp32 kernels of %s over the widened int8 (%s)\n",
                kvhead::to_string(path),
                !engine::host_bf16_hardware().int8_kernels_missing.empty()
                    ? engine::host_bf16_hardware().int8_kernels_missing.c_str()
                : std::getenv("KVHEAD_ISA") != nullptr ? "KVHEAD_ISA names an fp32 path"
                                                       : "no int8 paged kernels on this path");
}

// Median seconds of 7 runs of `run` in `arena`.
template <class Run>
double median_seconds(tbb::task_arena& arena, const Run& run) {
  std::vector<double> seconds;
  for (int repeat = 0; repeat < 7; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    arena.execute(run);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + 3, seconds.end());
  return seconds[3];
}

int run_kernel_demo(int threads) {
  std::printf("kvhead %s kernel demo: SIMD path %s, configuration %s, reduction order %s, %d thread(s)\n", version(),
              to_string(active_simd_path()), kernel_config_name(),
              current_reduction_order() == reduction_order::fixed ? "fixed" : "fastest", threads);
  print_configuration();
  tbb::task_arena arena(threads);
  std::mt19937 generator(42);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::size_t size : {256, 512, 1024}) {
    std::vector<float> a(size * size), b(size * size), c(size * size);
    for (float& x : a) x = uniform(generator);
    for (float& x : b) x = uniform(generator);
    const engine::gemm_operand a_op{a.data(), size, engine::transpose::no};
    const engine::gemm_operand b_op{b.data(), size, engine::transpose::no};
    const double flops = 2.0 * double(size) * double(size) * double(size);
    const double fp32 = median_seconds(arena, [&] {
      engine::gemm({size, size, size}, 1.0f, a_op, b_op, 0.0f, c.data(), size);
    });
    std::printf("  sgemm     %4zu x %4zu x %4zu: median %8.3f ms, %6.1f GFLOP/s\n", size, size, size, fp32 * 1e3,
                flops / fp32 * 1e-9);
    const engine::packed_bf16_b b_bf16(size, size, b_op);
    const double bf16 = median_seconds(arena, [&] {
      engine::gemm_bf16({size, size, size}, a_op, b_bf16, 0.0f, c.data(), size);
    });
    std::printf("  gemm_bf16 %4zu x %4zu x %4zu: median %8.3f ms, %6.1f GFLOP/s (%s)\n", size, size, size, bf16 * 1e3,
                flops / bf16 * 1e-9, engine::to_string(engine::active_bf16_unit()));
  }
  return exit_ok;
}

}  // namespace

int kernels_command(std::span<const char* const> args) {
  return run_guarded("kvhead kernels", [&] {
    static constexpr flag_spec kernels_flags[] = {{"--threads", true}};
    const parsed_flags flags = parse_flags(args, kernels_flags);
    if (flags.help()) {
      std::fputs(kernels_help_text, stdout);
      return exit_ok;
    }
    const std::size_t threads =
        flags.count("--threads", max_threads).value_or(std::size_t(std::max(1, tbb::info::default_concurrency())));
    // As in `kvhead run`: let the arena really have `threads` threads.
    const tbb::global_control allow(tbb::global_control::max_allowed_parallelism,
                                    std::max(threads, std::size_t(tbb::info::default_concurrency())));
    return run_kernel_demo(int(threads));
  });
}

}  // namespace kvhead::tools
