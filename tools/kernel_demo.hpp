// `kvhead kernels`: prints the CPU, the kernel configuration chosen for it
// and why, the bf16 GEMM unit, then times the GEMMs and prints GFLOP/s for the SIMD path in use
// (the first kvhead demo, kept next to the decoding demo).
#pragma once

#include <span>

namespace kvhead::tools {

/// Runs `kvhead kernels [--threads N]`; returns the exit code, never throws.
int kernels_command(std::span<const char* const> args);

/// One line for `kvhead --help`.
inline constexpr const char* kernels_help_text =
    "usage: kvhead kernels [--threads N]   (N from 1 to 1024; default: the CPU count)\n"
    "  prints the CPU (vendor, family, caches), the table of kernel configurations, the one\n"
    "  chosen (KVHEAD_CONFIG=<name> forces one) and why, the bf16 GEMM unit in use and why\n"
    "  not the others, then times sgemm and gemm_bf16 at 256^3, 512^3 and 1024^3 and prints\n"
    "  GFLOP/s and the SIMD path in use.\n";

}  // namespace kvhead::tools
