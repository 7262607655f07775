// The paged KV cache: a block pool, reference counts, LIFO free lists and a
// table of sequences (include/kvhead/kv_cache.hpp has the contract).
//
// Block order. The free blocks are kept in one stack per place in a group
// (index % G, "Block layout"). A sequence's table entry p takes the block
// after entry p - 1's when p % G != 0 and that block is free (it is then at
// place p % G of the same group), else the top of stack p % G (another
// stack only when that one is empty). A fresh cache's stacks hold their
// blocks lowest first, so each sequence's blocks are consecutive from a
// group's start and each of its 256-token runs is one group: its K or V
// regions of a kv head one stream. Truncate and free push a table's blocks
// last first: the next appends take them back in their old order. (With
// one stack, a sequence following another of 4097 tokens started one block
// into a group, and every chunk of 256 keys it read was two streams for K
// and two for V: S1 decode at blocks 16-128 5-13% slower, Zen 5.)
//
// Locking. One mutex guards the sequence map, the reference counts, the free
// lists and the id counter. A sequence's own fields (length, block table) are
// touched only by calls naming that sequence, which the contract forbids to
// overlap when one modifies it, so they are read and written outside the lock
// (the map's nodes are stable: another sequence's insert or erase never moves
// them).
//
// Copy-on-write with the lock released. append() takes the fresh block and
// points its table at it under the lock, copies outside it, and only then, under
// the lock again, drops its reference to the shared source. The source's count
// thus stays above 1 during the copy, so no other holder can start writing it
// in place (a concurrent append on another holder copies it too).
//
// Strong guarantee. Every check runs, and the table capacity is reserved (the
// only step that may allocate), before anything is taken from the pool.
//
// Written-up-to marks. Each sequence keeps, per layer, how many of its leading
// positions hold K/V written by a forward (kv_cache_internals::set_written).
// append leaves them, truncate lowers them to the new length, fork copies
// them. A debug build (NDEBUG not defined) fills a block with all-ones bytes
// (NaN in every dtype) when it
// returns to the pool, so a read of a recycled slot shows in the results.
#include "kvhead/kv_cache.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <iterator>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/arch/aligned_buffer.hpp"
#include "engine/arch/checked_size.hpp"
#include "engine/cache/kv_cache_internals.hpp"
#include "engine/gemm/stored_element.hpp"

