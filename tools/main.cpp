// The kvhead command-line program: dispatches to one command per file
// (run_command.cpp, decode_command.cpp, demo_command.cpp, kernel_demo.cpp);
// flags and exit codes in cli_args.hpp.
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "engine/gemm/gemm_bf16.hpp"
#include "kvhead/config.hpp"
#include "tools/cli_args.hpp"
#include "tools/decode_command.hpp"
#include "tools/demo_command.hpp"
#include "tools/kernel_demo.hpp"
#include "tools/run_command.hpp"

namespace {

using namespace kvhead::tools;

void print_help() {
  std::fputs(
      "usage: kvhead <command> [options]\n"
      "\n"
      "commands:\n"
      "  run [flags]       run one attention layer on a .npy input (kvhead run --help)\n"
      "  decode [flags]    the same, causal, by incremental decoding over a KV cache, --chunk\n"
      "                    tokens per step; bit-identical to run --causal (kvhead decode --help)\n"
      "  demo [flags]      decoding demo with built-in random weights: prefill, token-by-token\n"
      "                    decode with progress, speed, latency, cache use, and the speed-up over\n"
      "                    decoding without a cache (kvhead demo --help; tools/run demo runs it)\n"
      "  kernels [--threads N]   print the CPU and the kernel configuration chosen for it,\n"
      "                    the bf16 GEMM unit, time the GEMMs and print GFLOP/s and the SIMD path\n"
      "  --version         print the version, the SIMD path, the configuration and the bf16\n"
      "                    GEMM unit in use (and why not a better one)\n"
      "  --help            print this help\n"
      "\n",
      stdout);
  std::fputs(run_help_text().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fputs(decode_help_text(false).c_str(), stdout);
  std::fputs("\n", stdout);
  std::fputs(demo_help_text().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fputs(kernels_help_text, stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const char* const* const argv_const = argv;
  const std::span<const char* const> words(argv_const, std::size_t(argc));
  const std::string_view command = argc > 1 ? words[1] : "";
  const std::span<const char* const> args = argc > 1 ? words.subspan(2) : words.subspan(0, 0);
  if (command == "run") return run_command(args);
  if (command == "decode") return decode_command(args);
  if (command == "demo") return demo_command(args);
  if (command == "kernels") return kernels_command(args);
  return run_guarded("kvhead", [&] {
    const bool informative = command == "--help" || command == "-h" || command == "help" || command == "--version";
    if (informative && !args.empty())
      throw usage_error(std::string(command) + " takes no arguments, got " + quote_arg(args[0]));
    if (command == "--help" || command == "-h" || command == "help") {
      print_help();
      return exit_ok;
    }
    if (command == "--version") {
      namespace engine = kvhead::engine;
      const engine::bf16_unit unit = engine::active_bf16_unit();
      std::printf("kvhead %s (SIMD path: %s, configuration: %s, bf16 unit: %s, reduction order: %s)\n",
                  kvhead::version(), kvhead::to_string(kvhead::active_simd_path()), kvhead::kernel_config_name(),
                  engine::to_string(unit),
                  kvhead::current_reduction_order() == kvhead::reduction_order::fixed ? "fixed" : "fastest");
      if (!engine::bf16_unit_reason().empty())
        std::printf("bf16 unit %s because %s\n", engine::to_string(unit), engine::bf16_unit_reason().c_str());
      return exit_ok;
    }
    if (command.empty()) throw usage_error("no command given");
    throw usage_error("unknown command " + quote_arg(command));
  });
}
