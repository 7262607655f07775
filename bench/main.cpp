// kvhead_bench: Google Benchmark's main, with this machine's description and
// measured limits added to the report's context first (not to list the
// benchmarks: that takes no measurement).
#include <benchmark/benchmark.h>

#include <string_view>

#include "bench/machine_context.hpp"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    listing = listing || argument == "--benchmark_list_tests" || argument == "--benchmark_list_tests=true" ||
              argument == "--benchmark_list_tests=1";
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!listing) kvhead::bench::add_machine_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
