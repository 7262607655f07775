// One attention layer read from a safetensors file (weights for `kvhead run`).
//
// Tensors, in PyTorch nn.Linear layout (weight [out_features, in_features],
// y = x Wᵀ + b), named <prefix><proj>.weight / <prefix><proj>.bias with the
// prefix prepended verbatim (Hugging Face: "model.layers.0.self_attn."):
//
//   q_proj.weight  [H·d, d_model]      q_proj.bias  [H·d]      (bias optional)
//   k_proj.weight  [G·d, d_model]      k_proj.bias  [G·d]      (bias optional)
//   v_proj.weight  [G·d, d_model]      v_proj.bias  [G·d]      (bias optional)
//   o_proj.weight  [d_model, H·d]      o_proj.bias  [d_model]  (bias optional)
//
// BF16 weights are kept as they are (owned_linear::weight_bf16: a bf16 layer
// packs them as they are, an f32 one widens them exactly); F32 and F16
// weights, and every bias, are read as f32 (F16 widened exactly,
// safetensors_file::load_f32). Other tensors (any name) are ignored.
//
// Shapes are derived, then cross-checked:
//   1. head_dim d = rows(q_proj) / H (exact division, d > 0);
//      d_model    = columns(q_proj) (> 0, need not equal H·d);
//   2. G = rows(k_proj) / d (exact division); a given num_kv_heads must equal it;
//   3. H must be a multiple of G; v_proj must have k_proj's shape; o_proj must
//      be [d_model, H·d]; each bias must be rank 1 with its weight's row count;
//   4. rope_theta must be finite and >= 0 (0: no RoPE), and > 0 needs an even d;
//      a given scale must be finite.
//
// Every problem throws file_error naming the file: "<path>: <problem>", e.g.
//   "w.safetensors: no tensor name starts with prefix 'x.' (tensors: 'q_proj.weight', ...)"
//   "w.safetensors: 'k_proj.weight' has 32 rows = 4 kv heads of head_dim 8, but num_kv_heads is 2"
// Nothing else is thrown, except std::bad_alloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/file_error.hpp"
#include "engine/io/safetensors.hpp"
#include "kvhead/attention.hpp"

namespace kvhead::io {

struct layer_load_options {
  std::string prefix;                       // prepended verbatim to every name
  std::size_t num_heads = 0;                // H, > 0
  std::optional<std::size_t> num_kv_heads;  // G; unset: rows(k_proj) / head_dim
  std::optional<float> scale;               // unset: 1 / sqrt(head_dim)
  bool causal = false;
  double rope_theta = 0.0;  // 0: no RoPE
};

/// One nn.Linear's arrays, owned: weight [out, in] row-major, as floats or
/// (a BF16 tensor) as bf16 bit patterns in weight_bf16, the other empty; bias
/// empty when the file has none.
struct owned_linear {
  std::vector<float> weight;
  std::vector<float> bias;
  std::vector<std::uint16_t> weight_bf16;

  linear_weights view() const {
    return {weight.empty() ? nullptr : weight.data(), bias.empty() ? nullptr : bias.data(),
            weight_bf16.empty() ? nullptr : weight_bf16.data()};
  }
};

/// A weight tensor as owned_linear holds it: BF16 as bits, others as f32.
void load_weight(const safetensors_file& file, const std::string& name, owned_linear& target);

/// A validated configuration and the weights that go with it.
struct loaded_layer {
  attention_config config;  // num_kv_heads always set (never 0)
  owned_linear q_proj, k_proj, v_proj, o_proj;
  std::vector<float> q_norm, k_norm;  // [head_dim] each with QK-norm, else empty
  std::vector<float> sinks;           // [num_heads] attention sinks, else empty

  /// Pointers into this object: valid while it lives and is not modified.
  attention_weights weights() const {
    auto data = [](const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
    return {q_proj.view(), k_proj.view(), v_proj.view(), o_proj.view(), data(q_norm), data(k_norm), data(sinks)};
  }
  /// The layer (it copies the weights: this object may be freed afterwards).
  attention_layer build() const { return attention_layer(config, weights()); }
};

/// Reads and checks one layer; throws file_error (see the top of this file).
loaded_layer load_attention_layer(const safetensors_file& file, const layer_load_options& options);

}  // namespace kvhead::io
