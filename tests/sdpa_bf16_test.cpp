// scaled_dot_product_attention at bf16 precision (attention.hpp,
// attention_options::precision):
//   - against the double reference on the bf16-rounded q, k and v, every SIMD
//     path, over head dims 1, 7, 64, 80, lengths 1, primes and 255-257, GQA
//     ratios, causal, additive mask, valid_len and sliding windows, with the
//     bound derived from the arithmetic (tests/sdpa_cases.hpp: the f32 bound
//     plus the rounding of p);
//   - q, k and v rounded to nearest even as they enter: the bits of the
//     engine's bf16 tiles on inputs rounded beforehand (the layer's path),
//     with the scratch poisoned by NaN first; and not the bits of f32, on
//     rounded inputs (p is rounded) or raw ones;
//   - bit-identical at 1, 2 and 3 threads, and batched against each element
//     alone;
//   - the probabilities: f32's of the rounded inputs, bit for bit, and the
//     output unchanged by asking for them;
//   - a precision other than f32 or bf16 rejected, naming it; the public call
//     against f32 on a Llama-like shape (max |diff| / max |f32 out|, printed).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "engine/attention/flash_attention.hpp"
#include "engine/attention/scaled_dot_product.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "tests/reference/attention_reference.hpp"
#include "tests/reference/bf16_layer_reference.hpp"
#include "tests/sdpa_cases.hpp"

namespace {

using kvhead::attention_dims;
using kvhead::head_tensor;
using kvhead::precision;
using kvhead::simd_path;
using kvhead::testing::make_data;
using kvhead::testing::make_problem;
using kvhead::testing::sdpa_data;
using kvhead::testing::sdpa_setup;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A copy of `data` with each of q, k and v replaced by `change` of it (the
// views, which make_data starts at their vectors' data, moved to the copy's).
template <class Change>
sdpa_data changed(const sdpa_data& data, const Change& change) {
  sdpa_data copy = data;
  for (std::vector<float>* values : {&copy.q, &copy.k, &copy.v})
    for (float& x : *values) x = change(x);
  copy.q_view.data = copy.q.data();
  copy.k_view.data = copy.k.data();
  copy.v_view.data = copy.v.data();
  return copy;
}

// The data with q, k and v rounded to bf16 by the reference's rounding.
sdpa_data rounded(const sdpa_data& data) {
  return changed(data, [](float x) { return float(kvhead::reference::bf16_nearest(double(x))); });
}

// Setups over the masks, windows and layouts (attention_test's kinds).
std::vector<sdpa_setup> mixed_setups(unsigned seed, int count) {
  std::mt19937 generator(seed);
  auto pick = [&](const auto& list) { return list[generator() % list.size()]; };
  const std::vector<std::size_t> lengths = {1, 2, 31, 97, 211, 255, 256, 257, 521};
  std::vector<sdpa_setup> setups;
  for (int sample = 0; sample < count; ++sample) {
    sdpa_setup setup;
    const std::size_t kv_heads = pick(std::vector<std::size_t>{1, 2, 3});
    const std::size_t ratio = pick(std::vector<std::size_t>{1, 2, 4, 0});  // 0: MQA (G = 1, R = H)
    setup.dims.num_kv_heads = ratio == 0 ? 1 : kv_heads;
    setup.dims.num_heads = ratio == 0 ? pick(std::vector<std::size_t>{3, 8}) : kv_heads * ratio;
    setup.dims.batch = 1 + generator() % 3;
    setup.dims.head_dim = pick(std::vector<std::size_t>{1, 7, 64, 80});
    setup.dims.kv_len = pick(lengths);
    const int kind = sample % 3;  // 0: decode, 1: prefill, 2: a chunk of queries
    setup.dims.q_len = kind == 0 ? 1 : kind == 1 ? setup.dims.kv_len : pick(lengths);
    // Keep the double reference fast: at most ~8M multiply-adds per case.
    while (setup.dims.batch * setup.dims.num_heads * setup.dims.q_len * setup.dims.kv_len * setup.dims.head_dim >
           8'000'000)
      setup.dims.q_len = std::max<std::size_t>(1, setup.dims.q_len / 2);
    setup.bshd_layout = generator() & 1;
    setup.causal = generator() % 4 != 0;
    setup.explicit_offset = kind == 2 && (generator() % 2 == 0 || setup.dims.q_len > setup.dims.kv_len);
    setup.padded = generator() % 3 == 0;
    setup.additive = generator() % 4 == 0;
    if (generator() % 3 == 0) setup.window = pick(std::vector<std::size_t>{1, 2, 255, 256, 257, 100});
    if (sample % 7 == 3) setup.logit_softcap = 20.0f;
    setup.sinks = sample % 7 == 5;
    setups.push_back(setup);
  }
  return setups;
}

std::string describe(const sdpa_setup& s) {
  return "batch " + std::to_string(s.dims.batch) + " H " + std::to_string(s.dims.num_heads) + " G " +
         std::to_string(s.dims.num_kv_heads) + " q_len " + std::to_string(s.dims.q_len) + " kv_len " +
         std::to_string(s.dims.kv_len) + " d " + std::to_string(s.dims.head_dim) + " causal " +
         std::to_string(s.causal) + " padded " + std::to_string(s.padded) + " additive " + std::to_string(s.additive) +
         " window " + std::to_string(s.window);
}

}  // namespace

TEST_CASE("bf16 SDPA matches the double reference on bf16-rounded inputs within the derived bound, every SIMD path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(4099);
    for (const sdpa_setup& setup : mixed_setups(811, 36))
      kvhead::testing::check_sdpa(setup, path, generator, precision::bf16);
  }
}

