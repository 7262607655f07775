// Incremental decoding over the KV cache equals the full causal forward, bit
// for bit: token by token, chunked prefill, ragged batches, forks, truncation,
// every block size; the cache's isolation (written-up-to marks) on every path
// that could read or overwrite another sequence's K/V; several threads
// decoding in one cache.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <tbb/info.h>
#include <tbb/task_arena.h>

#include "engine/cache/kv_cache_internals.hpp"
#include "engine/scheduler/arena.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/cache_blocks.hpp"
#include "tests/random_values.hpp"
#include "tests/seeded_layer.hpp"
#include "tests/thread_sanitizer.hpp"

namespace {

using kvhead::testing::random_values;

// Seeded weights and biases of one layer, o_proj N(0, 1 / d_model) (a base,
// so they exist before the layer).
struct layer_weights : kvhead::testing::seeded_layer {
  layer_weights(const kvhead::attention_config& c, unsigned seed)
      : kvhead::testing::seeded_layer(c, seed, 1.0f / std::sqrt(float(c.d_model))) {}
};

struct layer_fixture : layer_weights {
  kvhead::attention_layer layer;
  explicit layer_fixture(const kvhead::attention_config& c, unsigned seed = 3)
      : layer_weights(c, seed), layer(config, weights()) {}

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

TEST_CASE("decode: longrope picks its factors per call as HF does, pinned ones give every cut the same bits") {
  using pick = kvhead::rope_scaling::longrope_pick;
  kvhead::attention_config c = gqa_rope;  // head_dim 16: 8 rotated pairs
  c.rope_scaling.type = kvhead::rope_scaling::kind::longrope;
  c.rope_scaling.original_max_position_embeddings = 20.0;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.short_factor = {1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5};
  c.rope_scaling.long_factor = {1.0, 1.5, 3.0, 6.0, 10.0, 16.0, 24.0, 40.0};
  std::mt19937 generator(4);
  constexpr std::size_t seq = 30, short_seq = 12;  // over and under the original length
  const std::vector<float> x = random_values(seq * c.d_model, generator, 1.0f);
  std::vector<std::vector<float>> one_call;  // per pick: the whole sequence in one cache-free call
  for (const pick choice : {pick::per_call, pick::short_factors, pick::long_factors}) {
    c.rope_scaling.longrope_factors = choice;
    layer_fixture f(c);
    const std::vector<float> expected = f.full(x, seq);
    one_call.push_back(expected);
    for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, seq}) {
      kvhead::kv_cache cache = make_cache(f.config, 16);
      const kvhead::sequence_id id = cache.create();
      std::vector<float> y(x.size());
      for (std::size_t done = 0; done < seq; done += chunk) {
        const std::size_t tokens = std::min(chunk, seq - done);
        cache.append(id, tokens);
        f.layer.forward(cache, 0, {{id, tokens}}, x.data() + done * c.d_model, y.data() + done * c.d_model);
      }
      INFO("pick " << int(choice) << " chunk " << chunk);
      // Per call, calls that end within the original length rotate their
      // tokens with the short factors, which one call over all 30 does not.
      CHECK(same_bits(y.data(), expected.data(), y.size()) == (choice != pick::per_call || chunk == seq));
    }
    // A short sequence batched with the long one in one call: its own
    // length decides its factors, as alone.
    const std::vector<float> short_alone =
        f.full(std::vector<float>(x.begin(), x.begin() + short_seq * c.d_model), short_seq);
    kvhead::kv_cache cache = make_cache(f.config, 16);
    const kvhead::sequence_id a = cache.create(), b = cache.create();
    cache.append(a, short_seq);
    cache.append(b, seq);
    std::vector<float> both_x(x.begin(), x.begin() + short_seq * c.d_model), both_y((short_seq + seq) * c.d_model);
    both_x.insert(both_x.end(), x.begin(), x.end());
    f.layer.forward(cache, 0, {{a, short_seq}, {b, seq}}, both_x.data(), both_y.data());
    CHECK(same_bits(both_y.data(), short_alone.data(), short_alone.size()));
    CHECK(same_bits(both_y.data() + short_seq * c.d_model, expected.data(), expected.size()));
  }
  // Per call, one call over 30 tokens is long throughout: the bits of the pinned long factors.
  CHECK(one_call[0] == one_call[2]);
  CHECK(one_call[0] != one_call[1]);
}

