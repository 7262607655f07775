// Attention over the blocks of a KV cache (the pieces of
// attention_layer::forward over a cache, also used by the decode benchmarks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/attention/flash_attention.hpp"
#include "kvhead/config.hpp"
#include "kvhead/kv_cache.hpp"

namespace kvhead::engine {

/// One sequence's new rows in a batched call: positions [past, length) are
/// new, their rows start at row0 of the row-major inputs.
struct cached_rows {
  const std::uint32_t* table;  // the sequence's block table
  std::size_t length, past, row0;
};

/// Writes the k and v rows (G heads of head_dim floats each, after RoPE) of
/// the new positions into the cache's blocks of `layer`, converted to the
/// cache's dtype (engine/attention/kv_encode.hpp), in the packed layout the
/// kernels read: input row r's kv head g at k + r * row_stride + g *
/// head_dim (likewise v).
void write_cached_kv(kv_cache& cache, std::size_t layer, const std::vector<cached_rows>& batch, const float* k,
                     const float* v, std::size_t row_stride, simd_path path);

/// The same, for dense k and v [rows, G, head_dim] (as the decode benchmarks hold them).
inline void write_cached_kv(kv_cache& cache, std::size_t layer, const std::vector<cached_rows>& batch, const float* k,
                            const float* v, simd_path path) {
  write_cached_kv(cache, layer, batch, k, v, cache.config().num_kv_heads * cache.config().head_dim, path);
}

/// out = causal attention of q (after RoPE) over each sequence's cached keys
/// [0, length) (within the sliding window `window` of each row, 0: none: the
/// blocks before it are never read), rows of sequence e at absolute
/// positions past.., in parallel over (sequence, kv head, query tile). Row
/// r's head h is at q + r * q_row_stride + h * head_dim; out is dense [rows,
/// H, head_dim]. variants: the layer's soft-capping and sinks
/// (flash_attention.hpp). Precision bf16: the probabilities rounded to bf16
/// for p v (attention_tile).
void cached_attention(const kv_cache& cache, std::size_t layer, const std::vector<cached_rows>& batch,
                      std::size_t num_heads, const float* q, std::size_t q_row_stride, float* out, float scale,
                      std::size_t window, simd_path path, const score_variants& variants = {},
                      kvhead::precision precision = kvhead::precision::f32);

/// The same, for a dense q [rows, H, head_dim] (as the decode benchmarks hold it).
inline void cached_attention(const kv_cache& cache, std::size_t layer, const std::vector<cached_rows>& batch,
                             std::size_t num_heads, const float* q, float* out, float scale, std::size_t window,
                             simd_path path) {
  cached_attention(cache, layer, batch, num_heads, q, num_heads * cache.config().head_dim, out, scale, window, path);
}

}  // namespace kvhead::engine
