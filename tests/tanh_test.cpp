// tanh_floats and softcap_floats: the accuracy stated in
// engine/softmax/softmax.hpp, on every SIMD path this CPU runs, against a
// double std::tanh, over large and tiny arguments.
//
// The bound, derived from xsimd 8.1's two branches (u = 2^-24, 1 ULP <= 2u
// relative; exp is within 2 ULP, softmax.hpp):
//   |x| >= 0.625: t = 1 - 2 r, r = 1 / (1 + exp(2|x|)). exp's 2 ULP (4u),
//     the add and the division (u each) give r a relative error <= 6u, so
//     2r an absolute one <= 12u r; the final fma rounds once (u t). With
//     r / t = r / (1 - 2r) <= 0.41 (at |x| = 0.625, r = 0.223; r falls with
//     |x|) the error is <= (12 * 0.41 + 1) u t < 6u t, and t in [0.55, 1)
//     has ULP u: 6 ULP.
//   |x| < 0.625: x + x^3 P(x^2), Cephes's minimax tanhf polynomial (peak
//     relative error 1.3e-7 documented, i.e. ~2.2 ULP at worst), the Horner
//     roundings scaled by x^2 P / 1 <= 0.13 of the result and the final fma:
//     below 4 ULP, so the 6 of the other branch bounds both.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/softmax/softmax.hpp"
#include "kvhead/config.hpp"

namespace {

using kvhead::simd_path;

constexpr std::int64_t ulp_bound = 6;
constexpr double unit_roundoff = std::numeric_limits<float>::epsilon() / 2;

std::int64_t ordered(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::int64_t magnitude = bits & 0x7fff'ffffu;
  return (bits >> 31) != 0 ? -magnitude : magnitude;
}

std::int64_t ulp_distance(float a, float b) { return std::llabs(ordered(a) - ordered(b)); }

float reference_tanh(float x) { return static_cast<float>(std::tanh(static_cast<double>(x))); }

std::vector<float> run_tanh(const std::vector<float>& in, simd_path path) {
  std::vector<float> out(in.size());
  kvhead::engine::tanh_floats(in.data(), out.data(), in.size(), path);
  return out;
}

// Both signs, every float from the smallest subnormal to FLT_MAX by a stride
// of bit patterns: dense (every 97th) from 2^-14 to 16, where tanh bends,
// sparse (every 40961st) elsewhere: tiny arguments (tanh x = x), and large
// ones (tanh x = +-1).
std::vector<float> sweep() {
  std::vector<float> inputs;
  const std::uint32_t dense_from = std::bit_cast<std::uint32_t>(0x1p-14f);
  const std::uint32_t dense_to = std::bit_cast<std::uint32_t>(16.0f);
  const std::uint32_t last = std::bit_cast<std::uint32_t>(std::numeric_limits<float>::max());
  for (std::uint32_t bits = 1; bits <= last; bits += bits >= dense_from && bits < dense_to ? 97u : 40961u) {
    inputs.push_back(std::bit_cast<float>(bits));
    inputs.push_back(-std::bit_cast<float>(bits));
  }
  for (float x : {0.625f, std::nextafter(0.625f, 0.0f), 9.0f, 9.1f, 44.0f, 45.0f})
    for (float sign : {1.0f, -1.0f}) inputs.push_back(sign * x);
  return inputs;
}

}  // namespace

TEST_CASE("tanh: within 6 ULP of the double tanh over tiny, mid and large arguments, every path") {
  const std::vector<float> inputs = sweep();
  for (simd_path path : kvhead::supported_simd_paths()) {
    const std::vector<float> out = run_tanh(inputs, path);
    std::int64_t worst = 0;
    float worst_input = 0.0f;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const std::int64_t distance =
          std::isnan(out[i]) ? ulp_bound + 1 : ulp_distance(out[i], reference_tanh(inputs[i]));
      if (distance > worst) worst = distance, worst_input = inputs[i];
    }
    MESSAGE("tanh on " << std::string(kvhead::to_string(path)) << ": " << inputs.size() << " inputs, max " << worst
                       << " ULP (at " << worst_input << ")");
    INFO("path " << std::string(kvhead::to_string(path)) << ", worst input " << worst_input);
    CHECK(worst <= ulp_bound);
  }
}