TEST_CASE("decode: ALiBi, token by token and in chunks, alone or batched, equals the full causal forward") {
  kvhead::attention_config c{8, 2, 16, 48, {}, true};  // no RoPE: ALiBi's models have none
  c.alibi_slopes = kvhead::alibi_slopes(8);
  c.sliding_window = 0;
  layer_fixture f(c);
  std::mt19937 generator(6);
  constexpr std::size_t seq = 300;  // crosses a 256-key chunk
  const std::vector<float> x = random_values(2 * seq * c.d_model, generator, 1.0f);
  const std::vector<float> expected = f.full(x, seq);  // two sequences
  for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, seq}) {
    kvhead::kv_cache cache = make_cache(f.config, 32);
    const kvhead::sequence_id a = cache.create(), b = cache.create();
    std::vector<float> y(x.size());
    for (std::size_t done = 0; done < seq; done += chunk) {
      const std::size_t tokens = std::min(chunk, seq - done);
      cache.append(a, tokens);
      cache.append(b, tokens);
      std::vector<float> rows(x.begin() + done * c.d_model, x.begin() + (done + tokens) * c.d_model);
      rows.insert(rows.end(), x.begin() + (seq + done) * c.d_model, x.begin() + (seq + done + tokens) * c.d_model);
      std::vector<float> out(rows.size());
      f.layer.forward(cache, 0, {{a, tokens}, {b, tokens}}, rows.data(), out.data());
      std::copy(out.begin(), out.begin() + tokens * c.d_model, y.begin() + done * c.d_model);
      std::copy(out.begin() + tokens * c.d_model, out.end(), y.begin() + (seq + done) * c.d_model);
    }
    INFO("chunk " << chunk);
    CHECK(same_bits(y.data(), expected.data(), y.size()));
  }
  // The slopes matter, and the layer checks them.
  kvhead::attention_config plain = c;
  plain.alibi_slopes.clear();
  CHECK(layer_fixture(plain).full(x, seq) != expected);
  kvhead::attention_config wrong = c;
  wrong.alibi_slopes.pop_back();
  CHECK_THROWS_WITH_AS(kvhead::attention_layer(wrong, f.weights()),
                       "attention_layer: alibi_slopes holds 7 slopes, not one per query head (8)",
                       std::invalid_argument);
  wrong.alibi_slopes = c.alibi_slopes;
  wrong.alibi_slopes[3] = NAN;
  CHECK_THROWS_WITH_AS(kvhead::attention_layer(wrong, f.weights()),
                       "attention_layer: alibi_slopes[3] is not finite (nan)", std::invalid_argument);
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

TEST_CASE("decode: a forked sequence that diverges equals running it from scratch, truncate then re-append") {
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
  const std::size_t cpus = std::size_t(std::max(1, tbb::info::default_concurrency()));
  for (std::size_t threads : {std::size_t(1), std::size_t(3), cpus + 1}) {
    kvhead::set_num_threads(threads);
    CHECK(kvhead::num_threads() == threads);                                                       // the setting
    CHECK(kvhead::engine::configured_arena()->max_concurrency() == int(std::min(threads, cpus)));  // no more than run
    CHECK(same_bits(f.full(x, 40).data(), expected.data(), expected.size()));
  }
  kvhead::set_num_threads(0);
  CHECK(kvhead::num_threads() == 0);
  CHECK_THROWS_AS(kvhead::set_num_threads(5000), std::invalid_argument);
}

// ------------------------------------------------------------ isolation
// Each (sequence, layer) has a written-up-to mark (kv_cache.hpp, "Writing"). The
// pools below hold NaN everywhere at first, as recycled blocks hold anything:
// a forward that read a position no forward wrote for that layer would give
// NaN, so every accepted call is also checked bit for bit against the
// cache-free forward.

namespace {

using kvhead::engine::kv_cache_internals;

// 8 MiB: a few hundred blocks of these tests' geometry.
kvhead::kv_cache make_poisoned_cache(const kvhead::attention_config& config, std::size_t block_size,
                                     std::size_t layers = 1) {
  kvhead::kv_cache cache({layers, config.num_kv_heads, config.head_dim, block_size, 8u << 20});
  auto* pool = reinterpret_cast<float*>(kv_cache_internals::pool(cache));
  std::fill(pool, pool + cache.total_blocks() * cache.block_bytes() / sizeof(float),
            std::numeric_limits<float>::quiet_NaN());
  return cache;
}

std::size_t mark(const kvhead::kv_cache& cache, kvhead::sequence_id id, std::size_t layer) {
  return kv_cache_internals::state(cache, id, layer).written;
}

// The bytes of the blocks of a sequence (every layer), to show a refused call wrote nothing.
std::vector<unsigned char> block_bytes_of(const kvhead::kv_cache& cache, kvhead::sequence_id id) {
  std::size_t count = 0;
  const std::uint32_t* table = kv_cache_internals::block_table(cache, id, &count);
  std::vector<unsigned char> bytes;
  for (std::size_t b = 0; b < count; ++b) {
    const std::vector<unsigned char> block = kvhead::tests::block_contents(cache, table[b]);
    bytes.insert(bytes.end(), block.begin(), block.end());
  }
  return bytes;
}

// Two layers of one geometry over a two-layer cache: the second reads the first's output.
struct layer_stack {
  layer_fixture first{gqa_rope, 3}, second{gqa_rope, 11};
  std::size_t d_model() const { return first.config.d_model; }
  std::vector<float> full(const std::vector<float>& x, std::size_t seq) const {
    return second.full(first.full(x, seq), seq);
  }
};

}  // namespace

