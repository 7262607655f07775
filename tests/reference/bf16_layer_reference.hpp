// The attention layer in bf16 precision (attention.hpp, attention_config::
// precision), in double, with each error bound the float computation can
// reach (no code shared with the engine). Rounding points as documented:
// x and the weights rounded to bf16; q, k, v after RoPE rounded to bf16;
// within each 256-key chunk (the fixed reduction unit, flash_attention.hpp)
// the unnormalized probabilities exp(s - chunk max) rounded to bf16 before
// p v, the sum taken over the unrounded ones; the attended rows rounded to
// bf16 before o_proj.
//
// Rounding is where a bound needs care: a value the engine computes in fp32
// within e of the reference's double x rounds to the same bf16 unless a
// rounding boundary lies in [x - e, x + e]. Only those "ambiguous" values
// (rare: e is fp32-sized, the gaps bf16-sized) carry a bf16-sized error
// into the bound, the gap round(x + e) - round(x - e); every other rounded
// value is the same in both, exactly. That gives `error`, a bound on each
// element. Many ambiguous values in one sum loosen it to bf16 size, so each
// element also gets `typical`, an estimate of its usual size for a mean
// bound: the same propagation with each fp32 sum's error taken as the
// random walk of its roundings (2 u times the sum of |terms|, where the
// bound has (2K + 6) u: rounding errors of random sign do not add up), and
// every bf16 rounding passing its input's deviation on instead of its gap
// (a value within d of x, uniformly placed in its bf16 interval, moves by d
// on average: |d| / gap of the time by one gap). The mean error over many
// elements stays below the mean of `typical`, at fp32 level; a rounding the
// engine skipped or added moves it to bf16 size, far beyond.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "tests/reference/attention_reference.hpp"

