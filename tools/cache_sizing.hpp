// A kv_cache whose pool is exactly big enough for a known workload (used by
// `kvhead decode` and `kvhead demo`).
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>

#include "kvhead/kv_cache.hpp"

namespace kvhead::tools {

/// The pool of a cache of `geometry` (its capacity_bytes is ignored;
/// block_size 0 means kv_cache_default_block_size; any dtype) holding
/// `sequences` sequences of up to `tokens` tokens each: sequences *
/// ceil(tokens / block_size) blocks of kv_cache_block_bytes(geometry)
/// (kv_cache.hpp, "Block layout"). A size that overflows std::size_t throws
/// std::bad_alloc, like a pool too large to allocate.
struct sized_pool {
  std::size_t blocks, block_bytes, bytes;
};
inline sized_pool sized_cache_pool(const kv_cache_config& geometry, std::size_t sequences, std::size_t tokens) {
  const std::size_t block_size = geometry.block_size != 0 ? geometry.block_size : kv_cache_default_block_size;
  const std::size_t blocks = tokens / block_size + (tokens % block_size != 0);
  const std::size_t block_bytes = kv_cache_block_bytes(geometry);  // std::invalid_argument for a bad geometry
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(block_bytes, blocks, &bytes) || __builtin_mul_overflow(bytes, sequences, &bytes))
    throw std::bad_alloc();
  return {blocks * sequences, block_bytes, bytes};
}

/// A cache with that pool (sized_cache_pool).
inline kv_cache make_sized_cache(kv_cache_config geometry, std::size_t sequences, std::size_t tokens) {
  const sized_pool pool = sized_cache_pool(geometry, sequences, tokens);
  geometry.capacity_bytes = pool.bytes;
  kv_cache cache(geometry);
  if (cache.block_bytes() != pool.block_bytes || cache.total_blocks() != pool.blocks)
    throw std::logic_error("make_sized_cache: kv_cache's block layout is not the one documented in kv_cache.hpp");
  return cache;
}

}  // namespace kvhead::tools
