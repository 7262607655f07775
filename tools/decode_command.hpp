// `kvhead decode`: `kvhead run --causal` computed by incremental decoding over
// a KV cache, chunk by chunk; the output is bit-identical to run --causal.
#pragma once

#include <span>
#include <string>

namespace kvhead::tools {

/// Runs `kvhead decode` with `args` (the words after "decode"); returns the
/// exit code. Never throws; a failure prints one line on stderr (cli_args.hpp).
int decode_command(std::span<const char* const> args);

/// The help of `kvhead decode --help`. With full == false, only what differs
/// from `kvhead run` (for `kvhead --help`, which prints run's help too).
std::string decode_help_text(bool full);

}  // namespace kvhead::tools
