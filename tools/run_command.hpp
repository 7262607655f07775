// `kvhead run`: one attention layer, weights from safetensors, input and
// output as float32 .npy files (the shared steps: layer_job.hpp). The flags,
// the exit codes and the environment are described by run_help_text(), which
// `kvhead --help` prints too.
#pragma once

#include <span>
#include <string>

namespace kvhead::tools {

/// Runs `kvhead run` with `args` (the words after "run"); returns the exit
/// code. Never throws; a failure prints one line on stderr (cli_args.hpp).
int run_command(std::span<const char* const> args);

/// The flag list, the error contract and the environment variables, one
/// paragraph each, ready to print.
std::string run_help_text();

}  // namespace kvhead::tools