TEST_CASE(
    "bf16 SDPA rounds q, k and v to nearest even as they enter: the bits of the bf16 tiles on rounded inputs, not "
    "those of f32") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(17);
    std::size_t differs_rounded = 0, differs_raw = 0, cases = 0;
    for (const sdpa_setup& setup : mixed_setups(29, 24)) {
      const sdpa_data data = make_data(setup, generator);
      const sdpa_data pre_rounded = rounded(data);
      INFO("path " << std::string(kvhead::to_string(path)) << " " << describe(setup));
      // Poison the scratch the copies will use: a row the engine reads but
      // the call did not copy then holds NaN.
      const sdpa_data poison = changed(data, [](float) { return std::numeric_limits<float>::quiet_NaN(); });
      std::vector<float> out, expected, f32_rounded, f32_raw;
      kvhead::engine::scaled_dot_product(make_problem(setup, poison, out, path, precision::bf16));
      kvhead::engine::scaled_dot_product(make_problem(setup, data, out, path, precision::bf16));
      kvhead::engine::flash_attention(make_problem(setup, pre_rounded, expected, path, precision::bf16));
      CHECK(same_bits(out, expected));
      // Inputs said to come rounded (a layer's) are read as they are: the same bits.
      std::vector<float> as_given;
      kvhead::engine::attention_problem given = make_problem(setup, pre_rounded, as_given, path, precision::bf16);
      given.inputs_rounded = true;
      kvhead::engine::flash_attention(given);
      CHECK(same_bits(as_given, expected));
      kvhead::engine::scaled_dot_product(make_problem(setup, pre_rounded, f32_rounded, path));
      kvhead::engine::scaled_dot_product(make_problem(setup, data, f32_raw, path));
      differs_rounded += !same_bits(out, f32_rounded);
      differs_raw += !same_bits(out, f32_raw);
      ++cases;
    }
    // Some setups have one visible key per row (p = 1 exactly) or none; most not.
    INFO("path " << std::string(kvhead::to_string(path)) << ": differs from f32 on rounded inputs in "
                 << differs_rounded << " of " << cases << ", on raw inputs in " << differs_raw);
    CHECK(differs_rounded >= cases * 2 / 3);
    CHECK(differs_raw >= cases * 2 / 3);
  }
}