TEST_CASE("decode isolation: truncate then forward without a new append is refused" *
          doctest::test_suite("isolation")) {
  layer_fixture f(gqa_rope);
  const std::size_t d_model = f.config.d_model;
  std::mt19937 generator(21);
  const std::vector<float> x = random_values(40 * d_model, generator, 1.0f);
  const std::vector<float> expected = f.full(x, 40);
  kvhead::kv_cache cache = make_poisoned_cache(f.config, 32);
  const kvhead::sequence_id a = cache.create();
  cache.append(a, 40);
  CHECK(mark(cache, a, 0) == 0);  // append reserves, writes nothing
  std::vector<float> y(40 * d_model);
  f.layer.forward(cache, 0, {{a, 40}}, x.data(), y.data());
  CHECK(mark(cache, a, 0) == 40);
  cache.truncate(a, 30);
  CHECK(mark(cache, a, 0) == 30);
  const std::vector<unsigned char> before = block_bytes_of(cache, a);
  for (const std::size_t tokens : {std::size_t{10}, std::size_t{5}, std::size_t{1}}) {
    CAPTURE(tokens);
    const std::string message =
        "sequence 1, layer 0: " + std::to_string(tokens) + " new tokens, but it is written up to 30 of length 30";
    CHECK_THROWS_WITH_AS(f.layer.forward(cache, 0, {{a, tokens}}, x.data(), y.data()),
                         doctest::Contains(message.c_str()), std::invalid_argument);
  }
  CHECK(block_bytes_of(cache, a) == before);
  CHECK(mark(cache, a, 0) == 30);
  cache.append(a, 10);
  f.layer.forward(cache, 0, {{a, 10}}, x.data() + 30 * d_model, y.data());
  CHECK(same_bits(y.data(), expected.data() + 30 * d_model, 10 * d_model));
  CHECK(mark(cache, a, 0) == 40);
}

TEST_CASE("decode isolation: forward on a fork without a new append is refused and the parent is untouched" *
          doctest::test_suite("isolation")) {
  layer_fixture f(gqa_rope);
  const std::size_t d_model = f.config.d_model, prefix = 45;
  std::mt19937 generator(22);
  const std::vector<float> x = random_values((prefix + 2) * d_model, generator, 1.0f);
  const std::vector<float> expected = f.full(x, prefix + 2);
  std::vector<float> y((prefix + 2) * d_model);
  kvhead::kv_cache cache = make_poisoned_cache(f.config, 32);
  const kvhead::sequence_id a = cache.create();
  cache.append(a, prefix);
  f.layer.forward(cache, 0, {{a, prefix}}, x.data(), y.data());

  SUBCASE("fork after the forward: the child's re-forward of the tail is refused") {
    const kvhead::sequence_id b = cache.fork(a);
    CHECK(mark(cache, b, 0) == prefix);  // fork copies the marks
    const std::vector<unsigned char> shared = block_bytes_of(cache, a);
    CHECK_THROWS_WITH_AS(f.layer.forward(cache, 0, {{b, 13}}, x.data(), y.data()),
                         doctest::Contains("written up to 45 of length 45"), std::invalid_argument);
    CHECK_THROWS_AS(f.layer.forward(cache, 0, {{a, 1}, {b, 1}}, x.data(), y.data()), std::invalid_argument);
    CHECK(block_bytes_of(cache, a) == shared);
    // Each branch goes on after an append (b's copy-on-write leaves a's block).
    for (const kvhead::sequence_id id : {b, a}) {
      cache.append(id, 1);
      f.layer.forward(cache, 0, {{id, 1}}, x.data() + prefix * d_model, y.data());
      CHECK(same_bits(y.data(), expected.data() + prefix * d_model, d_model));
    }
  }
  SUBCASE("fork between the append and the forward: both refuse to write the shared block") {
    cache.append(a, 2);
    const kvhead::sequence_id b = cache.fork(a);
    CHECK(mark(cache, b, 0) == prefix);
    const std::vector<unsigned char> shared = block_bytes_of(cache, a);
    for (const kvhead::sequence_id id : {a, b}) {
      CAPTURE(id);
      CHECK_THROWS_WITH_AS(f.layer.forward(cache, 0, {{id, 2}}, x.data() + prefix * d_model, y.data()),
                           doctest::Contains("positions from 45 to 47 lie in block 1, shared by 2 sequences"),
                           std::invalid_argument);
    }
    CHECK(block_bytes_of(cache, a) == shared);
    for (const kvhead::sequence_id id : {a, b}) {  // the way out: truncate to the mark, append again
      cache.truncate(id, prefix);
      cache.append(id, 2);
      f.layer.forward(cache, 0, {{id, 2}}, x.data() + prefix * d_model, y.data());
      CHECK(same_bits(y.data(), expected.data() + prefix * d_model, 2 * d_model));
    }
  }
}

