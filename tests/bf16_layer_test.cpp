// The attention layer in bf16 precision (attention.hpp, attention_config::
// precision):
//   - attention with rounded probabilities, every SIMD path, and the whole
//     layer, against the double reference on bf16-rounded weights and
//     activations (tests/reference/bf16_layer_reference.hpp: the bound is at
//     fp32 level wherever the rounding points agree; f32 arithmetic on the
//     same inputs must fail it, so the test sees the roundings);
//   - bit-identical for any thread count, batching and chunking of a decode
//     over a KV cache (f32 or bf16: either stores the rounded K/V exactly);
//   - bf16 weights (linear_weights::weight_bf16) used as they are;
//   - a Llama-like layer (d_model 4096, 32/8 heads, head_dim 128, 300 tokens)
//     within 2e-2 of the f32 layer (max |diff| / max |f32 out|, printed).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "engine/attention/flash_attention.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/random_values.hpp"
#include "tests/reference/bf16_layer_reference.hpp"
#include "tests/seeded_layer.hpp"

namespace {

using kvhead::precision;
using kvhead::testing::random_values;
namespace reference = kvhead::reference;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> bf16_valued(std::vector<float> values) {
  for (float& x : values) x = float(reference::bf16_nearest(double(x)));
  return values;
}

/// How many of `got` lie outside the reference's bound (NaN fails), the
/// worst error / bound, and the mean error against the mean typical bound
/// (tests/reference/bf16_layer_reference.hpp).
struct agreement {
  std::size_t failures = 0;
  double worst = 0.0, mean_error = 0.0, mean_typical = 0.0;
  bool within() const { return failures == 0 && mean_error <= mean_typical; }
};

agreement agree(const std::vector<float>& got, const reference::bounded_rows& expected) {
  agreement result;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(double(got[i]) - expected.value[i]);
    if (!(error <= expected.error[i])) ++result.failures;
    result.worst = std::max(result.worst, error / expected.error[i]);
    result.mean_error += error / double(got.size());
    result.mean_typical += expected.typical[i] / double(got.size());
  }
  return result;
}

// ------------------------------------------------------------- attention

struct attention_setup {
  std::size_t batch, heads, kv_heads, seq, head_dim;
  bool causal;
};

TEST_CASE("bf16 attention: probabilities rounded per chunk, against the double reference, every SIMD path") {
  const attention_setup setups[] = {
      {2, 4, 2, 300, 20, true},   // GQA, two chunks, d off the SIMD width
      {1, 8, 1, 257, 64, false},  // MQA, a chunk and one key
      {1, 3, 3, 33, 7, true},     // MHA, odd d
      {1, 2, 2, 520, 16, true},   // three chunks
  };
  for (const kvhead::simd_path path : kvhead::supported_simd_paths())
    for (const attention_setup& s : setups) {
      std::mt19937 generator(unsigned(s.seq + s.head_dim));
      const std::vector<float> q = bf16_valued(random_values(s.batch * s.seq * s.heads * s.head_dim, generator, 1.0f));
      const std::vector<float> k =
          bf16_valued(random_values(s.batch * s.seq * s.kv_heads * s.head_dim, generator, 1.0f));
      const std::vector<float> v = bf16_valued(random_values(k.size(), generator, 1.0f));
      const double scale = double(float(1.0 / std::sqrt(double(s.head_dim))));
      auto exact = [](const std::vector<float>& values) {
        return reference::bounded_rows{std::vector<double>(values.begin(), values.end()),
                                       std::vector<double>(values.size(), 0.0),
                                       std::vector<double>(values.size(), 0.0)};
      };
      const reference::bf16_attention_result expected = reference::bf16_attention(
          {s.batch, s.heads, s.kv_heads, s.seq, s.head_dim, scale, s.causal}, exact(q), exact(k), exact(v));
      for (const precision compute : {precision::bf16, precision::f32}) {
        std::vector<float> out(q.size());
        using view = kvhead::head_tensor<const float>;
        const kvhead::engine::attention_problem problem{
            {s.batch, s.heads, s.kv_heads, s.seq, s.seq, s.head_dim},
            view::bshd(q.data(), s.heads, s.seq, s.head_dim),
            view::bshd(k.data(), s.kv_heads, s.seq, s.head_dim),
            view::bshd(v.data(), s.kv_heads, s.seq, s.head_dim),
            kvhead::head_tensor<float>::bshd(out.data(), s.heads, s.seq, s.head_dim),
            float(scale),
            s.causal,
            0,
            nullptr,
            nullptr,
            path,
            0,
            {},
            compute};
        kvhead::engine::flash_attention(problem);
        const agreement result = agree(out, expected.out);
        INFO("path " << std::string(kvhead::to_string(path)) << " precision " << std::string(kvhead::to_string(compute))
                     << " H " << s.heads << " G " << s.kv_heads << " seq " << s.seq << " d " << s.head_dim
                     << " worst/bound " << result.worst << " failures " << result.failures << " of " << out.size()
                     << " mean error " << result.mean_error << " mean typical bound " << result.mean_typical
                     << " ambiguous roundings " << expected.ambiguous);
        CHECK(result.within() == (compute == precision::bf16));  // unrounded probabilities: far off
      }
    }
}