namespace kvhead {

namespace {

using engine::ceil_div;
using engine::kv_panel_multiple;
constexpr std::size_t min_table_capacity = 8;  // first growth of a block table
constexpr std::size_t region_alignment = 64;   // bytes: every region starts on a cache line
#ifdef NDEBUG
constexpr bool poison_freed_blocks = false;
#else
constexpr bool poison_freed_blocks = true;  // debug builds: a freed block reads as NaN in every dtype
#endif

/// a * b, or throws std::invalid_argument(message) when it overflows.
std::size_t checked_product(std::size_t a, std::size_t b, const char* message) {
  const std::optional<std::size_t> product = engine::checked_product({a, b});
  if (!product) throw std::invalid_argument(message);
  return *product;
}

/// a + b, or throws std::invalid_argument(message) when it overflows.
std::size_t checked_sum(std::size_t a, std::size_t b, const char* message) {
  const std::optional<std::size_t> sum = engine::checked_sum(a, b);
  if (!sum) throw std::invalid_argument(message);
  return *sum;
}

std::size_t checked_round_up(std::size_t value, std::size_t multiple, const char* message) {
  return checked_sum(value, multiple - 1, message) / multiple * multiple;
}

/// `requested` with block_size resolved; throws std::invalid_argument naming
/// the field of an invalid one.
kv_cache_config validated(const kv_cache_config& requested) {
  kv_cache_config config = requested;
  if (config.num_layers == 0) throw std::invalid_argument("kv_cache_config.num_layers must be at least 1");
  if (config.num_kv_heads == 0) throw std::invalid_argument("kv_cache_config.num_kv_heads must be at least 1");
  if (config.head_dim == 0) throw std::invalid_argument("kv_cache_config.head_dim must be at least 1");
  if (config.block_size == 0) config.block_size = kv_cache_default_block_size;
  if (std::ranges::find(kv_cache_block_sizes, config.block_size) == std::end(kv_cache_block_sizes))
    throw std::invalid_argument("kv_cache_config.block_size must be 16, 32, 64, 128 or 256 (or 0 for " +
                                std::to_string(kv_cache_default_block_size) + "), got " +
                                std::to_string(requested.block_size));
  if (static_cast<std::size_t>(config.dtype) >= engine::stored_dtype_count)
    throw std::invalid_argument("kv_cache_config.dtype is not one of f32, bf16, f16, int8");
  return config;
}

/// The "Block layout" of kv_cache.hpp for a validated configuration.
struct block_layout {
  std::size_t region_bytes = 0, scales_offset = 0, block_bytes = 0;
};

block_layout layout_of(const kv_cache_config& config) {
  const char* too_large = "kv_cache_config: num_layers * num_kv_heads * head_dim too large (block_bytes overflows)";
  const std::size_t padded_dim = checked_round_up(config.head_dim, kv_panel_multiple, too_large);
  const std::size_t elements = std::max(checked_product(config.head_dim, config.block_size, too_large),
                                        checked_product(config.block_size, padded_dim, too_large));
  block_layout layout;
  layout.scales_offset = checked_round_up(checked_product(elements, engine::element_bytes(config.dtype), too_large),
                                          region_alignment, too_large);
  const std::size_t scales_bytes =
      config.dtype == kv_dtype::int8 ? ceil_div(config.block_size * sizeof(float), region_alignment) * region_alignment
                                     : 0;
  layout.region_bytes = checked_sum(layout.scales_offset, scales_bytes, too_large);
  const std::size_t regions =
      checked_product(checked_product(config.num_layers, config.num_kv_heads, too_large), 2, too_large);
  layout.block_bytes = checked_product(regions, layout.region_bytes, too_large);
  return layout;
}

}  // namespace

std::size_t kv_cache_block_bytes(const kv_cache_config& config) { return layout_of(validated(config)).block_bytes; }

const char* to_string(kv_dtype dtype) {
  switch (dtype) {
    case kv_dtype::f32:
      return "f32";
    case kv_dtype::bf16:
      return "bf16";
    case kv_dtype::f16:
      return "f16";
    case kv_dtype::int8:
      return "int8";
  }
  return "unknown";
}

struct kv_cache::impl {
  struct sequence {
    std::size_t length = 0;
    std::vector<std::uint32_t> blocks;  // ceil(length / block_size) entries; the first `dropped` are dropped_block
    std::vector<std::size_t> written;   // per layer: positions [0, written) hold K/V; <= length
    std::size_t dropped = 0;            // leading table entries dropped (drop_outside_window)
  };

  kv_cache_config config;
  std::size_t region_bytes = 0;       // one K or V region ("Block layout")
  std::size_t scales_offset = 0;      // int8: byte offset of a region's scales
  std::size_t block_bytes = 0;        // regions_per_block * region_bytes
  std::size_t regions_per_block = 0;  // 2 * num_layers * num_kv_heads
  std::size_t group_blocks = 0;       // blocks per group: kv_group_tokens / block_size ("Block layout")
  std::size_t total_blocks = 0;
  engine::float_storage pool;

  // Guarded by mutex.
  mutable std::mutex mutex;
  std::vector<std::size_t> references;   // per block; 0 = free
  // Per place p < group_blocks, the free blocks of index % group_blocks ==
  // p, a stack reserved for all of them; free_count in all.
  std::vector<std::vector<std::uint32_t>> free_by_place;
  std::size_t free_count = 0;
  std::unordered_map<sequence_id, sequence> sequences;
  sequence_id next_id = 1;

  explicit impl(const kv_cache_config& requested);

