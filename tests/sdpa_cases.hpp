// Randomized scaled-dot-product cases shared by the attention tests
// (attention_test.cpp, sdpa_bf16_test.cpp): setups over every mask kind and
// layout, their data, the engine problem, and the check against the double
// reference with the error bound derived from the arithmetic.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/attention/flash_attention.hpp"
#include "engine/attention/scaled_dot_product.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "tests/reference/attention_reference.hpp"
#include "tests/reference/bf16_layer_reference.hpp"

namespace kvhead::testing {

inline constexpr double unit_roundoff = std::numeric_limits<float>::epsilon() / 2;

struct sdpa_setup {
  attention_dims dims;
  bool bshd_layout = false;
  bool causal = false;
  bool explicit_offset = false;
  bool padded = false;  // valid_len < kv_len for some batch elements
  bool additive = false;
  std::size_t window = 0;      // sliding window, 0: none
  float logit_softcap = 0.0f;  // > 0: soft-capping
  bool sinks = false;          // one sink logit per query head
  bool alibi = false;          // one ALiBi slope per query head
  float q_gain = 1.0f;         // q ~ N(0, q_gain^2): scores far beyond the cap
};

struct sdpa_data {
  std::vector<float> q, k, v, mask, sinks, alibi_slopes;
  std::vector<std::size_t> valid_len;
  head_tensor<const float> q_view, k_view, v_view;
  std::size_t q_offset = 0;
};

inline head_tensor<const float> make_view(const std::vector<float>& data, bool bshd, std::size_t heads, std::size_t seq,
                                          std::size_t head_dim) {
  return bshd ? head_tensor<const float>::bshd(data.data(), heads, seq, head_dim)
              : head_tensor<const float>::bhsd(data.data(), heads, seq, head_dim);
}

inline sdpa_data make_data(const sdpa_setup& setup, std::mt19937& generator) {
  const attention_dims& d = setup.dims;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  sdpa_data data;
  data.q.resize(d.batch * d.num_heads * d.q_len * d.head_dim);
  data.k.resize(d.batch * d.num_kv_heads * d.kv_len * d.head_dim);
  data.v.resize(data.k.size());
  for (auto* values : {&data.q, &data.k, &data.v})
    for (float& x : *values) x = normal(generator);
  for (float& x : data.q) x *= setup.q_gain;
  data.q_view = make_view(data.q, setup.bshd_layout, d.num_heads, d.q_len, d.head_dim);
  data.k_view = make_view(data.k, setup.bshd_layout, d.num_kv_heads, d.kv_len, d.head_dim);
  data.v_view = make_view(data.v, setup.bshd_layout, d.num_kv_heads, d.kv_len, d.head_dim);
  data.q_offset = d.kv_len >= d.q_len ? d.kv_len - d.q_len : 0;
  if (setup.explicit_offset) data.q_offset = generator() % (d.kv_len + 1);
  if (setup.padded) {
    data.valid_len.resize(d.batch);
    for (std::size_t& valid : data.valid_len) valid = generator() % (d.kv_len + 1);
    data.valid_len[0] = d.kv_len;
  }
  if (setup.additive) {
    data.mask.resize(d.q_len * d.kv_len);
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    for (float& x : data.mask) x = generator() % 7 == 0 ? -INFINITY : uniform(generator);
  }
  if (setup.sinks) {  // mostly near the scores, some far above them
    data.sinks.resize(d.num_heads);
    std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
    for (float& x : data.sinks) x = generator() % 5 == 0 ? 12.0f * uniform(generator) : uniform(generator);
  }
  if (setup.alibi) {  // BLOOM's slopes lie in (0, 0.5]; some steeper, a few negative
    data.alibi_slopes.resize(d.num_heads);
    std::uniform_real_distribution<float> uniform(-0.1f, 0.6f);
    for (float& x : data.alibi_slopes) x = generator() % 6 == 0 ? 4.0f * uniform(generator) : uniform(generator);
  }
  return data;
}

/// The engine problem of `data` at `compute` precision, writing `out` (resized, NaN-filled).
inline engine::attention_problem make_problem(const sdpa_setup& setup, const sdpa_data& data, std::vector<float>& out,
                                              simd_path path, precision compute = precision::f32) {
  const attention_dims& d = setup.dims;
  out.assign(d.batch * d.num_heads * d.q_len * d.head_dim, std::numeric_limits<float>::quiet_NaN());
  head_tensor<float> out_view = setup.bshd_layout
                                    ? head_tensor<float>::bshd(out.data(), d.num_heads, d.q_len, d.head_dim)
                                    : head_tensor<float>::bhsd(out.data(), d.num_heads, d.q_len, d.head_dim);
  return {d,
          data.q_view,
          data.k_view,
          data.v_view,
          out_view,
          float(1.0 / std::sqrt(double(d.head_dim))),
          setup.causal,
          data.q_offset,
          data.valid_len.empty() ? nullptr : data.valid_len.data(),
          data.mask.empty() ? nullptr : data.mask.data(),
          path,
          setup.window,
          {setup.logit_softcap, data.sinks.empty() ? nullptr : data.sinks.data(),
           data.alibi_slopes.empty() ? nullptr : data.alibi_slopes.data()},
          compute};
}

// Error bound of one output element at f32 (derivation in the comments), as
// a multiple of max|v| over the row's visible keys:
//   score error  ds <= (2d + 6) u (S + 2): the GEMM's sum over d (gemm_test),
//                 the scale and the mask add; S = max_j scale sum|q k_j| (plus
//                 |ALiBi's bias|, whose product and add round twice more), 2 = max|mask|;
//                 soft-capping passes that error on with a slope <= 1 (tanh' <= 1)
//                 and adds its own <= 13.45 u cap (tanh_test.cpp);
//   probability  relative error <= 2 ds + 4 u S (rounding of s - max; a capped
//                 score is no larger than the uncapped one)
//                 + (4 n + 8 chunks + 16) u (exp, the sums, merges, normalization);
//                 a sink adds its exp and argument, 2 u (S + |sink|) + 12 u;
//   output       |o - ref| <= max|v| * that (sum_j p_j <= 1).
inline double relative_bound(const reference::sdpa_result& ref, std::size_t row, std::size_t head_dim,
                             std::size_t kv_len, float logit_softcap, float sink) {
  const double score = ref.score_magnitude[row];
  const double chunks = double(kv_len / engine::kv_chunk + 1);
  const double score_error =
      (2.0 * double(head_dim) + 6.0) * unit_roundoff * (score + 2.0) + 13.45 * unit_roundoff * double(logit_softcap);
  return 2.0 * score_error + 4.0 * unit_roundoff * score +
         (4.0 * double(kv_len) + 8.0 * chunks + 16.0) * unit_roundoff +
         (2.0 * (score + std::fabs(double(sink))) + 12.0) * unit_roundoff;
}

// The bf16 rounding of p (attention_options::precision): the engine's
// unnormalized p~_j (its fp32 value, <= 1) becomes r_j = p~_j (1 + delta_j),
// |delta_j| <= 2^-8 (bf16's unit roundoff: 8 significant bits, nearest), or
// |r_j - p~_j| <= 2^-134 (half of bf16's subnormal spacing 2^-133) below
// 2^-126. Everything else is the f32 arithmetic, so out_bf16 - out_f32 =
// sum_j p'_j delta_j v_j with p'_j the engine's normalized probabilities,
// p'_j <= p_j (1 + relative) (the f32 bound above):
//   |out_bf16 - out_f32| <= 2^-8 (1 + relative) sum_j p_j |v_j| + n 2^-134 max|v|
// (each normalized weight <= 1: the row's sum is >= 1, its largest term
// exp(0)). The f32 accumulation's own roundings act on terms at most 1 + 2^-8
// times larger: the f32 bound times 1 + 2^-8.
inline constexpr double bf16_roundoff = 0x1p-8;
inline constexpr double bf16_subnormal_roundoff = 0x1p-134;

/// The setup at `compute` precision against the double reference (on the
/// bf16-rounded q, k and v at bf16), through the engine's
/// scaled_dot_product on `path`; checks every element within its bound.
inline void check_sdpa(const sdpa_setup& setup, simd_path path, std::mt19937& generator,
                       precision compute = precision::f32) {
  const attention_dims& d = setup.dims;
  const sdpa_data data = make_data(setup, generator);
  std::vector<float> out;
  const auto problem = make_problem(setup, data, out, path, compute);
  engine::scaled_dot_product(problem);

  const bool bf16 = compute == precision::bf16;
  auto reference_input = [&](const std::vector<float>& values, head_tensor<const float> view) {
    std::vector<float> rounded(values);
    if (bf16)
      for (float& x : rounded) x = float(reference::bf16_nearest(double(x)));
    return std::pair{rounded, reference::strided4{nullptr, view.batch_stride, view.head_stride, view.seq_stride}};
  };
  auto [q, q_view] = reference_input(data.q, data.q_view);
  auto [k, k_view] = reference_input(data.k, data.k_view);
  auto [v, v_view] = reference_input(data.v, data.v_view);
  q_view.data = q.data();
  k_view.data = k.data();
  v_view.data = v.data();
  const auto ref = reference::sdpa({d.batch, d.num_heads, d.num_kv_heads, d.q_len, d.kv_len, d.head_dim, problem.scale,
                                    setup.causal, data.q_offset, problem.valid_len, problem.additive_mask, setup.window,
                                    setup.logit_softcap, problem.variants.sinks, problem.variants.alibi_slopes},
                                   q_view, k_view, v_view);

  std::size_t failures = 0;
  double worst = 0.0;
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.num_heads; ++h)
      for (std::size_t i = 0; i < d.q_len; ++i) {
        const std::size_t row = (b * d.num_heads + h) * d.q_len + i;
        const float* got =
            problem.out.data + b * problem.out.batch_stride + h * problem.out.head_stride + i * problem.out.seq_stride;
        const double relative = relative_bound(ref, row, d.head_dim, d.kv_len, setup.logit_softcap,
                                               data.sinks.empty() ? 0.0f : data.sinks[h]);
        const double f32_tolerance = ref.value_magnitude[row] * relative + 1e-30;
        for (std::size_t e = 0; e < d.head_dim; ++e) {
          const double tolerance =
              bf16 ? (1.0 + bf16_roundoff) * f32_tolerance +
                         bf16_roundoff * (1.0 + relative) * ref.weighted_magnitude[row * d.head_dim + e] +
                         double(d.kv_len) * bf16_subnormal_roundoff * ref.value_magnitude[row]
                   : f32_tolerance;
          const double error = std::fabs(double(got[e]) - ref.out[row * d.head_dim + e]);
          if (!(error <= tolerance)) ++failures;
          worst = std::max(worst, error / tolerance);
        }
      }
  INFO("path " << std::string(to_string(path)) << " precision " << std::string(to_string(compute))
               << " batch=" << d.batch << " H=" << d.num_heads << " G=" << d.num_kv_heads << " q_len=" << d.q_len
               << " kv_len=" << d.kv_len << " d=" << d.head_dim << " bshd=" << setup.bshd_layout
               << " causal=" << setup.causal << " offset=" << data.q_offset << " padded=" << setup.padded
               << " additive=" << setup.additive << " window=" << setup.window << " softcap=" << setup.logit_softcap
               << " sinks=" << setup.sinks << " q_gain=" << setup.q_gain << " worst/tol=" << worst);
  CHECK(failures == 0);
}

}  // namespace kvhead::testing
