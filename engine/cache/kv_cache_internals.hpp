// The attention kernels' view of a kv_cache (include/kvhead/kv_cache.hpp):
// block tables and raw block storage. No checks beyond debug asserts, except
// that block_table() validates the sequence id.
//
// Addressing one token: for sequence s of length L and position p < L,
//   table = block_table(cache, s, &count);          // count = ceil(L / block_size)
//   std::byte* k = region(cache, table[p / block_size], layer, kv_head, false);  // K region
//   std::byte* v = region(cache, table[p / block_size], layer, kv_head, true);   // V region
// each region being region_bytes(cache) bytes ("Block layout" in
// kv_cache.hpp, a multiple of 64), 64-byte aligned, holding
// elements of cache.dtype(); for int8 the region's block_size fp32 scales
// start scales_offset(cache) bytes into it. The layout inside a region is the
// kernels' choice, within the layout contract below.
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

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "engine/arch/kernel_config.hpp"
#include "kvhead/kv_cache.hpp"

namespace kvhead::engine {

// The layout contract between the cache, the GEMM and attention (the other
// half, chunk <= KC and block <= chunk, sits next to kv_chunk in
// engine/attention/flash_attention.hpp and in engine/cache/cached_forward.cpp).
/// Block sizes: powers of two in [kv_min_block_size, kv_max_block_size].
inline constexpr std::size_t kv_min_block_size = 16, kv_max_block_size = 256;
/// A V region's columns (head_dim) are padded to a multiple of this, so
/// every path's packed panels (NR wide) tile it; a K region's key columns
/// are block_size, NR-wide panels or one narrow panel (kv_narrow_key_row_stride).
inline constexpr std::size_t kv_panel_multiple = 32;
static_assert(
    [] {
      for (const kernel_config_row& row : kernel_config_rows)
        if (kv_panel_multiple % row.nr != 0) return false;
      return true;
    }(),
    "every GEMM path's NR must divide the cache's panel padding");
static_assert(kv_max_block_size <= gemm_kc, "a block's keys are one KC-deep block of P·V");
static_assert(
    kv_min_block_size == 16 && kv_panel_multiple == 32,
    "the one block narrower than a panel is 16 keys: the narrow panels of the int8 q kᵀ kernel are 16 bytes wide");

/// A block's Kᵀ (head_dim x block_size, a region of head_dim * block_size
/// elements or more) on a path whose panels are `nr` wide: 0 when the block
/// is whole panels (the packed layout, pack_b_offset), else (16 keys on a
/// 32-wide path) block_size: Kᵀ is one narrow panel, row e of it at e *
/// block_size (paged_b_view::narrow_row_stride), so a 16-token block takes
/// half the memory of a 32-token one.
constexpr std::size_t kv_narrow_key_row_stride(std::size_t nr, std::size_t block_size) {
  return block_size < nr ? block_size : 0;
}
static_assert((kv_min_block_size & (kv_min_block_size - 1)) == 0 && kv_min_block_size <= kv_max_block_size);
static_assert(
    [] {
      std::size_t expected = kv_min_block_size;
      for (const std::size_t size : kv_cache_block_sizes) {
        if (size != expected) return false;
        expected *= 2;
      }
      return expected / 2 == kv_max_block_size;
    }(),
    "kv_cache_block_sizes (kvhead/kv_cache.hpp) lists the powers of two from kv_min_block_size to kv_max_block_size");
static_assert((kv_cache_default_block_size & (kv_cache_default_block_size - 1)) == 0 &&
                  kv_min_block_size <= kv_cache_default_block_size && kv_cache_default_block_size <= kv_max_block_size,
              "the default block size is one of kv_cache_block_sizes");

/// Tokens per group of blocks: the pool stores blocks in groups of
/// kv_group_tokens / block_size consecutive indices, and within a group
/// each (layer, kv head, K or V) region of its blocks side by side. A run of
/// consecutive blocks then reads as one stream per region (the prefetchers
/// stop at a gap), whatever the block size ("Block layout" in kv_cache.hpp).
inline constexpr std::size_t kv_group_tokens = 256;
static_assert(kv_group_tokens % kv_max_block_size == 0, "a group holds whole blocks of every size");
static_assert((kv_group_tokens & (kv_group_tokens - 1)) == 0,
              "with power-of-two block sizes, a group's first block is its index with the low bits cleared");

/// A block table entry whose block was dropped (kv_cache::drop_outside_window):
/// never a block index (a pool has at most 2^32 - 1 blocks, checked at creation).
inline constexpr std::uint32_t dropped_block = UINT32_MAX;

/// Where the pool holds its regions ("Block layout" in kv_cache.hpp): each
/// group of group_blocks consecutive blocks holds a region index's regions
/// of all its blocks side by side. Inline, for the readers that ask for a
/// region per block of every chunk (a decode step at 16-token blocks: two
/// per 16 keys of each kv head).
struct region_geometry {
  std::size_t block_bytes;   // regions_per_block * region_bytes
  std::size_t region_bytes;  // one K or V region, a multiple of 64
  std::size_t group_blocks;  // a power of two
  std::size_t total_blocks;

