// The inside of kvhead::attention_layer, shared by its two forwards: the
// cache-free one (engine/attention/attention.cpp) and the one over a KV cache
// (engine/cache/cached_forward.cpp).
#pragma once

#include <cstddef>
#include <vector>

#include "engine/attention/rope.hpp"
#include "engine/gemm/gemm.hpp"
#include "kvhead/attention.hpp"

namespace kvhead {
namespace engine {

/// One nn.Linear with Wᵀ packed once: y[rows, out] = x[rows, in] Wᵀ + b.
class linear {
 public:
  linear(const char* name, const linear_weights& weights, std::size_t in_features, std::size_t out_features);
  void apply(const float* x, std::size_t rows, float* y) const;

 private:
  packed_b weight_;
  std::vector<float> bias_;
};

}  // namespace engine

struct attention_layer::impl {
  attention_config config;  // validated, scale resolved
  engine::linear q_proj, k_proj, v_proj, o_proj;
  engine::rope rotary;

  impl(const attention_config& checked, const attention_weights& weights);

  /// q [rows, H d], k and v [rows, G d] from x [rows, d_model], then RoPE on
  /// q and k, row r at absolute position positions[r].
  void project(const float* x, std::size_t rows, const std::size_t* positions, float* q, float* k, float* v) const;
};

}  // namespace kvhead
