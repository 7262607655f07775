// RoPE's scaled variants (linear, llama3, yarn, longrope), partial rotary and QK-norm
// against the double references of tests/reference/rope_scaling_reference.hpp
// (written from Hugging Face's formulas), over random parameters, awkward
// head sizes and positions on both sides of the shared table's end (2^17);
// and the layer's checks of the new options.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "engine/attention/qk_norm.hpp"
#include "engine/attention/rope.hpp"
#include "engine/attention/rope_scaling.hpp"
#include "kvhead/attention.hpp"
#include "tests/random_values.hpp"
#include "tests/reference/rope_scaling_reference.hpp"

namespace {

using kvhead::rope_scaling;
using kvhead::reference::rope_kind;
using kvhead::reference::rope_variant;

/// A random variant of `kind` for rotary_dim r, and the same as kvhead's rope_scaling.
std::pair<rope_variant, rope_scaling> random_variant(rope_kind kind, std::size_t r, std::mt19937& generator) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  rope_variant v;
  rope_scaling s;
  v.kind = kind;
  v.rotary_dim = r;
  v.theta = std::pow(10.0, 2.0 + 4.5 * unit(generator));  // 100 to ~3e6
  v.factor = 1.0 + 31.0 * unit(generator);
  v.original_length = std::round(std::pow(2.0, 4.0 + 10.0 * unit(generator)));
  v.low_freq_factor = 0.5 + unit(generator);
  v.high_freq_factor = v.low_freq_factor + 0.5 + 4.0 * unit(generator);
  // llama3 as HF computes it when it only warns: frequency factors equal or
  // out of order (no medium band), a factor below 1.
  const unsigned llama3_case = generator() % 4;
  if (llama3_case == 1) v.high_freq_factor = v.low_freq_factor;
  if (llama3_case == 2) v.high_freq_factor = v.low_freq_factor * (0.2 + 0.7 * unit(generator));
  if (llama3_case == 3 && kind == rope_kind::llama3) v.factor = 0.1 + 0.8 * unit(generator);
  v.beta_fast = 8.0 + 40.0 * unit(generator);
  v.beta_slow = 0.5 + unit(generator);
  v.truncate = generator() % 2 == 0;
  const unsigned attention = generator() % 3;  // 0: from factor, 1: mscale pair, 2: given
  if (attention == 1) {
    v.mscale = 0.5 + unit(generator);
    v.mscale_all_dim = 0.5 + unit(generator);
  }
  if (attention == 2) v.attention_factor = 0.5 + unit(generator);
  // longrope: Phi-3's short factors are near 1, its long ones up to ~60;
  // a factor below 1 leaves the attention factor at 1.
  if (kind == rope_kind::longrope && generator() % 4 == 0) v.factor = 0.2 + 0.8 * unit(generator);
  for (std::size_t i = 0; i < r / 2; ++i) {
    v.short_factor.push_back(1.0 + 2.0 * unit(generator));
    v.long_factor.push_back(1.0 + 60.0 * unit(generator));
  }
  using k = rope_scaling::kind;
  s.type = kind == rope_kind::plain      ? k::none
           : kind == rope_kind::linear   ? k::linear
           : kind == rope_kind::llama3   ? k::llama3
           : kind == rope_kind::longrope ? k::longrope
                                         : k::yarn;
  s.factor = v.factor;
  s.low_freq_factor = v.low_freq_factor;
  s.high_freq_factor = v.high_freq_factor;
  s.original_max_position_embeddings = v.original_length;
  s.beta_fast = v.beta_fast;
  s.beta_slow = v.beta_slow;
  s.truncate = v.truncate;
  s.mscale = v.mscale;
  s.mscale_all_dim = v.mscale_all_dim;
  if (v.attention_factor != 0.0) s.attention_factor = v.attention_factor;
  s.short_factor = v.short_factor;
  s.long_factor = v.long_factor;
  return {v, s};
}

constexpr rope_kind all_kinds[] = {rope_kind::plain, rope_kind::linear, rope_kind::llama3, rope_kind::yarn,
                                   rope_kind::longrope};

}  // namespace

