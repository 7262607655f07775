// The --kv-dtype flag of `kvhead decode` and `kvhead demo`: how the KV cache
// stores keys and values (kv_cache.hpp, "Element types").
#pragma once

#include <string>
#include <string_view>

#include "kvhead/config.hpp"
#include "tools/cli_args.hpp"

namespace kvhead::tools {

inline constexpr kv_dtype kv_dtypes[] = {kv_dtype::f32, kv_dtype::bf16, kv_dtype::f16, kv_dtype::int8};

/// The dtype named `text` (f32, bf16, f16 or int8); a usage_error otherwise.
inline kv_dtype parse_kv_dtype(std::string_view text, std::string_view also_accepted = {}) {
  for (const kv_dtype dtype : kv_dtypes)
    if (text == to_string(dtype)) return dtype;
  throw usage_error("--kv-dtype needs f32, bf16, f16" + std::string(also_accepted.empty() ? " or int8" : ", int8") +
                    (also_accepted.empty() ? "" : " or " + std::string(also_accepted)) + ", got " + quote_arg(text));
}

}  // namespace kvhead::tools
