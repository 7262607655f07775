// RoPE's inverse frequencies and cos/sin factor for each rope_scaling kind
// (include/kvhead/attention.hpp documents the formulas, after Hugging Face's
// modeling_rope_utils), computed in double.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kvhead/attention.hpp"

namespace kvhead::engine {

struct rope_frequencies {
  std::vector<double> inv_freq;   // [rotary_dim / 2]
  double attention_factor = 1.0;  // multiplies cos and sin (yarn, longrope)
};

/// The frequencies of RoPE with base theta (> 0) over rotary_dim (even, > 0)
/// floats; `scaling` must have passed rope_scaling_problem. For kind none,
/// inv_freq_i = pow(theta, -2i / rotary_dim) exactly. longrope: those of
/// short_factor, or with `long_factors` those of long_factor; the other
/// kinds ignore `long_factors`.
rope_frequencies scaled_rope_frequencies(double theta, std::size_t rotary_dim, const rope_scaling& scaling,
                                         bool long_factors = false);

/// longrope: the fewest tokens of a sequence that take long_factor, those
/// longer than original_max_position_embeddings (HF's seq_len > original);
/// SIZE_MAX for the other kinds (and for a length past every size).
std::size_t longrope_long_length(const rope_scaling& scaling);

/// The problem of a positive `rope_theta` whose frequencies (up to
/// max(1, 1 / theta)) overflow a float, or an empty string.
std::string rope_theta_problem(double rope_theta);

/// The first problem of RoPE of base `rope_theta` (rope_theta_problem) over
/// rotary_dim floats with `scaling` (a non-finite number, factor <= 0, yarn
/// at theta 1, longrope factors not rotary_dim / 2, ...), or an empty string
/// when there is none.
std::string rope_scaling_problem(const rope_scaling& scaling, double rope_theta, std::size_t rotary_dim);

}  // namespace kvhead::engine
