// exp_floats: the accuracy and range stated in engine/softmax/softmax.hpp,
// checked on every SIMD path this CPU runs against a double std::exp.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/softmax/softmax.hpp"
#include "kvhead/config.hpp"
#include "tests/reference/softmax_reference.hpp"

namespace {

using kvhead::simd_path;
using kvhead::engine::exp_floats;

// The range of softmax.hpp's accuracy statement and its bound. An exhaustive
// run over all 2.24e9 floats of the range found 1.53 ULP at worst (2 apart
// in bit patterns for 2 inputs on sse2, 27 on avx2 and avx512; every other
// result within 1).
constexpr float lowest_accurate = -87.33f;
constexpr float highest_accurate = 88.37f;
constexpr std::int64_t ulp_bound = 2;

// Outside it (softmax.hpp): inf from xsimd's maxlog up, subnormal results
// down to -87.6831, and 0 below.
constexpr float first_infinite = 0x1.61814ap+6f;   // 88.3762589, xsimd's maxlog as a float
constexpr float last_finite = 0x1.618148p+6f;      // 88.3762512
constexpr float last_nonzero = -0x1.5ebb84p+6f;    // -87.6831207
constexpr float first_zero = -0x1.5ebb86p+6f;      // -87.6831284
constexpr float normal_floor = -0x1.5d589ep+6f;    // -87.3365402: smallest x with a normal result

// Floats as integers in value order, so that neighbouring floats are 1 apart
// (and -0 and +0 are both 0).
std::int64_t ordered(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::int64_t magnitude = bits & 0x7fff'ffffu;
  return (bits >> 31) != 0 ? -magnitude : magnitude;
}

std::int64_t ulp_distance(float a, float b) { return std::llabs(ordered(a) - ordered(b)); }

// The correctly rounded float exp (the double result rounded once more; a
// double rounding error could cost 1 ULP with probability ~2^-29 per input).
float reference_exp(float x) { return static_cast<float>(kvhead::reference::exp_double(x)); }

std::vector<float> run_exp(const std::vector<float>& in, simd_path path) {
  std::vector<float> out(in.size());
  exp_floats(in.data(), out.data(), in.size(), path);
  return out;
}

// Every float of one sign from 0 up to |limit|, dense where exp varies: every
// 97th bit pattern above 2^-12 (where exp(x) != 1 in float), every 4099th
// below. About 1.6M + 0.1M inputs per sign; the odd strides vary the low
// mantissa bits.
void append_sweep(std::vector<float>& inputs, float limit) {
  const std::uint32_t sign = std::signbit(limit) ? 0x8000'0000u : 0u;
  const std::uint32_t last = std::bit_cast<std::uint32_t>(std::fabs(limit));
  const std::uint32_t dense_from = std::bit_cast<std::uint32_t>(0x1p-12f);
  for (std::uint32_t bits = 0; bits <= last; bits += bits < dense_from ? 4099u : 97u)
    inputs.push_back(std::bit_cast<float>(bits | sign));
  inputs.push_back(limit);
}

}  // namespace

TEST_CASE("exp: within 2 ULP from -87.33 to 88.37 over a dense sweep of float bit patterns, every path") {
  std::vector<float> inputs;
  append_sweep(inputs, lowest_accurate);
  append_sweep(inputs, highest_accurate);
  // The hardest inputs of the exhaustive run (2 ULP apart on some path).
  for (float x : {-0x1.790c2ep+2f, 0x1.f314bep+3f, 0x1.28aaf6p+5f, -0x1.dfa82ep+5f, 0x1.4302c6p+6f})
    inputs.push_back(x);
  std::vector<float> reference(inputs.size());
  std::transform(inputs.begin(), inputs.end(), reference.begin(), reference_exp);

  for (simd_path path : kvhead::supported_simd_paths()) {
    const std::vector<float> out = run_exp(inputs, path);
    std::int64_t worst = 0;
    float worst_input = 0.0f;
    std::size_t above_one = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      // NaN out would give a huge distance; make sure it cannot hide.
      const std::int64_t distance = std::isnan(out[i]) ? ulp_bound + 1 : ulp_distance(out[i], reference[i]);
      if (distance > worst) worst = distance, worst_input = inputs[i];
      if (distance > 1) ++above_one;
    }
    MESSAGE("exp on " << std::string(kvhead::to_string(path)) << ": " << inputs.size() << " inputs, max " << worst
                      << " ULP (at " << worst_input << "), " << above_one << " above 1 ULP");
    INFO("path " << std::string(kvhead::to_string(path)) << ", worst input " << worst_input);
    CHECK(worst <= ulp_bound);
  }
}

TEST_CASE("exp: avx512 gives avx2's bits (the same fused arithmetic, 16 lanes instead of 8)") {
  const std::vector<simd_path> paths = kvhead::supported_simd_paths();
  if (std::find(paths.begin(), paths.end(), simd_path::avx512) == paths.end() ||
      std::find(paths.begin(), paths.end(), simd_path::avx2) == paths.end()) {
    MESSAGE("SKIPPED: this CPU does not run both avx512 and avx2");
    return;
  }
  std::vector<float> inputs;
  append_sweep(inputs, -104.0f);
  append_sweep(inputs, 89.0f);
  const std::vector<float> wide = run_exp(inputs, simd_path::avx512), narrow = run_exp(inputs, simd_path::avx2);
  std::size_t different = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    different += std::bit_cast<std::uint32_t>(wide[i]) != std::bit_cast<std::uint32_t>(narrow[i]);
  CHECK(different == 0);
}

