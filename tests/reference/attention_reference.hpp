// Plain attention references in double precision (no code shared with the
// engine): scaled-dot-product attention with every mask kind, soft-capping
// and sinks as Hugging Face's eager attention computes them (Gemma 2:
// scores = cap tanh(scores / cap) before the mask; gpt-oss: the sink logit
// concatenated to each row, the max and the softmax over both, the sink's
// column dropped), ALiBi (slope_h (j - i) added to each score after the cap,
// vLLM's form of BLOOM's slope_h j), RoPE, and the whole layer. Also returns the magnitudes
// the float error bound needs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace kvhead::reference {

// Element (b, h, s, e) of a strided [batch, heads, seq, d] tensor.
struct strided4 {
  const float* data;
  std::size_t batch_stride, head_stride, seq_stride;
  double at(std::size_t b, std::size_t h, std::size_t s, std::size_t e) const {
    return data[b * batch_stride + h * head_stride + s * seq_stride + e];
  }
};

struct sdpa_case {
  std::size_t batch, heads, kv_heads, q_len, kv_len, head_dim;
  double scale;
  bool causal;
  std::size_t q_offset;
  const std::size_t* valid_len;  // null: kv_len
  const float* additive_mask;    // [q_len, kv_len] or null
  std::size_t window = 0;        // sliding window: key j visible only if (q_offset + i) - j < window; 0: none
  double logit_softcap = 0.0;    // > 0: soft-capping
  const float* sinks = nullptr;  // [heads] or null
  const float* alibi_slopes = nullptr;  // [heads] or null
};

struct sdpa_result {
  std::vector<double> out;                 // [batch, heads, q_len, d]
  std::vector<double> probability;         // [batch, heads, q_len, kv_len]
  std::vector<double> score_magnitude;     // [batch, heads, q_len]: max_j scale * sum_e |q_e k_je| + |alibi_j|
  std::vector<double> value_magnitude;     // [batch, heads, q_len]: max over visible j, e of |v_je|
  std::vector<double> weighted_magnitude;  // [batch, heads, q_len, d]: sum_j p_j |v_je|
};

inline sdpa_result sdpa(const sdpa_case& c, strided4 q, strided4 k, strided4 v) {
  const std::size_t group = c.heads / c.kv_heads, d = c.head_dim;
  sdpa_result result;
  result.out.assign(c.batch * c.heads * c.q_len * d, 0.0);
  result.probability.assign(c.batch * c.heads * c.q_len * c.kv_len, 0.0);
  result.score_magnitude.assign(c.batch * c.heads * c.q_len, 0.0);
  result.value_magnitude.assign(c.batch * c.heads * c.q_len, 0.0);
  result.weighted_magnitude.assign(result.out.size(), 0.0);
  std::vector<double> score(c.kv_len);
  std::vector<bool> visible(c.kv_len);
  for (std::size_t b = 0; b < c.batch; ++b) {
    const std::size_t valid = c.valid_len ? c.valid_len[b] : c.kv_len;
    for (std::size_t h = 0; h < c.heads; ++h) {
      const std::size_t g = h / group;
      for (std::size_t i = 0; i < c.q_len; ++i) {
        const std::size_t index = (b * c.heads + h) * c.q_len + i;
        double best = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < c.kv_len; ++j) {
          visible[j] =
              j < valid && (!c.causal || j <= c.q_offset + i) && (c.window == 0 || c.q_offset + i < j + c.window);
          double dot = 0.0, magnitude = 0.0;
          for (std::size_t e = 0; e < d; ++e) {
            dot += q.at(b, h, i, e) * k.at(b, g, j, e);
            magnitude += std::fabs(q.at(b, h, i, e) * k.at(b, g, j, e));
          }
          score[j] = c.scale * dot;
          if (c.logit_softcap > 0.0) score[j] = c.logit_softcap * std::tanh(score[j] / c.logit_softcap);
          const double alibi = c.alibi_slopes ? double(c.alibi_slopes[h]) * (double(j) - double(c.q_offset + i)) : 0.0;
          score[j] += alibi;
          score[j] += c.additive_mask ? double(c.additive_mask[i * c.kv_len + j]) : 0.0;
          if (!visible[j]) score[j] = -std::numeric_limits<double>::infinity();
          if (visible[j]) {
            result.score_magnitude[index] =
                std::max(result.score_magnitude[index], std::fabs(c.scale) * magnitude + std::fabs(alibi));
            for (std::size_t e = 0; e < d; ++e)
              result.value_magnitude[index] = std::max(result.value_magnitude[index], std::fabs(v.at(b, g, j, e)));
          }
          best = std::max(best, score[j]);
        }
        const double sink = c.sinks ? double(c.sinks[h]) : -std::numeric_limits<double>::infinity();
        best = std::max(best, sink);
        if (best == -std::numeric_limits<double>::infinity()) continue;  // no visible key, no sink: zeros
        double total = c.sinks ? std::exp(sink - best) : 0.0;
        for (std::size_t j = 0; j < c.kv_len; ++j) {
          score[j] = std::exp(score[j] - best);
          total += score[j];
        }
        for (std::size_t j = 0; j < c.kv_len; ++j) {
          const double p = score[j] / total;
          result.probability[index * c.kv_len + j] = p;
          if (p == 0.0) continue;
          for (std::size_t e = 0; e < d; ++e) {
            result.out[index * d + e] += p * v.at(b, g, j, e);
            result.weighted_magnitude[index * d + e] += p * std::fabs(v.at(b, g, j, e));
          }
        }
      }
    }
  }
  return result;
}

// Hugging Face Llama RoPE (rotate_half) on one row of head_dim values, in double.
inline void rope(std::vector<double>& row, std::size_t offset, std::size_t head_dim, std::size_t position,
                 double theta) {
  const std::size_t half = head_dim / 2;
  for (std::size_t i = 0; i < half; ++i) {
    const double angle = double(position) * std::pow(theta, -2.0 * double(i) / double(head_dim));
    const double x1 = row[offset + i], x2 = row[offset + i + half];
    row[offset + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
    row[offset + i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
  }
}

// y = x Wᵀ + b in double: x [rows, in], W [out, in].
inline std::vector<double> linear(const std::vector<double>& x, std::size_t rows, const float* weight,
                                  const float* bias, std::size_t in, std::size_t out) {
  std::vector<double> y(rows * out);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double sum = bias ? double(bias[o]) : 0.0;
      for (std::size_t i = 0; i < in; ++i) sum += x[r * in + i] * double(weight[o * in + i]);
      y[r * out + o] = sum;
    }
  return y;
}

}  // namespace kvhead::reference