// ------------------------------------------------------------------ layer

// The layer tests' seeded weights (tests/seeded_layer.hpp), o_proj drawn
// N(0, 1 / (num_heads head_dim)), built at a precision.
struct seeded_layer : kvhead::testing::seeded_layer {
  seeded_layer(const kvhead::attention_config& c, unsigned seed, bool biases = true)
      : kvhead::testing::seeded_layer(c, seed, 1.0f / std::sqrt(float(c.num_heads * c.head_dim)), biases) {}
  kvhead::attention_layer build(precision compute) const {
    kvhead::attention_config c = config;
    c.precision = compute;
    return kvhead::attention_layer(c, weights());
  }
};

kvhead::attention_config layer_config(std::size_t heads, std::size_t kv_heads, std::size_t head_dim,
                                      std::size_t d_model, bool causal, double rope_theta) {
  kvhead::attention_config c;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.d_model = d_model;
  c.causal = causal;
  c.rope_theta = rope_theta;
  return c;
}

TEST_CASE("bf16 layer: against the double reference on rounded weights, activations and probabilities") {
  struct setting {
    kvhead::attention_config config;
    bool biases;
    std::size_t batch, seq;
  };
  const setting settings[] = {
      {layer_config(4, 2, 16, 48, true, 10000.0), true, 2, 300},  // GQA, RoPE, biases, two chunks
      {layer_config(3, 1, 10, 37, false, 0.0), false, 1, 70},     // MQA, no RoPE, odd sizes
      {layer_config(2, 2, 34, 40, true, 500.0), true, 1, 260},    // MHA, d off the SIMD width
  };
  for (const setting& s : settings) {
    const seeded_layer w(s.config, unsigned(s.config.head_dim), s.biases);
    std::mt19937 generator(7);
    const std::vector<float> x = random_values(s.batch * s.seq * s.config.d_model, generator, 1.0f);
    const kvhead::attention_config& c = s.config;
    const reference::bf16_layer_result expected = reference::bf16_layer(
        {c.num_heads, c.num_kv_heads, c.head_dim, c.d_model, double(float(1.0 / std::sqrt(double(c.head_dim)))),
         c.causal, c.rope_theta, s.batch, s.seq},
        {w.wq.data(), seeded_layer::data(w.bq), w.wk.data(), seeded_layer::data(w.bk), w.wv.data(),
         seeded_layer::data(w.bv), w.wo.data(), seeded_layer::data(w.bo)},
        x.data());
    for (const precision compute : {precision::bf16, precision::f32}) {
      std::vector<float> y(x.size());
      w.build(compute).forward(x.data(), s.batch, s.seq, y.data());
      const agreement result = agree(y, expected.y);
      INFO("precision " << std::string(kvhead::to_string(compute)) << " H " << c.num_heads << " G " << c.num_kv_heads
                        << " d " << c.head_dim << " d_model " << c.d_model << " seq " << s.seq << " worst/bound "
                        << result.worst << " failures " << result.failures << " mean error " << result.mean_error
                        << " mean typical bound " << result.mean_typical << " ambiguous roundings "
                        << expected.ambiguous);
      CHECK(result.within() == (compute == precision::bf16));  // no rounding: far off
    }
  }
}

// ------------------------------------------------------------ determinism