  /// Region index of (layer, kv head)'s K region; its V region is the next.
  static constexpr std::size_t key_region(std::size_t layer, std::size_t num_kv_heads, std::size_t kv_head) {
    return (layer * num_kv_heads + kv_head) * 2;
  }
  /// Bytes from the pool's start to region `region` of block `index` (< total_blocks).
  std::size_t offset(std::uint32_t index, std::size_t region) const {
    const std::size_t first = index & ~(group_blocks - 1);  // the group's first block
    const std::size_t blocks_in_group = std::min(group_blocks, total_blocks - first);
    return first * block_bytes + (region * blocks_in_group + (index - first)) * region_bytes;
  }
};

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
    std::size_t dropped;         // positions [0, dropped) are dropped (kv_cache::drop_outside_window)
  };
  /// Throws kv_cache_error for an unknown or freed id, its message naming
  /// `call` (the public call that asked: "attention_layer::forward (cache)").
  static layer_state state(const kv_cache& cache, sequence_id sequence, std::size_t layer,
                           const char* call = "kv_cache_internals::state");
  /// Sequences holding `block` (0: it is free).
  static std::size_t references(const kv_cache& cache, std::uint32_t block);
  /// Raises (or sets) the layer's mark to `written` <= length(sequence).
  static void set_written(kv_cache& cache, sequence_id sequence, std::size_t layer, std::size_t written);
  /// Whether this build fills blocks with NaN as they return to the pool
  /// (builds without NDEBUG).
  static bool poisons_freed_blocks();

  /// The pool: total_blocks() * block_bytes() bytes, 64-byte aligned.
  static std::byte* pool(kv_cache& cache);
  static const std::byte* pool(const kv_cache& cache);
  /// Bytes of one K or V region (region_bytes of "Block layout").
  static std::size_t region_bytes(const kv_cache& cache);
  /// The pool's arrangement of regions: region(cache, block, layer, kv_head, value) is
  /// pool(cache) + geometry(cache).offset(block, key_region(layer, num_kv_heads, kv_head) + value).
  static region_geometry geometry(const kv_cache& cache);
  /// The K (value == false) or V region of (layer, kv_head) in block `block`
  /// (< total_blocks()): region_bytes bytes, 64-byte aligned.
  static std::byte* region(kv_cache& cache, std::uint32_t block, std::size_t layer, std::size_t kv_head, bool value);
  static const std::byte* region(const kv_cache& cache, std::uint32_t block, std::size_t layer, std::size_t kv_head,
                                 bool value);
  /// int8: byte offset, within a region, of its fp32 scales (one per token slot).
  static std::size_t scales_offset(const kv_cache& cache);
};

}  // namespace kvhead::engine
