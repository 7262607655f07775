#include "tools/kernel_demo.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include "engine/gemm/gemm.hpp"
#include "kvhead/config.hpp"
#include "tools/cli_args.hpp"

namespace kvhead::tools {

namespace {

int run_kernel_demo(int threads) {
  std::printf("kvhead %s kernel demo: SIMD path %s, %d thread(s)\n", version(), to_string(active_simd_path()), threads);
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
    std::printf("  sgemm %4zu x %4zu x %4zu: median %8.3f ms, %6.1f GFLOP/s\n", size, size, size, seconds[3] * 1e3,
                gflops);
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
