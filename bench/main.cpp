// kvhead_bench: Google Benchmark's main, with this machine's description and
// measured limits added to the report's context first.
#include <benchmark/benchmark.h>

#include "bench/machine_context.hpp"

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  kvhead::bench::add_machine_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
