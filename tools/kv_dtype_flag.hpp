// The --kv-dtype flag of `kvhead decode` and `kvhead demo`: how the KV cache
// stores keys and values (kv_cache.hpp, "Element types").
#pragma once

#include <string_view>

#include "kvhead/config.hpp"
#include "tools/cli_args.hpp"

namespace kvhead::tools {

inline constexpr kv_dtype kv_dtypes[] = {kv_dtype::f32, kv_dtype::bf16, kv_dtype::f16, kv_dtype::int8};

/// The dtype named `text` (f32, bf16, f16 or int8); a usage_error otherwise.
inline kv_dtype parse_kv_dtype(std::string_view text, std::string_view also_accepted = {}) {
  return parse_named("--kv-dtype", kv_dtypes, text, also_accepted);
}

}  // namespace kvhead::tools