  /// The live sequence `id`; throws kv_cache_error naming `call` otherwise.
  /// Requires the lock.
  sequence& find(sequence_id id, const char* call) { return find_for(id, "kv_cache::", call); }
  /// The same, the message naming prefix + call (a call outside kv_cache:
  /// prefix ""). Allocates nothing unless it throws.
  sequence& find_for(sequence_id id, const char* prefix, const char* call) {
    const auto found = sequences.find(id);
    if (found != sequences.end()) return found->second;
    const bool was_created = id >= 1 && id < next_id;
    throw kv_cache_error(std::string(prefix) + call + ": sequence " + std::to_string(id) +
                         (was_created ? " was freed" : " does not exist (never created)"));
  }

  /// A free block for entry `position` of `table` (entries before it
  /// filled), now referenced once ("Block order" above). Requires the lock
  /// and a free block.
  std::uint32_t take(const std::vector<std::uint32_t>& table, std::size_t position) {
    assert(free_count > 0);
    std::size_t place = position % group_blocks;
    std::uint32_t block = 0;
    const std::size_t next = position > 0 ? std::size_t{table[position - 1]} + 1 : 0;  // dropped: 2^32, none
    if (place != 0 && next < total_blocks && next % group_blocks == place && references[next] == 0) {
      block = static_cast<std::uint32_t>(next);  // place `place` of the previous block's group: in that place's stack
      std::vector<std::uint32_t>& stack = free_by_place[place];
      const auto found = std::find(stack.rbegin(), stack.rend(), block);  // near the top in practice
      assert(found != stack.rend());
      stack.erase(found.base() - 1);
    } else {
      while (free_by_place[place].empty()) place = (place + 1) % group_blocks;
      block = free_by_place[place].back();
      free_by_place[place].pop_back();
    }
    --free_count;
    assert(references[block] == 0);
    references[block] = 1;
    return block;
  }

  /// Drops one reference to `block` (nothing for a dropped entry). Requires the lock.
  void release(std::uint32_t block) {
    if (block == engine::dropped_block) return;
    assert(references[block] > 0);
    if (--references[block] != 0) return;
    if constexpr (poison_freed_blocks)  // all-ones bytes: NaN as f32, bf16 and f16, and as int8 blocks' fp32 scales
      for (std::size_t r = 0; r < regions_per_block; ++r) std::memset(region(block, r), 0xff, region_bytes);
    free_by_place[block % group_blocks].push_back(block);  // within capacity: never allocates
    ++free_count;
  }

  /// Capacity for at least `entries` table entries: doubling, capped at
  /// total_blocks while the table fits in it (more only for a sequence whose
  /// dropped entries hold no block: drop_outside_window).
  void reserve_table(std::vector<std::uint32_t>& table, std::size_t entries) const {
    if (table.capacity() >= entries) return;
    const std::size_t grown = std::max(2 * table.capacity(), min_table_capacity);
    table.reserve(std::max(entries, entries <= total_blocks ? std::min(grown, total_blocks) : grown));
  }