TEST_CASE("decode isolation: a layer skipped is refused until its positions are written" *
          doctest::test_suite("isolation")) {
  const layer_stack stack;
  const std::size_t d_model = stack.d_model(), seq = 12;
  std::mt19937 generator(23);
  const std::vector<float> x = random_values(seq * d_model, generator, 1.0f);
  const std::vector<float> hidden = stack.first.full(x, seq), expected = stack.second.full(hidden, seq);
  for (const std::size_t block_size : {32, 256}) {
    CAPTURE(block_size);
    kvhead::kv_cache cache = make_poisoned_cache(stack.first.config, block_size, 2);
    const kvhead::sequence_id s = cache.create();
    std::vector<float> y(seq * d_model);
    cache.append(s, 10);
    stack.first.layer.forward(cache, 0, {{s, 10}}, x.data(), y.data());
    stack.second.layer.forward(cache, 1, {{s, 10}}, hidden.data(), y.data());
    cache.append(s, 1);
    stack.first.layer.forward(cache, 0, {{s, 1}}, x.data() + 10 * d_model, y.data());  // layer 1 skipped
    cache.append(s, 1);
    stack.first.layer.forward(cache, 0, {{s, 1}}, x.data() + 11 * d_model, y.data());
    CHECK(mark(cache, s, 0) == 12);
    CHECK(mark(cache, s, 1) == 10);
    CHECK_THROWS_WITH_AS(
        stack.second.layer.forward(cache, 1, {{s, 1}}, hidden.data() + 11 * d_model, y.data()),
        doctest::Contains("sequence 1, layer 1: 1 new tokens, but it is written up to 10 of length 12"),
        std::invalid_argument);
    CHECK_THROWS_WITH_AS(stack.first.layer.forward(cache, 0, {{s, 1}}, x.data() + 11 * d_model, y.data()),
                         doctest::Contains("layer 0: 1 new tokens, but it is written up to 12 of length 12"),
                         std::invalid_argument);
    // Writing the skipped position with the next one catches up.
    stack.second.layer.forward(cache, 1, {{s, 2}}, hidden.data() + 10 * d_model, y.data());
    CHECK(same_bits(y.data(), expected.data() + 10 * d_model, 2 * d_model));
    CHECK(mark(cache, s, 1) == 12);
  }
}

TEST_CASE("decode isolation: after an exception between layers the step is redone from the lowest mark" *
          doctest::test_suite("isolation")) {
  const layer_stack stack;
  const std::size_t d_model = stack.d_model(), seq = 9;
  std::mt19937 generator(24);
  const std::vector<float> x = random_values(seq * d_model, generator, 1.0f);
  const std::vector<float> hidden = stack.first.full(x, seq), expected = stack.second.full(hidden, seq);
  kvhead::kv_cache cache = make_poisoned_cache(stack.first.config, 32, 2);
  const kvhead::sequence_id s = cache.create();
  std::vector<float> h(d_model), y(seq * d_model);
  // One token per step through both layers; step 5 fails between the layers.
  const auto step = [&](std::size_t t, bool fail_between) {
    cache.append(s, 1);
    stack.first.layer.forward(cache, 0, {{s, 1}}, x.data() + t * d_model, h.data());
    if (fail_between) throw std::runtime_error("the caller's code failed between layers");
    stack.second.layer.forward(cache, 1, {{s, 1}}, h.data(), y.data() + t * d_model);
  };
  for (std::size_t t = 0; t < 5; ++t) step(t, false);
  CHECK_THROWS_AS(step(5, true), std::runtime_error);
  CHECK(mark(cache, s, 0) == 6);
  CHECK(mark(cache, s, 1) == 5);
  // Going on regardless is refused at layer 1, before it writes or attends.
  cache.append(s, 1);
  stack.first.layer.forward(cache, 0, {{s, 1}}, x.data() + 6 * d_model, h.data());
  CHECK_THROWS_WITH_AS(stack.second.layer.forward(cache, 1, {{s, 1}}, h.data(), y.data()),
                       doctest::Contains("layer 1: 1 new tokens, but it is written up to 5 of length 7"),
                       std::invalid_argument);
  // Redo from the lowest mark: truncate lowers both marks to 5.
  cache.truncate(s, 5);
  CHECK(mark(cache, s, 0) == 5);
  for (std::size_t t = 5; t < seq; ++t) step(t, false);
  CHECK(same_bits(y.data(), expected.data(), seq * d_model));
}

