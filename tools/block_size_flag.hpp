// The --block-size flag of `kvhead decode` and `kvhead demo`: tokens per block
// of the KV cache (kv_cache.hpp, "Pages"), one of kv_cache_block_sizes.
#pragma once

#include <array>
#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "kvhead/kv_cache.hpp"
#include "tools/cli_args.hpp"

namespace kvhead::tools {

/// A block size as the flag names it: its decimal digits (parse_named).
struct block_size_choice {
  std::size_t tokens;
};
inline std::string to_string(block_size_choice choice) { return std::to_string(choice.tokens); }

/// The block size --block-size names (exactly the digits of one of
/// kv_cache_block_sizes), or 0, the cache's default, when the flag is
/// absent; a usage_error otherwise ("--block-size needs 16, 32, ... or 256,
/// got '<text>'").
inline std::size_t parse_block_size(const parsed_flags& flags) {
  const std::optional<std::string> text = flags.value("--block-size");
  if (!text) return 0;
  static constexpr auto choices = [] {
    std::array<block_size_choice, std::size(kv_cache_block_sizes)> list{};
    for (std::size_t i = 0; i < list.size(); ++i) list[i].tokens = kv_cache_block_sizes[i];
    return list;
  }();
  return parse_named("--block-size", choices, *text).tokens;
}

/// The flag's lines of a command's help (the sizes and the default from kv_cache.hpp).
inline std::string block_size_help() {
  std::vector<std::string> sizes;
  for (const std::size_t size : kv_cache_block_sizes) sizes.push_back(std::to_string(size));
  return "  --block-size B  tokens per KV cache block: " + or_list(sizes) + " (default " +
         std::to_string(kv_cache_default_block_size) +
         ");\n"
         "                  the output is the same at every size; smaller blocks pin less memory\n"
         "                  per sequence.\n";
}

}  // namespace kvhead::tools
