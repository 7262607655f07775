#include "engine/attention/rope_scaling.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <utility>

#include "engine/arch/require.hpp"

namespace kvhead::engine {

namespace {

// HF's yarn get_mscale: 1 for scale <= 1, else 0.1 m ln(scale) + 1.
double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// The pair index at which `rotations` full turns fit in `length` positions
// (HF find_correction_dim), for rotary_dim r and base theta.
double correction_dim(double rotations, double r, double theta, double length) {
  return r * std::log(length / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
}

void scale_llama3(std::vector<double>& inv_freq, const rope_scaling& s) {
  const double low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
  const double high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f /= s.factor;
    } else if (wavelen >= high_freq_wavelen && s.high_freq_factor > s.low_freq_factor) {
      // The medium band; none when high_freq_factor <= low_freq_factor (HF
      // warns and computes the same, but at a wavelength exactly on both
      // bounds, where it divides 0 by 0).
      const double smooth =
          (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
}

void scale_yarn(std::vector<double>& inv_freq, double theta, std::size_t rotary_dim, const rope_scaling& s) {
  const double r = double(rotary_dim);
  double low = correction_dim(s.beta_fast, r, theta, s.original_max_position_embeddings);
  double high = correction_dim(s.beta_slow, r, theta, s.original_max_position_embeddings);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, r - 1.0);
  if (low == high) high += 0.001;  // HF: prevents a division by zero
  for (std::size_t i = 0; i < inv_freq.size(); ++i) {
    // ramp 0 keeps the frequency (extrapolation), ramp 1 divides it by factor.
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;
    inv_freq[i] = inv_freq[i] / s.factor * (1.0 - extrapolation) + inv_freq[i] * extrapolation;
  }
}

double yarn_attention_factor(const rope_scaling& s) {
  if (s.attention_factor) return *s.attention_factor;
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

// HF's longrope: as given, else 1 up to factor 1 and sqrt(1 + ln factor / ln L) above.
double longrope_attention_factor(const rope_scaling& s) {
  if (s.attention_factor) return *s.attention_factor;
  if (s.factor <= 1.0) return 1.0;
  return std::sqrt(1.0 + std::log(s.factor) / std::log(s.original_max_position_embeddings));
}

// The largest unscaled frequency, theta^(-2i/r) over i < r/2, is at most
// max(1, 1 / theta); scaled, at most that over the factor. Within a float
// (HF's frequencies are floats), every angle position * frequency is finite
// in double, as cos and sin need (a factor of 1e-308 made them NaN).
double largest_frequency(double rope_theta) { return std::max(1.0, 1.0 / rope_theta); }
constexpr double float_max = std::numeric_limits<float>::max();

std::string longrope_problem(const rope_scaling& s, double rope_theta, std::size_t rotary_dim) {
  // Its default attention factor divides by ln L: none at L = 1.
  if (!(s.original_max_position_embeddings > 1.0))
    return "longrope rope_scaling original_max_position_embeddings must be above 1, got " +
           real_text(s.original_max_position_embeddings);
  if (s.attention_factor && !(std::isfinite(*s.attention_factor) && *s.attention_factor > 0.0))
    return "longrope rope_scaling attention_factor must be positive and finite";
  using pick = rope_scaling::longrope_pick;
  if (s.longrope_factors != pick::per_call && s.longrope_factors != pick::short_factors &&
      s.longrope_factors != pick::long_factors)
    return "longrope rope_scaling longrope_factors must be per_call, short_factors or long_factors, got " +
           std::to_string(int(s.longrope_factors));
  for (const auto& [name, factors] : {std::pair{"short_factor", &s.short_factor}, {"long_factor", &s.long_factor}}) {
    if (factors->size() != rotary_dim / 2)
      return std::string("longrope rope_scaling ") + name +
             " must hold rotary_dim / 2 = " + std::to_string(rotary_dim / 2) + " numbers, got " +
             std::to_string(factors->size());
    for (const double factor : *factors) {
      if (!(std::isfinite(factor) && factor > 0.0))
        return std::string("longrope rope_scaling ") + name + " must be positive and finite, got " + real_text(factor);
      if (largest_frequency(rope_theta) / factor > float_max)
        return std::string("longrope rope_scaling ") + name + " " + real_text(factor) +
               " is too small: the frequencies over it overflow a float";
    }
  }
  return "";
}

}  // namespace

rope_frequencies scaled_rope_frequencies(double theta, std::size_t rotary_dim, const rope_scaling& scaling,
                                         bool long_factors) {
  rope_frequencies result;
  for (std::size_t i = 0; i < rotary_dim / 2; ++i)
    result.inv_freq.push_back(std::pow(theta, -2.0 * double(i) / double(rotary_dim)));
  switch (scaling.type) {
    case rope_scaling::kind::none:
      break;
    case rope_scaling::kind::linear:
      for (double& f : result.inv_freq) f /= scaling.factor;
      break;
    case rope_scaling::kind::llama3:
      scale_llama3(result.inv_freq, scaling);
      break;
    case rope_scaling::kind::yarn:
      scale_yarn(result.inv_freq, theta, rotary_dim, scaling);
      result.attention_factor = yarn_attention_factor(scaling);
      break;
    case rope_scaling::kind::longrope: {
      const std::vector<double>& factors = long_factors ? scaling.long_factor : scaling.short_factor;
      for (std::size_t i = 0; i < result.inv_freq.size(); ++i) result.inv_freq[i] /= factors[i];
      result.attention_factor = longrope_attention_factor(scaling);
      break;
    }
  }
  return result;
}

std::size_t longrope_long_length(const rope_scaling& scaling) {
  // The first integer above L.
  const double first = std::floor(scaling.original_max_position_embeddings) + 1.0;
  if (scaling.type != rope_scaling::kind::longrope || !(first < 0x1p63)) return SIZE_MAX;
  return std::size_t(first);
}

std::string rope_theta_problem(double rope_theta) {
  if (largest_frequency(rope_theta) > float_max)
    return "rope_theta " + real_text(rope_theta) +
           " is too small: its frequencies (up to 1 / rope_theta) overflow a float";
  return "";
}

std::string rope_scaling_problem(const rope_scaling& s, double rope_theta, std::size_t rotary_dim) {
  using kind = rope_scaling::kind;
  if (const std::string problem = rope_theta_problem(rope_theta); !problem.empty()) return problem;
  if (s.type != kind::none && s.type != kind::linear && s.type != kind::llama3 && s.type != kind::yarn &&
      s.type != kind::longrope)
    return "rope_scaling type must be none, linear, llama3, yarn or longrope, got " + std::to_string(int(s.type));
  if (s.type == kind::none) return "";
  for (const double value : {s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings,
                             s.beta_fast, s.beta_slow, s.mscale, s.mscale_all_dim})
    if (!std::isfinite(value)) return "rope_scaling numbers must be finite";
  if (!(s.factor > 0.0)) return "rope_scaling factor must be positive, got " + real_text(s.factor);
  if (largest_frequency(rope_theta) / s.factor > float_max)
    return "rope_scaling factor " + real_text(s.factor) + " is too small: the frequencies over it overflow a float";
  // llama3: HF only warns about a factor below 1 and frequency factors out of order.
  if (s.type == kind::llama3 && !(s.low_freq_factor > 0.0 && s.high_freq_factor > 0.0))
    return "llama3 rope_scaling needs positive low_freq_factor and high_freq_factor";
  if ((s.type == kind::llama3 || s.type == kind::yarn) && !(s.original_max_position_embeddings > 0.0))
    return "rope_scaling original_max_position_embeddings must be positive";
  if (s.type == kind::yarn) {
    if (!(s.beta_fast > 0.0 && s.beta_slow > 0.0)) return "yarn rope_scaling beta_fast and beta_slow must be positive";
    if (s.attention_factor && !(std::isfinite(*s.attention_factor) && *s.attention_factor > 0.0))
      return "yarn rope_scaling attention_factor must be positive and finite";
    // Its correction range divides by log(theta): every frequency NaN at 1.
    if (rope_theta == 1.0) return "yarn rope_scaling needs rope_theta other than 1 (it divides by log(rope_theta))";
  }
  if (s.type == kind::longrope) return longrope_problem(s, rope_theta, rotary_dim);
  return "";
}

}  // namespace kvhead::engine
