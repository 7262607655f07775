// The kvhead command-line program.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <tbb/info.h>

#include "kvhead/config.hpp"
#include "tools/kernel_demo.hpp"

namespace {

constexpr int exit_usage = 2;

void print_help() {
  std::printf(
      "usage: kvhead <command> [options]\n"
      "\n"
      "commands:\n"
      "  demo [--threads N]   time the GEMM kernel and print GFLOP/s and the SIMD path\n"
      "  --version            print the version and the SIMD path in use\n"
      "  --help               print this help\n"
      "\n"
      "environment:\n"
      "  KVHEAD_ISA=avx512|avx2|sse2   force a lower SIMD path than the best this CPU has\n");
}

// Parses a positive thread count; returns 0 when the text is not one.
int parse_threads(std::string_view text) {
  if (text.empty() || text.size() > 6) return 0;
  int value = 0;
  for (char digit : text) {
    if (digit < '0' || digit > '9') return 0;
    value = value * 10 + (digit - '0');
  }
  return value;
}

int demo(int argc, char** argv) {
  int threads = tbb::info::default_concurrency();
  for (int i = 2; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view value;
    if (arg.rfind("--threads=", 0) == 0) {
      value = arg.substr(10);
    } else if (arg == "--threads" && i + 1 < argc) {
      value = argv[++i];
    } else {
      std::fprintf(stderr, "kvhead demo: unknown or incomplete option '%s' (see kvhead --help)\n", argv[i]);
      return exit_usage;
    }
    threads = parse_threads(value);
    if (threads <= 0) {
      std::fprintf(stderr, "kvhead demo: --threads needs a positive whole number, got '%.*s'\n",
                   int(value.size()), value.data());
      return exit_usage;
    }
  }
  return kvhead::tools::run_kernel_demo(threads);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string_view command = argc > 1 ? argv[1] : "";
    if (command == "--help" || command == "-h" || command == "help") {
      print_help();
      return 0;
    }
    if (command == "--version") {
      std::printf("kvhead %s (SIMD path: %s)\n", kvhead::version(),
                  kvhead::to_string(kvhead::active_simd_path()));
      return 0;
    }
    if (command == "demo") return demo(argc, argv);
    if (command.empty())
      std::fprintf(stderr, "kvhead: no command given\n");
    else
      std::fprintf(stderr, "kvhead: unknown command '%s'\n", argv[1]);
    print_help();
    return exit_usage;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "kvhead: %s\n", error.what());
    return 1;
  }
}
