// `kvhead demo` until the decoding demo exists: times the GEMM and prints
// GFLOP/s for the SIMD path in use.
#pragma once

namespace kvhead::tools {

int run_kernel_demo(int threads);

}  // namespace kvhead::tools
