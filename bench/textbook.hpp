// The textbook attention a user writes first, on the S shapes
// (bench/shapes.hpp): the baselines of textbook_bench.cpp. Per head, with q
// [q_len, d] and k, v [kv_len, d] in contiguous rows:
//   1. scores [q_len, kv_len] = scale q kᵀ, materialized (OpenBLAS cblas_sgemm);
//   2. masked_fill(-inf) above the causal diagonal (S2), then a scalar softmax
//      per row: max-subtracted, std::exp, divided by the sum;
//   3. out [q_len, d] = scores v (cblas_sgemm).
// Around it, the layout work such code does: K/V repeated per query head for
// GQA/MQA (Hugging Face's repeat_kv; the copy is part of the textbook's time),
// and for the whole layer (S3) the projections x Wᵀ (cblas_sgemm), split heads
// and merge heads copies, and the output projection. The decode inputs are the
// kvhead benchmark's own: projected queries, and a plain cache per sequence,
// contiguous [past + 1, kv_heads, head_dim] fp32 K and V arrays.
// Threads: the caller sets openblas_set_num_threads; copies and softmax run on
// the calling thread. Buffers are allocated once, at construction.
#pragma once

#include <cstddef>
#include <vector>

#include "bench/shapes.hpp"

namespace kvhead::bench {

class textbook_decode {
 public:
  explicit textbook_decode(const decode_shape& shape);

  /// Same contract as cached_decode::run (bench/cached_decode.hpp).
  void run(std::size_t call, const float* q, float* out);

 private:
  decode_shape shape_;
  std::vector<sequence_kv> cache_;                 // sequence i: decode_kv(shape, i)
  std::vector<float> k_heads_, v_heads_, scores_;  // [heads, past + 1, head_dim], [past + 1]
};

class textbook_prefill {
 public:
  explicit textbook_prefill(const prefill_shape& shape);

  /// out [heads, tokens, head_dim] := causal attention of the inputs.
  void run(const prefill_inputs& in, float* out);

 private:
  prefill_shape shape_;
  std::vector<float> k_heads_, v_heads_, scores_;  // [heads, tokens, head_dim], [tokens, tokens]
};

class textbook_layer {
 public:
  /// Keeps a reference to the weights of `in`.
  textbook_layer(const layer_shape& shape, const layer_inputs& in);

  /// y [batch, seq, d_model] := the layer (no mask) applied to x.
  void run(const float* x, float* y);

 private:
  layer_shape shape_;
  const layer_inputs& weights_;
  std::vector<float> q_, k_, v_;                                // projections [batch, seq, d_model]
  std::vector<float> q_heads_, k_heads_, v_heads_, out_heads_;  // [batch, heads, seq, head_dim]
  std::vector<float> merged_;                                   // [batch, seq, d_model]
  std::vector<float> scores_;                                   // [seq, seq]
};

}  // namespace kvhead::bench
