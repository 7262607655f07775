// Tiled attention against the double reference on every SIMD path, over GQA
// ratios, head dims, lengths around the tile sizes, every mask kind, batch > 1
// and both activation layouts; with logit soft-capping and attention sinks.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "engine/attention/flash_attention.hpp"
#include "engine/cache/cached_attention.hpp"
#include "engine/cache/kv_cache_internals.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/reference/attention_reference.hpp"
#include "tests/reference/kv_dtype_reference.hpp"
#include "tests/sdpa_cases.hpp"

using kvhead::attention_dims;
using kvhead::head_tensor;
using kvhead::simd_path;
using kvhead::testing::check_sdpa;
using kvhead::testing::make_data;
using kvhead::testing::make_problem;
using kvhead::testing::sdpa_data;
using kvhead::testing::sdpa_setup;

TEST_CASE("attention matches the double reference: GQA ratios, head dims, lengths, masks, every SIMD path") {
  const std::vector<std::size_t> head_dims = {1, 7, 24, 64, 80, 128};
  // Around the query tile (128 stacked rows / R) and the KV chunk (256), primes, long.
  const std::vector<std::size_t> lengths = {1, 2, 31, 32, 33, 127, 128, 129, 255, 256, 257, 97, 211, 701};
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(1129);
    auto pick = [&](const auto& list) { return list[generator() % list.size()]; };
    for (int sample = 0; sample < 40; ++sample) {
      sdpa_setup setup;
      const std::size_t kv_heads = pick(std::vector<std::size_t>{1, 2, 3});
      const std::size_t ratio = pick(std::vector<std::size_t>{1, 2, 4, 0});  // 0: MQA (G = 1, R = H)
      setup.dims.num_kv_heads = ratio == 0 ? 1 : kv_heads;
      setup.dims.num_heads = ratio == 0 ? pick(std::vector<std::size_t>{3, 8}) : kv_heads * ratio;
      setup.dims.batch = 1 + generator() % 3;
      setup.dims.head_dim = pick(head_dims);
      setup.dims.kv_len = pick(lengths);
      setup.dims.q_len = generator() % 3 == 0 ? setup.dims.kv_len : pick(lengths);
      // Keep the double reference fast: at most ~30M multiply-adds per case.
      while (setup.dims.batch * setup.dims.num_heads * setup.dims.q_len * setup.dims.kv_len * setup.dims.head_dim >
             30'000'000)
        setup.dims.q_len = std::max<std::size_t>(1, setup.dims.q_len / 2);
      setup.bshd_layout = generator() & 1;
      setup.causal = generator() % 3 != 0;
      setup.explicit_offset = generator() % 4 == 0 || setup.dims.q_len > setup.dims.kv_len;
      setup.padded = generator() % 3 == 0;
      setup.additive = generator() % 4 == 0;
      check_sdpa(setup, path, generator);
    }
  }
}

TEST_CASE("attention with a sliding window matches the double reference: windows 1, 2, chunk +-1, decode, prefill") {
  const std::vector<std::size_t> windows = {1, 2, 3, 255, 256, 257, 511, 0};  // 0: a random one below kv_len
  const std::vector<std::size_t> lengths = {1, 2, 31, 129, 255, 256, 257, 97, 211, 701};
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(1733);
    auto pick = [&](const auto& list) { return list[generator() % list.size()]; };
    for (int sample = 0; sample < 36; ++sample) {
      sdpa_setup setup;
      const std::size_t kv_heads = pick(std::vector<std::size_t>{1, 2, 3});
      setup.dims.num_kv_heads = kv_heads;
      setup.dims.num_heads = kv_heads * pick(std::vector<std::size_t>{1, 2, 4});
      setup.dims.batch = 1 + generator() % 2;
      setup.dims.head_dim = pick(std::vector<std::size_t>{7, 16, 33, 64});
      const int kind = sample % 3;  // 0: decode at a long past, 1: prefill, 2: a chunk of queries
      setup.dims.kv_len = kind == 0 ? 1500 + generator() % 1700 : pick(lengths);
      setup.dims.q_len = kind == 0 ? 1 : kind == 1 ? setup.dims.kv_len : pick(lengths);
      while (setup.dims.batch * setup.dims.num_heads * setup.dims.q_len * setup.dims.kv_len * setup.dims.head_dim >
             20'000'000)
        setup.dims.q_len = std::max<std::size_t>(1, setup.dims.q_len / 2);
      setup.window = pick(windows);
      if (setup.window == 0) setup.window = 1 + generator() % setup.dims.kv_len;
      setup.bshd_layout = generator() & 1;
      setup.causal = sample % 5 != 4;
      setup.explicit_offset = kind == 2 && (generator() % 2 == 0 || setup.dims.q_len > setup.dims.kv_len);
      setup.padded = generator() % 4 == 0;
      setup.additive = generator() % 5 == 0;
      check_sdpa(setup, path, generator);
    }
  }
}

