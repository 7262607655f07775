// Tiled (flash-style) attention over already-projected Q, K, V.
//
// Shapes: Q and O [batch, H, q_len, d], K and V [batch, G, kv_len, d], each
// a head_tensor (any strides, head_dim contiguous). Query head h reads kv head
// h / (H / G).
//
// Work unit: (batch b, kv head g, query tile). The R = H / G query heads of the
// group are stacked as extra rows (row = position * R + head in group), so every
// K/V tile is streamed once per group, not once per query head.
//
// Fixed reduction order (every path — prefill, decode, split-KV decode —
// follows it, so results are bit-identical however the work is cut):
//   1. The key axis is cut into chunks at fixed absolute positions
//      [c * kv_chunk, (c + 1) * kv_chunk).
//   2. Each chunk yields, per query row, a partial (max, sum, accumulator):
//        s = scale * q kᵀ (+ additive mask)        GEMM, one element per (row, key)
//        (max, sum), p = online_softmax_block over the row's visible keys of
//                        the chunk, from an empty state
//        acc = p v over those visible keys           GEMM, depth = visible count
//      The GEMM does the same arithmetic per element for one row as for many
//      (engine/gemm/gemm.hpp), and the softmax kernels are per row.
//   3. Partials are merged left to right, starting from the empty partial
//      (merge_partials), and the row is normalized once at the end.
// Chunks with no visible key for any row of the tile are skipped (merging an
// empty partial changes nothing).
#pragma once

#include <cstddef>

#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"

namespace kvhead::engine {

/// Keys per chunk: the fixed reduction unit above. 256 keys x 128 rows of
/// scores is 128 KiB (in L2 with the K/V tile); see the benchmark notes in
/// flash_attention.cpp.
inline constexpr std::size_t kv_chunk = 256;

/// A validated attention problem (validation happens at the public boundary).
struct attention_problem {
  attention_dims dims;
  head_tensor<const float> q, k, v;
  head_tensor<float> out;
  float scale;
  bool causal;
  std::size_t q_offset;
  const std::size_t* valid_len;  // null: kv_len
  const float* additive_mask;    // [q_len, kv_len] or null
  simd_path path;

  /// Keys [0, visible_end(b, i)) are visible to query row i of batch b (before
  /// the additive mask).
  std::size_t visible_end(std::size_t batch, std::size_t row) const;
};

/// Writes every output row with the fixed-order tiled algorithm above, in
/// parallel over (batch, kv head, query tile) on the caller's task arena.
void flash_attention(const attention_problem& problem);

/// The materialized probabilities [batch, H, q_len, kv_len] (row softmax of
/// the full score rows; rows with no visible key are zeros).
void attention_probabilities(const attention_problem& problem, float* probabilities);

}  // namespace kvhead::engine
