// The kvhead command-line program: dispatches to one command per file
// (run_command.cpp, kernel_demo.cpp); flags and exit codes in cli_args.hpp.
#include <algorithm>
#include <cstdio>
#include <span>
#include <string_view>

#include <tbb/global_control.h>
#include <tbb/info.h>

#include "kvhead/config.hpp"
#include "tools/cli_args.hpp"
#include "tools/kernel_demo.hpp"
#include "tools/run_command.hpp"

namespace {

using namespace kvhead::tools;

void print_help() {
  std::fputs(
      "usage: kvhead <command> [options]\n"
      "\n"
      "commands:\n"
      "  run [flags]          run one attention layer on a .npy input (below; kvhead run --help)\n"
      "  demo [--threads N]   time the GEMM kernel and print GFLOP/s and the SIMD path\n"
      "  --version            print the version and the SIMD path in use\n"
      "  --help               print this help\n"
      "\n",
      stdout);
  std::fputs(run_help_text(), stdout);
}

int demo(std::span<const char* const> args) {
  return run_guarded("kvhead demo", [&] {
    static constexpr flag_spec demo_flags[] = {{"--threads", true}};
    const parsed_flags flags = parse_flags(args, demo_flags);
    if (flags.help()) {
      std::fputs("usage: kvhead demo [--threads N]   (N from 1 to 1024; default: the CPU count)\n", stdout);
      return exit_ok;
    }
    const std::size_t threads =
        flags.count("--threads", max_threads).value_or(std::size_t(tbb::info::default_concurrency()));
    // As in `kvhead run`: let the demo's arena really have `threads` threads.
    const tbb::global_control allow(tbb::global_control::max_allowed_parallelism,
                                    std::max(threads, std::size_t(tbb::info::default_concurrency())));
    return kvhead::tools::run_kernel_demo(int(threads));
  });
}

}  // namespace

int main(int argc, char** argv) {
  const char* const* const argv_const = argv;
  const std::span<const char* const> words(argv_const, std::size_t(argc));
  const std::string_view command = argc > 1 ? words[1] : "";
  const std::span<const char* const> args = argc > 1 ? words.subspan(2) : words.subspan(0, 0);
  if (command == "run") return run_command(args);
  if (command == "demo") return demo(args);
  return run_guarded("kvhead", [&] {
    if (command == "--help" || command == "-h" || command == "help") {
      print_help();
      return exit_ok;
    }
    if (command == "--version") {
      std::printf("kvhead %s (SIMD path: %s)\n", kvhead::version(), kvhead::to_string(kvhead::active_simd_path()));
      return exit_ok;
    }
    if (command.empty()) throw usage_error("no command given");
    throw usage_error("unknown command " + quote_arg(command));
  });
}