TEST_CASE(
    "attention with soft-capping, sinks and ALiBi matches the double reference: scores far beyond the cap, windows, "
    "padding, GQA and MQA, decode and prefill, every SIMD path") {
  const std::vector<std::size_t> lengths = {1, 2, 31, 97, 127, 255, 256, 257, 600, 1500};
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(2718);
    auto pick = [&](const auto& list) { return list[generator() % list.size()]; };
    for (int sample = 0; sample < 42; ++sample) {
      sdpa_setup setup;
      const std::size_t kv_heads = pick(std::vector<std::size_t>{1, 2, 3});
      const std::size_t ratio = pick(std::vector<std::size_t>{1, 2, 4, 5, 0});  // 0: MQA
      setup.dims.num_kv_heads = ratio == 0 ? 1 : kv_heads;
      setup.dims.num_heads = ratio == 0 ? pick(std::vector<std::size_t>{3, 8}) : kv_heads * ratio;
      setup.dims.batch = 1 + generator() % 3;
      setup.dims.head_dim = pick(std::vector<std::size_t>{1, 8, 24, 33, 64, 80});
      setup.dims.kv_len = pick(lengths);
      // Every third sample a decode step (one query at the end of the past).
      setup.dims.q_len = sample % 3 == 0 ? 1 : generator() % 2 == 0 ? setup.dims.kv_len : pick(lengths);
      while (setup.dims.batch * setup.dims.num_heads * setup.dims.q_len * setup.dims.kv_len * setup.dims.head_dim >
             20'000'000)
        setup.dims.q_len = std::max<std::size_t>(1, setup.dims.q_len / 2);
      setup.bshd_layout = generator() & 1;
      setup.causal = generator() % 4 != 0;
      setup.explicit_offset = generator() % 4 == 0 || setup.dims.q_len > setup.dims.kv_len;
      setup.padded = generator() % 2 == 0;  // valid_len 0 included: rows with no visible key
      setup.additive = generator() % 5 == 0;
      setup.window = generator() % 4 == 0 ? 1 + generator() % setup.dims.kv_len : 0;
      // Each pair of the three variants, all three, and each alone in turn.
      setup.logit_softcap = sample % 3 != 2 ? pick(std::vector<float>{5.0f, 20.0f, 50.0f}) : 0.0f;
      setup.sinks = sample % 3 != 1;
      setup.alibi = sample % 2 == 0;
      setup.q_gain = setup.logit_softcap > 0.0f ? pick(std::vector<float>{1.0f, 30.0f}) : 1.0f;
      check_sdpa(setup, path, generator);
    }
  }
}

