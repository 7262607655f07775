// QK-norm (Qwen 3): RMSNorm of every query and key head over its head_dim
// floats, before RoPE. For one head x[0, d) with weight w[0, d):
//   inv = 1 / sqrt(sum(x_e^2) / d + eps)      (sum and root in double)
//   x_e = w_e * float(x_e * inv)              (the product in float)
// as Hugging Face's Qwen3RMSNorm computes in float32 (normalize, then scale
// by the weight). A head's result depends only on its own floats.
#pragma once

#include <cstddef>
#include <vector>

namespace kvhead::engine {

class qk_norm {
 public:
  /// q_weight and k_weight: [head_dim] each (copied).
  qk_norm(std::size_t head_dim, float eps, const float* q_weight, const float* k_weight);

  /// In each of `rows` rows (row r at qkv + r * row_stride), normalizes the
  /// num_heads query heads, then the num_kv_heads key heads that follow them.
  void apply(float* qkv, std::size_t rows, std::size_t row_stride, std::size_t num_heads,
             std::size_t num_kv_heads) const;

 private:
  std::size_t head_dim_;
  float eps_;
  std::vector<float> q_weight_, k_weight_;
};

}  // namespace kvhead::engine