kvhead::kv_cache make_cache(const kvhead::attention_config& config, std::size_t block_size, kvhead::kv_dtype dtype) {
  kvhead::kv_cache_config cache_config;
  cache_config.num_kv_heads = config.num_kv_heads;
  cache_config.head_dim = config.head_dim;
  cache_config.block_size = block_size;
  cache_config.dtype = dtype;
  cache_config.capacity_bytes = 64u << 20;
  return kvhead::kv_cache(cache_config);
}

TEST_CASE("bf16 layer: the same bits for 1, 2, 3 and 8 threads, batched or alone") {
  const seeded_layer w(layer_config(8, 2, 16, 48, true, 10000.0), 5);
  const kvhead::attention_layer layer = w.build(precision::bf16);
  std::mt19937 generator(3);
  constexpr std::size_t batch = 3, seq = 290;
  const std::vector<float> x = random_values(batch * seq * 48, generator, 1.0f);
  std::vector<float> expected;
  for (int threads : {1, 2, 3, 8}) {
    std::vector<float> y(x.size());
    tbb::task_arena arena(threads);
    arena.execute([&] { layer.forward(x.data(), batch, seq, y.data()); });
    if (expected.empty()) expected = y;
    CAPTURE(threads);
    CHECK(same_bits(y, expected));
  }
  for (std::size_t b = 0; b < batch; ++b) {
    const std::vector<float> one(x.begin() + std::ptrdiff_t(b * seq * 48),
                                 x.begin() + std::ptrdiff_t((b + 1) * seq * 48));
    std::vector<float> y(one.size());
    layer.forward(one.data(), 1, seq, y.data());
    CHECK(same_bits(y, std::vector<float>(expected.begin() + std::ptrdiff_t(b * seq * 48),
                                          expected.begin() + std::ptrdiff_t((b + 1) * seq * 48))));
  }
}

TEST_CASE("bf16 layer: decoding in chunks over an f32 or bf16 cache equals the causal forward, bit for bit") {
  const seeded_layer w(layer_config(8, 2, 16, 48, true, 10000.0), 9);
  const kvhead::attention_layer layer = w.build(precision::bf16);
  std::mt19937 generator(1);
  constexpr std::size_t seq = 300;  // crosses a 256-key chunk
  const std::vector<float> x = random_values(seq * 48, generator, 1.0f);
  std::vector<float> expected(x.size());
  layer.forward(x.data(), 1, seq, expected.data());
  for (const kvhead::kv_dtype dtype : {kvhead::kv_dtype::f32, kvhead::kv_dtype::bf16})
    for (std::size_t block_size : {16, 256})
      for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, seq}) {
        kvhead::kv_cache cache = make_cache(w.config, block_size, dtype);
        const kvhead::sequence_id id = cache.create();
        std::vector<float> y(x.size());
        for (std::size_t done = 0; done < seq; done += chunk) {
          const std::size_t tokens = std::min(chunk, seq - done);
          cache.append(id, tokens);
          layer.forward(cache, 0, {{id, tokens}}, x.data() + done * 48, y.data() + done * 48);
        }
        INFO("dtype " << std::string(kvhead::to_string(dtype)) << " block_size " << block_size << " chunk " << chunk);
        CHECK(same_bits(y, expected));
      }
}

// ---------------------------------------------------------------- weights

