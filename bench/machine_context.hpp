// The benchmark report's description of this machine: the CPU model (from
// /proc/cpuinfo), the SIMD path in use, the OpenBLAS baseline's kernels
// (openblas_get_corename) and the limits measured by this run
// (bench/limits.hpp), as context entries of the report (and of its JSON):
//   cpu_model, simd_path, openblas_core, fma_peak_gflops/threads:<t>,
//   dram_read_gbps/threads:<t>
// for t = 1 and 2, the thread counts of the benchmarks.
#pragma once

namespace kvhead::bench {

/// Measures the limits (if not yet measured) and adds the entries.
void add_machine_context();

}  // namespace kvhead::bench