TEST_CASE("decode isolation: a recycled block's old K/V are never attended" * doctest::test_suite("isolation")) {
  const layer_stack stack;
  const std::size_t d_model = stack.d_model(), seq = 6;
  std::mt19937 generator(25);
  const std::vector<float> x = random_values(seq * d_model, generator, 1.0f);
  const std::vector<float> hidden = stack.first.full(x, seq), expected = stack.second.full(hidden, seq);
  // A cache of one block: the old sequence's K/V (finite, large) stay in it
  // after its free, unless a debug build poisons it.
  kvhead::kv_cache_config one_block{2, stack.first.config.num_kv_heads, stack.first.config.head_dim, 32, 1u << 20};
  one_block.capacity_bytes = kvhead::kv_cache(one_block).block_bytes();
  kvhead::kv_cache cache(one_block);
  REQUIRE(cache.total_blocks() == 1);
  {
    const std::vector<float> loud = random_values(32 * d_model, generator, 100.0f);
    std::vector<float> scratch(loud.size());
    const kvhead::sequence_id old = cache.create();
    cache.append(old, 32);
    stack.first.layer.forward(cache, 0, {{old, 32}}, loud.data(), scratch.data());
    stack.second.layer.forward(cache, 1, {{old, 32}}, loud.data(), scratch.data());
    cache.free(old);
  }
  const kvhead::sequence_id s = cache.create();
  // h: layer 0's outputs (unused: `hidden` holds them); y: the stack's.
  std::vector<float> h(seq * d_model), y(seq * d_model);
  cache.append(s, 3);
  stack.first.layer.forward(cache, 0, {{s, 3}}, x.data(), h.data());  // layer 1 left unwritten
  cache.append(s, 1);
  stack.first.layer.forward(cache, 0, {{s, 1}}, x.data() + 3 * d_model, h.data());
  // Layer 1's positions 0-2 still hold the old sequence's keys: refused.
  CHECK_THROWS_WITH_AS(stack.second.layer.forward(cache, 1, {{s, 1}}, hidden.data() + 3 * d_model, y.data()),
                       doctest::Contains("written up to 0 of length 4"), std::invalid_argument);
  stack.second.layer.forward(cache, 1, {{s, 4}}, hidden.data(), y.data());
  cache.append(s, 2);
  stack.first.layer.forward(cache, 0, {{s, 2}}, x.data() + 4 * d_model, h.data());
  stack.second.layer.forward(cache, 1, {{s, 2}}, hidden.data() + 4 * d_model, y.data() + 4 * d_model);
  CHECK(same_bits(y.data(), expected.data(), seq * d_model));
}

// ------------------------------------------------------------ threads
// Several threads decode their own sequences in one shared cache, all forked
// from one shared root, freed once forked (so they read blocks other threads
// hold, copy-on-write runs in several threads at once, and a shared block
// returns to the pool when its last holder, any thread, drops it): a seeded
// schedule per thread of create, append + decode through both layers (single
// tokens, prefill chunks, ragged batches of several sequences), fork,
// truncate and free. Each thread's outputs must equal, bit for bit, a one-thread replay of
// the same schedules, which checks every step against the cache-free forward.
//
// Under ThreadSanitizer every thread runs in a one-thread task arena (and
// oneTBB runs no worker at all: tests/thread_sanitizer.cpp says why); elsewhere
// the arenas have two threads (results never depend on the thread count).

namespace {

using kvhead::testing::under_thread_sanitizer;

struct stress_run {
  static constexpr std::size_t threads = 4, steps = 120, max_sequences = 6, max_length = 150, root_length = 45;

  const layer_stack& stack;
  kvhead::kv_cache cache;
  std::vector<float> root_x;
  std::vector<kvhead::sequence_id> forks;  // one per thread

  // The root is freed once forked: its blocks are then held by the threads'
  // sequences only, so the last holder to drop one (and poison it, in the
  // tsan build) may be another thread than one copying it.
  explicit stress_run(const layer_stack& s) : stack(s), cache(make_poisoned_cache(s.first.config, 32, 2)) {
    std::mt19937 generator(99);
    root_x = random_values(root_length * s.d_model(), generator, 1.0f);
    const kvhead::sequence_id root = cache.create();
    cache.append(root, root_length);
    std::vector<float> h(root_x.size()), y(root_x.size());
    stack.first.layer.forward(cache, 0, {{root, root_length}}, root_x.data(), h.data());
    stack.second.layer.forward(cache, 1, {{root, root_length}}, h.data(), y.data());
    for (std::size_t t = 0; t < threads; ++t) forks.push_back(cache.fork(root));
    cache.free(root);
  }

