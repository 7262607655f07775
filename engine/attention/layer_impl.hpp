// The inside of kvhead::attention_layer, shared by its two forwards: the
// cache-free one (engine/attention/attention.cpp) and the one over a KV cache
// (engine/cache/cached_forward.cpp).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "engine/attention/flash_attention.hpp"
#include "engine/attention/qk_norm.hpp"
#include "engine/attention/rope.hpp"
#include "engine/gemm/gemm.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "kvhead/attention.hpp"

namespace kvhead {
namespace engine {

/// One nn.Linear of the layer, or several over the same input stacked into
/// one (their weights' rows, then their outputs, side by side).
struct linear_part {
  const char* name;  // for messages
  linear_weights weights;
  std::size_t out_features;
};

/// y[rows, out] = x[rows, in] Wᵀ + b with Wᵀ packed once, W the parts' weights
/// stacked row-wise (out = the sum of their out_features). Each output
/// element gets the arithmetic of its own part's GEMM alone (gemm.hpp: an
/// element depends only on its row and column), so stacking changes no bit.
/// A part without bias gets -0 in the stacked bias: x + (-0) == x for every
/// float x, so its outputs keep the bits of a bias-free GEMM.
/// Precision f32: W in fp32 (bf16 parts widened exactly), the fp32 GEMM.
/// Precision bf16: W in bf16 (bf16 parts as given, fp32 ones rounded to
/// nearest even), x rounded to bf16 as gemm_bf16 packs it, fp32 accumulation.
class linear {
 public:
  linear(std::size_t in_features, std::initializer_list<linear_part> parts,
         kvhead::precision compute = kvhead::precision::f32);
  void apply(const float* x, std::size_t rows, float* y) const;

 private:
  std::variant<packed_b, packed_bf16_b> weight_;
  std::vector<float> bias_;  // empty: no part has one
};

}  // namespace engine

struct attention_layer::impl {
  attention_config config;  // validated, scale resolved
  engine::linear qkv_proj;  // [Wq; Wk; Wv]
  engine::linear o_proj;
  engine::rope rotary;
  std::optional<engine::qk_norm> norm;  // QK-norm, when configured
  std::vector<float> sinks;             // [H] attention sinks, or empty

  impl(const attention_config& checked, const attention_weights& weights);

  /// Floats per row of the projections: q, k and v side by side, (H + 2G) d.
  std::size_t qkv_width() const;

  /// Soft-capping, sinks and ALiBi for the attention kernels.
  engine::score_variants variants() const {
    return {config.logit_softcap, sinks.empty() ? nullptr : sinks.data(),
            config.alibi_slopes.empty() ? nullptr : config.alibi_slopes.data()};
  }

  /// qkv [rows, (H + 2G) d] from x [rows, d_model]: per row the H query
  /// heads, then the G key heads, then the G value heads, d floats each; then
  /// QK-norm (when configured) and RoPE on the query and key heads, row r at
  /// absolute position positions[r] of a sequence lengths[r] long at the end
  /// of the call (rope::apply). Precision bf16: then every value of qkv
  /// rounded to bf16 (the inputs of q kᵀ and p v, and what a KV cache
  /// stores).
  void project(const float* x, std::size_t rows, const std::size_t* positions, const std::size_t* lengths,
               float* qkv) const;

  /// `layer`'s impl; std::logic_error naming `where` when the layer was moved
  /// from (its impl is gone: using it is a caller bug, not a crash).
  static const impl& of(const std::unique_ptr<impl>& layer, const char* where) {
    if (layer == nullptr) throw std::logic_error(std::string(where) + ": the layer was moved from");
    return *layer;
  }
};

}  // namespace kvhead