TEST_CASE("bf16 SDPA is bit-identical at 1, 2 and 3 threads and batched against each batch element alone") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(31);
    for (const sdpa_setup& base : mixed_setups(53, 12)) {
      sdpa_setup setup = base;
      setup.dims.batch = 3;
      setup.padded = true;  // a different valid_len per element
      const sdpa_data data = make_data(setup, generator);
      std::vector<float> reference_out;
      {
        tbb::task_arena arena(1);
        arena.execute([&] {
          kvhead::engine::scaled_dot_product(make_problem(setup, data, reference_out, path, precision::bf16));
        });
      }
      INFO("path " << std::string(kvhead::to_string(path)) << " " << describe(setup));
      for (int threads : {2, 3}) {
        std::vector<float> out;
        tbb::task_arena arena(threads);
        arena.execute(
            [&] { kvhead::engine::scaled_dot_product(make_problem(setup, data, out, path, precision::bf16)); });
        INFO("threads " << threads);
        CHECK(same_bits(out, reference_out));
      }
      const attention_dims& d = setup.dims;
      for (std::size_t b = 0; b < d.batch; ++b) {
        sdpa_setup single = setup;
        single.dims.batch = 1;
        sdpa_data one = data;
        one.q_view.data += b * data.q_view.batch_stride;
        one.k_view.data += b * data.k_view.batch_stride;
        one.v_view.data += b * data.v_view.batch_stride;
        one.valid_len = {data.valid_len[b]};
        std::vector<float> out;
        kvhead::engine::scaled_dot_product(make_problem(single, one, out, path, precision::bf16));
        // Both layouts keep a batch element's output contiguous: element b at b * (its size).
        const std::size_t size = d.num_heads * d.q_len * d.head_dim;
        INFO("batch element " << b);
        CHECK(std::memcmp(out.data(), reference_out.data() + b * size, size * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("bf16 SDPA probabilities are f32's of the rounded inputs bit for bit, the output unchanged by them") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(37);
    for (const sdpa_setup& base : mixed_setups(61, 12)) {
      sdpa_setup setup = base;
      setup.dims.q_len = std::min<std::size_t>(setup.dims.q_len, 40);  // materialized: q_len x kv_len per head
      if (setup.dims.q_len > setup.dims.kv_len) setup.explicit_offset = true;
      const sdpa_data data = make_data(setup, generator);
      const attention_dims& d = setup.dims;
      std::vector<float> probabilities(d.batch * d.num_heads * d.q_len * d.kv_len, NAN), expected(probabilities.size());
      std::vector<float> plain, with, f32_out;
      kvhead::engine::scaled_dot_product(make_problem(setup, data, plain, path, precision::bf16));
      kvhead::engine::scaled_dot_product(make_problem(setup, data, with, path, precision::bf16), probabilities.data());
      kvhead::engine::scaled_dot_product(make_problem(setup, rounded(data), f32_out, path), expected.data());
      INFO("path " << std::string(kvhead::to_string(path)) << " " << describe(setup));
      CHECK(same_bits(plain, with));
      CHECK(same_bits(probabilities, expected));
    }
  }
}

TEST_CASE("bf16 SDPA: the public option, against f32 on a Llama-like shape, and a bad precision named") {
  // 32 / 8 heads, head_dim 128, 300 tokens, causal, N(0, 1) inputs.
  std::mt19937 generator(41);
  sdpa_setup setup;
  setup.dims = {1, 32, 8, 300, 300, 128};
  setup.causal = true;
  const sdpa_data data = make_data(setup, generator);
  const attention_dims& d = setup.dims;
  std::vector<float> f32_out(d.num_heads * d.q_len * d.head_dim), bf16_out(f32_out.size());
  auto out_view = [&](std::vector<float>& out) {
    return head_tensor<float>::bhsd(out.data(), d.num_heads, d.q_len, d.head_dim);
  };
  kvhead::attention_options options;
  options.causal = true;
  kvhead::scaled_dot_product_attention(d, data.q_view, data.k_view, data.v_view, out_view(f32_out), options);
  options.precision = precision::bf16;
  kvhead::scaled_dot_product_attention(d, data.q_view, data.k_view, data.v_view, out_view(bf16_out), options);
  std::vector<float> engine_out;
  kvhead::engine::scaled_dot_product(
      make_problem(setup, data, engine_out, kvhead::active_simd_path(), precision::bf16));
  CHECK(same_bits(bf16_out, engine_out));  // the option reaches the engine
  double largest = 0.0, difference = 0.0;
  for (std::size_t i = 0; i < f32_out.size(); ++i) {
    largest = std::max(largest, std::fabs(double(f32_out[i])));
    difference = std::max(difference, std::fabs(double(bf16_out[i]) - double(f32_out[i])));
  }
  MESSAGE("bf16 SDPA on " << std::string(kvhead::to_string(kvhead::active_simd_path()))
                          << ", 32/8 heads, d 128, 300 tokens causal: max |bf16 - f32| / max |f32| = "
                          << difference / largest);
  CHECK(difference > 0.0);
  CHECK(difference / largest <= 2e-2);

  std::vector<float> untouched(f32_out.size(), 7.0f);
  options.precision = precision(7);
  CHECK_THROWS_WITH_AS(
      kvhead::scaled_dot_product_attention(d, data.q_view, data.k_view, data.v_view, out_view(untouched), options),
      doctest::Contains("scaled_dot_product_attention: precision must be f32 or bf16, got 7"), std::invalid_argument);
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](float x) { return x == 7.0f; }));
  // Rejected with empty queries too, as the other options are.
  CHECK_THROWS_AS(kvhead::scaled_dot_product_attention({1, 32, 8, 0, 300, 128}, data.q_view, data.k_view, data.v_view,
                                                       out_view(untouched), options),
                  std::invalid_argument);
}