namespace kvhead::reference {

inline constexpr double float_roundoff = 0x1p-24;  // u of fp32
inline constexpr std::size_t bf16_chunk_keys = 256;

/// x rounded to the nearest bfloat16 (8 significant bits), ties to even; x
/// finite and in bf16's normal range, or 0 (test values are O(1)).
inline double bf16_nearest(double x) {
  if (x == 0.0) return x;
  int exponent = 0;
  std::frexp(x, &exponent);  // |x| in [2^(exponent - 1), 2^exponent)
  return std::ldexp(std::nearbyint(std::ldexp(x, 8 - exponent)), exponent - 8);
}

/// How far the bf16 rounding of a value within `error` of x may lie from
/// bf16_nearest(x): 0 unless a rounding boundary is within reach.
inline double bf16_rounding_spread(double x, double error) { return bf16_nearest(x + error) - bf16_nearest(x - error); }

/// Rows [batch, seq, heads, d] of doubles with a bound on the engine's
/// deviation from each, and its typical size (see the top of the file).
struct bounded_rows {
  std::vector<double> value, error, typical;
};

struct bf16_attention_case {
  std::size_t batch, heads, kv_heads, seq, head_dim;
  double scale;
  bool causal;
};

/// Attention over bf16 values q [batch, seq, H, d], k and v [batch, seq, G,
/// d] (each within its error of the engine's), every sequence from position
/// 0. Returns out [batch, seq, H, d] and the bound on the engine's error;
/// `ambiguous` counts the probabilities whose rounding may differ.
struct bf16_attention_result {
  bounded_rows out;
  std::size_t ambiguous = 0;
};

inline bf16_attention_result bf16_attention(const bf16_attention_case& c, const bounded_rows& q, const bounded_rows& k,
                                            const bounded_rows& v) {
  const std::size_t d = c.head_dim, group = c.heads / c.kv_heads;
  const double u = float_roundoff;
  bf16_attention_result result;
  result.out.value.assign(c.batch * c.seq * c.heads * d, 0.0);
  result.out.error.assign(result.out.value.size(), 0.0);
  result.out.typical.assign(result.out.value.size(), 0.0);
  std::vector<double> score(c.seq), score_error(c.seq), score_typical(c.seq), rounded(c.seq), spread(c.seq),
      deviation(c.seq), chunk_max(c.seq);
  for (std::size_t b = 0; b < c.batch; ++b)
    for (std::size_t h = 0; h < c.heads; ++h)
      for (std::size_t i = 0; i < c.seq; ++i) {
        const std::size_t g = h / group, visible = c.causal ? i + 1 : c.seq;
        const std::size_t q_row = ((b * c.seq + i) * c.heads + h) * d;
        auto kv_row = [&](std::size_t j) { return ((b * c.seq + j) * c.kv_heads + g) * d; };
        // 1. Scores: the fp32 GEMM of exact bf16 products (error (2d + 6) u
        // times the magnitude, gemm_test), plus what the inputs' deviations move.
        double largest_score = 0.0, value_max = 0.0;
        for (std::size_t j = 0; j < visible; ++j) {
          double dot = 0.0, magnitude = 0.0, moved = 0.0, moved_typical = 0.0;
          for (std::size_t e = 0; e < d; ++e) {
            const double qe = q.value[q_row + e], ke = k.value[kv_row(j) + e];
            const double dq = q.error[q_row + e], dk = k.error[kv_row(j) + e];
            const double tq = q.typical[q_row + e], tk = k.typical[kv_row(j) + e];
            dot += qe * ke;
            magnitude += std::fabs(qe * ke);
            moved += std::fabs(dq * ke) + std::fabs(qe * dk) + dq * dk;
            moved_typical += std::fabs(tq * ke) + std::fabs(qe * tk) + tq * tk;
            value_max = std::max(value_max, std::fabs(v.value[kv_row(j) + e]) + v.error[kv_row(j) + e]);
          }
          score[j] = c.scale * dot;
          score_error[j] = std::fabs(c.scale) * ((2.0 * double(d) + 6.0) * u * magnitude + moved);
          score_typical[j] = std::fabs(c.scale) * (2.0 * u * magnitude + moved_typical);
          largest_score = std::max(largest_score, std::fabs(c.scale) * magnitude);
        }
        // 2. Per chunk: max, p~ = exp(s - max), its bf16 rounding and how far
        // the engine's may be from it (exp within 2 ULP; s - max within the
        // two scores' errors and one rounding).
        double best = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < visible; ++j) best = std::max(best, score[j]);
        double total = 0.0;
        for (std::size_t first = 0; first < visible; first += bf16_chunk_keys) {
          const std::size_t end = std::min(visible, first + bf16_chunk_keys);
          double m = -std::numeric_limits<double>::infinity(), m_error = 0.0, m_typical = 0.0;
          for (std::size_t j = first; j < end; ++j) {
            m = std::max(m, score[j]);
            m_error = std::max(m_error, score_error[j]);
            m_typical = std::max(m_typical, score_typical[j]);
          }
          for (std::size_t j = first; j < end; ++j) {
            const double p = std::exp(score[j] - m), own = u * std::fabs(score[j] - m) + 5.0 * u;
            rounded[j] = bf16_nearest(p);
            spread[j] = bf16_rounding_spread(p, p * std::expm1(score_error[j] + m_error + own) + 1e-38);
            deviation[j] = p * std::expm1(score_typical[j] + m_typical + own) + 1e-38;
            result.ambiguous += spread[j] != 0.0;
            chunk_max[j] = m;
            total += p * std::exp(m - best);
          }
        }
        // 3. out = sum_c exp(m_c - max) sum_j round(p~_j) v_j / sum_j exp(s_j - max).
        // Bound: the fp32 roundings of the sums, the rescaling and the
        // normalization (attention_test.cpp's terms, on max |v|); the scores'
        // errors ds_j through the (unrounded) sum and the rescaling, to first
        // order sum_j p_j ds_j |v_j - out| (p_j the exact probabilities),
        // doubled; the ambiguous roundings of p~ and the deviations of v.
        const double chunks = double(visible / bf16_chunk_keys + 1);
        const double own = 4.0 * u * largest_score + (8.0 * chunks + 16.0) * u;
        const double own_error = own + 4.0 * double(visible) * u;
        for (std::size_t e = 0; e < d; ++e) {
          double acc = 0.0;
          for (std::size_t j = 0; j < visible; ++j)
            acc += std::exp(chunk_max[j] - best) / total * rounded[j] * v.value[kv_row(j) + e];
          double moved = 0.0, moved_typical = 0.0;
          for (std::size_t j = 0; j < visible; ++j) {
            const double weight = std::exp(chunk_max[j] - best) / total, vj = v.value[kv_row(j) + e];
            const double through_scores = 2.0 * std::exp(score[j] - best) / total * std::fabs(vj - acc);
            moved += weight * (std::fabs(spread[j]) * (std::fabs(vj) + v.error[kv_row(j) + e]) +
                               rounded[j] * v.error[kv_row(j) + e]) +
                     through_scores * score_error[j];
            moved_typical += weight * (deviation[j] * std::fabs(vj) + rounded[j] * v.typical[kv_row(j) + e]) +
                             through_scores * score_typical[j];
          }
          result.out.value[q_row + e] = acc;
          result.out.error[q_row + e] = value_max * own_error + 1.01 * moved + 1e-30;
          result.out.typical[q_row + e] = value_max * own + 1.01 * moved_typical + 1e-30;
        }
      }
  return result;
}

struct bf16_layer_case {
  std::size_t heads, kv_heads, head_dim, d_model;
  double scale;
  bool causal;
  double rope_theta;  // 0: none (else plain RoPE over all of head_dim)
  std::size_t batch, seq;
};

/// Weights [out, in] and biases (may be null), fp32 as given to the layer.
struct bf16_layer_weights {
  const float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
};

