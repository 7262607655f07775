// Seeded random weights and biases of one attention layer, shared by the
// layer tests: q, k, v projections N(0, 1 / d_model), o_proj N(0, o_sigma²),
// biases N(0, 0.1²) unless left out, drawn in that order from one generator.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "kvhead/attention.hpp"
#include "tests/random_values.hpp"

namespace kvhead::testing {

struct seeded_layer {
  kvhead::attention_config config;
  std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo;  // biases empty when left out

  seeded_layer(const kvhead::attention_config& c, unsigned seed, float o_sigma, bool biases = true) : config(c) {
    std::mt19937 generator(seed);
    const std::size_t q_out = c.num_heads * c.head_dim, kv_out = c.num_kv_heads * c.head_dim;
    const float sigma = 1.0f / std::sqrt(float(c.d_model));
    wq = random_values(q_out * c.d_model, generator, sigma);
    wk = random_values(kv_out * c.d_model, generator, sigma);
    wv = random_values(kv_out * c.d_model, generator, sigma);
    wo = random_values(c.d_model * q_out, generator, o_sigma);
    if (!biases) return;
    bq = random_values(q_out, generator, 0.1f);
    bk = random_values(kv_out, generator, 0.1f);
    bv = random_values(kv_out, generator, 0.1f);
    bo = random_values(c.d_model, generator, 0.1f);
  }
  /// v's data, or null when it is empty (a bias left out).
  static const float* data(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }
  kvhead::attention_weights weights() const {
    return {{wq.data(), data(bq)}, {wk.data(), data(bk)}, {wv.data(), data(bv)}, {wo.data(), data(bo)}};
  }
};

}  // namespace kvhead::testing
