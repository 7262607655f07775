// Incremental decoding over the KV cache equals the full causal forward, bit
// for bit: token by token, chunked prefill, ragged batches, forks, truncation,
// every block size.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/random_values.hpp"

namespace {

using kvhead::testing::random_values;

// Seeded weights and biases of one layer (a base, so they exist before the layer).
struct layer_weights {
  kvhead::attention_config config;
  std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo;
  layer_weights(const kvhead::attention_config& c, unsigned seed) : config(c) {
    std::mt19937 generator(seed);
    const std::size_t q_out = c.num_heads * c.head_dim, kv_out = c.num_kv_heads * c.head_dim;
    const float scale = 1.0f / std::sqrt(float(c.d_model));
    wq = random_values(q_out * c.d_model, generator, scale);
    wk = random_values(kv_out * c.d_model, generator, scale);
    wv = random_values(kv_out * c.d_model, generator, scale);
    wo = random_values(c.d_model * q_out, generator, scale);
    bq = random_values(q_out, generator, 0.1f);
    bk = random_values(kv_out, generator, 0.1f);
    bv = random_values(kv_out, generator, 0.1f);
    bo = random_values(c.d_model, generator, 0.1f);
  }
};

struct layer_fixture : layer_weights {
  kvhead::attention_layer layer;
  explicit layer_fixture(const kvhead::attention_config& c, unsigned seed = 3)
      : layer_weights(c, seed),
        layer(config,
              {{wq.data(), bq.data()}, {wk.data(), bk.data()}, {wv.data(), bv.data()}, {wo.data(), bo.data()}}) {}

  // The reference: the cache-free causal forward of each whole sequence.
  std::vector<float> full(const std::vector<float>& x, std::size_t seq) const {
    std::vector<float> y(x.size());
    layer.forward(x.data(), x.size() / config.d_model / seq, seq, y.data());
    return y;
  }
};

kvhead::kv_cache make_cache(const kvhead::attention_config& config, std::size_t block_size, std::size_t layers = 1) {
  kvhead::kv_cache_config cache_config;
  cache_config.num_layers = layers;
  cache_config.num_kv_heads = config.num_kv_heads;
  cache_config.head_dim = config.head_dim;
  cache_config.block_size = block_size;
  cache_config.capacity_bytes = 64u << 20;
  return kvhead::kv_cache(cache_config);
}

// Row t of a, then row t of b.
std::vector<float> concat_rows(const std::vector<float>& a, const std::vector<float>& b, std::size_t t,
                               std::size_t width) {
  std::vector<float> rows(a.begin() + t * width, a.begin() + (t + 1) * width);
  rows.insert(rows.end(), b.begin() + t * width, b.begin() + (t + 1) * width);
  return rows;
}

bool same_bits(const float* a, const float* b, std::size_t count) {
  return std::memcmp(a, b, count * sizeof(float)) == 0;
}

const kvhead::attention_config gqa_rope{8, 2, 16, 48, {}, true, 10000.0};

}  // namespace

TEST_CASE("decode: token by token and in chunks equals the full causal forward, every block size") {
  layer_fixture f(gqa_rope);
  std::mt19937 generator(1);
  constexpr std::size_t seq = 300;  // crosses a 256-key chunk
  const std::vector<float> x = random_values(seq * f.config.d_model, generator, 1.0f);
  const std::vector<float> expected = f.full(x, seq);
  for (std::size_t block_size : {16, 32, 64, 256}) {
    for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{128}, seq}) {
      kvhead::kv_cache cache = make_cache(f.config, block_size);
      const kvhead::sequence_id id = cache.create();
      std::vector<float> y(x.size());
      for (std::size_t done = 0; done < seq; done += chunk) {
        const std::size_t tokens = std::min(chunk, seq - done);
        cache.append(id, tokens);
        f.layer.forward(cache, 0, {{id, tokens}}, x.data() + done * f.config.d_model,
                        y.data() + done * f.config.d_model);
      }
      INFO("block_size " << block_size << " chunk " << chunk);
      CHECK(same_bits(y.data(), expected.data(), y.size()));
    }
  }
}