/// y = layer(x) for x [batch, seq, d_model], with the bound on each
/// element's error; `ambiguous` counts the roundings that may differ.
struct bf16_layer_result {
  bounded_rows y;
  std::size_t ambiguous = 0;
};

namespace detail {

// y [rows, out] = round(x) round(W)ᵀ + b in double, error bound: the fp32
// GEMM's (2K + 6) u on the magnitude (bias included), plus the deviations
// of the rounded inputs x (their error and typical).
inline bounded_rows bf16_linear(const bounded_rows& x, std::size_t rows, const float* weight, const float* bias,
                                std::size_t in, std::size_t out) {
  bounded_rows y{std::vector<double>(rows * out), std::vector<double>(rows * out), std::vector<double>(rows * out)};
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double sum = bias ? double(bias[o]) : 0.0, magnitude = std::fabs(sum), moved = 0.0, moved_typical = 0.0;
      for (std::size_t i = 0; i < in; ++i) {
        const double w = bf16_nearest(double(weight[o * in + i]));
        sum += x.value[r * in + i] * w;
        magnitude += std::fabs(x.value[r * in + i] * w);
        moved += std::fabs(x.error[r * in + i] * w);
        moved_typical += std::fabs(x.typical[r * in + i] * w);
      }
      y.value[r * out + o] = sum;
      y.error[r * out + o] = (2.0 * double(in) + 6.0) * float_roundoff * magnitude + moved;
      y.typical[r * out + o] = 2.0 * float_roundoff * magnitude + moved_typical;
    }
  return y;
}

// Rounds every value to bf16: the error becomes the rounding's spread (0
// where both round alike), the typical deviation stays; counts the
// ambiguous ones.
inline bounded_rows rounded_to_bf16(const bounded_rows& rows, std::size_t& ambiguous) {
  bounded_rows result{std::vector<double>(rows.value.size()), std::vector<double>(rows.value.size()), rows.typical};
  for (std::size_t i = 0; i < rows.value.size(); ++i) {
    result.value[i] = bf16_nearest(rows.value[i]);
    result.error[i] = bf16_rounding_spread(rows.value[i], rows.error[i]);
    ambiguous += result.error[i] != 0.0;
  }
  return result;
}

}  // namespace detail

inline bf16_layer_result bf16_layer(const bf16_layer_case& c, const bf16_layer_weights& w, const float* x) {
  const std::size_t rows = c.batch * c.seq, d = c.head_dim;
  const std::size_t q_width = c.heads * d, kv_width = c.kv_heads * d;
  bf16_layer_result result;
  bounded_rows xr{std::vector<double>(rows * c.d_model), std::vector<double>(rows * c.d_model, 0.0),
                  std::vector<double>(rows * c.d_model, 0.0)};
  for (std::size_t i = 0; i < xr.value.size(); ++i) xr.value[i] = bf16_nearest(double(x[i]));
  // 1. Projections, 2. RoPE in fp32 (error: both inputs' and 4 u of their
  // magnitudes: cos and sin rounded to float, two products, one sum).
  bounded_rows q = detail::bf16_linear(xr, rows, w.wq, w.bq, c.d_model, q_width);
  bounded_rows k = detail::bf16_linear(xr, rows, w.wk, w.bk, c.d_model, kv_width);
  const bounded_rows v = detail::bf16_linear(xr, rows, w.wv, w.bv, c.d_model, kv_width);
  if (c.rope_theta != 0.0)
    for (bounded_rows* rotated : {&q, &k}) {
      const std::size_t heads = rotated == &q ? c.heads : c.kv_heads;
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t h = 0; h < heads; ++h) {
          const std::size_t offset = (r * heads + h) * d;
          for (std::size_t i = 0; i < d / 2; ++i) {
            const double own = 4.0 * float_roundoff *
                               (std::fabs(rotated->value[offset + i]) + std::fabs(rotated->value[offset + i + d / 2]));
            for (std::vector<double>* bound : {&rotated->error, &rotated->typical})
              (*bound)[offset + i] = (*bound)[offset + i + d / 2] =
                  (*bound)[offset + i] + (*bound)[offset + i + d / 2] + own;
          }
          rope(rotated->value, offset, d, r % c.seq, c.rope_theta);
        }
    }
  // 3. q, k, v rounded to bf16; attention.
  const bf16_attention_result attended = bf16_attention(
      {c.batch, c.heads, c.kv_heads, c.seq, d, c.scale, c.causal}, detail::rounded_to_bf16(q, result.ambiguous),
      detail::rounded_to_bf16(k, result.ambiguous), detail::rounded_to_bf16(v, result.ambiguous));
  result.ambiguous += attended.ambiguous;
  // 4. The attended rows rounded to bf16, o_proj.
  const bounded_rows a = detail::rounded_to_bf16(attended.out, result.ambiguous);
  result.y = detail::bf16_linear(a, rows, w.wo, w.bo, q_width, c.d_model);
  return result;
}

}  // namespace kvhead::reference
