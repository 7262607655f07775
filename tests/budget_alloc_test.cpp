// Resource limits (counted by tests/counting_new.cpp): a kv_cache holds no
// more than its byte budget in blocks, however it is used, and what it
// allocates besides the pool (sequence entries, block tables) stays small.
#include <doctest/doctest.h>

#include <vector>

#include "kvhead/kv_cache.hpp"
#include "tests/counting_new.hpp"

TEST_CASE("budget: a kv_cache never allocates beyond its byte budget") {
  const kvhead::kv_cache_config geometry{2, 2, 40, 32, 0};
  std::size_t block_bytes = 0;
  {
    const kvhead::kv_cache probe({2, 2, 40, 32, 1 << 22});
    block_bytes = probe.block_bytes();
  }
  kvhead::kv_cache_config config = geometry;
  config.capacity_bytes = 10 * block_bytes + block_bytes / 2;  // 10.5 blocks: 10
  const std::size_t before = kvhead::testing::live_bytes();
  kvhead::kv_cache cache(config);
  CHECK(cache.total_blocks() == 10);
  // The pool, at most the budget, and a little bookkeeping.
  const std::size_t bookkeeping = 64 * 1024;
  CHECK(kvhead::testing::live_bytes() - before <= config.capacity_bytes + bookkeeping);
  // Fill it every way: long sequences, forks that copy on write, until appends fail.
  std::vector<kvhead::sequence_id> sequences;
  std::size_t refused = 0;
  for (int round = 0; round < 40; ++round) {
    const kvhead::sequence_id id = round % 3 == 2 && !sequences.empty() ? cache.fork(sequences.back()) : cache.create();
    sequences.push_back(id);
    try {
      cache.append(id, 1 + std::size_t(round) * 7 % 50);
    } catch (const kvhead::kv_cache_error&) {
      ++refused;
    }
    CHECK(cache.bytes_in_use() <= cache.total_blocks() * block_bytes);
    CHECK(kvhead::testing::live_bytes() - before <= config.capacity_bytes + bookkeeping);
  }
  CHECK(refused > 0);
}