TEST_CASE("decode: a ragged batch mixing a prefill chunk with single-token steps equals each sequence alone") {
  layer_fixture f({6, 3, 8, 24, {}, true, 500.0});
  std::mt19937 generator(2);
  const std::size_t lengths[] = {40, 9, 23};
  std::vector<std::vector<float>> inputs, expected;
  for (std::size_t length : lengths) {
    inputs.push_back(random_values(length * f.config.d_model, generator, 1.0f));
    expected.push_back(f.full(inputs.back(), length));
  }
  kvhead::kv_cache cache = make_cache(f.config, 32);
  std::vector<kvhead::sequence_id> ids;
  for (std::size_t s = 0; s < 3; ++s) ids.push_back(cache.create());
  std::vector<std::vector<float>> outputs(3);
  for (std::size_t s = 0; s < 3; ++s) outputs[s].resize(inputs[s].size());
  // Sequence s advances by step[s] tokens per call: 13 (prefill chunks), 1, 1.
  const std::size_t step[] = {13, 1, 1};
  std::size_t done[] = {0, 0, 0};
  while (done[0] < lengths[0] || done[1] < lengths[1] || done[2] < lengths[2]) {
    std::vector<kvhead::sequence_tokens> batch;
    std::vector<float> x, y;
    for (std::size_t s = 0; s < 3; ++s) {
      const std::size_t tokens = std::min(step[s], lengths[s] - done[s]);
      if (tokens == 0) continue;
      cache.append(ids[s], tokens);
      batch.push_back({ids[s], tokens});
      x.insert(x.end(), inputs[s].begin() + done[s] * f.config.d_model,
               inputs[s].begin() + (done[s] + tokens) * f.config.d_model);
    }
    y.resize(x.size());
    f.layer.forward(cache, 0, batch, x.data(), y.data());
    std::size_t row = 0;
    for (const auto& item : batch) {
      const std::size_t s = std::size_t(std::find(ids.begin(), ids.end(), item.sequence) - ids.begin());
      std::copy(y.begin() + row * f.config.d_model, y.begin() + (row + item.tokens) * f.config.d_model,
                outputs[s].begin() + done[s] * f.config.d_model);
      done[s] += item.tokens;
      row += item.tokens;
    }
  }
  for (std::size_t s = 0; s < 3; ++s) CHECK(same_bits(outputs[s].data(), expected[s].data(), outputs[s].size()));
}

