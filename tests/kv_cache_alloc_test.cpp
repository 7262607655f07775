// The KV cache allocates nothing per token in steady state: this executable
// replaces every global operator new/delete with counting versions and checks
// that, once a sequence's block table has grown (warm-up), appends of single
// tokens (crossing block boundaries too), copy-on-write appends, truncates
// and the queries make zero allocations. A separate executable because the
// replacement is global.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "engine/cache/kv_cache_internals.hpp"
#include "kvhead/kv_cache.hpp"

namespace {

std::atomic<std::size_t> allocations{0};

void* counted_allocate(std::size_t size, std::size_t alignment) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (size == 0) size = 1;
  if (alignment <= alignof(std::max_align_t)) return std::malloc(size);
  void* pointer = nullptr;
  return posix_memalign(&pointer, alignment, size) == 0 ? pointer : nullptr;
}

void* counted_allocate_or_throw(std::size_t size, std::size_t alignment) {
  if (void* pointer = counted_allocate(size, alignment)) return pointer;
  throw std::bad_alloc();
}

std::size_t align_of(std::align_val_t alignment) { return static_cast<std::size_t>(alignment); }

}  // namespace

void* operator new(std::size_t size) { return counted_allocate_or_throw(size, 0); }
void* operator new[](std::size_t size) { return counted_allocate_or_throw(size, 0); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted_allocate(size, 0); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return counted_allocate(size, 0); }
void* operator new(std::size_t size, std::align_val_t alignment) {
  return counted_allocate_or_throw(size, align_of(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return counted_allocate_or_throw(size, align_of(alignment));
}
void* operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_allocate(size, align_of(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_allocate(size, align_of(alignment));
}
void operator delete(void* pointer) noexcept { std::free(pointer); }
void operator delete[](void* pointer) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::size_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::size_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, const std::nothrow_t&) noexcept { std::free(pointer); }
void operator delete[](void* pointer, const std::nothrow_t&) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::align_val_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::align_val_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::size_t, std::align_val_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::size_t, std::align_val_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::align_val_t, const std::nothrow_t&) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::align_val_t, const std::nothrow_t&) noexcept { std::free(pointer); }

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
  const std::size_t start = allocations.load();
  kv_cache cache(config_for(32, 4));
  CHECK(allocations.load() > start);  // the impl and the pool
  const std::size_t created = allocations.load();
  const sequence_id id = cache.create();
  cache.append(id, 1);
  CHECK(allocations.load() > created);  // the sequence entry and its table
}

TEST_CASE("kv_cache alloc: 1000 single-token appends into reserved capacity allocate nothing") {
  for (const std::size_t block_size : {std::size_t{0}, std::size_t{32}, std::size_t{256}}) {
    CAPTURE(block_size);
    kv_cache cache(config_for(block_size, 40));
    const sequence_id id = cache.create();
    cache.append(id, 1100);  // warm-up: grows the block table
    cache.truncate(id, 1);   // keeps the table's capacity, returns the blocks

    std::size_t checksum = 0;
    const std::size_t before = allocations.load();
    for (int i = 0; i < 1000; ++i) {
      cache.append(id, 1);  // new blocks come from the pool every block_size tokens
      std::size_t count = 0;
      checksum += kv_cache_internals::block_table(cache, id, &count)[count - 1];
      checksum += cache.length(id) + cache.blocks_used(id) + cache.free_blocks() + cache.bytes_in_use();
    }
    cache.truncate(id, 500);
    cache.append(id, 300);
    const std::size_t during = allocations.load() - before;
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
  const std::size_t before = allocations.load();
  cache.append(child, 1);   // copies the shared last block
  cache.append(parent, 1);  // exclusive again: in place
  cache.truncate(child, 10);
  cache.free(parent);       // the node is freed; nothing is allocated
  const std::size_t during = allocations.load() - before;
  CHECK(during == 0);
  CHECK(cache.free_blocks() == free_before + 4 - 1);
}

}  // namespace
