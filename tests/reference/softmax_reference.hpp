// Plain softmax and exp references in double precision (share no code with
// the engine). Special values follow the engine's documented contract
// (engine/softmax/softmax.hpp): -inf is masked (probability 0), a fully
// masked row gives zeros, and NaN or +inf anywhere in a row gives NaN for
// the whole row.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace kvhead::reference {

/// exp in double: accurate to ~1e-16 relative, far beyond float.
inline double exp_double(float x) { return std::exp(static_cast<double>(x)); }

struct softmax_result {
  std::vector<double> value;    // the probabilities
  std::vector<double> shifted;  // x[j] - max in double (-inf when masked): the argument of exp
};

/// Softmax of x[0:n] in double, by the textbook formula exp(x - max) / sum;
/// with an attention sink (a finite logit; -inf: none), Hugging Face
/// gpt-oss's: the sink joins the max and the sum and has no entry of its own.
inline softmax_result softmax(const float* x, std::size_t n, double sink = -std::numeric_limits<double>::infinity()) {
  constexpr double infinity = std::numeric_limits<double>::infinity();
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  softmax_result result{std::vector<double>(n, 0.0), std::vector<double>(n, -infinity)};
  double max = -infinity;
  bool undefined = false;
  for (std::size_t j = 0; j < n; ++j) {
    const double value = x[j];
    if (std::isnan(value) || value == infinity) undefined = true;
    if (value > max) max = value;
  }
  if (undefined) {
    result.value.assign(n, nan);
    return result;
  }
  if (sink > max) max = sink;
  if (max == -infinity) return result;  // no visible entry: zeros
  double sum = sink == -infinity ? 0.0 : std::exp(sink - max);
  for (std::size_t j = 0; j < n; ++j) {
    result.shifted[j] = double(x[j]) - max;
    result.value[j] = std::exp(result.shifted[j]);
    sum += result.value[j];
  }
  for (double& value : result.value) value /= sum;
  return result;
}

}  // namespace kvhead::reference
