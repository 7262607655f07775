// The attention kernels' view of a kv_cache (include/kvhead/kv_cache.hpp):
// block tables and raw block storage. No checks beyond debug asserts, except
// that block_table() validates the sequence id.
//
// Addressing one token: for sequence s of length L and position p < L,
//   table = block_table(cache, s, &count);          // count = ceil(L / block_size)
//   float* block = block_data(cache, table[p / block_size]);
//   float* k = block + region_offset(cache, layer, kv_head, false);  // K region
//   float* v = block + region_offset(cache, layer, kv_head, true);   // V region
// each region being region_floats(cache) = block_size * round_up(head_dim, 32)
// floats, 64-byte aligned; the layout inside a region is the kernels' choice.
//
// Lifetimes. A table pointer stays valid, and its entries unchanged, until the
// next append, truncate or free of that sequence (append may move the table
// and, for copy-on-write, replace its last entry). Block pointers are valid
// for the cache's lifetime. Kernels write only the token slots made writable
// by the last append on the sequence (see "Writing" in kv_cache.hpp).
//
// Written-up-to marks. Per (sequence, layer), positions [0, written) hold K/V
// a forward wrote. attention_layer::forward (engine/cache/cached_forward.cpp)
// checks a call against them (it must write exactly [written, length), into
// blocks referenced once) and raises them with set_written() when it is done;
// truncate lowers them and fork copies them (kv_cache.cpp).
//
// Threads. block_table(), state(), references() and set_written() take the
// cache's lock (like length()); the other functions only compute addresses and
// take no lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvhead/kv_cache.hpp"

namespace kvhead::engine {

struct kv_cache_internals {
  /// The sequence's block table (block indices into the pool) and, in
  /// *count, its length. Throws kv_cache_error for an unknown or freed id.
  static const std::uint32_t* block_table(const kv_cache& cache, sequence_id sequence, std::size_t* count);

  /// One sequence as a forward over layer `layer` sees it, read under one lock.
  struct layer_state {
    const std::uint32_t* table;  // as block_table()
    std::size_t blocks;          // table entries: ceil(length / block_size)
    std::size_t length;          // the sequence's length
    std::size_t written;         // the layer's mark: positions [0, written) hold K/V, written <= length
  };
  /// Throws kv_cache_error for an unknown or freed id, like block_table().
  static layer_state state(const kv_cache& cache, sequence_id sequence, std::size_t layer);
  /// Sequences holding `block` (0: it is free).
  static std::size_t references(const kv_cache& cache, std::uint32_t block);
  /// Raises (or sets) the layer's mark to `written` <= length(sequence).
  static void set_written(kv_cache& cache, sequence_id sequence, std::size_t layer, std::size_t written);
  /// Whether this build fills blocks with NaN as they return to the pool
  /// (builds without NDEBUG).
  static bool poisons_freed_blocks();

  /// Start of block `block` (< total_blocks()): block_bytes() / 4 floats.
  static float* block_data(kv_cache& cache, std::uint32_t block);
  static const float* block_data(const kv_cache& cache, std::uint32_t block);
  /// Floats per K or V region: block_size * round_up(head_dim, 32).
  static std::size_t region_floats(const kv_cache& cache);
  /// Float offset within a block of the K (value == false) or V region of
  /// (layer, kv_head): ((layer * num_kv_heads + kv_head) * 2 + value) * region_floats.
  static std::size_t region_offset(const kv_cache& cache, std::size_t layer, std::size_t kv_head, bool value);
};

}  // namespace kvhead::engine
