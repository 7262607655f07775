#include "tools/kernel_demo.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <tbb/task_arena.h>

#include "engine/gemm/gemm.hpp"
#include "kvhead/config.hpp"

namespace kvhead::tools {

int run_kernel_demo(int threads) {
  std::printf("kvhead %s kernel demo: SIMD path %s, %d thread(s)\n", version(),
              to_string(active_simd_path()), threads);
  tbb::task_arena arena(threads);
  std::mt19937 generator(42);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::size_t size : {256, 512, 1024}) {
    std::vector<float> a(size * size), b(size * size), c(size * size);
    for (float& x : a) x = uniform(generator);
    for (float& x : b) x = uniform(generator);
    const engine::gemm_operand a_op{a.data(), size, engine::transpose::no};
    const engine::gemm_operand b_op{b.data(), size, engine::transpose::no};
    std::vector<double> seconds;
    for (int repeat = 0; repeat < 7; ++repeat) {
      const auto start = std::chrono::steady_clock::now();
      arena.execute([&] { engine::gemm({size, size, size}, 1.0f, a_op, b_op, 0.0f, c.data(), size); });
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::nth_element(seconds.begin(), seconds.begin() + 3, seconds.end());
    const double gflops = 2.0 * double(size) * double(size) * double(size) / seconds[3] * 1e-9;
    std::printf("  sgemm %4zu x %4zu x %4zu: median %8.3f ms, %6.1f GFLOP/s\n", size, size, size,
                seconds[3] * 1e3, gflops);
  }
  return 0;
}

}  // namespace kvhead::tools