  struct sequence {
    kvhead::sequence_id id;
    std::vector<float> x;  // the inputs of its positions so far, [length, d_model]
  };

  // Thread t's schedule. Returns every output row it decoded, in order; with
  // `check`, also compares each step with the cache-free forward (the
  // replay), counting mismatches in *wrong.
  std::vector<float> work(std::size_t t, bool check, std::size_t* wrong) {
    const std::size_t d_model = stack.d_model();
    std::mt19937 random(static_cast<std::uint32_t>(7000 + t));
    std::vector<sequence> mine = {{forks[t], root_x}};
    std::vector<float> outputs, x, h, y;
    std::vector<kvhead::sequence_tokens> batch;
    for (std::size_t step = 0; step < steps; ++step) {
      const unsigned op = random() % 20;
      const std::size_t pick = random() % mine.size();
      if (op < 2 && mine.size() < max_sequences) {  // create
        mine.push_back({cache.create(), {}});
      } else if (op < 4 && mine.size() < max_sequences) {  // fork
        mine.push_back({cache.fork(mine[pick].id), mine[pick].x});
      } else if (op < 7) {  // truncate
        sequence& s = mine[pick];
        const std::size_t length = random() % (s.x.size() / d_model + 1);
        cache.truncate(s.id, length);
        s.x.resize(length * d_model);
      } else if (op < 8 && mine.size() > 1) {  // free
        cache.free(mine[pick].id);
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(pick));
      } else {  // decode a batch of 1-3 sequences, mostly single tokens
        const std::size_t count = 1 + random() % std::min<std::size_t>(3, mine.size());
        batch.clear();
        x.clear();
        for (std::size_t i = 0; i < count; ++i) {
          sequence& s = mine[(pick + i) % mine.size()];
          const std::size_t tokens = random() % 4 == 0 ? 1 + random() % 20 : 1;
          if (s.x.size() / d_model + tokens > max_length) {
            cache.truncate(s.id, root_length);
            s.x.resize(root_length * d_model);
          }
          const std::vector<float> rows = random_values(tokens * d_model, random, 1.0f);
          cache.append(s.id, tokens);
          batch.push_back({s.id, tokens});
          x.insert(x.end(), rows.begin(), rows.end());
          s.x.insert(s.x.end(), rows.begin(), rows.end());
        }
        h.resize(x.size());
        y.resize(x.size());
        stack.first.layer.forward(cache, 0, batch, x.data(), h.data());
        stack.second.layer.forward(cache, 1, batch, h.data(), y.data());
        outputs.insert(outputs.end(), y.begin(), y.end());
        if (check) {
          std::size_t row = 0;
          for (std::size_t i = 0; i < count; ++i) {
            const sequence& s = mine[(pick + i) % mine.size()];
            const std::size_t length = s.x.size() / d_model, tokens = batch[i].tokens;
            const std::vector<float> expected = stack.full(s.x, length);
            *wrong +=
                !same_bits(y.data() + row * d_model, expected.data() + (length - tokens) * d_model, tokens * d_model);
            row += tokens;
          }
        }
      }
    }
    for (const sequence& s : mine) cache.free(s.id);
    return outputs;
  }
};

}  // namespace

TEST_CASE("decode stress: threads decoding forked and truncated sequences of one cache equal a one-thread replay" *
          doctest::test_suite("concurrency")) {
  const layer_stack stack;
  constexpr std::size_t threads = stress_run::threads;
  const int arena_threads = under_thread_sanitizer ? 1 : 2;

  stress_run concurrent(stack);
  std::vector<std::vector<float>> outputs(threads);
  std::vector<std::string> failures(threads);
  std::atomic<std::size_t> started{0};
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      tbb::task_arena arena(arena_threads);
      started.fetch_add(1);
      while (started.load() < threads) std::this_thread::yield();  // all start together
      try {
        arena.execute([&] { outputs[t] = concurrent.work(t, false, nullptr); });
      } catch (const std::exception& error) {
        failures[t] = error.what();
      }
    });
  for (std::thread& thread : pool) thread.join();
  for (std::size_t t = 0; t < threads; ++t) {
    CAPTURE(t);
    CHECK(failures[t] == "");
  }
  CHECK(concurrent.cache.free_blocks() == concurrent.cache.total_blocks());

  stress_run replay(stack);
  tbb::task_arena one(1);
  for (std::size_t t = 0; t < threads; ++t) {
    CAPTURE(t);
    std::size_t wrong = 0;
    std::vector<float> expected;
    one.execute([&] { expected = replay.work(t, true, &wrong); });
    CHECK(wrong == 0);
    CHECK(expected.size() > 1000);
    REQUIRE(outputs[t].size() == expected.size());
    CHECK(same_bits(outputs[t].data(), expected.data(), expected.size()));
  }
}

