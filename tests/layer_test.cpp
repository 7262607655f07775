// The layer's pieces keep the bits of the straightforward computation: one
// GEMM over the stacked [Wq; Wk; Wv] equals three separate projections, and
// the whole forward equals projections, RoPE, scaled_dot_product_attention
// and the output projection done one after the other on separate buffers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/attention/layer_impl.hpp"
#include "kvhead/attention.hpp"
#include "tests/random_values.hpp"
#include "tests/reference/rope_float_reference.hpp"

namespace {

using kvhead::testing::random_values;

bool same_bits(const float* a, const float* b, std::size_t count) {
  return std::memcmp(a, b, count * sizeof(float)) == 0;
}

struct projections {
  std::size_t d_model;
  std::size_t out[3];  // q, k, v features
  std::vector<float> weight[3], bias[3];
  projections(std::size_t in, std::size_t q, std::size_t kv, std::mt19937& generator) : d_model(in), out{q, kv, kv} {
    for (int p = 0; p < 3; ++p) {
      weight[p] = random_values(out[p] * in, generator, 1.0f / std::sqrt(float(in)));
      bias[p] = random_values(out[p], generator, 0.1f);
    }
  }
  // Part p's weights, with its bias when bit p of bias_mask is set.
  kvhead::linear_weights part(int p, int bias_mask) const {
    return {weight[p].data(), (bias_mask >> p) & 1 ? bias[p].data() : nullptr};
  }
};

}  // namespace

TEST_CASE("layer: the stacked QKV GEMM gives the bits of three separate projections, with any mix of biases") {
  std::mt19937 generator(17);
  const projections w(72, 96, 40, generator);
  constexpr std::size_t rows = 9;
  std::vector<float> x = random_values(rows * w.d_model, generator, 1.0f);
  // A row of the smallest subnormals: its products underflow to zeros of
  // either sign, so a bias-free output can be -0 (an FMA from +0 keeps the
  // sign of a product that rounds to zero); a +0 bias would turn it into +0.
  for (std::size_t e = 0; e < w.d_model; ++e)
    x[4 * w.d_model + e] = (e % 3 == 0 ? -1.0f : 1.0f) * std::numeric_limits<float>::denorm_min();
  for (int bias_mask = 0; bias_mask < 8; ++bias_mask) {
    const kvhead::engine::linear stacked(w.d_model, {{"q_proj", w.part(0, bias_mask), w.out[0]},
                                                     {"k_proj", w.part(1, bias_mask), w.out[1]},
                                                     {"v_proj", w.part(2, bias_mask), w.out[2]}});
    const std::size_t width = w.out[0] + w.out[1] + w.out[2];
    std::vector<float> together(rows * width);
    stacked.apply(x.data(), rows, together.data());
    std::size_t column = 0;
    for (int p = 0; p < 3; ++p) {
      const kvhead::engine::linear alone(w.d_model, {{"part", w.part(p, bias_mask), w.out[p]}});
      std::vector<float> separate(rows * w.out[p]);
      alone.apply(x.data(), rows, separate.data());
      for (std::size_t row = 0; row < rows; ++row) {
        INFO("bias mask " << bias_mask << " part " << p << " row " << row);
        CHECK(same_bits(together.data() + row * width + column, separate.data() + row * w.out[p], w.out[p]));
      }
      column += w.out[p];
    }
  }
}

TEST_CASE("layer: forward equals projections, RoPE, attention and output projection done separately") {
  struct setting {
    kvhead::attention_config config;
    int bias_mask;  // bits: q, k, v, o
    std::size_t batch, seq;
  };
  const setting settings[] = {
      {{8, 8, 16, 64, {}, false, 0.0}, 0, 2, 70},        // MHA, no RoPE, no bias
      {{8, 2, 20, 48, {}, true, 10000.0}, 15, 1, 300},   // GQA, RoPE, every bias; d off the SIMD width
      {{6, 1, 8, 30, 0.25f, true, 500.0}, 5, 3, 41},     // MQA, q and v biases only
      {{4, 2, 34, 40, {}, false, 10000.0}, 10, 2, 130},  // k and o biases only
  };
  for (const setting& s : settings) {
    const kvhead::attention_config& c = s.config;
    std::mt19937 generator(static_cast<unsigned>(c.head_dim));
    const std::size_t q_features = c.num_heads * c.head_dim, kv_features = c.num_kv_heads * c.head_dim;
    const projections w(c.d_model, q_features, kv_features, generator);
    const std::vector<float> wo = random_values(c.d_model * q_features, generator, 0.1f);
    const std::vector<float> bo = random_values(c.d_model, generator, 0.1f);
    const kvhead::linear_weights o_proj{wo.data(), (s.bias_mask & 8) != 0 ? bo.data() : nullptr};
    const kvhead::attention_layer layer(
        c, {w.part(0, s.bias_mask), w.part(1, s.bias_mask), w.part(2, s.bias_mask), o_proj});
    const std::size_t rows = s.batch * s.seq;
    const std::vector<float> x = random_values(rows * c.d_model, generator, 1.0f);
    std::vector<float> y(rows * c.d_model);
    layer.forward(x.data(), s.batch, s.seq, y.data());

    // The same, one piece at a time: q, k, v [batch, seq, heads, d] each.
    std::vector<float> qkv[3];
    for (int p = 0; p < 3; ++p) {
      qkv[p].resize(rows * w.out[p]);
      kvhead::engine::linear(c.d_model, {{"part", w.part(p, s.bias_mask), w.out[p]}})
          .apply(x.data(), rows, qkv[p].data());
    }
    if (c.rope_theta != 0.0)
      for (std::size_t row = 0; row < rows; ++row) {
        kvhead::reference::rope_float(qkv[0].data() + row * q_features, c.num_heads, c.head_dim, c.rope_theta,
                                      row % s.seq);
        kvhead::reference::rope_float(qkv[1].data() + row * kv_features, c.num_kv_heads, c.head_dim, c.rope_theta,
                                      row % s.seq);
      }
    using view = kvhead::head_tensor<const float>;
    std::vector<float> attended(rows * q_features), expected(rows * c.d_model);
    kvhead::attention_options options;
    options.causal = c.causal;
    options.scale = c.scale;
    kvhead::scaled_dot_product_attention(
        {s.batch, c.num_heads, c.num_kv_heads, s.seq, s.seq, c.head_dim},
        view::bshd(qkv[0].data(), c.num_heads, s.seq, c.head_dim),
        view::bshd(qkv[1].data(), c.num_kv_heads, s.seq, c.head_dim),
        view::bshd(qkv[2].data(), c.num_kv_heads, s.seq, c.head_dim),
        kvhead::head_tensor<float>::bshd(attended.data(), c.num_heads, s.seq, c.head_dim), options);
    kvhead::engine::linear(q_features, {{"o_proj", o_proj, c.d_model}}).apply(attended.data(), rows, expected.data());
    INFO("H " << c.num_heads << " G " << c.num_kv_heads << " d " << c.head_dim << " biases " << s.bias_mask);
    CHECK(same_bits(y.data(), expected.data(), y.size()));
  }
}
