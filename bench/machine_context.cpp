#include "bench/machine_context.hpp"

#include <cstdio>
#include <fstream>
#include <string>

#include <benchmark/benchmark.h>
#include <cblas.h>

#include "bench/limits.hpp"
#include "kvhead/config.hpp"

namespace kvhead::bench {
namespace {

// The first "model name" of /proc/cpuinfo, or "unknown CPU".
std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string key = "model name";
  for (std::string line; std::getline(cpuinfo, line);) {
    const std::size_t colon = line.find(':');
    if (line.compare(0, key.size(), key) != 0 || colon == std::string::npos) continue;
    const std::size_t start = line.find_first_not_of(' ', colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown CPU";
}

std::string one_decimal(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

}  // namespace

void add_machine_context() {
  benchmark::AddCustomContext("cpu_model", cpu_model());
  benchmark::AddCustomContext("simd_path", to_string(active_simd_path()));
  // Which kernels the OpenBLAS baseline runs (OPENBLAS_CORETYPE can force
  // weaker ones; tools/run bench clears it).
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  for (int threads : {1, 2}) {
    const std::string suffix = "/threads:" + std::to_string(threads);
    benchmark::AddCustomContext("fma_peak_gflops" + suffix, one_decimal(fma_peak_gflops(threads)));
    benchmark::AddCustomContext("dram_read_gbps" + suffix, one_decimal(dram_read_gbps(threads)));
  }
}

}  // namespace kvhead::bench