TEST_CASE("exp: special values -inf, +inf, NaN, zeros, on every path") {
  constexpr float infinity = std::numeric_limits<float>::infinity();
  const float negative_nan = -std::numeric_limits<float>::quiet_NaN();
  const float payload_nan = std::bit_cast<float>(0x7fc1'2345u);
  const std::vector<float> in = {-infinity, infinity, std::numeric_limits<float>::quiet_NaN(), negative_nan,
                                 payload_nan, 0.0f, -0.0f, 1.0f};
  for (simd_path path : kvhead::supported_simd_paths()) {
    INFO("path " << std::string(kvhead::to_string(path)));
    const std::vector<float> out = run_exp(in, path);
    CHECK(out[0] == 0.0f);
    CHECK(!std::signbit(out[0]));
    CHECK(out[1] == infinity);
    CHECK(std::isnan(out[2]));
    CHECK(std::isnan(out[3]));
    CHECK(std::isnan(out[4]));
    CHECK(out[5] == 1.0f);
    CHECK(out[6] == 1.0f);
    CHECK(ulp_distance(out[7], reference_exp(1.0f)) <= 1);
  }
}

TEST_CASE("exp: documented behaviour outside the accurate range, on every path") {
  // Above: every float from xsimd's maxlog up is +inf (the true exp is finite
  // up to 88.72); the float just below it is still accurate.
  std::vector<float> high = {last_finite, first_infinite, 88.5f, 88.72f, 88.73f, 100.0f, 1e30f,
                             std::numeric_limits<float>::max()};
  // Below: subnormal results down to last_nonzero (checked one by one, every
  // float of that window), then exactly 0 down to -FLT_MAX.
  std::vector<float> subnormal;
  for (float x = std::nextafter(normal_floor, -1000.0f); x >= last_nonzero; x = std::nextafter(x, -1000.0f))
    subnormal.push_back(x);
  const std::vector<float> zero = {first_zero, -87.7f, -88.0f, -88.3762626f, -88.4f, -103.0f, -104.0f, -1e30f,
                                   std::numeric_limits<float>::lowest()};
  for (simd_path path : kvhead::supported_simd_paths()) {
    INFO("path " << std::string(kvhead::to_string(path)));
    const std::vector<float> high_out = run_exp(high, path);
    CHECK(std::isfinite(high_out[0]));
    CHECK(ulp_distance(high_out[0], reference_exp(high[0])) <= ulp_bound);
    for (std::size_t i = 1; i < high.size(); ++i) CHECK(high_out[i] == std::numeric_limits<float>::infinity());

    // Within the subnormal window: 1 ULP of the subnormals (2^-149), and
    // the smallest normal input still gives a normal result.
    const std::vector<float> subnormal_out = run_exp(subnormal, path);
    std::int64_t worst = 0;
    std::size_t not_subnormal = 0;
    for (std::size_t i = 0; i < subnormal.size(); ++i) {
      worst = std::max(worst, ulp_distance(subnormal_out[i], reference_exp(subnormal[i])));
      if (std::fpclassify(subnormal_out[i]) != FP_SUBNORMAL) ++not_subnormal;
    }
    CHECK(subnormal.size() > 40000);
    CHECK(worst <= 1);
    CHECK(not_subnormal == 0);
    CHECK(std::fpclassify(run_exp({normal_floor}, path)[0]) == FP_NORMAL);

    const std::vector<float> zero_out = run_exp(zero, path);
    for (float value : zero_out) CHECK(std::bit_cast<std::uint32_t>(value) == 0u);  // +0 exactly
  }
}

TEST_CASE("exp_floats: every length 0..49 and in place, tails included, neighbours untouched") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    for (std::size_t n = 0; n <= 49; ++n) {
      INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n);
      // The input sits in a buffer of exactly n floats (the sanitizer build
      // catches any read past it); the output between guard floats.
      std::vector<float> in(n);
      for (std::size_t i = 0; i < n; ++i) in[i] = -80.0f + 3.3f * float(i);
      constexpr std::size_t guard = 16;
      const float sentinel = std::bit_cast<float>(0x7fa5'a5a5u);
      std::vector<float> out(n + 2 * guard, sentinel);
      exp_floats(in.data(), out.data() + guard, n, path);
      std::size_t failures = 0;
      for (std::size_t i = 0; i < n; ++i)
        if (!(ulp_distance(out[guard + i], reference_exp(in[i])) <= ulp_bound)) ++failures;
      for (std::size_t i = 0; i < guard; ++i)
        if (std::memcmp(&out[i], &sentinel, sizeof sentinel) != 0 ||
            std::memcmp(&out[guard + n + i], &sentinel, sizeof sentinel) != 0)
          ++failures;
      // In place gives the same bits.
      std::vector<float> in_place = in;
      exp_floats(in_place.data(), in_place.data(), n, path);
      if (n != 0 && std::memcmp(in_place.data(), out.data() + guard, n * sizeof(float)) != 0) ++failures;
      CHECK(failures == 0);
    }
  }
}