TEST_CASE("rope scaling: inverse frequencies and attention factor equal HF's formulas") {
  std::mt19937 generator(11);
  for (const rope_kind kind : all_kinds)
    for (const std::size_t r : {2, 4, 6, 12, 16, 34, 64, 128, 130})
      for (int trial = 0; trial < 20; ++trial) {
        const auto [v, s] = random_variant(kind, r, generator);
        INFO("kind " << int(kind) << " rotary_dim " << r << " trial " << trial);
        REQUIRE(kvhead::engine::rope_scaling_problem(s, v.theta, r).empty());
        // longrope: the frequencies before and from the original length
        // (a sequence of it and of one token more); the other kinds have one set.
        const std::size_t original = std::size_t(v.original_length);
        for (const bool long_factors : {false, true}) {
          const kvhead::engine::rope_frequencies got =
              kvhead::engine::scaled_rope_frequencies(v.theta, r, s, long_factors);
          const std::vector<double> expected =
              kvhead::reference::rope_inv_freq(v, long_factors ? original + 1 : original);
          REQUIRE(got.inv_freq.size() == expected.size());
          for (std::size_t i = 0; i < expected.size(); ++i) {
            // Both in double, in different orders: a few ulps of pow and log apart.
            CHECK(std::fabs(got.inv_freq[i] - expected[i]) <= 1e-13 * expected[i]);
          }
          CHECK(std::fabs(got.attention_factor - kvhead::reference::rope_attention_factor(v)) <= 1e-15 * 4);
        }
        CHECK(kvhead::engine::longrope_long_length(s) == (kind == rope_kind::longrope ? original + 1 : SIZE_MAX));
      }
}

TEST_CASE("rope scaling: rows rotated by the engine agree with the double reference, the rest of each head is kept") {
  std::mt19937 generator(5);
  struct shape {
    std::size_t head_dim, rotary_dim;
  };
  const std::vector<std::size_t> fixed_positions = {0, 1, 7, 31, 4095, 4096, 65537, 131071, 131072, 131073, 200003};
  for (const rope_kind kind : all_kinds)
    for (const shape sh : {shape{2, 2}, shape{16, 12}, shape{18, 18}, shape{33, 16}, shape{96, 64}, shape{130, 98}})
      for (int trial = 0; trial < 3; ++trial) {
        const auto [v, s] = random_variant(kind, sh.rotary_dim, generator);
        INFO("kind " << int(kind) << " head_dim " << sh.head_dim << " rotary_dim " << sh.rotary_dim);
        // And the rows on both sides of the original length (longrope's
        // short and long factors), in one call.
        std::vector<std::size_t> positions = fixed_positions;
        const std::size_t original = std::size_t(v.original_length);
        positions.insert(positions.end(), {original - 1, original, original + 1});
        const kvhead::engine::rope rope(sh.head_dim, sh.rotary_dim, v.theta, s);
        constexpr std::size_t heads = 3;
        const std::size_t row_stride = heads * sh.head_dim + 1;
        std::vector<float> rows = kvhead::testing::random_values(positions.size() * row_stride, generator, 1.0f);
        const std::vector<float> before = rows;
        rope.apply(rows.data(), positions.size(), row_stride, heads, positions.data());
        const double af = kvhead::reference::rope_attention_factor(v);
        for (std::size_t row = 0; row < positions.size(); ++row)
          for (std::size_t head = 0; head < heads; ++head) {
            const std::size_t at = row * row_stride + head * sh.head_dim;
            std::vector<double> expected(before.begin() + std::ptrdiff_t(at),
                                         before.begin() + std::ptrdiff_t(at + sh.head_dim));
            kvhead::reference::rope_double(expected.data(), v, positions[row]);
            const std::size_t half = sh.rotary_dim / 2;
            for (std::size_t e = 0; e < sh.head_dim; ++e) {
              if (e >= sh.rotary_dim) {
                CHECK(rows[at + e] == before[at + e]);  // passed through bit for bit
                continue;
              }
              // cos and sin rounded to float (1/2 ulp each), two rounded
              // products and a rounded sum: <= 3 eps * af * (|a| + |b|), plus
              // the angle's double rounding at large positions (~1e-11).
              const double a = before[at + e], b = before[at + (e < half ? e + half : e - half)];
              const double tolerance =
                  3.0 * std::numeric_limits<float>::epsilon() * af * (std::fabs(a) + std::fabs(b)) + 1e-9;
              CHECK(std::fabs(double(rows[at + e]) - expected[e]) <= tolerance);
            }
          }
        CHECK(rows[row_stride - 1] == before[row_stride - 1]);  // the float after the heads
      }
}

