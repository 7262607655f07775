// A KV cache block's bytes as tests compare them: every region of the block
// (kv_cache_internals::region), in region order, concatenated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/cache/kv_cache_internals.hpp"
#include "kvhead/kv_cache.hpp"

namespace kvhead::tests {

inline std::vector<unsigned char> block_contents(const kv_cache& cache, std::uint32_t block) {
  const std::size_t region_bytes = engine::kv_cache_internals::region_bytes(cache);
  std::vector<unsigned char> bytes;
  bytes.reserve(cache.block_bytes());
  for (std::size_t layer = 0; layer < cache.config().num_layers; ++layer)
    for (std::size_t head = 0; head < cache.config().num_kv_heads; ++head)
      for (const bool value : {false, true}) {
        const auto* region = reinterpret_cast<const unsigned char*>(
            engine::kv_cache_internals::region(cache, block, layer, head, value));
        bytes.insert(bytes.end(), region, region + region_bytes);
      }
  return bytes;
}

}  // namespace kvhead::tests