  /// Region `region` ((layer * num_kv_heads + kv_head) * 2 + value) of
  /// block `index`: in the block's group, the group's blocks hold that
  /// region side by side ("Block layout" in kv_cache.hpp).
  std::byte* region(std::uint32_t index, std::size_t region) const {
    assert(index < total_blocks && region < regions_per_block);
    return reinterpret_cast<std::byte*>(pool.get()) + geometry().offset(index, region);
  }
  engine::region_geometry geometry() const { return {block_bytes, region_bytes, group_blocks, total_blocks}; }
};

kv_cache::impl::impl(const kv_cache_config& requested) : config(validated(requested)) {
  const block_layout layout = layout_of(config);
  region_bytes = layout.region_bytes;
  scales_offset = layout.scales_offset;
  block_bytes = layout.block_bytes;
  regions_per_block = block_bytes / region_bytes;
  group_blocks = engine::kv_group_tokens / config.block_size;

  total_blocks = config.capacity_bytes / block_bytes;
  if (total_blocks == 0)
    throw std::invalid_argument("kv_cache_config.capacity_bytes = " + std::to_string(config.capacity_bytes) +
                                " holds no block of " + std::to_string(block_bytes) + " bytes");
  if (total_blocks > std::numeric_limits<std::uint32_t>::max())
    throw std::invalid_argument("kv_cache_config.capacity_bytes = " + std::to_string(config.capacity_bytes) +
                                " makes " + std::to_string(total_blocks) +
                                " blocks, more than the 2^32 - 1 a block table can index");

  // Not zeroed: untouched pages stay uncommitted until first written. Huge
  // pages where offered (engine/arch/aligned_buffer.hpp): decode streams K/V
  // from DRAM.
  pool = engine::allocate_floats(total_blocks * block_bytes / sizeof(float));
  references.assign(total_blocks, 0);
  free_by_place.resize(group_blocks);
  for (std::size_t place = 0; place < group_blocks; ++place)
    free_by_place[place].reserve(ceil_div(total_blocks, group_blocks));
  for (std::size_t i = total_blocks; i-- > 0;)  // the lowest index of each place on top
    free_by_place[i % group_blocks].push_back(static_cast<std::uint32_t>(i));
  free_count = total_blocks;
}

kv_cache::kv_cache(const kv_cache_config& config) : impl_(std::make_unique<impl>(config)) {}
kv_cache::~kv_cache() = default;
kv_cache::kv_cache(kv_cache&&) noexcept = default;
kv_cache& kv_cache::operator=(kv_cache&&) noexcept = default;

const kv_cache_config& kv_cache::config() const { return impl_->config; }
kv_dtype kv_cache::dtype() const { return impl_->config.dtype; }

sequence_id kv_cache::create() {
  impl& cache = *impl_;
  impl::sequence fresh;
  fresh.written.assign(cache.config.num_layers, 0);  // may throw bad_alloc: nothing changed
  const std::lock_guard lock(cache.mutex);
  cache.sequences.try_emplace(cache.next_id, std::move(fresh));  // likewise
  return cache.next_id++;
}

void kv_cache::append(sequence_id id, std::size_t tokens) {
  impl& cache = *impl_;
  const std::size_t block_size = cache.config.block_size;
  std::unique_lock lock(cache.mutex);
  impl::sequence& sequence = cache.find(id, "append");
  if (tokens == 0)
    throw kv_cache_error("kv_cache::append: 0 tokens for sequence " + std::to_string(id) + " (append at least 1)");
  const std::size_t length = sequence.length;
  if (tokens > std::numeric_limits<std::size_t>::max() - length)
    throw kv_cache_error("kv_cache::append: sequence " + std::to_string(id) + " of length " + std::to_string(length) +
                         " + " + std::to_string(tokens) + " tokens overflows the length");
  const std::size_t new_length = length + tokens;
  const std::size_t entries = ceil_div(new_length, block_size);
  const std::size_t held = entries - sequence.dropped;  // the dropped entries hold no block
  if (held > cache.total_blocks)
    throw kv_cache_error(
        "kv_cache::append: out of capacity: sequence " + std::to_string(id) + " of length " + std::to_string(length) +
        " + " + std::to_string(tokens) + " tokens needs " + std::to_string(held) + " blocks" +
        (sequence.dropped != 0 ? " (positions from " + std::to_string(sequence.dropped * block_size) + " on)"
                               : std::string()) +
        ", the cache has " + std::to_string(cache.total_blocks));

  // Table room first, outside the lock: the sequence is ours (contract).
  if (sequence.blocks.capacity() < entries) {
    lock.unlock();
    cache.reserve_table(sequence.blocks, entries);
    lock.lock();
  }

  const std::size_t fresh = entries - sequence.blocks.size();
  const bool partial = length % block_size != 0;
  const bool copy = partial && cache.references[sequence.blocks.back()] > 1;
  const std::size_t wanted = fresh + (copy ? 1 : 0);
  if (wanted > cache.free_count)
    throw kv_cache_error("kv_cache::append: out of capacity: sequence " + std::to_string(id) + " of length " +
                         std::to_string(length) + " + " + std::to_string(tokens) + " tokens needs " +
                         std::to_string(wanted) + " free blocks (" + std::to_string(fresh) + " new" +
                         (copy ? " + 1 copy-on-write" : "") + "), " + std::to_string(cache.free_count) + " of " +
                         std::to_string(cache.total_blocks) + " free");

  // Nothing below throws.
  std::uint32_t shared = 0, target = 0;
  if (copy) {
    shared = sequence.blocks.back();
    target = cache.take(sequence.blocks, sequence.blocks.size() - 1);
    sequence.blocks.back() = target;
  }
  for (std::size_t i = 0; i < fresh; ++i)
    sequence.blocks.push_back(cache.take(sequence.blocks, sequence.blocks.size()));
  sequence.length = new_length;
  if (copy) {
    lock.unlock();
    for (std::size_t r = 0; r < cache.regions_per_block; ++r)
      std::memcpy(cache.region(target, r), cache.region(shared, r), cache.region_bytes);
    lock.lock();
    cache.release(shared);
  }
}

sequence_id kv_cache::fork(sequence_id parent_id) {
  impl& cache = *impl_;
  std::unique_lock lock(cache.mutex);
  const impl::sequence& parent = cache.find(parent_id, "fork");
  lock.unlock();

  // fork only reads the parent, whose blocks stay referenced meanwhile.
  impl::sequence child;
  child.length = parent.length;
  child.written = parent.written;
  child.dropped = parent.dropped;
  cache.reserve_table(child.blocks, parent.blocks.size());
  child.blocks.assign(parent.blocks.begin(), parent.blocks.end());

  lock.lock();
  const sequence_id id = cache.next_id;
  const auto [position, inserted] = cache.sequences.try_emplace(id, std::move(child));  // may throw
  assert(inserted);
  for (const std::uint32_t block : position->second.blocks)
    if (block != engine::dropped_block) ++cache.references[block];
  ++cache.next_id;
  return id;
}

void kv_cache::truncate(sequence_id id, std::size_t length) {
  impl& cache = *impl_;
  const std::lock_guard lock(cache.mutex);
  impl::sequence& sequence = cache.find(id, "truncate");
  if (length > sequence.length)
    throw kv_cache_error("kv_cache::truncate: length " + std::to_string(length) + " exceeds sequence " +
                         std::to_string(id) + "'s length " + std::to_string(sequence.length));
  const std::size_t dropped = sequence.dropped * cache.config.block_size;
  if (length < dropped)
    throw kv_cache_error("kv_cache::truncate: length " + std::to_string(length) + " of sequence " + std::to_string(id) +
                         " is below its dropped positions (0 to " + std::to_string(dropped - 1) +
                         ", kv_cache::drop_outside_window)");
  const std::size_t entries = ceil_div(length, cache.config.block_size);
  for (std::size_t i = sequence.blocks.size(); i > entries; --i) cache.release(sequence.blocks[i - 1]);
  sequence.blocks.resize(entries);  // shrinks: keeps the capacity
  sequence.length = length;
  for (std::size_t& written : sequence.written) written = std::min(written, length);
}

void kv_cache::free(sequence_id id) {
  impl& cache = *impl_;
  std::unique_lock lock(cache.mutex);
  cache.find(id, "free");
  auto node = cache.sequences.extract(id);
  const std::vector<std::uint32_t>& blocks = node.mapped().blocks;
  for (auto block = blocks.rbegin(); block != blocks.rend(); ++block) cache.release(*block);
  lock.unlock();
  // node (and its table) is destroyed here, outside the lock.
}

std::size_t kv_cache::drop_outside_window(sequence_id id, std::size_t window) {
  impl& cache = *impl_;
  const std::lock_guard lock(cache.mutex);
  impl::sequence& sequence = cache.find(id, "drop_outside_window");
  if (window == 0)
    throw kv_cache_error("kv_cache::drop_outside_window: sequence " + std::to_string(id) +
                         ": window 0 (a window holds at least 1 key)");
  // The earliest future query is at the lowest mark; it sees keys from mark + 1 - window on.
  const std::size_t mark = *std::min_element(sequence.written.begin(), sequence.written.end());
  const std::size_t first_seen = mark + 1 > window ? mark + 1 - window : 0;
  const std::size_t keep_from = std::min(first_seen / cache.config.block_size, sequence.blocks.size());
  const std::size_t before = sequence.dropped;
  for (; sequence.dropped < keep_from; ++sequence.dropped) {
    cache.release(sequence.blocks[sequence.dropped]);
    sequence.blocks[sequence.dropped] = engine::dropped_block;
  }
  return sequence.dropped > before ? sequence.dropped - before : 0;
}

std::size_t kv_cache::dropped(sequence_id id) const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->find(id, "dropped").dropped * impl_->config.block_size;
}