TEST_CASE("decode with a sliding window runs past the pool's positions, the blocks outside it dropped") {
  // A pool of 5 blocks of 16 tokens (80 positions) decodes 300 tokens one at
  // a time under a window of 37: at most 4 blocks are held at once. The
  // capacity check counted the dropped positions too and refused position 80.
  constexpr std::size_t window = 37, seq = 300, block_size = 16, pool_blocks = 5;
  kvhead::attention_config windowed = gqa_rope;
  windowed.sliding_window = window;
  const layer_fixture fixture(windowed, 3);
  std::mt19937 generator(5);
  const std::vector<float> x = random_values(seq * windowed.d_model, generator, 1.0f);
  const std::vector<float> expected = fixture.full(x, seq);
  kvhead::kv_cache_config small = make_cache(windowed, block_size).config();
  small.capacity_bytes = pool_blocks * make_cache(windowed, block_size).block_bytes();
  kvhead::kv_cache cache(small);
  REQUIRE(cache.total_blocks() == pool_blocks);
  const kvhead::sequence_id id = cache.create();
  std::vector<float> y(x.size());
  for (std::size_t position = 0; position < seq; ++position) {
    const std::size_t offset = position * windowed.d_model;
    cache.append(id, 1);
    fixture.layer.forward(cache, 0, {{id, 1}}, x.data() + offset, y.data() + offset);
    cache.drop_outside_window(id, window);
  }
  CHECK(same_bits(y.data(), expected.data(), x.size()));
  CHECK(cache.length(id) == seq);
  CHECK(cache.blocks_used(id) == (seq + block_size - 1) / block_size);  // the dropped entries included
  // Without dropping, the pool's positions are the limit, and the message counts the blocks held.
  const kvhead::sequence_id other = cache.create();
  CHECK_THROWS_WITH_AS(cache.append(other, pool_blocks * block_size + 1),
                       doctest::Contains("needs 6 blocks, the cache has 5"), kvhead::kv_cache_error);
  // A forward naming a freed sequence names the forward, not an internal call.
  cache.free(other);
  std::vector<float> out(windowed.d_model);
  const std::string freed = "attention_layer::forward (cache): sequence " + std::to_string(other) + " was freed";
  CHECK_THROWS_WITH_AS(fixture.layer.forward(cache, 0, {{other, 1}}, x.data(), out.data()),
                       doctest::Contains(freed.c_str()), kvhead::kv_cache_error);
}

TEST_CASE(
    "decode with a sliding window over each compressed dtype: one long prefill equals single steps, bit for bit") {
  // A 300-token forward over 16-token blocks: rows of one tile see different
  // key ranges, some none of a chunk whose first visible key lies past the
  // chunk's first block (the int8 path took an offset from there: UBSan).
  constexpr std::size_t window = 20, seq = 300;
  kvhead::attention_config windowed = gqa_rope;
  windowed.sliding_window = window;
  const layer_fixture fixture(windowed, 3);
  std::mt19937 generator(6);
  const std::vector<float> x = random_values(seq * windowed.d_model, generator, 1.0f);
  for (const kvhead::kv_dtype dtype : {kvhead::kv_dtype::bf16, kvhead::kv_dtype::f16, kvhead::kv_dtype::int8}) {
    CAPTURE(int(dtype));
    std::vector<float> outputs[2];
    for (const std::size_t chunk : {seq, std::size_t{1}}) {
      kvhead::kv_cache_config config = make_cache(windowed, 16).config();
      config.dtype = dtype;
      kvhead::kv_cache cache(config);
      const kvhead::sequence_id id = cache.create();
      std::vector<float>& y = outputs[chunk == 1];
      y.assign(x.size(), 0.0f);
      for (std::size_t done = 0; done < seq; done += chunk) {
        const std::size_t offset = done * windowed.d_model;
        cache.append(id, chunk);
        fixture.layer.forward(cache, 0, {{id, chunk}}, x.data() + offset, y.data() + offset);
      }
    }
    CHECK(same_bits(outputs[0].data(), outputs[1].data(), x.size()));
  }
}

