// RoPE with Hugging Face's scaling variants, in double, written from
// transformers' modeling_rope_utils (default, linear, llama3, yarn, longrope) and
// apply_rotary_pos_emb with rotate_half on the first rotary_dim floats of a
// head (Phi-3's partial rotary). Shares no code with the engine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace kvhead::reference {

enum class rope_kind { plain, linear, llama3, yarn, longrope };

struct rope_variant {
  rope_kind kind = rope_kind::plain;
  double theta = 10000.0;
  std::size_t rotary_dim = 0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0, original_length = 0.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0: not given
  double attention_factor = 0.0;              // 0: not given
  bool truncate = true;
  std::vector<double> short_factor, long_factor;  // longrope
};

/// HF's inverse frequencies [rotary_dim / 2]: 1 / theta^(2i / r), then
/// scaled; longrope's for a sequence of seq_len tokens (HF's dynamic update:
/// long_factor when seq_len > original_max_position_embeddings).
inline std::vector<double> rope_inv_freq(const rope_variant& v, std::size_t seq_len = 0) {
  const double pi = 3.14159265358979323846;
  const std::size_t r = v.rotary_dim, half = r / 2;
  std::vector<double> base(half), out(half);
  for (std::size_t i = 0; i < half; ++i) base[i] = 1.0 / std::pow(v.theta, double(2 * i) / double(r));
  if (v.kind == rope_kind::plain) return base;
  if (v.kind == rope_kind::linear) {
    for (std::size_t i = 0; i < half; ++i) out[i] = base[i] / v.factor;
    return out;
  }
  if (v.kind == rope_kind::longrope) {
    const std::vector<double>& ext = double(seq_len) > v.original_length ? v.long_factor : v.short_factor;
    for (std::size_t i = 0; i < half; ++i) out[i] = 1.0 / (ext[i] * std::pow(v.theta, double(2 * i) / double(r)));
    return out;
  }
  if (v.kind == rope_kind::llama3) {
    for (std::size_t i = 0; i < half; ++i) {
      const double wavelen = 2 * pi / base[i];
      const double low_wavelen = v.original_length / v.low_freq_factor;
      const double high_wavelen = v.original_length / v.high_freq_factor;
      // HF's two torch.where, in its order: the low frequencies divided, then
      // the medium band (none when high_freq_factor <= low_freq_factor but at
      // a wavelength exactly on both bounds, where HF divides 0 by 0) blended.
      out[i] = wavelen > low_wavelen ? base[i] / v.factor : base[i];
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen) && v.high_freq_factor > v.low_freq_factor) {
        const double s = (v.original_length / wavelen - v.low_freq_factor) / (v.high_freq_factor - v.low_freq_factor);
        out[i] = (1 - s) * out[i] / v.factor + s * out[i];
      }
    }
    return out;
  }
  // yarn
  auto dim_of = [&](double rotations) {
    return double(r) * std::log(v.original_length / (rotations * 2 * pi)) / (2 * std::log(v.theta));
  };
  double low = dim_of(v.beta_fast), high = dim_of(v.beta_slow);
  if (v.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  if (low < 0) low = 0;
  if (high > double(r) - 1) high = double(r) - 1;
  if (low == high) high += 0.001;
  for (std::size_t i = 0; i < half; ++i) {
    double linear = (double(i) - low) / (high - low);
    linear = std::min(1.0, std::max(0.0, linear));
    const double keep = 1 - linear;  // HF's inv_freq_extrapolation_factor
    out[i] = (1.0 / (v.factor / base[i])) * (1 - keep) + base[i] * keep;
  }
  return out;
}

/// The factor on cos and sin (yarn, longrope; 1 otherwise).
inline double rope_attention_factor(const rope_variant& v) {
  if (v.kind == rope_kind::longrope) {
    if (v.attention_factor != 0.0) return v.attention_factor;
    return v.factor <= 1 ? 1.0 : std::sqrt(1 + std::log(v.factor) / std::log(v.original_length));
  }
  if (v.kind != rope_kind::yarn) return 1.0;
  if (v.attention_factor != 0.0) return v.attention_factor;
  auto mscale = [&](double m) { return v.factor <= 1 ? 1.0 : 0.1 * m * std::log(v.factor) + 1.0; };
  if (v.mscale != 0.0 && v.mscale_all_dim != 0.0) return mscale(v.mscale) / mscale(v.mscale_all_dim);
  return mscale(1.0);
}

/// One head at `position` of a sequence seq_len tokens long (0: position +
/// 1): q * cos + rotate_half(q) * sin on x[0, r); the floats after them are
/// not touched.
inline void rope_double(double* x, const rope_variant& v, std::size_t position, std::size_t seq_len = 0) {
  const std::vector<double> inv_freq = rope_inv_freq(v, seq_len != 0 ? seq_len : position + 1);
  const double af = rope_attention_factor(v);
  const std::size_t half = v.rotary_dim / 2;
  std::vector<double> rotated(v.rotary_dim);
  for (std::size_t e = 0; e < v.rotary_dim; ++e) {
    const double angle = double(position) * inv_freq[e % half];
    const double rotate_half = e < half ? -x[e + half] : x[e - half];
    rotated[e] = x[e] * std::cos(angle) * af + rotate_half * std::sin(angle) * af;
  }
  std::copy(rotated.begin(), rotated.end(), x);
}

/// RMSNorm over n values: w_e * x_e / sqrt(mean(x^2) + eps).
inline void rms_norm_double(double* x, const double* w, std::size_t n, double eps) {
  double sum = 0;
  for (std::size_t e = 0; e < n; ++e) sum += x[e] * x[e];
  const double inv = 1 / std::sqrt(sum / double(n) + eps);
  for (std::size_t e = 0; e < n; ++e) x[e] = w[e] * (x[e] * inv);
}

}  // namespace kvhead::reference