TEST_CASE("rope scaling: longrope takes each row's factors from its sequence's length, or always the pinned ones") {
  std::mt19937 generator(13);
  using pick = rope_scaling::longrope_pick;
  constexpr std::size_t head_dim = 24, rotary_dim = 16;
  for (int trial = 0; trial < 4; ++trial) {
    auto [v, s] = random_variant(rope_kind::longrope, rotary_dim, generator);
    const std::size_t original = std::size_t(v.original_length);
    // Rows of three sequences in one call: one that ends at the original
    // length (short throughout), one a token longer (long throughout, its
    // first tokens too), one far longer; each row at a position of its own.
    const std::vector<std::size_t> positions = {0, 3, original - 1, 0, original - 1, original, 5, original + 40};
    const std::vector<std::size_t> lengths = {original,     original,     original,      original + 1,
                                              original + 1, original + 1, original + 41, original + 41};
    for (const pick choice : {pick::per_call, pick::short_factors, pick::long_factors}) {
      s.longrope_factors = choice;
      INFO("trial " << trial << " choice " << int(choice) << " original " << original);
      const kvhead::engine::rope rope(head_dim, rotary_dim, v.theta, s);
      std::vector<float> rows = kvhead::testing::random_values(positions.size() * head_dim, generator, 1.0f);
      const std::vector<float> before = rows;
      rope.apply(rows.data(), positions.size(), head_dim, 1, positions.data(), lengths.data());
      for (std::size_t row = 0; row < positions.size(); ++row) {
        std::vector<double> expected(before.begin() + std::ptrdiff_t(row * head_dim),
                                     before.begin() + std::ptrdiff_t((row + 1) * head_dim));
        const std::size_t seq_len = choice == pick::per_call       ? lengths[row]
                                    : choice == pick::long_factors ? original + 1
                                                                   : original;
        kvhead::reference::rope_double(expected.data(), v, positions[row], seq_len);
        const double af = kvhead::reference::rope_attention_factor(v);
        for (std::size_t e = 0; e < head_dim; ++e) {
          const std::size_t half = rotary_dim / 2;
          const double a = before[row * head_dim + e],
                       b = e < rotary_dim ? before[row * head_dim + (e < half ? e + half : e - half)] : 0.0;
          // As the test above: cos and sin rounded, two products and a sum.
          const double tolerance =
              3.0 * std::numeric_limits<float>::epsilon() * af * (std::fabs(a) + std::fabs(b)) + 1e-9;
          CHECK(std::fabs(double(rows[row * head_dim + e]) - expected[e]) <= tolerance);
        }
      }
    }
  }
}

TEST_CASE("rope scaling: kind none with rotary_dim = head_dim is the plain RoPE, bit for bit") {
  std::mt19937 generator(2);
  const kvhead::engine::rope plain(64, 10000.0), configured(64, 64, 10000.0, rope_scaling{});
  const std::vector<std::size_t> positions = {0, 5, 300, 140000};
  std::vector<float> a = kvhead::testing::random_values(positions.size() * 64, generator, 1.0f), b = a;
  plain.apply(a.data(), positions.size(), 64, 1, positions.data());
  configured.apply(b.data(), positions.size(), 64, 1, positions.data());
  CHECK(a == b);
}

TEST_CASE("qk_norm: every query and key head RMS-normalized as the double reference") {
  std::mt19937 generator(9);
  for (const std::size_t head_dim : {1, 3, 8, 17, 128}) {
    const std::size_t heads = 5, kv_heads = 2, values = 2, rows = 7;
    const std::size_t row_stride = (heads + kv_heads + values) * head_dim;
    const std::vector<float> q_weight = kvhead::testing::random_values(head_dim, generator, 1.0f),
                             k_weight = kvhead::testing::random_values(head_dim, generator, 1.0f);
    const float eps = 1e-6f;
    const kvhead::engine::qk_norm norm(head_dim, eps, q_weight.data(), k_weight.data());
    std::vector<float> x = kvhead::testing::random_values(rows * row_stride, generator, 3.0f);
    const std::vector<float> before = x;
    norm.apply(x.data(), rows, row_stride, heads, kv_heads);
    for (std::size_t row = 0; row < rows; ++row)
      for (std::size_t head = 0; head < heads + kv_heads + values; ++head) {
        const std::size_t at = row * row_stride + head * head_dim;
        if (head >= heads + kv_heads) {  // value heads untouched
          for (std::size_t e = 0; e < head_dim; ++e) CHECK(x[at + e] == before[at + e]);
          continue;
        }
        std::vector<double> expected(before.begin() + std::ptrdiff_t(at),
                                     before.begin() + std::ptrdiff_t(at + head_dim));
        std::vector<double> weight((head < heads ? q_weight : k_weight).begin(),
                                   (head < heads ? q_weight : k_weight).end());
        kvhead::reference::rms_norm_double(expected.data(), weight.data(), head_dim, eps);
        // Two float roundings (the normalized value, then the product).
        for (std::size_t e = 0; e < head_dim; ++e)
          CHECK(std::fabs(double(x[at + e]) - expected[e]) <=
                2.0 * std::numeric_limits<float>::epsilon() * std::fabs(expected[e]) + 1e-30);
      }
  }
}