TEST_CASE("tanh: special values, saturation and tiny arguments exactly, every path") {
  constexpr float infinity = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {
      0.0f,     -0.0f, infinity, -infinity, std::numeric_limits<float>::quiet_NaN(), 0x1p-149f, -0x1p-140f,
      0x1p-30f, 9.1f,  -50.0f,   1e30f,     -std::numeric_limits<float>::max()};
  for (simd_path path : kvhead::supported_simd_paths()) {
    INFO("path " << std::string(kvhead::to_string(path)));
    const std::vector<float> out = run_tanh(in, path);
    CHECK(std::bit_cast<std::uint32_t>(out[0]) == 0u);
    CHECK(std::bit_cast<std::uint32_t>(out[1]) == 0x8000'0000u);
    CHECK(out[2] == 1.0f);
    CHECK(out[3] == -1.0f);
    CHECK(std::isnan(out[4]));
    CHECK(out[5] == 0x1p-149f);
    CHECK(out[6] == -0x1p-140f);
    CHECK(out[7] == 0x1p-30f);
    CHECK(out[8] == 1.0f);
    CHECK(out[9] == -1.0f);
    CHECK(out[10] == 1.0f);
    CHECK(out[11] == -1.0f);
  }
}

TEST_CASE("softcap: cap tanh(x / cap) within its derived bound for scores far beyond the cap, every length") {
  // Error of fl(cap * fl(tanh(fl(x / cap)))) against cap tanh(x / cap):
  // the division's rounding moves the argument by u |x / cap|, which moves
  // the result by cap u y sech^2(y) <= 0.45 u cap (y = x / cap); tanh's
  // 6 ULP (<= 12 u |t|) and the multiply's u: <= (0.45 + 12 + 1) u cap.
  std::mt19937 generator(77);
  for (simd_path path : kvhead::supported_simd_paths())
    for (float cap : {0.5f, 30.0f, 50.0f, 1000.0f})
      for (std::size_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 256, 1000}) {
        std::vector<float> values(n);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        for (std::size_t i = 0; i < n; ++i)  // |x| from 1e-6 cap to 1e6 cap
          values[i] = cap * uniform(generator) * std::pow(10.0f, float(int(generator() % 13) - 6));
        const std::vector<float> in = values;
        constexpr std::size_t guard = 8;
        std::vector<float> buffer(n + 2 * guard, 123.0f);
        std::copy(values.begin(), values.end(), buffer.begin() + guard);
        kvhead::engine::softcap_floats(buffer.data() + guard, n, cap, path);
        std::size_t failures = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double expected = double(cap) * std::tanh(double(in[i]) / double(cap));
          const double got = buffer[guard + i];
          if (!(std::fabs(got - expected) <= 13.45 * unit_roundoff * double(cap))) ++failures;
          if (!(std::fabs(got) <= double(cap))) ++failures;
        }
        for (std::size_t i = 0; i < guard; ++i)
          if (buffer[i] != 123.0f || buffer[guard + n + i] != 123.0f) ++failures;
        INFO("path " << std::string(kvhead::to_string(path)) << " cap " << cap << " n " << n);
        CHECK(failures == 0);
      }
}

TEST_CASE("softcap: infinite scores become +-cap, NaN stays NaN, every path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::vector<float> values = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN(), 0.0f};
    kvhead::engine::softcap_floats(values.data(), values.size(), 50.0f, path);
    CHECK(values[0] == 50.0f);
    CHECK(values[1] == -50.0f);
    CHECK(std::isnan(values[2]));
    CHECK(values[3] == 0.0f);
  }
}