TEST_CASE(
    "bf16 SDPA: a prefill's rows have the bits of the same rows asked one at a time (K and V staged once for many "
    "query tiles, or by each product), also with Inf and NaN in V") {
  // On amx tiles a prefill of several query tiles packs K and V in the tiles'
  // layout once (pack_tile_pairs); a single query row takes the staging
  // products. Head dims and lengths off the tiles' 32 and the 256-key chunk.
  for (simd_path path : kvhead::supported_simd_paths())
    for (const std::size_t head_dim : {std::size_t{80}, std::size_t{33}})
      for (const bool non_finite : {false, true}) {
        sdpa_setup setup;
        setup.dims = {1, 4, 2, 300, 300, head_dim};
        setup.causal = true;
        setup.window = non_finite ? 0 : 270;
        std::mt19937 generator(67 + head_dim);
        sdpa_data data = make_data(setup, generator);
        // Inf in V of kv head 1 (query heads 2 and 3), NaN in kv head 0's
        // (query heads 0 and 1) just past the keys some rows of its chunk see.
        const std::size_t inf_key = 150, nan_key = 290;
        if (non_finite) {
          data.v[(300 + inf_key) * head_dim + 5] = std::numeric_limits<float>::infinity();
          data.v[nan_key * head_dim + 5] = std::numeric_limits<float>::quiet_NaN();
        }
        std::vector<float> whole;
        kvhead::engine::flash_attention(make_problem(setup, data, whole, path, precision::bf16));
        std::size_t compared = 0, non_finite_rows = 0;
        for (std::size_t position = 0; position < setup.dims.q_len; position += 7) {
          sdpa_setup one_row = setup;
          one_row.dims.q_len = 1;
          sdpa_data row_data = data;
          row_data.q_view = head_tensor<const float>::bhsd(data.q.data() + position * head_dim, 4, 1, head_dim);
          row_data.q_view.head_stride = setup.dims.q_len * head_dim;
          row_data.q_offset = position;
          std::vector<float> out;
          kvhead::engine::flash_attention(make_problem(one_row, row_data, out, path, precision::bf16));
          for (std::size_t head = 0; head < 4; ++head) {
            const float* expected = whole.data() + (head * setup.dims.q_len + position) * head_dim;
            const float* got = out.data() + head * head_dim;
            INFO("path " << std::string(kvhead::to_string(path)) << " head_dim " << head_dim << " position " << position
                         << " head " << head);
            if (non_finite && position >= (head >= 2 ? inf_key : nan_key)) {  // not finite in place in both
              ++non_finite_rows;
              for (std::size_t i = 0; i < head_dim; ++i) CHECK(std::isfinite(got[i]) == std::isfinite(expected[i]));
              CHECK(!std::isfinite(got[5]));
            } else {
              ++compared;
              CHECK(std::memcmp(got, expected, head_dim * sizeof(float)) == 0);
            }
          }
        }
        CHECK(compared > 100);
        CHECK(non_finite_rows == (non_finite ? 2 * ((300 - 154) / 7 + 1) + 2 * ((300 - 294) / 7 + 1) : 0));
      }
}
