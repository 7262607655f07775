// The --precision flag of `kvhead run`, `kvhead decode` and `kvhead demo`: how
// the attention layers compute (attention.hpp, attention_config::precision).
#pragma once

#include <string_view>

#include "kvhead/config.hpp"
#include "tools/cli_args.hpp"

namespace kvhead::tools {

inline constexpr precision precisions[] = {precision::f32, precision::bf16};

/// The precision named `text` (f32 or bf16); a usage_error otherwise.
inline precision parse_precision(std::string_view text, std::string_view also_accepted = {}) {
  return parse_named("--precision", precisions, text, also_accepted);
}

}  // namespace kvhead::tools