TEST_CASE("attention_layer: the new options are checked") {
  std::vector<float> weight(64 * 64, 0.01f), norm(16, 1.0f);
  const kvhead::linear_weights linear{weight.data(), nullptr};
  const kvhead::attention_weights weights{linear, linear, linear, linear};
  auto config = [] {
    kvhead::attention_config c;
    c.num_heads = 4;
    c.num_kv_heads = 4;
    c.head_dim = 16;
    c.d_model = 64;
    c.rope_theta = 10000.0;
    return c;
  };
  auto rejects = [&](const kvhead::attention_config& c, const kvhead::attention_weights& w, const char* text) {
    try {
      const kvhead::attention_layer layer(c, w);
      FAIL("accepted: expected an error mentioning " << std::string(text));
    } catch (const std::invalid_argument& error) {
      INFO("message: " << std::string(error.what()));
      CHECK(std::string(error.what()).find(text) != std::string::npos);
    }
  };
  kvhead::attention_config c = config();
  c.rotary_dim = 18;
  rejects(c, weights, "rotary_dim (18) exceeds head_dim (16)");
  c.rotary_dim = 7;
  rejects(c, weights, "even rotary_dim");
  c = config();
  c.rope_scaling.type = rope_scaling::kind::llama3;
  c.rope_scaling.factor = 8.0;
  rejects(c, weights, "original_max_position_embeddings");
  c.rope_scaling.original_max_position_embeddings = 8192.0;
  c.rope_scaling.high_freq_factor = -0.5;
  rejects(c, weights, "positive low_freq_factor and high_freq_factor");
  c.rope_scaling.high_freq_factor = 0.5;  // below low_freq_factor: HF only warns
  CHECK_NOTHROW(kvhead::attention_layer(c, weights));
  c = config();
  c.rope_scaling.type = rope_scaling::kind::linear;
  c.rope_scaling.factor = 0.0;
  rejects(c, weights, "factor must be positive");
  c = config();
  c.rope_theta = 1e-300;  // plain RoPE: frequencies up to 1e300, every angle past position 0 infinite
  rejects(c, weights, "rope_theta 1e-300 is too small");
  c = config();
  c.rope_scaling.type = static_cast<rope_scaling::kind>(9);  // an integer cast: not silently plain RoPE
  c.rope_scaling.factor = 4.0;
  rejects(c, weights, "rope_scaling type must be none, linear, llama3, yarn or longrope, got 9");
  c = config();
  c.rotary_dim = 12;
  c.rope_scaling.type = rope_scaling::kind::longrope;
  c.rope_scaling.original_max_position_embeddings = 4096.0;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.short_factor.assign(6, 1.5);
  c.rope_scaling.long_factor.assign(5, 20.0);
  rejects(c, weights, "long_factor must hold rotary_dim / 2 = 6 numbers, got 5");
  c.rope_scaling.long_factor.assign(6, 20.0);
  CHECK_NOTHROW(kvhead::attention_layer(c, weights));
  c.rope_scaling.short_factor[3] = 0.0;
  rejects(c, weights, "short_factor must be positive and finite, got 0");
  c.rope_scaling.short_factor[3] = 1e-300;  // frequencies over it past FLT_MAX
  rejects(c, weights, "short_factor 1e-300 is too small");
  c.rope_scaling.short_factor[3] = 1.5;
  c.rope_scaling.long_factor[0] = NAN;
  rejects(c, weights, "long_factor must be positive and finite, got nan");
  c.rope_scaling.long_factor[0] = 20.0;
  c.rope_scaling.attention_factor = -1.0;
  rejects(c, weights, "longrope rope_scaling attention_factor must be positive and finite");
  c.rope_scaling.attention_factor.reset();
  c.rope_scaling.original_max_position_embeddings = 1.0;  // its attention factor divides by ln 1
  rejects(c, weights, "original_max_position_embeddings must be above 1, got 1");
  c = config();
  c.qk_norm_eps = 1e-6f;
  rejects(c, weights, "q_norm weight is null");
  kvhead::attention_weights with_norms = weights;
  with_norms.q_norm = with_norms.k_norm = norm.data();
  CHECK_NOTHROW(kvhead::attention_layer(c, with_norms));
  c.qk_norm_eps = -1.0f;
  rejects(c, with_norms, "qk_norm_eps");
}