TEST_CASE("decode: a forked sequence that diverges equals running it from scratch; truncate then re-append") {
  layer_fixture f(gqa_rope);
  std::mt19937 generator(4);
  const std::size_t prefix = 45, tail = 20;
  const std::vector<float> shared = random_values(prefix * f.config.d_model, generator, 1.0f);
  const std::vector<float> tail_a = random_values(tail * f.config.d_model, generator, 1.0f);
  const std::vector<float> tail_b = random_values(tail * f.config.d_model, generator, 1.0f);
  auto concat = [&](const std::vector<float>& t) {
    std::vector<float> all = shared;
    all.insert(all.end(), t.begin(), t.end());
    return all;
  };
  const std::vector<float> expected_a = f.full(concat(tail_a), prefix + tail);
  const std::vector<float> expected_b = f.full(concat(tail_b), prefix + tail);
  const std::size_t d_model = f.config.d_model;

  kvhead::kv_cache cache = make_cache(f.config, 32);
  const kvhead::sequence_id a = cache.create();
  std::vector<float> scratch(prefix * d_model);
  cache.append(a, prefix);
  f.layer.forward(cache, 0, {{a, prefix}}, shared.data(), scratch.data());
  const kvhead::sequence_id b = cache.fork(a);
  std::vector<float> out_a(tail * d_model), out_b(tail * d_model);
  for (std::size_t t = 0; t < tail; ++t) {  // interleaved single steps on both branches
    cache.append(a, 1);
    cache.append(b, 1);
    f.layer.forward(cache, 0, {{a, 1}, {b, 1}}, concat_rows(tail_a, tail_b, t, d_model).data(), scratch.data());
    std::copy(scratch.begin(), scratch.begin() + d_model, out_a.begin() + t * d_model);
    std::copy(scratch.begin() + d_model, scratch.begin() + 2 * d_model, out_b.begin() + t * d_model);
  }
  CHECK(same_bits(out_a.data(), expected_a.data() + prefix * d_model, out_a.size()));
  CHECK(same_bits(out_b.data(), expected_b.data() + prefix * d_model, out_b.size()));

  // Roll b back into the shared prefix's last block and decode tail_a there:
  // it must equal a (and a must be untouched by b's writes).
  cache.truncate(b, prefix);
  std::vector<float> again(tail * d_model);
  cache.append(b, tail);
  f.layer.forward(cache, 0, {{b, tail}}, tail_a.data(), again.data());
  CHECK(same_bits(again.data(), expected_a.data() + prefix * d_model, again.size()));
  std::vector<float> one_more(d_model);
  cache.append(a, 1);
  const std::vector<float> next = random_values(d_model, generator, 1.0f);
  f.layer.forward(cache, 0, {{a, 1}}, next.data(), one_more.data());
  std::vector<float> extended = concat(tail_a);
  extended.insert(extended.end(), next.begin(), next.end());
  const std::vector<float> expected_next = f.full(extended, prefix + tail + 1);
  CHECK(same_bits(one_more.data(), expected_next.data() + (prefix + tail) * d_model, d_model));
}

TEST_CASE("decode: bad calls are rejected before anything is written") {
  layer_fixture f(gqa_rope);
  kvhead::kv_cache cache = make_cache(f.config, 32);
  const kvhead::sequence_id id = cache.create();
  cache.append(id, 2);
  std::vector<float> x(3 * f.config.d_model), y(x.size());
  CHECK_THROWS_WITH_AS(f.layer.forward(cache, 0, {{id, 3}}, x.data(), y.data()), doctest::Contains("append them first"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(f.layer.forward(cache, 1, {{id, 1}}, x.data(), y.data()), doctest::Contains("out of range"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(f.layer.forward(cache, 0, {{id, 1}, {id, 1}}, x.data(), y.data()),
                       doctest::Contains("listed twice"), std::invalid_argument);
  CHECK_THROWS_AS(f.layer.forward(cache, 0, {{id + 100, 1}}, x.data(), y.data()), kvhead::kv_cache_error);
  kvhead::kv_cache other = make_cache({8, 4, 16, 48, {}, true, 0.0}, 32);
  const kvhead::sequence_id other_id = other.create();
  other.append(other_id, 1);
  CHECK_THROWS_WITH_AS(f.layer.forward(other, 0, {{other_id, 1}}, x.data(), y.data()), doctest::Contains("kv heads"),
                       std::invalid_argument);
}

TEST_CASE("set_num_threads: calls run in an arena of that size, with the same bits") {
  layer_fixture f(gqa_rope);
  std::mt19937 generator(8);
  const std::vector<float> x = random_values(40 * f.config.d_model, generator, 1.0f);
  const std::vector<float> expected = f.full(x, 40);
  for (std::size_t threads : {1, 3}) {
    kvhead::set_num_threads(threads);
    CHECK(kvhead::num_threads() == threads);
    CHECK(same_bits(f.full(x, 40).data(), expected.data(), expected.size()));
  }
  kvhead::set_num_threads(0);
  CHECK(kvhead::num_threads() == 0);
  CHECK_THROWS_AS(kvhead::set_num_threads(5000), std::invalid_argument);
}
