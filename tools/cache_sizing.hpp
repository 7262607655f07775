// A kv_cache whose pool is exactly big enough for a known workload (used by
// `kvhead decode` and `kvhead demo`).
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>

#include "kvhead/kv_cache.hpp"

namespace kvhead::tools {

/// A cache of `geometry` (its capacity_bytes is ignored; block_size 0 means
/// kv_cache_default_block_size; any dtype) holding `sequences` sequences of
/// up to `tokens` tokens each: sequences * ceil(tokens / block_size) blocks
/// of kv_cache_block_bytes(geometry) (kv_cache.hpp, "Block layout"). A pool
/// size that overflows std::size_t throws std::bad_alloc, like a pool too
/// large to allocate.
inline kv_cache make_sized_cache(kv_cache_config geometry, std::size_t sequences, std::size_t tokens) {
  const std::size_t block_size = geometry.block_size != 0 ? geometry.block_size : kv_cache_default_block_size;
  const std::size_t blocks = tokens / block_size + (tokens % block_size != 0);
  const std::size_t block_bytes = kv_cache_block_bytes(geometry);  // std::invalid_argument for a bad geometry
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(block_bytes, blocks, &bytes) || __builtin_mul_overflow(bytes, sequences, &bytes))
    throw std::bad_alloc();
  geometry.capacity_bytes = bytes;
  kv_cache cache(geometry);
  if (cache.block_bytes() != block_bytes || cache.total_blocks() != blocks * sequences)
    throw std::logic_error("make_sized_cache: kv_cache's block layout is not the one documented in kv_cache.hpp");
  return cache;
}

}  // namespace kvhead::tools