TEST_CASE("alibi_slopes: BLOOM's and MPT's slopes, for a power of two of heads and between them") {
  // Written from transformers' build_alibi_tensor: n = 2^floor(log2 H), base
  // 2^(-8/n), slopes base^1 .. base^n, then the odd powers 1, 3, 5, ... of
  // 2^(-8/(2n)) for the H - n heads left.
  for (const std::size_t heads : {1, 2, 8, 12, 32, 40, 71}) {
    CAPTURE(heads);
    std::size_t n = 1;
    while (2 * n <= heads) n *= 2;
    std::vector<double> expected;
    for (std::size_t i = 1; i <= n; ++i) expected.push_back(std::pow(std::pow(2.0, -8.0 / double(n)), double(i)));
    for (std::size_t i = 1; expected.size() < heads; i += 2)
      expected.push_back(std::pow(std::pow(2.0, -8.0 / double(2 * n)), double(i)));
    const std::vector<float> slopes = kvhead::alibi_slopes(heads);
    REQUIRE(slopes.size() == heads);
    for (std::size_t h = 0; h < heads; ++h) CHECK(slopes[h] == float(expected[h]));
  }
  CHECK(kvhead::alibi_slopes(4, 4.0) == std::vector<float>{0.5f, 0.25f, 0.125f, 0.0625f});
  CHECK_THROWS_WITH_AS(kvhead::alibi_slopes(0), "alibi_slopes: num_heads must be at least 1", std::invalid_argument);
  CHECK_THROWS_AS(kvhead::alibi_slopes(8, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(kvhead::alibi_slopes(8, INFINITY), std::invalid_argument);
}

namespace {

// Each query at `positions` of the causal prefill `setup`, run alone as a
// one-row decode step over the keys [0, position] at every thread count of
// `thread_counts`, gives the bits of its row of the prefill.
void check_decode_steps_match_prefill(const sdpa_setup& setup, simd_path path, std::mt19937& generator,
                                      std::initializer_list<std::size_t> positions,
                                      std::initializer_list<int> thread_counts) {
  const sdpa_data data = make_data(setup, generator);
  std::vector<float> full;
  kvhead::engine::flash_attention(make_problem(setup, data, full, path));
  for (std::size_t position : positions) {
    sdpa_setup step = setup;
    step.dims.q_len = 1;
    step.dims.kv_len = position + 1;
    sdpa_data step_data = data;
    step_data.q_view.data = data.q.data() + position * setup.dims.head_dim;
    step_data.q_offset = position;
    for (int threads : thread_counts) {
      std::vector<float> out;
      auto problem = make_problem(step, step_data, out, path);
      problem.out = head_tensor<float>{out.data(), 0, setup.dims.head_dim, 0};
      tbb::task_arena arena(threads);
      arena.execute([&] { kvhead::engine::flash_attention(problem); });
      for (std::size_t h = 0; h < setup.dims.num_heads; ++h) {
        INFO("path " << std::string(kvhead::to_string(path)) << " window " << setup.window << " softcap "
                     << setup.logit_softcap << " sinks " << setup.sinks << " position " << position << " threads "
                     << threads << " head " << h);
        CHECK(std::memcmp(out.data() + h * setup.dims.head_dim,
                          full.data() + (h * setup.dims.q_len + position) * setup.dims.head_dim,
                          setup.dims.head_dim * sizeof(float)) == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("attention with a sliding window: a decode step equals its row of the prefill at 1, 2, 3 and 8 threads") {
  for (simd_path path : kvhead::supported_simd_paths())
    for (std::size_t window : {1, 2, 255, 256, 257}) {
      std::mt19937 generator(static_cast<unsigned>(window));
      sdpa_setup setup;
      setup.dims = {1, 8, 2, 700, 700, 24};
      setup.causal = true;
      setup.window = window;
      check_decode_steps_match_prefill(setup, path, generator, {0, 1, 255, 256, 257, 511, 512, 699}, {1, 2, 3, 8});
    }
}

TEST_CASE("attention with ALiBi: a decode step equals its row of the prefill at 1, 2, 3 and 8 threads") {
  for (simd_path path : kvhead::supported_simd_paths())
    for (std::size_t window : {0, 257}) {
      std::mt19937 generator(static_cast<unsigned>(window) + 17);
      sdpa_setup setup;
      setup.dims = {1, 8, 2, 700, 700, 24};
      setup.causal = true;
      setup.window = window;
      setup.alibi = true;
      check_decode_steps_match_prefill(setup, path, generator, {0, 1, 255, 256, 257, 511, 512, 699}, {1, 2, 3, 8});
    }
}

TEST_CASE("attention with a sliding window: NaN in keys and values outside a query's window never reaches it") {
  // Key and value 300 poisoned: seen by queries 300 .. 300 + window - 1 only.
  // User K/V (prefill, V packed or read in place) and a cache of 16-key
  // blocks (a window edge inside a block: its V page copied with zeros).
  // In bf16 precision too, where the CPU's bf16 products read K and V in
  // pairs of keys (gemm_bf16_paged): a pair never reaches past a query's keys.
  // There q, k and v are rounded to bf16 first, as the layer rounds its
  // projections before they reach the cache (flash_attention rounds user K/V
  // as it packs them; a cache holds what was written).
  constexpr std::size_t seq = 700, head_dim = 16, poisoned = 300;
  for (const kvhead::precision precision : {kvhead::precision::f32, kvhead::precision::bf16})
    for (simd_path path : kvhead::supported_simd_paths())
      for (std::size_t window : {1, 5, 250, 257}) {
        std::mt19937 generator(3);
        sdpa_setup setup;
        setup.dims = {1, 2, 1, seq, seq, head_dim};
        setup.causal = true;
        setup.window = window;
        sdpa_data data = make_data(setup, generator);
        if (precision == kvhead::precision::bf16)
          for (std::vector<float>* values : {&data.q, &data.k, &data.v})
            for (float& x : *values) x = float(kvhead::reference::bf16_value(kvhead::reference::round_to_bf16(x)));
        for (std::size_t e = 0; e < head_dim; ++e) {
          data.k[poisoned * head_dim + e] = NAN;
          data.v[poisoned * head_dim + e] = NAN;
        }
        auto sees = [&](std::size_t i) { return i >= poisoned && i < poisoned + window; };
        std::vector<float> out;
        kvhead::engine::attention_problem problem = make_problem(setup, data, out, path);
        problem.precision = precision;
        kvhead::engine::flash_attention(problem);
        for (std::size_t i = 0; i < seq; ++i) {
          INFO("precision " << std::string(kvhead::to_string(precision)) << " path "
                            << std::string(kvhead::to_string(path)) << " window " << window << " query " << i);
          CHECK(std::isnan(out[i * head_dim]) == sees(i));
        }
        kvhead::kv_cache cache({1, 1, head_dim, 16, 4u << 20});
        const kvhead::sequence_id id = cache.create();
        cache.append(id, seq);
        std::size_t count = 0;
        const std::vector<kvhead::engine::cached_rows> rows = {
            {kvhead::engine::kv_cache_internals::block_table(cache, id, &count), seq, 0, 0}};
        kvhead::engine::write_cached_kv(cache, 0, rows, data.k.data(), data.v.data(), path);
        // q [seq, 2 heads, d] from the bhsd q of the setup.
        std::vector<float> q(seq * 2 * head_dim), cached(q.size());
        for (std::size_t h = 0; h < 2; ++h)
          for (std::size_t i = 0; i < seq; ++i)
            std::copy_n(data.q.data() + (h * seq + i) * head_dim, head_dim, q.data() + (i * 2 + h) * head_dim);
        const float scale = float(1.0 / std::sqrt(double(head_dim)));
        kvhead::engine::cached_attention(cache, 0, rows, 2, q.data(), 2 * head_dim, cached.data(), scale, window, path,
                                         {}, precision);
        for (std::size_t i = 0; i < seq; ++i) {
          INFO("cache, precision " << std::string(kvhead::to_string(precision)) << " path "
                                   << std::string(kvhead::to_string(path)) << " window " << window << " query " << i);
          CHECK(std::isnan(cached[i * 2 * head_dim]) == sees(i));
          if (!sees(i))
            CHECK(std::memcmp(cached.data() + i * 2 * head_dim, out.data() + i * head_dim, 4 * head_dim) == 0);
        }
        for (std::size_t position : {poisoned - 1, poisoned + window - 1, poisoned + window, seq - 1}) {
          const std::vector<kvhead::engine::cached_rows> step = {
              {kvhead::engine::kv_cache_internals::block_table(cache, id, &count), position + 1, position, 0}};
          std::vector<float> one(2 * head_dim);
          kvhead::engine::cached_attention(cache, 0, step, 2, q.data() + position * 2 * head_dim, 2 * head_dim,
                                           one.data(), scale, window, path, {}, precision);
          INFO("cache decode, precision " << std::string(kvhead::to_string(precision)) << " path "
                                          << std::string(kvhead::to_string(path)) << " window " << window
                                          << " position " << position);
          CHECK(std::memcmp(one.data(), cached.data() + position * 2 * head_dim, one.size() * sizeof(float)) == 0);
        }
      }
}

TEST_CASE("attention sinks: rows with every key masked give zeros, as Hugging Face's eager gpt-oss gives them") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(6);
    sdpa_setup setup;
    setup.dims = {2, 4, 2, 9, 12, 8};
    setup.padded = true;
    setup.sinks = true;
    setup.logit_softcap = 10.0f;
    sdpa_data data = make_data(setup, generator);
    data.valid_len = {0, 3};
    std::vector<float> out;
    kvhead::engine::flash_attention(make_problem(setup, data, out, path));
    const std::size_t per_batch = setup.dims.num_heads * setup.dims.q_len * setup.dims.head_dim;
    INFO("path " << std::string(kvhead::to_string(path)));
    for (std::size_t i = 0; i < per_batch; ++i) CHECK(out[i] == 0.0f);
    for (std::size_t i = per_batch; i < out.size(); ++i) CHECK(std::isfinite(out[i]));
    // Rows hidden by an additive mask of -inf alone: zeros too.
    sdpa_setup masked = setup;
    masked.padded = false;
    masked.additive = true;
    sdpa_data masked_data = make_data(masked, generator);
    std::fill(masked_data.mask.begin(), masked_data.mask.end(), -INFINITY);
    kvhead::engine::flash_attention(make_problem(masked, masked_data, out, path));
    for (float x : out) CHECK(x == 0.0f);
  }
}

TEST_CASE("attention: probabilities on request match the reference, the output unchanged bit for bit") {
  // Plain, and with soft-capping, sinks (whose share leaves the rows' sums visibly below 1) and ALiBi.
  for (const bool capped_with_sinks : {false, true}) {
    CAPTURE(capped_with_sinks);
    std::mt19937 generator(capped_with_sinks ? 13 : 11);
    sdpa_setup setup;
    setup.dims = {2, 4, 2, 5, 7, 8};
    setup.causal = true;
    setup.additive = true;
    setup.sinks = capped_with_sinks;
    setup.alibi = capped_with_sinks;
    if (capped_with_sinks) setup.q_gain = 20.0f;  // scores far beyond the cap
    const sdpa_data data = make_data(setup, generator);
    const attention_dims& d = setup.dims;
    const double softcap = capped_with_sinks ? 4.0 : 0.0;
    kvhead::attention_options options;
    options.causal = true;
    options.additive_mask = data.mask.data();
    options.logit_softcap = float(softcap);
    options.sinks = capped_with_sinks ? data.sinks.data() : nullptr;
    options.alibi_slopes = capped_with_sinks ? data.alibi_slopes.data() : nullptr;
    std::vector<float> plain(d.batch * d.num_heads * d.q_len * d.head_dim), with(plain.size());
    std::vector<float> probabilities(d.batch * d.num_heads * d.q_len * d.kv_len);
    auto out_view = [&](std::vector<float>& out) {
      return head_tensor<float>::bhsd(out.data(), d.num_heads, d.q_len, d.head_dim);
    };
    kvhead::scaled_dot_product_attention(d, data.q_view, data.k_view, data.v_view, out_view(plain), options);
    options.probabilities = probabilities.data();
    kvhead::scaled_dot_product_attention(d, data.q_view, data.k_view, data.v_view, out_view(with), options);
    CHECK(std::memcmp(plain.data(), with.data(), plain.size() * sizeof(float)) == 0);
    const auto ref = kvhead::reference::sdpa(
        {d.batch, d.num_heads, d.num_kv_heads, d.q_len, d.kv_len, d.head_dim, 1.0 / std::sqrt(8.0), true,
         d.kv_len - d.q_len, nullptr, data.mask.data(), 0, softcap, options.sinks, options.alibi_slopes},
        {data.q.data(), d.num_heads * d.q_len * 8, d.q_len * 8, 8},
        {data.k.data(), d.num_kv_heads * d.kv_len * 8, d.kv_len * 8, 8},
        {data.v.data(), d.num_kv_heads * d.kv_len * 8, d.kv_len * 8, 8});
    double lowest_row_sum = 1.0, highest_row_sum = 0.0;
    for (std::size_t row = 0; row < probabilities.size() / d.kv_len; ++row) {
      double sum = 0.0;
      for (std::size_t j = 0; j < d.kv_len; ++j) {
        const std::size_t i = row * d.kv_len + j;
        CHECK(std::fabs(probabilities[i] - ref.probability[i]) <= 1e-5);
        sum += probabilities[i];
      }
      lowest_row_sum = std::min(lowest_row_sum, sum);
      highest_row_sum = std::max(highest_row_sum, sum);
    }
    if (capped_with_sinks) {
      CHECK(lowest_row_sum < 0.99);  // the sinks took a visible share
    } else {
      CHECK(lowest_row_sum >= 1.0 - 1e-5);
      CHECK(highest_row_sum <= 1.0 + 1e-5);
    }
    for (std::size_t i = 0; i < plain.size(); ++i) CHECK(std::fabs(plain[i] - ref.out[i]) <= 1e-4);
  }
}

TEST_CASE("attention rejects a bad logit_softcap or a non-finite sink, naming it") {
  std::vector<float> q(64), out(64);
  auto view = [](std::vector<float>& x) { return head_tensor<float>::bhsd(x.data(), 2, 2, 4); };
  auto cview = [](const std::vector<float>& x) { return head_tensor<const float>::bhsd(x.data(), 2, 2, 4); };
  for (float cap : {-1.0f, INFINITY, NAN}) {
    kvhead::attention_options options;
    options.logit_softcap = cap;
    CHECK_THROWS_WITH_AS(
        kvhead::scaled_dot_product_attention({1, 2, 2, 2, 2, 4}, cview(q), cview(q), cview(q), view(out), options),
        doctest::Contains("logit_softcap"), std::invalid_argument);
  }
  const float sinks[] = {0.5f, NAN};
  kvhead::attention_options options;
  options.sinks = sinks;
  CHECK_THROWS_WITH_AS(
      kvhead::scaled_dot_product_attention({1, 2, 2, 2, 2, 4}, cview(q), cview(q), cview(q), view(out), options),
      doctest::Contains("sinks[1]"), std::invalid_argument);
}

TEST_CASE("attention: a query with no visible key gives zeros, and zero-length keys give zeros") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(5);
    sdpa_setup setup;
    setup.dims = {2, 4, 2, 9, 12, 8};
    setup.padded = true;
    sdpa_data data = make_data(setup, generator);
    data.valid_len = {0, 3};
    std::vector<float> out;
    auto problem = make_problem(setup, data, out, path);
    kvhead::engine::flash_attention(problem);
    const std::size_t per_batch = setup.dims.num_heads * setup.dims.q_len * setup.dims.head_dim;
    for (std::size_t i = 0; i < per_batch; ++i) CHECK(out[i] == 0.0f);
    for (std::size_t i = per_batch; i < out.size(); ++i) CHECK(std::isfinite(out[i]));

    setup.dims.kv_len = 0;
    setup.padded = false;
    data = make_data(setup, generator);
    problem = make_problem(setup, data, out, path);
    kvhead::engine::flash_attention(problem);
    for (float x : out) CHECK(x == 0.0f);
  }
}

TEST_CASE("attention: zero keys with null K and V give zeros (no arithmetic on the null pointers)") {
  // kv_len 0 allows null k and v (attention.hpp); under UBSan any offset
  // added to them is an error.
  const attention_dims dims{2, 4, 2, 3, 0, 8};
  const std::vector<float> q(dims.batch * dims.num_heads * dims.q_len * dims.head_dim, 0.5f);
  for (const kvhead::precision precision : {kvhead::precision::f32, kvhead::precision::bf16}) {
    std::vector<float> out(q.size(), 7.0f);
    kvhead::attention_options options;
    options.precision = precision;
    kvhead::scaled_dot_product_attention(
        dims, head_tensor<const float>::bshd(q.data(), dims.num_heads, dims.q_len, dims.head_dim),
        head_tensor<const float>::bshd(nullptr, dims.num_kv_heads, 0, dims.head_dim),
        head_tensor<const float>::bshd(nullptr, dims.num_kv_heads, 0, dims.head_dim),
        head_tensor<float>::bshd(out.data(), dims.num_heads, dims.q_len, dims.head_dim), options);
    for (float x : out) CHECK(x == 0.0f);
  }
}

TEST_CASE("attention: a NaN value behind an additive -inf mask reaches the row wherever the mask's chunk falls") {
  // attention.hpp: a key hidden only by the additive mask contributes 0 * v.
  // A fully masked 256-key chunk first in the row dropped its 0 * NaN.
  const attention_dims dims{1, 1, 1, 1, 600, 4};
  std::mt19937 generator(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(dims.head_dim), k(dims.kv_len * dims.head_dim), v(k.size());
  for (float& x : q) x = normal(generator);
  for (float& x : k) x = normal(generator);
  for (float& x : v) x = normal(generator);
  using view = head_tensor<const float>;
  // (No structured bindings: clang 14's doctest CAPTURE cannot take them.)
  for (const std::array<std::size_t, 3>& masked :
       {std::array<std::size_t, 3>{0, 11, 10}, {0, 256, 10}, {256, 512, 300}, {512, 600, 599}, {0, 512, 300}}) {
    const std::size_t masked_begin = masked[0], masked_end = masked[1], poisoned = masked[2];
    CAPTURE(masked_begin);
    CAPTURE(masked_end);
    std::vector<float> mask(dims.kv_len, 0.0f), poisoned_v = v, out(dims.head_dim);
    std::fill(mask.begin() + std::ptrdiff_t(masked_begin), mask.begin() + std::ptrdiff_t(masked_end), -INFINITY);
    poisoned_v[poisoned * dims.head_dim + 1] = NAN;
    kvhead::attention_options options;
    options.additive_mask = mask.data();
    for (const int threads : {1, 2}) {
      tbb::task_arena arena(threads);
      arena.execute([&] {
        kvhead::scaled_dot_product_attention(dims, view::bhsd(q.data(), 1, 1, dims.head_dim),
                                             view::bhsd(k.data(), 1, dims.kv_len, dims.head_dim),
                                             view::bhsd(poisoned_v.data(), 1, dims.kv_len, dims.head_dim),
                                             head_tensor<float>::bhsd(out.data(), 1, 1, dims.head_dim), options);
      });
      CHECK(std::isnan(out[1]));  // the poisoned column, whatever chunk holds it
      CHECK(std::isfinite(out[0]));
    }
  }
}

TEST_CASE("attention: zero outputs keep their sign for any thread count (a split key range merges exactly)") {
  // V of -0 and the smallest negative subnormal: outputs of -0 and +0 whose
  // sign an extra merge into the empty partial (0 * 0 + -0) used to flip.
  const attention_dims dims{1, 1, 1, 4, 3000, 2};
  using view = head_tensor<const float>;
  for (unsigned seed = 0; seed < 50; ++seed) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(dims.q_len * dims.head_dim), k(dims.kv_len * dims.head_dim), v(k.size());
    for (float& x : q) x = normal(generator);
    for (float& x : k) x = normal(generator);
    for (float& x : v) x = generator() % 2 != 0 ? -std::numeric_limits<float>::denorm_min() : -0.0f;
    std::vector<float> outputs[2];
    for (const int threads : {1, 2}) {
      std::vector<float>& out = outputs[threads - 1];
      out.assign(q.size(), 42.0f);
      tbb::task_arena arena(threads);
      arena.execute([&] {
        kvhead::scaled_dot_product_attention(dims, view::bhsd(q.data(), 1, dims.q_len, dims.head_dim),
                                             view::bhsd(k.data(), 1, dims.kv_len, dims.head_dim),
                                             view::bhsd(v.data(), 1, dims.kv_len, dims.head_dim),
                                             head_tensor<float>::bhsd(out.data(), 1, dims.q_len, dims.head_dim));
      });
    }
    CAPTURE(seed);
    CHECK(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("attention: NaN in a key reaches only the queries that see it") {
  std::mt19937 generator(9);
  sdpa_setup setup;
  setup.dims = {1, 2, 1, 300, 300, 16};
  setup.causal = true;
  sdpa_data data = make_data(setup, generator);
  const std::size_t poisoned = 270;  // in the second KV chunk, on the diagonal tile
  for (std::size_t e = 0; e < 16; ++e) {
    data.k[poisoned * 16 + e] = NAN;
    data.v[poisoned * 16 + e] = NAN;
  }
  std::vector<float> out;
  const auto problem = make_problem(setup, data, out, kvhead::active_simd_path());
  kvhead::engine::flash_attention(problem);
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 300; ++i) {
      const float x = out[(h * 300 + i) * 16];
      INFO("head " << h << " query " << i);
      CHECK(std::isnan(x) == (i >= poisoned));
    }
}

TEST_CASE("attention rejects bad arguments with a message naming them") {
  std::vector<float> q(64), out(64);
  auto view = [](std::vector<float>& x) { return head_tensor<float>::bhsd(x.data(), 2, 2, 4); };
  auto cview = [](const std::vector<float>& x) { return head_tensor<const float>::bhsd(x.data(), 2, 2, 4); };
  CHECK_THROWS_WITH_AS(
      kvhead::scaled_dot_product_attention({1, 3, 2, 2, 2, 4}, cview(q), cview(q), cview(q), view(out)),
      doctest::Contains("not a multiple of num_kv_heads"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      kvhead::scaled_dot_product_attention({1, 2, 2, 2, 2, 0}, cview(q), cview(q), cview(q), view(out)),
      doctest::Contains("head_dim"), std::invalid_argument);
  kvhead::attention_options causal;
  causal.causal = true;
  CHECK_THROWS_WITH_AS(
      kvhead::scaled_dot_product_attention({1, 2, 2, 3, 2, 4}, cview(q), cview(q), cview(q), view(out), causal),
      doctest::Contains("q_offset"), std::invalid_argument);
  const std::size_t too_long[] = {3};
  kvhead::attention_options padded;
  padded.valid_len = too_long;
  CHECK_THROWS_WITH_AS(
      kvhead::scaled_dot_product_attention({1, 2, 2, 2, 2, 4}, cview(q), cview(q), cview(q), view(out), padded),
      doctest::Contains("valid_len[0]"), std::invalid_argument);
  const head_tensor<const float> overlapping{q.data(), 0, 4, 2};  // rows 2 floats apart, head_dim 4
  CHECK_THROWS_WITH_AS(
      kvhead::scaled_dot_product_attention({1, 2, 2, 2, 2, 4}, cview(q), overlapping, cview(q), view(out)),
      doctest::Contains("k rows overlap (seq_stride 2 < head_dim 4)"), std::invalid_argument);
}

TEST_CASE(
    "attention determinism: one query alone is bit-identical to the same query inside a prefill, with and "
    "without soft-capping and sinks") {
  for (simd_path path : kvhead::supported_simd_paths())
    for (const bool variants : {false, true}) {
      std::mt19937 generator(21);
      sdpa_setup setup;
      setup.dims = {1, 8, 2, 600, 600, 24};
      setup.causal = true;
      setup.logit_softcap = variants ? 8.0f : 0.0f;
      setup.sinks = variants;
      setup.q_gain = variants ? 10.0f : 1.0f;
      check_decode_steps_match_prefill(setup, path, generator, {0, 1, 130, 255, 256, 257, 511, 599}, {1, 2});
    }
}

TEST_CASE("attention: a query whose own values are NaN gives NaN, not zeros") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> q = {1.0f, 0.0f, nan, nan}, k = {1.0f, 0.0f, 0.0f, 1.0f}, v = {1.0f, 2.0f, 3.0f, 4.0f};
  for (bool causal : {false, true}) {
    std::vector<float> out(4, 7.0f);
    kvhead::attention_options options;
    options.causal = causal;
    using view = head_tensor<const float>;
    kvhead::scaled_dot_product_attention({1, 1, 1, 2, 2, 2}, view::bhsd(q.data(), 1, 2, 2),
                                         view::bhsd(k.data(), 1, 2, 2), view::bhsd(v.data(), 1, 2, 2),
                                         head_tensor<float>::bhsd(out.data(), 1, 2, 2), options);
    CHECK(std::isfinite(out[0]));
    CHECK(std::isnan(out[2]));
    CHECK(std::isnan(out[3]));
  }
}

TEST_CASE(
    "attention determinism: 1, 2, 3 and 8 threads give the same bits (prefill and split decode), with and "
    "without soft-capping and sinks") {
  for (const attention_dims dims : {attention_dims{2, 8, 2, 300, 300, 32}, attention_dims{1, 8, 2, 1, 3000, 32}})
    for (const bool variants : {false, true}) {
      std::mt19937 generator(31);
      sdpa_setup setup;
      setup.dims = dims;
      setup.causal = true;
      setup.logit_softcap = variants ? 8.0f : 0.0f;
      setup.sinks = variants;
      setup.q_gain = variants ? 10.0f : 1.0f;
      const sdpa_data data = make_data(setup, generator);
      std::vector<float> reference;
      for (int threads : {1, 2, 3, 8}) {
        std::vector<float> out;
        const auto problem = make_problem(setup, data, out, kvhead::active_simd_path());
        tbb::task_arena arena(threads);
        arena.execute([&] { kvhead::engine::flash_attention(problem); });
        if (reference.empty()) reference = out;
        INFO("q_len " << dims.q_len << " threads " << threads << " variants " << variants);
        CHECK(std::memcmp(out.data(), reference.data(), out.size() * sizeof(float)) == 0);
      }
    }
}

TEST_CASE("attention: the fastest reduction order stays within rounding of the fixed one, at any thread count") {
  std::mt19937 generator(41);
  sdpa_setup setup;
  setup.dims = attention_dims{1, 8, 1, 1, 3000, 32};  // one MQA decode step: its key range is split
  setup.causal = true;
  const sdpa_data data = make_data(setup, generator);
  std::vector<float> fixed;
  kvhead::engine::flash_attention(make_problem(setup, data, fixed, kvhead::active_simd_path()));
  kvhead::set_reduction_order(kvhead::reduction_order::fastest);
  for (int threads : {1, 2, 3, 8}) {
    std::vector<float> fastest;
    const auto problem = make_problem(setup, data, fastest, kvhead::active_simd_path());
    tbb::task_arena arena(threads);
    arena.execute([&] { kvhead::engine::flash_attention(problem); });
    for (std::size_t i = 0; i < fixed.size(); ++i)
      CHECK(std::fabs(fastest[i] - fixed[i]) <= 1e-5f * (1.0f + std::fabs(fixed[i])));
  }
  kvhead::set_reduction_order(kvhead::reduction_order::fixed);
  CHECK(kvhead::current_reduction_order() == kvhead::reduction_order::fixed);
  // An integer cast to the enum is refused, the order left as it was (it
  // acted as fastest, silently giving up bit-identity across thread counts).
  CHECK_THROWS_WITH_AS(kvhead::set_reduction_order(static_cast<kvhead::reduction_order>(7)),
                       doctest::Contains("unknown reduction order 7"), std::invalid_argument);
  CHECK(kvhead::current_reduction_order() == kvhead::reduction_order::fixed);
}

TEST_CASE("attention: the fastest reduction order with a sliding window, a split tile's rows seeing different chunks") {
  // One tile of 100 positions over 4200 keys (causal): the window hides
  // chunk 0 from the last rows but not from the first, and at 2 threads the
  // first task's range is chunks 0 and 1 (8 pieces of 17 chunks), which
  // those rows see from chunk 1 on.
  for (const std::size_t window : {3850, 3900, 3940}) {
    std::mt19937 generator(static_cast<unsigned>(window));
    sdpa_setup setup;
    setup.dims = attention_dims{1, 1, 1, 100, 4200, 32};
    setup.causal = true;
    setup.window = window;
    const sdpa_data data = make_data(setup, generator);
    std::vector<float> fixed;
    kvhead::engine::flash_attention(make_problem(setup, data, fixed, kvhead::active_simd_path()));
    kvhead::set_reduction_order(kvhead::reduction_order::fastest);
    for (int threads : {2, 3}) {
      std::vector<float> fastest;
      const auto problem = make_problem(setup, data, fastest, kvhead::active_simd_path());
      tbb::task_arena arena(threads);
      arena.execute([&] { kvhead::engine::flash_attention(problem); });
      std::size_t beyond_rounding = 0;
      for (std::size_t i = 0; i < fixed.size(); ++i)
        beyond_rounding += std::fabs(fastest[i] - fixed[i]) > 1e-5f * (1.0f + std::fabs(fixed[i]));
      INFO("window " << window << " threads " << threads);
      CHECK(beyond_rounding == 0);
    }
    kvhead::set_reduction_order(kvhead::reduction_order::fixed);
  }
}

TEST_CASE("attention: V read in place or packed, and K and V from a cache's blocks, give the same bits") {
  // One sequence's q, k and v side by side, rows of (H + 2G) d floats (the
  // layer's fused projection). A 300-query prefill has several query tiles
  // per kv head (V packed once and shared); a single query has one (V read in
  // place); the cache holds K and V packed in its blocks.
  constexpr std::size_t heads = 4, kv_heads = 2, seq = 300;
  const float sinks[heads] = {0.5f, -1.0f, 3.0f, 0.0f};
  kvhead::engine::score_variants variants{};
  SUBCASE("plain") {}
  SUBCASE("with soft-capping and sinks") { variants = {2.0f, sinks}; }
  for (simd_path path : kvhead::supported_simd_paths())
    for (std::size_t head_dim : {7, 20, 33, 64}) {
      std::mt19937 generator(static_cast<unsigned>(head_dim));
      const std::size_t width = (heads + 2 * kv_heads) * head_dim;
      std::vector<float> qkv(seq * width);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& x : qkv) x = normal(generator);
      auto view = [&](std::size_t first_head, std::size_t position) {
        return head_tensor<const float>{qkv.data() + position * width + first_head * head_dim, 0, head_dim, width};
      };
      const float scale = float(1.0 / std::sqrt(double(head_dim)));
      std::vector<float> full(seq * heads * head_dim);
      kvhead::engine::flash_attention({{1, heads, kv_heads, seq, seq, head_dim},
                                       view(0, 0),
                                       view(heads, 0),
                                       view(heads + kv_heads, 0),
                                       head_tensor<float>::bshd(full.data(), heads, seq, head_dim),
                                       scale,
                                       true,
                                       0,
                                       nullptr,
                                       nullptr,
                                       path,
                                       0,
                                       variants});
      const std::size_t row_floats = heads * head_dim;
      for (std::size_t position : {0, 59, 60, 255, 256, 299}) {
        std::vector<float> alone(row_floats);
        kvhead::engine::flash_attention({{1, heads, kv_heads, 1, position + 1, head_dim},
                                         view(0, position),
                                         view(heads, 0),
                                         view(heads + kv_heads, 0),
                                         head_tensor<float>::bshd(alone.data(), heads, 1, head_dim),
                                         scale,
                                         true,
                                         position,
                                         nullptr,
                                         nullptr,
                                         path,
                                         0,
                                         variants});
        INFO("path " << std::string(kvhead::to_string(path)) << " d " << head_dim << " position " << position);
        CHECK(std::memcmp(alone.data(), full.data() + position * row_floats, row_floats * sizeof(float)) == 0);
      }
      for (std::size_t block_size : {32, 256}) {
        kvhead::kv_cache cache({1, kv_heads, head_dim, block_size, 16u << 20});
        const kvhead::sequence_id id = cache.create();
        cache.append(id, seq);
        std::size_t count = 0;
        const std::vector<kvhead::engine::cached_rows> rows = {
            {kvhead::engine::kv_cache_internals::block_table(cache, id, &count), seq, 0, 0}};
        kvhead::engine::write_cached_kv(cache, 0, rows, qkv.data() + heads * head_dim,
                                        qkv.data() + (heads + kv_heads) * head_dim, width, path);
        std::vector<float> cached(full.size());
        kvhead::engine::cached_attention(cache, 0, rows, heads, qkv.data(), width, cached.data(), scale, 0, path,
                                         variants);
        INFO("path " << std::string(kvhead::to_string(path)) << " d " << head_dim << " block " << block_size);
        CHECK(std::memcmp(cached.data(), full.data(), full.size() * sizeof(float)) == 0);
      }
    }
}
