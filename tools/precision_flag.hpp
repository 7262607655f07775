// The --precision flag of `kvhead run`, `kvhead decode` and `kvhead demo`: how
// the attention layers compute (attention.hpp, attention_config::precision).
#pragma once

#include <string>
#include <string_view>

#include "kvhead/config.hpp"
#include "tools/cli_args.hpp"

namespace kvhead::tools {

inline constexpr precision precisions[] = {precision::f32, precision::bf16};

/// The precision named `text` (f32 or bf16); a usage_error otherwise.
inline precision parse_precision(std::string_view text, std::string_view also_accepted = {}) {
  for (const precision value : precisions)
    if (text == to_string(value)) return value;
  throw usage_error("--precision needs f32" + std::string(also_accepted.empty() ? " or bf16" : ", bf16") +
                    (also_accepted.empty() ? "" : " or " + std::string(also_accepted)) + ", got " + quote_arg(text));
}

}  // namespace kvhead::tools