TEST_CASE("bf16 layer: bf16 weights are used as they are, and widened exactly by an f32 layer") {
  const seeded_layer w(layer_config(4, 2, 8, 24, true, 10000.0), 11);
  seeded_layer rounded = w;  // the same weights, already bf16 values
  std::vector<std::uint16_t> bits[4];
  std::vector<float>* sources[] = {&rounded.wq, &rounded.wk, &rounded.wv, &rounded.wo};
  for (int p = 0; p < 4; ++p) {
    *sources[p] = bf16_valued(*sources[p]);
    for (const float value : *sources[p]) bits[p].push_back(std::uint16_t(std::bit_cast<std::uint32_t>(value) >> 16));
  }
  std::mt19937 generator(2);
  const std::vector<float> x = random_values(2 * 30 * 24, generator, 1.0f);
  for (const precision compute : {precision::bf16, precision::f32}) {
    kvhead::attention_config c = w.config;
    c.precision = compute;
    kvhead::attention_weights given = rounded.weights();
    kvhead::linear_weights* parts[] = {&given.q_proj, &given.k_proj, &given.v_proj, &given.o_proj};
    for (int p = 0; p < 4; ++p) {
      parts[p]->weight_bf16 = bits[p].data();
      parts[p]->weight = nullptr;
    }
    std::vector<float> from_bits(x.size()), from_floats(x.size()), from_unrounded(x.size());
    kvhead::attention_layer(c, given).forward(x.data(), 2, 30, from_bits.data());
    rounded.build(compute).forward(x.data(), 2, 30, from_floats.data());
    w.build(compute).forward(x.data(), 2, 30, from_unrounded.data());
    CAPTURE(std::string(kvhead::to_string(compute)));
    CHECK(same_bits(from_bits, from_floats));
    // bf16 rounds the fp32 weights at construction: the same bits again.
    CHECK(same_bits(from_unrounded, from_floats) == (compute == precision::bf16));
  }
  kvhead::attention_weights both = w.weights();
  both.k_proj.weight_bf16 = bits[1].data();
  CHECK_THROWS_WITH_AS(kvhead::attention_layer(w.config, both), doctest::Contains("k_proj has both weight"),
                       std::invalid_argument);
  kvhead::attention_weights neither = w.weights();
  neither.v_proj.weight = nullptr;
  CHECK_THROWS_WITH_AS(kvhead::attention_layer(w.config, neither), doctest::Contains("v_proj weight is null"),
                       std::invalid_argument);
  kvhead::attention_config bad = w.config;
  bad.precision = precision(7);
  CHECK_THROWS_WITH_AS(kvhead::attention_layer(bad, w.weights()), doctest::Contains("precision must be f32 or bf16"),
                       std::invalid_argument);
  CHECK(std::string(kvhead::to_string(precision::bf16)) == "bf16");
}

// ------------------------------------------------------- Llama-like layer

/// `count` values ~ N(0, sigma^2), in parallel blocks each from its own seed.
std::vector<float> seeded_normal(std::size_t count, float sigma, unsigned stream) {
  std::vector<float> values(count);
  constexpr std::size_t block = std::size_t(1) << 16;
  tbb::parallel_for(std::size_t{0}, (count + block - 1) / block, [&](std::size_t index) {
    std::mt19937 generator(stream * 100003u + unsigned(index));
    std::normal_distribution<float> normal(0.0f, sigma);
    for (std::size_t i = index * block; i < std::min(count, (index + 1) * block); ++i) values[i] = normal(generator);
  });
  return values;
}

TEST_CASE("bf16 layer: a Llama-like layer (d_model 4096, 32/8 heads, head_dim 128, 300 tokens) within 2e-2 of f32") {
  constexpr std::size_t d_model = 4096, heads = 32, kv_heads = 8, head_dim = 128, tokens = 300;
  kvhead::attention_config config = layer_config(heads, kv_heads, head_dim, d_model, true, 500000.0);
  const float sigma = 1.0f / std::sqrt(float(d_model));
  const std::vector<float> wq = seeded_normal(heads * head_dim * d_model, sigma, 1);
  const std::vector<float> wk = seeded_normal(kv_heads * head_dim * d_model, sigma, 2);
  const std::vector<float> wv = seeded_normal(kv_heads * head_dim * d_model, sigma, 3);
  const std::vector<float> wo = seeded_normal(d_model * heads * head_dim, sigma, 4);
  const std::vector<float> x = seeded_normal(tokens * d_model, 1.0f, 5);
  const kvhead::attention_weights weights{
      {wq.data(), nullptr}, {wk.data(), nullptr}, {wv.data(), nullptr}, {wo.data(), nullptr}};
  std::vector<float> y32(x.size()), y16(x.size());
  kvhead::attention_layer(config, weights).forward(x.data(), 1, tokens, y32.data());
  config.precision = precision::bf16;
  kvhead::attention_layer(config, weights).forward(x.data(), 1, tokens, y16.data());
  double largest = 0.0, difference = 0.0;
  for (std::size_t i = 0; i < y32.size(); ++i) {
    largest = std::max(largest, std::fabs(double(y32[i])));
    const double d = std::fabs(double(y16[i]) - double(y32[i]));
    difference = std::isnan(d) ? d : std::max(difference, d);
  }
  const double relative = difference / largest;
  MESSAGE("Llama-like layer on " << std::string(kvhead::to_string(kvhead::active_simd_path()))
                                 << ": max |y_bf16 - y_f32| / max |y_f32| = " << relative);
  CHECK(relative <= 2e-2);
  CHECK(relative > 0.0);
}

}  // namespace
