// Paged KV cache: capacity arithmetic over every block size, ids, fork and
// reference counts, the block layout, copy-on-write checked through the block
// data, the strong guarantee of every error (full snapshots: lengths, tables,
// free count and the whole pool, bitwise), invalid configurations, moves, and
// threads working on distinct sequences (some sharing blocks across threads).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/cache/kv_cache_internals.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/cache_blocks.hpp"

namespace {

using kvhead::kv_cache;
using kvhead::kv_cache_config;
using kvhead::kv_cache_error;
using kvhead::sequence_id;
using kvhead::engine::kv_cache_internals;
using kvhead::tests::block_contents;

constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
constexpr std::size_t block_sizes[] = {32, 64, 128, 256};

/// 2 layers, 2 kv heads, head_dim 8 (padded to 32): 8 regions of
/// block_size * 32 floats, block_bytes = 1024 * block_size.
kv_cache_config small_config(std::size_t block_size, std::size_t blocks) {
  kv_cache_config config;
  config.num_layers = 2;
  config.num_kv_heads = 2;
  config.head_dim = 8;
  config.block_size = block_size;
  config.capacity_bytes = blocks * 1024 * block_size;
  return config;
}

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

std::vector<std::uint32_t> table_of(const kv_cache& cache, sequence_id id) {
  std::size_t count = 0;
  const std::uint32_t* table = kv_cache_internals::block_table(cache, id, &count);
  return std::vector<std::uint32_t>(table, table + count);
}

std::size_t padded_dim(const kv_cache& cache) {
  return kv_cache_internals::region_bytes(cache) / sizeof(float) / cache.config().block_size;
}

std::size_t regions(const kv_cache& cache) { return 2 * cache.config().num_layers * cache.config().num_kv_heads; }

/// The value written at `position` of region `region` by a writer tagged `tag`
/// (an exact float: below 2^24).
float token_value(unsigned tag, std::size_t region, std::size_t position) {
  return static_cast<float>(((tag % 256) * 16 + region % 16) * 4096 + position % 4096);
}

/// The row of token slot `slot` in region `region` (K/V of layer, head) of a block.
float* row(kv_cache& cache, std::uint32_t block, std::size_t region, std::size_t slot) {
  const kv_cache_config& config = cache.config();
  const std::size_t layer = region / 2 / config.num_kv_heads, head = region / 2 % config.num_kv_heads;
  return reinterpret_cast<float*>(kv_cache_internals::region(cache, block, layer, head, region % 2 == 1)) +
         slot * padded_dim(cache);
}

/// Writes positions [from, to) of the sequence, as a kernel would after an append.
void write_tokens(kv_cache& cache, sequence_id id, std::size_t from, std::size_t to, unsigned tag) {
  std::size_t count = 0;
  const std::uint32_t* table = kv_cache_internals::block_table(cache, id, &count);
  const std::size_t block_size = cache.config().block_size;
  for (std::size_t position = from; position < to; ++position)
    for (std::size_t region = 0; region < regions(cache); ++region) {
      float* values = row(cache, table[position / block_size], region, position % block_size);
      std::fill(values, values + padded_dim(cache), token_value(tag, region, position));
    }
}

/// Number of token rows of the sequence that differ from tags[position].
std::size_t mismatches(kv_cache& cache, sequence_id id, const std::vector<unsigned char>& tags) {
  std::size_t count = 0, wrong = 0;
  const std::uint32_t* table = kv_cache_internals::block_table(cache, id, &count);
  const std::size_t block_size = cache.config().block_size;
  for (std::size_t position = 0; position < tags.size(); ++position)
    for (std::size_t region = 0; region < regions(cache); ++region) {
      const float* values = row(cache, table[position / block_size], region, position % block_size);
      const float expected = token_value(tags[position], region, position);
      for (std::size_t e = 0; e < padded_dim(cache); ++e) wrong += values[e] != expected;
    }
  return wrong;
}

/// Fills every float of the pool with a distinct value.
void fill_pool(kv_cache& cache) {
  auto* pool = reinterpret_cast<float*>(kv_cache_internals::pool(cache));
  const std::size_t floats = cache.total_blocks() * cache.block_bytes() / sizeof(float);
  for (std::size_t i = 0; i < floats; ++i) pool[i] = static_cast<float>(i % 8388608);
}

/// Everything observable about the cache, the pool bitwise.
struct snapshot {
  std::size_t free_blocks = 0, bytes_in_use = 0;
  std::vector<std::size_t> lengths, blocks_used;
  std::vector<std::vector<std::uint32_t>> tables;
  std::vector<unsigned char> pool;
  bool operator==(const snapshot&) const = default;
};

snapshot take_snapshot(const kv_cache& cache, const std::vector<sequence_id>& ids) {
  snapshot result;
  result.free_blocks = cache.free_blocks();
  result.bytes_in_use = cache.bytes_in_use();
  for (const sequence_id id : ids) {
    result.lengths.push_back(cache.length(id));
    result.blocks_used.push_back(cache.blocks_used(id));
    result.tables.push_back(table_of(cache, id));
  }
  const auto* pool = reinterpret_cast<const unsigned char*>(kv_cache_internals::pool(cache));
  result.pool.assign(pool, pool + cache.total_blocks() * cache.block_bytes());
  return result;
}

TEST_CASE("kv_cache: block size resolution, block geometry and capacity") {
  for (const std::size_t block_size :
       {std::size_t{0}, std::size_t{32}, std::size_t{64}, std::size_t{128}, std::size_t{256}}) {
    CAPTURE(block_size);
    const std::size_t resolved = block_size == 0 ? kvhead::kv_cache_default_block_size : block_size;
    kv_cache_config config;
    config.num_layers = 3;
    config.num_kv_heads = 2;
    config.head_dim = 33;  // padded to 64
    config.block_size = block_size;
    const std::size_t block_bytes = 2 * 3 * 2 * resolved * 64 * 4;
    config.capacity_bytes = 5 * block_bytes + block_bytes - 1;  // 5 whole blocks
    const kv_cache cache(config);
    CHECK(cache.config().block_size == resolved);
    CHECK(cache.config().num_layers == 3);
    CHECK(cache.config().capacity_bytes == config.capacity_bytes);
    CHECK(cache.block_bytes() == block_bytes);
    CHECK(cache.bytes_per_token() == block_bytes / resolved);
    CHECK(kv_cache_internals::region_bytes(cache) == resolved * 64 * 4);
    CHECK(cache.total_blocks() == 5);
    CHECK(cache.free_blocks() == 5);
    CHECK(cache.free_tokens() == 5 * resolved);
    CHECK(cache.bytes_in_use() == 0);
  }
  CHECK(kvhead::kv_cache_default_block_size == 256);
  // Exactly one block is enough.
  const kv_cache one(small_config(64, 1));
  CHECK(one.total_blocks() == 1);
}

// "Block layout" in kv_cache.hpp: groups of 256 / block_size blocks, each
// region of a group's blocks side by side; the last group may be short.
TEST_CASE("kv_cache: block layout: groups of blocks, regions side by side, 64-byte aligned, tiling the pool") {
  for (const std::size_t block_size : {std::size_t{16}, std::size_t{32}, std::size_t{64}, std::size_t{256}}) {
    for (const std::size_t blocks : {std::size_t{1}, std::size_t{7}, std::size_t{19}}) {
      CAPTURE(block_size);
      CAPTURE(blocks);
      kv_cache_config config;
      config.num_layers = 3;
      config.num_kv_heads = 2;
      config.head_dim = 64;  // already a multiple of 32
      config.block_size = block_size;
      const std::size_t region = block_size * 64 * 4, block_bytes = 2 * 3 * 2 * region;
      config.capacity_bytes = blocks * block_bytes;
      kv_cache cache(config);
      REQUIRE(cache.total_blocks() == blocks);
      CHECK(kv_cache_internals::region_bytes(cache) == region);
      CHECK(cache.block_bytes() == block_bytes);
      const std::size_t group = 256 / block_size;
      const auto* pool = kv_cache_internals::pool(std::as_const(cache));
      std::set<std::size_t> offsets;
      for (std::uint32_t block = 0; block < blocks; ++block) {
        const std::size_t first = block / group * group, in_group = std::min(group, blocks - first);
        for (std::size_t layer = 0; layer < 3; ++layer)
          for (std::size_t head = 0; head < 2; ++head)
            for (const bool value : {false, true}) {
              const std::byte* data = kv_cache_internals::region(cache, block, layer, head, value);
              CHECK(data == kv_cache_internals::region(std::as_const(cache), block, layer, head, value));
              const std::size_t index = (layer * 2 + head) * 2 + (value ? 1 : 0);
              const auto offset = static_cast<std::size_t>(data - pool);
              CHECK(offset == first * block_bytes + (index * in_group + block - first) * region);
              // The inline form a decode step computes addresses with.
              CHECK(offset ==
                    kv_cache_internals::geometry(cache).offset(
                        block, kvhead::engine::region_geometry::key_region(layer, 2, head) + (value ? 1 : 0)));
              CHECK(reinterpret_cast<std::uintptr_t>(data) % 64 == 0);
              offsets.insert(offset);
            }
      }
      // Every region distinct, together exactly the pool.
      CHECK(offsets.size() == blocks * 12);
      CHECK(*offsets.rbegin() + region == blocks * block_bytes);
    }
  }
  // A padded head_dim: rows of 32 floats for head_dim 1.
  kv_cache_config config;
  config.num_layers = 3;
  config.num_kv_heads = 2;
  config.head_dim = 1;
  config.block_size = 32;
  config.capacity_bytes = 4 * (2 * 3 * 2 * 32 * 32 * 4);
  const kv_cache padded(config);
  CHECK(kv_cache_internals::region_bytes(padded) == 32 * 32 * 4);
  CHECK(padded.block_bytes() == 2 * 3 * 2 * 32 * 32 * 4);
}

// Consecutive blocks stream as one ("Block layout"): a fresh cache hands out
// blocks in index order, and freed or truncated blocks come back in the
// order their table held them.
TEST_CASE(
    "kv_cache: entry p takes the block after entry p - 1's, or the lowest free one at place p % G of a group, again in "
    "table order after free and truncate") {
  kv_cache cache(small_config(32, 20));  // groups of G = 8 blocks: 0-7, 8-15, 16-19
  const sequence_id a = cache.create(), b = cache.create();
  cache.append(a, 5 * 32);
  cache.append(b, 2 * 32);
  CHECK(table_of(cache, a) == std::vector<std::uint32_t>{0, 1, 2, 3, 4});
  CHECK(table_of(cache, b) == std::vector<std::uint32_t>{8, 9});  // from the next group's start, not from block 5
  cache.free(a);
  const sequence_id c = cache.create();
  cache.append(c, 4 * 32);
  CHECK(table_of(cache, c) == std::vector<std::uint32_t>{0, 1, 2, 3});
  cache.truncate(c, 1);
  cache.append(b, 3 * 32);
  CHECK(table_of(cache, b) == std::vector<std::uint32_t>{8, 9, 10, 11, 12});  // the run of 8 and 9 goes on
  // Places with no free block left: the next place that has one, and no block is out of reach.
  const sequence_id d = cache.create();
  cache.append(d, 14 * 32);
  CHECK(table_of(cache, d) == std::vector<std::uint32_t>{16, 17, 18, 19, 4, 5, 6, 7, 1, 2, 3, 13, 14, 15});
  CHECK(cache.free_blocks() == 0);
}

TEST_CASE("kv_cache: append, length and blocks_used over block sizes and lengths") {
  for (const std::size_t block_size : block_sizes) {
    CAPTURE(block_size);
    const std::size_t total = 40;  // the lengths below need 27 blocks of 32
    kv_cache cache(small_config(block_size, total));
    REQUIRE(cache.total_blocks() == total);
    const std::vector<std::size_t> lengths = {
        1, block_size - 1, block_size, block_size + 1, 2 * block_size, 2 * block_size + 1, 2, 3, 7, 31, 97, 257};
    // One append per length, every sequence alive at once.
    std::vector<sequence_id> ids;
    std::size_t used = 0;
    for (const std::size_t length : lengths) {
      CAPTURE(length);
      const sequence_id id = cache.create();
      CHECK(cache.length(id) == 0);
      CHECK(cache.blocks_used(id) == 0);
      cache.append(id, length);
      used += ceil_div(length, block_size);
      ids.push_back(id);
      CHECK(cache.length(id) == length);
      CHECK(cache.blocks_used(id) == ceil_div(length, block_size));
      CHECK(table_of(cache, id).size() == ceil_div(length, block_size));
      CHECK(cache.free_blocks() == total - used);
      CHECK(cache.free_tokens() == (total - used) * block_size);
      CHECK(cache.bytes_in_use() == used * cache.block_bytes());
      CHECK(cache.bytes_per_token() * block_size == cache.block_bytes());
    }
    // The tables are disjoint: no block is handed out twice.
    std::set<std::uint32_t> seen;
    for (const sequence_id id : ids)
      for (const std::uint32_t block : table_of(cache, id)) {
        CHECK(block < total);
        CHECK(seen.insert(block).second);
      }
    for (const sequence_id id : ids) cache.free(id);
    CHECK(cache.free_blocks() == total);
    CHECK(cache.bytes_in_use() == 0);

    // The same lengths grown in chunks of 1, 2, 3, 5, 7, 11, 13, ... tokens.
    for (const std::size_t length : lengths) {
      CAPTURE(length);
      const sequence_id id = cache.create();
      const std::size_t chunks[] = {1, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41};
      std::size_t grown = 0, step = 0;
      while (grown < length) {
        const std::size_t chunk = std::min(chunks[step++ % std::size(chunks)], length - grown);
        cache.append(id, chunk);
        grown += chunk;
        CHECK(cache.length(id) == grown);
        CHECK(cache.blocks_used(id) == ceil_div(grown, block_size));
        CHECK(cache.free_blocks() == total - ceil_div(grown, block_size));
      }
      cache.free(id);
      CHECK(cache.free_blocks() == total);
    }
  }
}

TEST_CASE("kv_cache: the whole pool can be filled, then one token more is refused") {
  for (const std::size_t block_size : block_sizes) {
    CAPTURE(block_size);
    kv_cache cache(small_config(block_size, 3));
    const sequence_id a = cache.create();
    cache.append(a, 3 * block_size);
    CHECK(cache.free_blocks() == 0);
    CHECK(cache.free_tokens() == 0);
    CHECK_THROWS_AS(cache.append(a, 1), kv_cache_error);
    const sequence_id b = cache.create();
    CHECK_THROWS_AS(cache.append(b, 1), kv_cache_error);
    cache.truncate(a, 2 * block_size + 1);  // keeps 3 blocks
    CHECK(cache.free_blocks() == 0);
    cache.truncate(a, 2 * block_size);
    CHECK(cache.free_blocks() == 1);
    cache.append(b, block_size);
    CHECK(cache.free_blocks() == 0);
  }
}

TEST_CASE("kv_cache: ids start at 1, increase and are never reused") {
  kv_cache cache(small_config(32, 4));
  const sequence_id first = cache.create();
  CHECK(first == 1);
  std::set<sequence_id> ids = {first};
  sequence_id last = first;
  for (int round = 0; round < 50; ++round) {
    const sequence_id created = cache.create();
    const sequence_id forked = cache.fork(created);
    CHECK(created > last);
    CHECK(forked > created);
    CHECK(ids.insert(created).second);
    CHECK(ids.insert(forked).second);
    last = forked;
    cache.free(created);
    if (round % 2 == 0) cache.free(forked);
  }
  CHECK(cache.free_blocks() == 4);
}

TEST_CASE("kv_cache: truncate drops the blocks no longer needed") {
  kv_cache cache(small_config(32, 8));
  const sequence_id id = cache.create();
  cache.append(id, 100);  // 4 blocks
  const std::vector<std::uint32_t> table = table_of(cache, id);
  cache.truncate(id, 100);  // no-op
  CHECK(table_of(cache, id) == table);
  cache.truncate(id, 65);  // 3 blocks: a prefix of the table
  CHECK(cache.length(id) == 65);
  CHECK(table_of(cache, id) == std::vector<std::uint32_t>(table.begin(), table.begin() + 3));
  CHECK(cache.free_blocks() == 5);
  cache.truncate(id, 64);
  CHECK(cache.blocks_used(id) == 2);
  CHECK(cache.free_blocks() == 6);
  cache.truncate(id, 0);
  CHECK(cache.length(id) == 0);
  CHECK(cache.blocks_used(id) == 0);
  CHECK(cache.free_blocks() == 8);
  cache.append(id, 33);
  CHECK(cache.blocks_used(id) == 2);
  CHECK(cache.free_blocks() == 6);
}

TEST_CASE("kv_cache: fork shares blocks, references drop on free of either") {
  for (const bool parent_first : {true, false}) {
    CAPTURE(parent_first);
    kv_cache cache(small_config(64, 10));
    const sequence_id parent = cache.create();
    cache.append(parent, 150);  // 3 blocks
    CHECK(cache.free_blocks() == 7);
    const sequence_id child = cache.fork(parent);
    CHECK(cache.free_blocks() == 7);  // fork costs no block
    CHECK(cache.length(child) == 150);
    CHECK(cache.blocks_used(child) == 3);
    CHECK(table_of(cache, child) == table_of(cache, parent));
    const sequence_id grandchild = cache.fork(child);
    CHECK(table_of(cache, grandchild) == table_of(cache, parent));
    CHECK(cache.free_blocks() == 7);
    cache.free(parent_first ? parent : child);
    CHECK(cache.free_blocks() == 7);
    cache.free(grandchild);
    CHECK(cache.free_blocks() == 7);
    cache.free(parent_first ? child : parent);
    CHECK(cache.free_blocks() == 10);  // the last reference returns the blocks
  }
  // Forks of an empty sequence, and truncating a fork releases only its references.
  kv_cache cache(small_config(32, 4));
  const sequence_id empty = cache.fork(cache.create());
  CHECK(cache.length(empty) == 0);
  const sequence_id parent = cache.create();
  cache.append(parent, 64);
  const sequence_id child = cache.fork(parent);
  cache.truncate(child, 0);
  CHECK(cache.free_blocks() == 2);
  CHECK(cache.length(parent) == 64);
  cache.truncate(parent, 0);
  CHECK(cache.free_blocks() == 4);
}

TEST_CASE("kv_cache: copy-on-write after fork and truncate into a shared block") {
  for (const std::size_t block_size : block_sizes) {
    CAPTURE(block_size);
    kv_cache cache(small_config(block_size, 8));
    const std::size_t parent_length = 2 * block_size + block_size / 2;  // 3 blocks, the last half full
    const sequence_id parent = cache.create();
    cache.append(parent, parent_length);
    write_tokens(cache, parent, 0, parent_length, 1);
    std::vector<unsigned char> parent_tags(parent_length, 1);
    CHECK(cache.free_blocks() == 5);

    const sequence_id child = cache.fork(parent);
    CHECK(cache.free_blocks() == 5);
    const std::size_t cut = block_size + 3;  // into the shared block 1
    cache.truncate(child, cut);
    CHECK(cache.free_blocks() == 5);  // block 2 is still the parent's
    const std::vector<std::uint32_t> parent_table = table_of(cache, parent);
    CHECK(table_of(cache, child) == std::vector<std::uint32_t>(parent_table.begin(), parent_table.begin() + 2));

    // The child appends into the shared block: it gets a private copy.
    const std::vector<unsigned char> shared_before = block_contents(cache, parent_table[1]);
    cache.append(child, 5);
    CHECK(cache.free_blocks() == 4);
    const std::vector<std::uint32_t> child_table = table_of(cache, child);
    REQUIRE(child_table.size() == 2);
    CHECK(child_table[0] == parent_table[0]);  // full blocks stay shared
    CHECK(child_table[1] != parent_table[1]);
    CHECK(std::find(parent_table.begin(), parent_table.end(), child_table[1]) == parent_table.end());
    // The copy is the whole block, every layer, bitwise.
    CHECK(block_contents(cache, child_table[1]) == shared_before);
    write_tokens(cache, child, cut, cut + 5, 2);
    std::vector<unsigned char> child_tags(cut, 1);
    child_tags.resize(cut + 5, 2);

    // The parent appends into its own last block (exclusive): in place.
    cache.append(parent, 4);
    CHECK(table_of(cache, parent) == parent_table);
    CHECK(cache.free_blocks() == 4);
    write_tokens(cache, parent, parent_length, parent_length + 4, 3);
    parent_tags.resize(parent_length + 4, 3);

    CHECK(mismatches(cache, parent, parent_tags) == 0);
    CHECK(mismatches(cache, child, child_tags) == 0);
    // The parent's shared block 1 is untouched by the child's writes.
    CHECK(block_contents(cache, parent_table[1]) == shared_before);

    // Both fill their blocks and grow: still independent.
    const std::size_t child_more = 2 * block_size;
    cache.append(child, child_more);
    write_tokens(cache, child, cut + 5, cut + 5 + child_more, 4);
    child_tags.resize(cut + 5 + child_more, 4);
    cache.append(parent, block_size);
    write_tokens(cache, parent, parent_length + 4, parent_length + 4 + block_size, 5);
    parent_tags.resize(parent_length + 4 + block_size, 5);
    CHECK(mismatches(cache, parent, parent_tags) == 0);
    CHECK(mismatches(cache, child, child_tags) == 0);

    // Freeing the parent leaves the child's data; freeing both empties the pool.
    cache.free(parent);
    CHECK(cache.free_blocks() == 8 - cache.blocks_used(child));
    CHECK(mismatches(cache, child, child_tags) == 0);
    cache.free(child);
    CHECK(cache.free_blocks() == 8);
  }
}

TEST_CASE("kv_cache: a parent appending into its shared last block copies it, the child keeps the original") {
  kv_cache cache(small_config(32, 6));
  const sequence_id parent = cache.create();
  cache.append(parent, 40);  // blocks: full, partial
  write_tokens(cache, parent, 0, 40, 7);
  const sequence_id child = cache.fork(parent);
  const std::vector<std::uint32_t> before = table_of(cache, parent);
  cache.append(parent, 1);
  CHECK(cache.free_blocks() == 3);
  const std::vector<std::uint32_t> after = table_of(cache, parent);
  CHECK(after[0] == before[0]);
  CHECK(after[1] != before[1]);
  CHECK(table_of(cache, child) == before);
  write_tokens(cache, parent, 40, 41, 8);
  std::vector<unsigned char> parent_tags(40, 7);
  parent_tags.push_back(8);
  CHECK(mismatches(cache, parent, parent_tags) == 0);
  CHECK(mismatches(cache, child, std::vector<unsigned char>(40, 7)) == 0);
  // The child's block is exclusive again: its append is in place.
  cache.append(child, 2);
  CHECK(table_of(cache, child) == before);
  CHECK(cache.free_blocks() == 3);
}

TEST_CASE("kv_cache: appending after a fork at a block boundary copies nothing") {
  kv_cache cache(small_config(32, 6));
  const sequence_id parent = cache.create();
  cache.append(parent, 64);  // two full blocks
  const sequence_id child = cache.fork(parent);
  cache.append(child, 1);
  cache.append(parent, 1);
  CHECK(cache.free_blocks() == 2);  // one new block each, no copy
  const std::vector<std::uint32_t> p = table_of(cache, parent), c = table_of(cache, child);
  CHECK(p[0] == c[0]);
  CHECK(p[1] == c[1]);
  CHECK(p[2] != c[2]);
}

TEST_CASE("kv_cache: every error leaves the cache exactly as before") {
  // 8 blocks of 32 tokens. a: 70 tokens (3 blocks); b = fork(a) truncated to
  // 40 (shares a's blocks 0 and 1, block 1 partial); c: 32 tokens (1 block);
  // d freed. 4 blocks free.
  kv_cache cache(small_config(32, 8));
  fill_pool(cache);
  const sequence_id a = cache.create();
  cache.append(a, 70);
  const sequence_id b = cache.fork(a);
  cache.truncate(b, 40);
  const sequence_id c = cache.create();
  cache.append(c, 32);
  const sequence_id d = cache.create();
  cache.append(d, 5);
  cache.free(d);
  REQUIRE(cache.free_blocks() == 4);
  const std::vector<sequence_id> ids = {a, b, c};
  const snapshot before = take_snapshot(cache, ids);
  const sequence_id never = 1000;

  const auto refused = [&](auto&& call) {
    CHECK_THROWS_AS(call(), kv_cache_error);
    CHECK(take_snapshot(cache, ids) == before);
  };
  SUBCASE("unknown, zero and freed ids") {
    for (const sequence_id bad : {sequence_id{0}, d, never}) {
      CAPTURE(bad);
      refused([&] { cache.append(bad, 1); });
      refused([&] { cache.truncate(bad, 0); });
      refused([&] { (void)cache.fork(bad); });
      refused([&] { cache.free(bad); });
      refused([&] { (void)cache.length(bad); });
      refused([&] { (void)cache.blocks_used(bad); });
      refused([&] {
        std::size_t count = 0;
        (void)kv_cache_internals::block_table(cache, bad, &count);
      });
    }
    const sequence_id next = cache.create();  // ids are not consumed by errors
    CHECK(next == d + 1);
  }
  SUBCASE("append of 0 tokens") {
    refused([&] { cache.append(a, 0); });
  }
  SUBCASE("length overflow") {
    refused([&] { cache.append(a, size_max); });
    refused([&] { cache.append(a, size_max - 69); });
    refused([&] { cache.append(b, size_max - 39); });
  }
  SUBCASE("more blocks than the whole cache (no table is reserved for it)") {
    refused([&] { cache.append(a, size_max - 70); });
    refused([&] { cache.append(c, 8 * 32 + 1); });
  }
  SUBCASE("out of capacity by one block") {
    refused([&] { cache.append(a, 26 + 4 * 32 + 1); });  // 5 new blocks, 4 free
    refused([&] { cache.append(c, 4 * 32 + 1); });
    cache.append(a, 26 + 4 * 32);  // exactly 4: succeeds
    CHECK(cache.free_blocks() == 0);
    CHECK(cache.blocks_used(a) == 7);
  }
  SUBCASE("out of capacity only because of the copy-on-write block") {
    refused([&] { cache.append(b, 24 + 4 * 32); });  // 4 new + 1 copy, 4 free
    refused([&] { cache.append(b, 24 + 3 * 32 + 1); });
    cache.append(b, 24 + 3 * 32);  // 3 new + 1 copy: succeeds
    CHECK(cache.free_blocks() == 0);
    CHECK(table_of(cache, b)[1] != table_of(cache, a)[1]);
  }
  SUBCASE("truncate beyond the length") {
    refused([&] { cache.truncate(a, 71); });
    refused([&] { cache.truncate(b, 41); });
    refused([&] { cache.truncate(c, size_max); });
  }
  SUBCASE("double free") {
    const sequence_id e = cache.fork(c);
    cache.free(e);
    refused([&] { cache.free(e); });
  }
}

TEST_CASE("kv_cache: error messages name the call, the sequence and the numbers") {
  kv_cache cache(small_config(32, 3));
  const sequence_id a = cache.create();
  cache.append(a, 40);
  const sequence_id gone = cache.create();
  cache.free(gone);
  cache.append(cache.create(), 1);  // no block left
  CHECK_THROWS_WITH_AS(cache.append(77, 1), doctest::Contains("append: sequence 77 does not exist"), kv_cache_error);
  CHECK_THROWS_WITH_AS(cache.fork(gone), doctest::Contains("fork: sequence 2 was freed"), kv_cache_error);
  CHECK_THROWS_WITH_AS(cache.append(a, 0), doctest::Contains("0 tokens for sequence 1"), kv_cache_error);
  CHECK_THROWS_WITH_AS(cache.append(a, size_max), doctest::Contains("overflows"), kv_cache_error);
  CHECK_THROWS_WITH_AS(cache.append(a, 100), doctest::Contains("out of capacity"), kv_cache_error);
  CHECK_THROWS_WITH_AS(cache.append(a, 25), doctest::Contains("needs 1 free blocks (1 new), 0 of 3 free"),
                       kv_cache_error);
  CHECK_THROWS_WITH_AS(cache.truncate(a, 41), doctest::Contains("length 41 exceeds sequence 1's length 40"),
                       kv_cache_error);
  CHECK_THROWS_WITH_AS(cache.free(gone), doctest::Contains("free: sequence 2 was freed"), kv_cache_error);
  CHECK_THROWS_WITH_AS(cache.length(0), doctest::Contains("length: sequence 0 does not exist"), kv_cache_error);
}

TEST_CASE("kv_cache: invalid configurations throw std::invalid_argument naming the field") {
  const auto rejected = [](kv_cache_config config, const char* field) {
    CAPTURE(field);
    CHECK_THROWS_WITH_AS(kv_cache{config}, doctest::Contains(field), std::invalid_argument);
  };
  const kv_cache_config good = small_config(64, 4);
  CHECK_NOTHROW(kv_cache{good});
  kv_cache_config config = good;
  config.num_layers = 0;
  rejected(config, "num_layers");
  config = good;
  config.num_kv_heads = 0;
  rejected(config, "num_kv_heads");
  config = good;
  config.head_dim = 0;
  rejected(config, "head_dim");
  for (const std::size_t block_size : {1, 8, 15, 17, 31, 33, 48, 96, 255, 257, 512, 1024}) {
    config = good;
    config.block_size = block_size;
    config.capacity_bytes = size_max / 2;  // the block size is checked before any allocation
    rejected(config, "block_size");
  }
  config = good;
  config.capacity_bytes = 0;
  rejected(config, "capacity_bytes");
  config.capacity_bytes = 64 * 1024 - 1;  // one byte short of a block
  rejected(config, "capacity_bytes");
  config = good;
  config.head_dim = size_max;
  rejected(config, "head_dim");
  config.head_dim = size_max / 64;
  rejected(config, "head_dim");
  config = good;
  config.num_kv_heads = size_max / 4;
  rejected(config, "num_kv_heads");
  config = good;
  config.num_layers = size_max / 3;
  rejected(config, "num_layers");
  config = good;
  config.capacity_bytes = size_max;  // 2^48 blocks: more than a uint32 block index
  rejected(config, "capacity_bytes");
}

TEST_CASE("kv_cache: move-only, a moved cache keeps its sequences") {
  static_assert(!std::is_copy_constructible_v<kv_cache> && !std::is_copy_assignable_v<kv_cache>);
  static_assert(std::is_nothrow_move_constructible_v<kv_cache> && std::is_nothrow_move_assignable_v<kv_cache>);
  kv_cache first(small_config(32, 4));
  const sequence_id id = first.create();
  first.append(id, 40);
  write_tokens(first, id, 0, 40, 9);
  kv_cache second(std::move(first));
  CHECK(second.length(id) == 40);
  CHECK(mismatches(second, id, std::vector<unsigned char>(40, 9)) == 0);
  kv_cache third(small_config(64, 1));
  third = std::move(second);
  CHECK(third.total_blocks() == 4);
  CHECK(third.config().block_size == 32);
  third.append(id, 1);
  CHECK(third.free_blocks() == 2);
  CHECK(third.create() == id + 1);
}

// The written-up-to marks (kv_cache.hpp, "Writing"), per layer: 0 for a new
// sequence, kept by append, lowered by truncate, copied by fork.
TEST_CASE("kv_cache: written-up-to marks are kept by append and lowered by truncate and copied by fork" *
          doctest::test_suite("isolation")) {
  kv_cache cache(small_config(32, 8));
  const auto marks = [&](sequence_id id) {
    return std::vector<std::size_t>{kv_cache_internals::state(cache, id, 0).written,
                                    kv_cache_internals::state(cache, id, 1).written};
  };
  const sequence_id a = cache.create();
  CHECK(marks(a) == std::vector<std::size_t>{0, 0});
  cache.append(a, 70);
  CHECK(marks(a) == std::vector<std::size_t>{0, 0});
  kv_cache_internals::set_written(cache, a, 0, 70);
  kv_cache_internals::set_written(cache, a, 1, 50);
  const kv_cache_internals::layer_state state = kv_cache_internals::state(cache, a, 1);
  CHECK(state.length == 70);
  CHECK(state.blocks == 3);
  CHECK(std::vector<std::uint32_t>(state.table, state.table + state.blocks) == table_of(cache, a));
  cache.append(a, 5);
  CHECK(marks(a) == std::vector<std::size_t>{70, 50});
  const sequence_id b = cache.fork(a);
  CHECK(marks(b) == std::vector<std::size_t>{70, 50});
  cache.truncate(a, 60);
  CHECK(marks(a) == std::vector<std::size_t>{60, 50});
  cache.truncate(a, 10);
  CHECK(marks(a) == std::vector<std::size_t>{10, 10});
  CHECK(marks(b) == std::vector<std::size_t>{70, 50});  // the fork's own
  CHECK(kv_cache_internals::references(cache, table_of(cache, a)[0]) == 2);
  CHECK(kv_cache_internals::references(cache, table_of(cache, b)[2]) == 1);
  const std::uint32_t dropped = table_of(cache, b)[2];
  cache.free(b);
  CHECK(kv_cache_internals::references(cache, dropped) == 0);
  CHECK_THROWS_AS((void)kv_cache_internals::state(cache, b, 0), kv_cache_error);
}

// Debug builds (NDEBUG not defined) fill a block with NaN when its last
// reference goes (free, truncate, the source of a copy-on-write); release
// builds leave it as it was. Blocks still held are never touched.
TEST_CASE("kv_cache: a debug build poisons blocks returning to the pool with NaN" * doctest::test_suite("isolation")) {
#ifdef NDEBUG
  CHECK_FALSE(kv_cache_internals::poisons_freed_blocks());
#else
  CHECK(kv_cache_internals::poisons_freed_blocks());
#endif
  const bool poisons = kv_cache_internals::poisons_freed_blocks();
  kv_cache cache(small_config(32, 6));
  const auto all = [&](std::uint32_t block, bool nan) {
    const std::vector<unsigned char> bytes = block_contents(cache, block);
    for (std::size_t at = 0; at < bytes.size(); at += sizeof(float)) {
      float value = 0;
      std::memcpy(&value, bytes.data() + at, sizeof value);
      if (std::isnan(value) != nan) return false;
    }
    return true;
  };
  // Three whole blocks, every slot written: a slot never written holds
  // whatever the pool's memory held (an earlier cache's poison, when other
  // tests ran before in the same process).
  const sequence_id a = cache.create();
  cache.append(a, 96);
  write_tokens(cache, a, 0, 96, 1);
  const std::vector<std::uint32_t> table = table_of(cache, a);
  const sequence_id b = cache.fork(a);
  cache.truncate(a, 40);  // block 2 still held by b
  CHECK(all(table[2], false));
  cache.free(b);  // now block 2's last reference goes
  CHECK(all(table[2], poisons));
  CHECK(all(table[0], false));
  cache.append(a, 1);  // in place: block 1 is a's alone
  const sequence_id c = cache.fork(a);
  cache.append(c, 1);  // copy-on-write: the source keeps a's reference
  CHECK(all(table[1], false));
  cache.free(a);  // block 1's last reference goes; block 0 is c's still
  CHECK(all(table[1], poisons));
  CHECK(mismatches(cache, c, std::vector<unsigned char>(41, 1)) == 0);
}

// One thread's copy-on-write must be ordered before the other holder's
// in-place write of the source block. The child's thread signals through a
// relaxed atomic, which orders nothing for ThreadSanitizer: only the cache's
// own lock can make the copy happen before the parent's write. A cache that
// dropped its reference before copying gets a race report here (checked).
TEST_CASE("kv_cache: concurrent copy-on-write is ordered before the last holder writes in place" *
          doctest::test_suite("concurrency")) {
  for (int round = 0; round < 8; ++round) {
    CAPTURE(round);
    kv_cache cache(small_config(32, 4));
    const sequence_id parent = cache.create();
    cache.append(parent, 40);
    write_tokens(cache, parent, 0, 40, 1);
    const sequence_id child = cache.fork(parent);
    std::atomic<bool> copied{false}, written{false};
    std::thread child_thread([&] {
      cache.append(child, 1);
      copied.store(true, std::memory_order_relaxed);
      // No other call (hence no lock) until the parent has written.
      while (!written.load(std::memory_order_relaxed)) std::this_thread::yield();
      write_tokens(cache, child, 40, 41, 2);
    });
    std::thread parent_thread([&] {
      while (!copied.load(std::memory_order_relaxed)) std::this_thread::yield();
      cache.append(parent, 1);  // the last block is the parent's alone again: in place
      write_tokens(cache, parent, 40, 41, 3);
      written.store(true, std::memory_order_relaxed);
    });
    child_thread.join();
    parent_thread.join();
    std::vector<unsigned char> tags(40, 1);
    tags.push_back(3);
    CHECK(mismatches(cache, parent, tags) == 0);
    tags.back() = 2;
    CHECK(mismatches(cache, child, tags) == 0);
    CHECK(cache.free_blocks() == 1);
  }
}

// Threads on distinct sequences. Every thread starts with its own fork of a
// shared root (so copy-on-write of the root's partial last block runs in
// several threads at once) and thread 0 also owns the root. Each thread then
// runs a fixed-seed loop of create / append (+ write the new tokens, as a
// kernel would) / fork / truncate / free / verify on its own sequences, with a
// model of the expected tag of every token. The pool is small, so appends
// also fail for lack of capacity, which must leave the sequence unchanged.
TEST_CASE("kv_cache: concurrent create/append/fork/truncate/free on distinct sequences" *
          doctest::test_suite("concurrency")) {
  constexpr std::size_t threads = 4, iterations = 300, block_size = 32;
  kv_cache cache(small_config(block_size, 20));
  const std::size_t total = cache.total_blocks();

  struct tracked {
    sequence_id id = 0;
    sequence_id family = 0;  // the root of its fork tree
    std::vector<unsigned char> tags;
  };
  const sequence_id root = cache.create();
  cache.append(root, 3 * block_size + 7);
  write_tokens(cache, root, 0, 3 * block_size + 7, 200);
  std::vector<std::vector<tracked>> owned(threads);
  owned[0].push_back({root, root, std::vector<unsigned char>(3 * block_size + 7, 200)});
  for (std::size_t t = 0; t < threads; ++t)
    owned[t].push_back({cache.fork(root), root, std::vector<unsigned char>(3 * block_size + 7, 200)});

  std::vector<std::string> failures(threads);
  std::vector<std::size_t> refused(threads, 0), copies(threads, 0);
  const auto work = [&](std::size_t t) {
    std::mt19937 random(static_cast<std::uint32_t>(1234 + t));
    std::vector<tracked>& mine = owned[t];
    const auto fail = [&](const std::string& what) {
      if (failures[t].empty()) failures[t] = what;
    };
    const auto pick = [&]() -> std::size_t { return random() % mine.size(); };
    for (std::size_t step = 0; step < iterations && failures[t].empty(); ++step) {
      const unsigned op = mine.empty() ? 0 : random() % 10;
      const unsigned tag = static_cast<unsigned>(t * 50 + step % 50);
      try {
        if (op == 0) {  // create
          const sequence_id id = cache.create();
          mine.push_back({id, id, {}});
        } else if (op <= 4) {  // append 1..40 tokens, then write them
          tracked& s = mine[pick()];
          const std::size_t tokens = 1 + random() % 40, length = s.tags.size();
          const std::vector<std::uint32_t> before = table_of(cache, s.id);
          try {
            cache.append(s.id, tokens);
          } catch (const kv_cache_error&) {
            ++refused[t];
            if (cache.length(s.id) != length || table_of(cache, s.id) != before) fail("refused append changed");
            continue;
          }
          const std::vector<std::uint32_t> after = table_of(cache, s.id);
          if (length % block_size != 0 && after[length / block_size] != before[length / block_size]) ++copies[t];
          if (cache.length(s.id) != length + tokens || after.size() != ceil_div(length + tokens, block_size))
            fail("append length");
          write_tokens(cache, s.id, length, length + tokens, tag);
          s.tags.resize(length + tokens, static_cast<unsigned char>(tag));
        } else if (op == 5 && mine.size() < 6) {  // fork
          const tracked& parent = mine[pick()];
          tracked child{cache.fork(parent.id), parent.family, parent.tags};
          if (table_of(cache, child.id) != table_of(cache, parent.id)) fail("fork table");
          mine.push_back(std::move(child));
        } else if (op == 6) {  // truncate
          tracked& s = mine[pick()];
          const std::size_t length = s.tags.empty() ? 0 : random() % (s.tags.size() + 1);
          cache.truncate(s.id, length);
          s.tags.resize(length);
          if (cache.blocks_used(s.id) != ceil_div(length, block_size)) fail("truncate blocks");
        } else if (op <= 8) {  // free
          const std::size_t index = pick();
          cache.free(mine[index].id);
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(index));
        } else {  // verify
          const tracked& s = mine[pick()];
          if (mismatches(cache, s.id, s.tags) != 0) fail("data of sequence " + std::to_string(s.id));
        }
      } catch (const std::exception& error) {
        fail(std::string("unexpected exception: ") + error.what());
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(work, t);
  for (std::thread& thread : pool) thread.join();

  for (std::size_t t = 0; t < threads; ++t) {
    CAPTURE(t);
    CHECK(failures[t] == "");
  }
  std::size_t total_refused = 0, total_copies = 0;
  for (std::size_t t = 0; t < threads; ++t) total_refused += refused[t], total_copies += copies[t];
  CHECK(total_refused > 0);  // the pool is small enough to run out
  CHECK(total_copies > 0);

  // Consistency: every referenced block is counted once against the pool; a
  // block in two tables only within one fork family, at the same index; the
  // data matches every sequence's model.
  std::map<std::uint32_t, std::vector<std::pair<sequence_id, std::size_t>>> holders;  // block -> (family, index)
  for (const auto& list : owned)
    for (const tracked& s : list) {
      CHECK(cache.length(s.id) == s.tags.size());
      CHECK(mismatches(cache, s.id, s.tags) == 0);
      const std::vector<std::uint32_t> table = table_of(cache, s.id);
      CHECK(table.size() == ceil_div(s.tags.size(), block_size));
      CHECK(std::set<std::uint32_t>(table.begin(), table.end()).size() == table.size());
      for (std::size_t i = 0; i < table.size(); ++i) holders[table[i]].push_back({s.family, i});
    }
  CHECK(cache.free_blocks() + holders.size() == total);
  for (const auto& [block, list] : holders)
    for (const auto& holder : list) CHECK(holder == list.front());
  for (const auto& list : owned)
    for (const tracked& s : list) cache.free(s.id);
  CHECK(cache.free_blocks() == total);
}

}  // namespace
