// The KV cache allocates nothing per token in steady state (counted by the
// operator new of tests/counting_new.cpp): once a sequence's block table has
// grown (warm-up), appends of single tokens (crossing block boundaries too),
// copy-on-write appends, truncates and the queries make zero allocations.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>

#include "engine/cache/kv_cache_internals.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/counting_new.hpp"

namespace {

using kvhead::kv_cache;
using kvhead::kv_cache_config;
using kvhead::sequence_id;
using kvhead::engine::kv_cache_internals;

kv_cache_config config_for(std::size_t block_size, std::size_t blocks) {
  kv_cache_config config;
  config.num_layers = 2;
  config.num_kv_heads = 2;
  config.head_dim = 8;  // padded to 32: block_bytes = 1024 * block_size
  config.block_size = block_size;
  config.capacity_bytes = blocks * 1024 * (block_size == 0 ? kvhead::kv_cache_default_block_size : block_size);
  return config;
}

TEST_CASE("kv_cache alloc: the counting hook sees the cache's allocations") {
  const std::size_t start = kvhead::testing::allocation_count();
  kv_cache cache(config_for(32, 4));
  CHECK(kvhead::testing::allocation_count() > start);  // the impl and the pool
  const std::size_t created = kvhead::testing::allocation_count();
  const sequence_id id = cache.create();
  cache.append(id, 1);
  CHECK(kvhead::testing::allocation_count() > created);  // the sequence entry and its table
}

TEST_CASE("kv_cache alloc: 1000 single-token appends into reserved capacity allocate nothing") {
  for (const std::size_t block_size : {std::size_t{0}, std::size_t{32}, std::size_t{256}}) {
    CAPTURE(block_size);
    kv_cache cache(config_for(block_size, 40));
    const sequence_id id = cache.create();
    cache.append(id, 1100);  // warm-up: grows the block table
    cache.truncate(id, 1);   // keeps the table's capacity, returns the blocks

    std::size_t checksum = 0;
    const std::size_t before = kvhead::testing::allocation_count();
    for (int i = 0; i < 1000; ++i) {
      cache.append(id, 1);  // new blocks come from the pool every block_size tokens
      std::size_t count = 0;
      checksum += kv_cache_internals::block_table(cache, id, &count)[count - 1];
      checksum += cache.length(id) + cache.blocks_used(id) + cache.free_blocks() + cache.bytes_in_use();
    }
    cache.truncate(id, 500);
    cache.append(id, 300);
    const std::size_t during = kvhead::testing::allocation_count() - before;
    CHECK(during == 0);
    CHECK(cache.length(id) == 800);
    CHECK(checksum > 0);
  }
}

TEST_CASE("kv_cache alloc: a copy-on-write append allocates nothing once the table has room") {
  kv_cache cache(config_for(32, 16));
  const sequence_id parent = cache.create();
  cache.append(parent, 100);  // last block partial
  const sequence_id child = cache.fork(parent);  // the fork's table: 8 entries reserved
  const std::size_t free_before = cache.free_blocks();
  const std::size_t before = kvhead::testing::allocation_count();
  cache.append(child, 1);   // copies the shared last block
  cache.append(parent, 1);  // exclusive again: in place
  cache.truncate(child, 10);
  cache.free(parent);       // the node is freed; nothing is allocated
  const std::size_t during = kvhead::testing::allocation_count() - before;
  CHECK(during == 0);
  CHECK(cache.free_blocks() == free_before + 4 - 1);
}

}  // namespace