std::size_t kv_cache::length(sequence_id id) const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->find(id, "length").length;
}

std::size_t kv_cache::blocks_used(sequence_id id) const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->find(id, "blocks_used").blocks.size();
}

std::size_t kv_cache::total_blocks() const { return impl_->total_blocks; }

std::size_t kv_cache::free_blocks() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->free_count;
}

std::size_t kv_cache::free_tokens() const { return free_blocks() * impl_->config.block_size; }
std::size_t kv_cache::bytes_per_token() const { return impl_->block_bytes / impl_->config.block_size; }
std::size_t kv_cache::block_bytes() const { return impl_->block_bytes; }
std::size_t kv_cache::bytes_in_use() const { return (total_blocks() - free_blocks()) * impl_->block_bytes; }

namespace engine {

const std::uint32_t* kv_cache_internals::block_table(const kv_cache& cache, sequence_id sequence, std::size_t* count) {
  assert(count != nullptr);
  const std::lock_guard lock(cache.impl_->mutex);
  const auto& blocks = cache.impl_->find(sequence, "block_table").blocks;
  *count = blocks.size();
  return blocks.data();
}

kv_cache_internals::layer_state kv_cache_internals::state(const kv_cache& cache, sequence_id sequence,
                                                          std::size_t layer, const char* call) {
  assert(layer < cache.config().num_layers);
  const std::lock_guard lock(cache.impl_->mutex);
  const kv_cache::impl::sequence& found = cache.impl_->find_for(sequence, "", call);
  return {found.blocks.data(), found.blocks.size(), found.length, found.written[layer],
          found.dropped * cache.config().block_size};
}

std::size_t kv_cache_internals::references(const kv_cache& cache, std::uint32_t block) {
  assert(block < cache.impl_->total_blocks);
  const std::lock_guard lock(cache.impl_->mutex);
  return cache.impl_->references[block];
}

void kv_cache_internals::set_written(kv_cache& cache, sequence_id sequence, std::size_t layer, std::size_t written) {
  assert(layer < cache.config().num_layers);
  const std::lock_guard lock(cache.impl_->mutex);
  kv_cache::impl::sequence& found = cache.impl_->find(sequence, "block_table");
  assert(written <= found.length);
  found.written[layer] = written;
}

bool kv_cache_internals::poisons_freed_blocks() { return poison_freed_blocks; }

std::byte* kv_cache_internals::pool(kv_cache& cache) { return reinterpret_cast<std::byte*>(cache.impl_->pool.get()); }

const std::byte* kv_cache_internals::pool(const kv_cache& cache) {
  return reinterpret_cast<const std::byte*>(cache.impl_->pool.get());
}

std::size_t kv_cache_internals::region_bytes(const kv_cache& cache) { return cache.impl_->region_bytes; }

region_geometry kv_cache_internals::geometry(const kv_cache& cache) { return cache.impl_->geometry(); }

std::byte* kv_cache_internals::region(kv_cache& cache, std::uint32_t block, std::size_t layer, std::size_t kv_head,
                                      bool value) {
  const kv_cache_config& config = cache.impl_->config;
  assert(layer < config.num_layers && kv_head < config.num_kv_heads);
  return cache.impl_->region(block, region_geometry::key_region(layer, config.num_kv_heads, kv_head) + (value ? 1 : 0));
}

const std::byte* kv_cache_internals::region(const kv_cache& cache, std::uint32_t block, std::size_t layer,
                                            std::size_t kv_head, bool value) {
  return region(const_cast<kv_cache&>(cache), block, layer, kv_head, value);
}

std::size_t kv_cache_internals::scales_offset(const kv_cache& cache) { return cache.impl_->scales_offset; }

}  // namespace engine
}  // namespace kvhead
