// kvhead_bench: Google Benchmark's main, with this machine's description and
// measured limits added to the report's context first (not to list the
// benchmarks: that takes no measurement).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bench/machine_context.hpp"

namespace {

// Google Benchmark's reading of a boolean flag's value: one character other
// than 0, f, F, n, N, or true / yes / on in any case, is true.
bool truthy(std::string_view value) {
  if (value.size() == 1) return std::string_view("0fFnN").find(value[0]) == std::string_view::npos;
  std::string lower(value);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return lower == "true" || lower == "yes" || lower == "on";
}

// Whether the benchmarks are to be listed (--benchmark_list_tests[=value], the
// last one given, else BENCHMARK_LIST_TESTS), as Google Benchmark decides it.
bool listing(int argc, char** argv) {
  const char* environment = std::getenv("BENCHMARK_LIST_TESTS");
  bool list = environment != nullptr && truthy(environment);
  constexpr std::string_view flag = "--benchmark_list_tests";
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (argument == flag) list = true;
    if (argument.starts_with(flag) && argument.size() > flag.size() && argument[flag.size()] == '=')
      list = truthy(argument.substr(flag.size() + 1));
  }
  return list;
}

}  // namespace

int main(int argc, char** argv) {
  const bool list = listing(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!list) kvhead::bench::add_machine_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