TEST_CASE("decode with a sliding window equals the full forward, and dropping the blocks outside it frees them") {
  constexpr std::size_t window = 37, seq = 300;
  kvhead::attention_config windowed = gqa_rope;
  windowed.sliding_window = window;
  const layer_fixture first(windowed, 3), second(windowed, 4);  // two sliding layers of one cache
  std::mt19937 generator(2);
  const std::vector<float> x = random_values(seq * windowed.d_model, generator, 1.0f);
  const std::vector<float> expected_first = first.full(x, seq), expected_second = second.full(x, seq);
  // The window matters: the same layer without it differs.
  kvhead::attention_config unwindowed = windowed;
  unwindowed.sliding_window = 0;
  const layer_fixture full_first(unwindowed, 3);
  CHECK(!same_bits(full_first.full(x, seq).data(), expected_first.data(), x.size()));
  for (std::size_t block_size : {16, 64})
    for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, seq})
      for (bool drop : {false, true}) {
        INFO("block_size " << block_size << " chunk " << chunk << " drop " << drop);
        kvhead::kv_cache cache = make_cache(windowed, block_size, 2);
        const kvhead::sequence_id id = cache.create();
        std::vector<float> y_first(x.size()), y_second(x.size());
        std::size_t most_held = 0;
        for (std::size_t done = 0; done < seq; done += chunk) {
          const std::size_t tokens = std::min(chunk, seq - done), offset = done * windowed.d_model;
          cache.append(id, tokens);
          first.layer.forward(cache, 0, {{id, tokens}}, x.data() + offset, y_first.data() + offset);
          second.layer.forward(cache, 1, {{id, tokens}}, x.data() + offset, y_second.data() + offset);
          if (drop) cache.drop_outside_window(id, window);
          most_held = std::max(most_held, cache.total_blocks() - cache.free_blocks());
        }
        CHECK(same_bits(y_first.data(), expected_first.data(), x.size()));
        CHECK(same_bits(y_second.data(), expected_second.data(), x.size()));
        const std::size_t held = cache.total_blocks() - cache.free_blocks();
        if (!drop) {
          CHECK(cache.dropped(id) == 0);
          CHECK(held == (seq + block_size - 1) / block_size);
          continue;
        }
        // Every block wholly below position seq + 1 - window is back in the pool.
        CHECK(cache.dropped(id) == (seq + 1 - window) / block_size * block_size);
        CHECK(held == cache.blocks_used(id) - cache.dropped(id) / block_size);
        if (chunk == 1) CHECK(most_held <= (window + block_size - 1) / block_size + 1);
        CHECK(cache.drop_outside_window(id, window) == 0);  // nothing more to drop

        // Later reads of dropped positions are errors, never garbage: a layer
        // without a window, a wider window, new queries back inside the window.
        cache.append(id, 1);
        const std::vector<float> row(windowed.d_model, 0.5f);
        std::vector<float> out(windowed.d_model);
        CHECK_THROWS_WITH_AS(full_first.layer.forward(cache, 0, {{id, 1}}, row.data(), out.data()),
                             doctest::Contains("were dropped (kv_cache::drop_outside_window)"), std::invalid_argument);
        kvhead::attention_config wider = windowed;
        wider.sliding_window = seq;
        const layer_fixture wide(wider, 3);
        CHECK_THROWS_WITH_AS(wide.layer.forward(cache, 0, {{id, 1}}, row.data(), out.data()),
                             doctest::Contains("sliding window 300"), std::invalid_argument);
        first.layer.forward(cache, 0, {{id, 1}}, row.data(), out.data());  // its own window: fine
        second.layer.forward(cache, 1, {{id, 1}}, row.data(), out.data());
        CHECK_THROWS_WITH_AS(cache.truncate(id, cache.dropped(id) - 1), doctest::Contains("dropped positions"),
                             kvhead::kv_cache_error);
        cache.truncate(id, cache.dropped(id));  // the next query's window reaches back into the dropped ones
        cache.append(id, 1);
        CHECK_THROWS_WITH_AS(first.layer.forward(cache, 0, {{id, 1}}, row.data(), out.data()),
                             doctest::Contains("dropped"), std::invalid_argument);
        const kvhead::sequence_id child = cache.fork(id);  // shares the kept blocks only, and the dropped positions
        CHECK(cache.dropped(child) == cache.dropped(id));
        cache.truncate(child, cache.dropped(child));
        cache.append(child, 1);
        CHECK_THROWS_WITH_AS(first.layer.forward(cache, 0, {{child, 1}}, row.data(), out.data()),
                             doctest::Contains("dropped"), std::invalid_argument);
        cache.free(id);
        cache.free(child);
        CHECK(cache.free_blocks() == cache.total_blocks());
        CHECK_THROWS_AS(cache.drop_outside_window(child, window), kvhead::kv_cache_error);
      }
}
