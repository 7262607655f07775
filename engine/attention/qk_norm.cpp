#include "engine/attention/qk_norm.hpp"

#include <cmath>

namespace kvhead::engine {

qk_norm::qk_norm(std::size_t head_dim, float eps, const float* q_weight, const float* k_weight)
    : head_dim_(head_dim),
      eps_(eps),
      q_weight_(q_weight, q_weight + head_dim),
      k_weight_(k_weight, k_weight + head_dim) {}

void qk_norm::apply(float* qkv, std::size_t rows, std::size_t row_stride, std::size_t num_heads,
                    std::size_t num_kv_heads) const {
  auto normalize = [&](float* x, const float* weight) {
    double sum = 0.0;
    for (std::size_t e = 0; e < head_dim_; ++e) sum += double(x[e]) * double(x[e]);
    const double inv = 1.0 / std::sqrt(sum / double(head_dim_) + double(eps_));
    for (std::size_t e = 0; e < head_dim_; ++e) x[e] = weight[e] * float(double(x[e]) * inv);
  };
  for (std::size_t row = 0; row < rows; ++row) {
    float* head = qkv + row * row_stride;
    for (std::size_t h = 0; h < num_heads + num_kv_heads; ++h, head += head_dim_)
      normalize(head, h < num_heads ? q_weight_.data() : k_weight_.data());
  }
}

}  // namespace kvhead::engine
