// Attention over the blocks of a KV cache (the pieces of
// attention_layer::forward over a cache, also used by the decode benchmarks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvhead/config.hpp"
#include "kvhead/kv_cache.hpp"

namespace kvhead::engine {

/// One sequence's new rows in a batched call: positions [past, length) are
/// new, their rows start at row0 of the row-major inputs.
struct cached_rows {
  const std::uint32_t* table;  // the sequence's block table
  std::size_t length, past, row0;
};

/// Writes k and v rows ([rows, G, head_dim], after RoPE) of the new positions
/// into the cache's blocks of `layer`, in the packed layout the kernels read.
void write_cached_kv(kv_cache& cache, std::size_t layer, const std::vector<cached_rows>& batch, const float* k,
                     const float* v, simd_path path);

/// out = causal attention of q ([rows, H, head_dim], after RoPE) over each
/// sequence's cached keys [0, length), rows of sequence e at absolute
/// positions past.., in parallel over (sequence, kv head, query tile).
void cached_attention(const kv_cache& cache, std::size_t layer, const std::vector<cached_rows>& batch,
                      std::size_t num_heads, const float* q, float* out, float scale, simd_path path);

}  // namespace kvhead::engine
