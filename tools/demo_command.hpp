// `kvhead demo`: token-by-token decoding through a stack of attention layers
// over one KV cache, with built-in seeded weights and prompt (no files): live
// progress, then prefill and decode speed, latency early and late in the
// context, cache use, and the speed-up over decoding without a cache (checked
// to give the same bits). The model and the flags: demo_help_text().
#pragma once

#include <span>
#include <string>

namespace kvhead::tools {

/// Runs `kvhead demo` with `args` (the words after "demo"); returns the exit
/// code. Never throws; a failure prints one line on stderr (cli_args.hpp).
int demo_command(std::span<const char* const> args);

/// The help of `kvhead demo --help` (also printed by `kvhead --help`).
std::string demo_help_text();

}  // namespace kvhead::tools
