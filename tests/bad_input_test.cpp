// Bad input at every public entry point, as one table per kind of state: each
// row is a call with one thing wrong, the exception it must throw, words its
// message must contain (naming the problem), and the state is checked
// unchanged afterwards (the output buffer's bits, the cache's counters and
// lengths, the file and the open descriptors). NaN and Inf are not errors:
// their rows check that the call returns and what propagates.
//
// The command line's own rows (input rank, dtype, d_model against the
// weights, H not a multiple of G, zero or negative counts) are the cli.*
// tests of cli_test.cpp, which run the kvhead binary.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/layer_loader.hpp"
#include "engine/io/npy.hpp"
#include "engine/io/safetensors.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/io_test_files.hpp"
#include "tests/random_values.hpp"

namespace {

using kvhead::head_tensor;
using kvhead::kv_cache_error;
using kvhead::io::file_error;
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();

enum class error_kind { invalid_argument, cache_error, file_error };

const char* kind_name(error_kind kind) {
  switch (kind) {
    case error_kind::invalid_argument:
      return "std::invalid_argument";
    case error_kind::cache_error:
      return "kvhead::kv_cache_error";
    case error_kind::file_error:
      return "kvhead::io::file_error";
  }
  return "?";
}

bool is_kind(const std::exception& error, error_kind kind) {
  switch (kind) {
    case error_kind::invalid_argument:
      return dynamic_cast<const std::invalid_argument*>(&error) != nullptr;
    case error_kind::cache_error:
      return dynamic_cast<const kv_cache_error*>(&error) != nullptr;
    case error_kind::file_error:
      return dynamic_cast<const file_error*>(&error) != nullptr;
  }
  return false;
}

struct bad_input {
  const char* input;            // what is wrong
  std::function<void()> call;   // the call with that input
  error_kind kind;              // what it must throw
  std::vector<std::string> says;  // words the message must contain
};

/// Runs every row; `state` describes what must not change (compared as text).
void check_table(const std::vector<bad_input>& rows, const std::function<std::string()>& state) {
  for (const bad_input& row : rows) {
    const std::string input = row.input;
    INFO("input: ", input);
    const std::string before = state();
    bool threw = false;
    try {
      row.call();
    } catch (const std::exception& error) {
      threw = true;
      const std::string message = error.what();
      INFO("message: ", message);
      CHECK_MESSAGE(is_kind(error, row.kind), "expected ", std::string(kind_name(row.kind)));
      CHECK(message.find('\n') == std::string::npos);
      for (const std::string& word : row.says)
        CHECK_MESSAGE(message.find(word) != std::string::npos, "missing '", word, "'");
    }
    CHECK_MESSAGE(threw, "no exception");
    const bool unchanged = state() == before;
    CHECK_MESSAGE(unchanged, "the state changed");
  }
}

std::string bits_text(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// ---------------------------------------------------------------- attention

// Small shapes: H = 4 query heads over G = 2 kv heads of head_dim 8.
struct sdpa_inputs {
  static constexpr std::size_t batch = 2, heads = 4, kv_heads = 2, q_len = 3, kv_len = 5, head_dim = 8;
  std::vector<float> q, k, v, out;
  kvhead::attention_dims dims{batch, heads, kv_heads, q_len, kv_len, head_dim};

  sdpa_inputs() {
    std::mt19937 generator(3);
    q = kvhead::testing::random_values(batch * heads * q_len * head_dim, generator, 1.0f);
    k = kvhead::testing::random_values(batch * kv_heads * kv_len * head_dim, generator, 1.0f);
    v = kvhead::testing::random_values(batch * kv_heads * kv_len * head_dim, generator, 1.0f);
    out.assign(q.size(), 1234.5f);
  }
  head_tensor<const float> qv() const { return head_tensor<const float>::bhsd(q.data(), heads, q_len, head_dim); }
  head_tensor<const float> kview() const {
    return head_tensor<const float>::bhsd(k.data(), kv_heads, kv_len, head_dim);
  }
  head_tensor<const float> vview() const {
    return head_tensor<const float>::bhsd(v.data(), kv_heads, kv_len, head_dim);
  }
  head_tensor<float> outv() { return head_tensor<float>::bhsd(out.data(), heads, q_len, head_dim); }
};

}  // namespace

TEST_CASE("bad input: scaled_dot_product_attention") {
  sdpa_inputs in;
  using dims_t = kvhead::attention_dims;
  auto call = [&](dims_t dims, head_tensor<const float> q, head_tensor<float> out,
                  kvhead::attention_options options = {}) {
    return [&in, dims, q, out, options] {
      kvhead::scaled_dot_product_attention(dims, q, in.kview(), in.vview(), out, options);
    };
  };
  auto with = [&](auto change) {
    dims_t dims = in.dims;
    change(dims);
    return dims;
  };
  auto strided_q = [&](std::size_t seq_stride) {
    head_tensor<const float> q = in.qv();
    q.seq_stride = seq_stride;
    return q;
  };
  auto out_with = [&](std::size_t batch_stride, std::size_t head_stride, std::size_t seq_stride) {
    return head_tensor<float>{in.out.data(), batch_stride, head_stride, seq_stride};
  };
  kvhead::attention_options near_max_offset;
  near_max_offset.causal = true;
  near_max_offset.q_offset = size_max - 1;
  kvhead::attention_options bad_scale;
  bad_scale.scale = std::numeric_limits<float>::infinity();
  const std::size_t too_long[] = {5, 6};
  kvhead::attention_options bad_valid_len;
  bad_valid_len.valid_len = too_long;
  kvhead::attention_options causal_no_offset;
  causal_no_offset.causal = true;
  const std::size_t d = sdpa_inputs::head_dim;
  check_table(
      {
          {"num_heads 0", call(with([](dims_t& x) { x.num_heads = 0; }), in.qv(), in.outv()),
           error_kind::invalid_argument, {"num_heads must be positive"}},
          {"num_kv_heads 0", call(with([](dims_t& x) { x.num_kv_heads = 0; }), in.qv(), in.outv()),
           error_kind::invalid_argument, {"num_kv_heads must be positive"}},
          {"head_dim 0", call(with([](dims_t& x) { x.head_dim = 0; }), in.qv(), in.outv()),
           error_kind::invalid_argument, {"head_dim must be positive"}},
          {"heads not divisible (4 over 3)", call(with([](dims_t& x) { x.num_kv_heads = 3; }), in.qv(), in.outv()),
           error_kind::invalid_argument, {"num_heads (4) is not a multiple of num_kv_heads (3)"}},
          {"q_offset near SIZE_MAX", call(in.dims, in.qv(), in.outv(), near_max_offset),
           error_kind::invalid_argument, {"q_offset 18446744073709551614 + q_len 3 overflows"}},
          {"causal, q_len > kv_len, no q_offset",
           call(with([](dims_t& x) { x.kv_len = 2; }), in.qv(), in.outv(), causal_no_offset),
           error_kind::invalid_argument, {"needs an explicit q_offset"}},
          {"q seq_stride < head_dim", call(in.dims, strided_q(d - 1), in.outv()), error_kind::invalid_argument,
           {"q rows overlap", "seq_stride 7 < head_dim 8"}},
          {"q seq_stride 0", call(in.dims, strided_q(0), in.outv()), error_kind::invalid_argument,
           {"q rows overlap", "seq_stride 0"}},
          {"out seq_stride < head_dim", call(in.dims, in.qv(), out_with(4 * 3 * d, 3 * d, d / 2)),
           error_kind::invalid_argument, {"out rows overlap"}},
          {"out heads overlap (head_stride 0)", call(in.dims, in.qv(), out_with(4 * 3 * d, 0, d)),
           error_kind::invalid_argument, {"out rows overlap one another", "head_stride 0"}},
          {"out batches overlap", call(in.dims, in.qv(), out_with(d, 3 * d, d)), error_kind::invalid_argument,
           {"out rows overlap one another"}},
          {"strides address beyond size_t", call(in.dims, head_tensor<const float>{in.q.data(), size_max / 2, 3 * d, d},
                                                 in.outv()),
           error_kind::invalid_argument, {"q strides address beyond the end of memory"}},
          {"batch x heads x seq overflowing size_t",
           call(with([](dims_t& x) { x.batch = size_max / 2; }), in.qv(), in.outv()), error_kind::invalid_argument,
           {"strides address beyond the end of memory"}},
          {"valid_len beyond kv_len", call(in.dims, in.qv(), in.outv(), bad_valid_len), error_kind::invalid_argument,
           {"valid_len[1] (6) exceeds kv_len (5)"}},
          {"scale infinite", call(in.dims, in.qv(), in.outv(), bad_scale), error_kind::invalid_argument,
           {"scale must be finite"}},
          {"q null", call(in.dims, head_tensor<const float>{}, in.outv()), error_kind::invalid_argument,
           {"q or out is null"}},
      },
      [&] { return bits_text(in.out); });
}

TEST_CASE("bad input: NaN and Inf in attention inputs propagate, never crash") {
  sdpa_inputs in;
  const std::size_t d = sdpa_inputs::head_dim;
  // q row (batch 0, head 0, position 0) NaN: only that output row is NaN.
  in.q[0] = std::numeric_limits<float>::quiet_NaN();
  // v row (batch 1, kv head 0, key 0) +Inf: every query of batch 1's heads 0
  // and 1 sees it (not causal) and gets Inf or NaN; kv head 1 stays finite.
  in.v[sdpa_inputs::kv_heads * sdpa_inputs::kv_len * d] = std::numeric_limits<float>::infinity();
  kvhead::scaled_dot_product_attention(in.dims, in.qv(), in.kview(), in.vview(), in.outv());
  auto row_finite = [&](std::size_t b, std::size_t h, std::size_t s) {
    const float* row = in.out.data() + ((b * sdpa_inputs::heads + h) * sdpa_inputs::q_len + s) * d;
    return std::all_of(row, row + d, [](float x) { return std::isfinite(x); });
  };
  CHECK_FALSE(row_finite(0, 0, 0));
  CHECK(row_finite(0, 0, 1));
  CHECK(row_finite(0, 3, 2));
  CHECK_FALSE(row_finite(1, 0, 0));
  CHECK(row_finite(1, 2, 0));  // kv head 1: never sees the Inf

  // The layer: an Inf and a NaN token of x reach the outputs that attend to them.
  const std::size_t d_model = 16, heads = 2, head_dim = 4, seq = 6;
  std::mt19937 generator(4);
  const auto w = kvhead::testing::random_values(heads * head_dim * d_model, generator, 0.3f);
  const kvhead::attention_layer layer({heads, heads, head_dim, d_model, std::nullopt, true, 0.0},
                                      {{w.data()}, {w.data()}, {w.data()}, {w.data()}});
  auto x = kvhead::testing::random_values(seq * d_model, generator, 1.0f);
  x[3 * d_model] = std::numeric_limits<float>::infinity();
  x[4 * d_model + 1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(x.size());
  layer.forward(x.data(), 1, seq, y.data());
  for (std::size_t token = 0; token < 3; ++token)
    CHECK(std::all_of(&y[token * d_model], &y[(token + 1) * d_model], [](float v) { return std::isfinite(v); }));
  CHECK_FALSE(std::all_of(&y[3 * d_model], &y[4 * d_model], [](float v) { return std::isfinite(v); }));
}

TEST_CASE("bad input: attention_layer construction and forward") {
  std::mt19937 generator(6);
  const std::size_t d_model = 16, heads = 4, kv_heads = 2, head_dim = 4;
  const auto wq = kvhead::testing::random_values(heads * head_dim * d_model, generator, 0.3f);
  const auto wkv = kvhead::testing::random_values(kv_heads * head_dim * d_model, generator, 0.3f);
  const auto wo = kvhead::testing::random_values(d_model * heads * head_dim, generator, 0.3f);
  const kvhead::attention_weights weights{{wq.data()}, {wkv.data()}, {wkv.data()}, {wo.data()}};
  const kvhead::attention_config good{heads, kv_heads, head_dim, d_model, std::nullopt, true, 10000.0};
  auto construct = [&](auto change) {
    kvhead::attention_config config = good;
    change(config);
    return [config, &weights] { const kvhead::attention_layer layer(config, weights); };
  };
  using config_t = kvhead::attention_config;
  const kvhead::attention_layer layer(good, weights);
  const std::vector<float> x(3 * 5 * d_model, 0.5f);
  std::vector<float> y(x.size(), 7.0f);
  check_table(
      {
          {"num_heads 0",
           construct([](config_t& c) { c.num_heads = 0; }),
           error_kind::invalid_argument,
           {"attention_layer", "num_heads must be positive"}},
          {"head_dim 0",
           construct([](config_t& c) { c.head_dim = 0; }),
           error_kind::invalid_argument,
           {"head_dim must be positive"}},
          {"d_model 0",
           construct([](config_t& c) { c.d_model = 0; }),
           error_kind::invalid_argument,
           {"d_model must be positive"}},
          {"heads not divisible (4 over 3)",
           construct([](config_t& c) { c.num_kv_heads = 3; }),
           error_kind::invalid_argument,
           {"num_heads (4) is not a multiple of num_kv_heads (3)"}},
          {"negative num_heads (wrapped to SIZE_MAX)",
           construct([](config_t& c) {
             c.num_heads = size_max;
             c.num_kv_heads = 1;
           }),
           error_kind::invalid_argument,
           {"sizes overflow std::size_t"}},
          {"head_dim x d_model overflowing size_t",
           construct([](config_t& c) { c.head_dim = std::size_t(1) << 40, c.d_model = std::size_t(1) << 30; }),
           error_kind::invalid_argument,
           {"sizes overflow std::size_t"}},
          {"odd head_dim with RoPE",
           construct([](config_t& c) { c.head_dim = 3; }),
           error_kind::invalid_argument,
           {"RoPE needs an even head_dim, got 3"}},
          {"rope_theta negative",
           construct([](config_t& c) { c.rope_theta = -1.0; }),
           error_kind::invalid_argument,
           {"rope_theta"}},
          {"yarn at rope_theta 1 (NaN frequencies)",
           construct([](config_t& c) {
             c.rope_theta = 1.0;
             c.rope_scaling.type = kvhead::rope_scaling::kind::yarn;
             c.rope_scaling.factor = 4.0;
             c.rope_scaling.original_max_position_embeddings = 256.0;
           }),
           error_kind::invalid_argument,
           {"yarn rope_scaling needs rope_theta other than 1"}},
          {"weights' bytes overflowing size_t (their floats fit)",
           construct([](config_t& c) {
             c.num_heads = c.num_kv_heads = 1;
             c.head_dim = std::size_t(1) << 62;
             c.d_model = 1;
           }),
           error_kind::invalid_argument,
           {"sizes overflow std::size_t"}},
          {"null weight",
           [&] {
             const kvhead::attention_layer l(good, {{wq.data()}, {nullptr}, {wkv.data()}, {wo.data()}});
           },
           error_kind::invalid_argument,
           {"k_proj weight is null"}},
          {"batch x seq x d_model overflowing size_t",
           [&] { layer.forward(x.data(), size_max / 4, 3, y.data()); },
           error_kind::invalid_argument,
           {"batch 4611686018427387903 x seq 3", "overflows std::size_t"}},
          {"batch x seq overflowing size_t",
           [&] { layer.forward(x.data(), size_max / 2, 5, y.data()); },
           error_kind::invalid_argument,
           {"overflows std::size_t"}},
          // 2^58 rows of 32 floats: the floats fit a size_t, their bytes do not.
          {"batch x seq x row width in bytes overflowing size_t",
           [&] { layer.forward(x.data(), std::size_t(1) << 29, std::size_t(1) << 29, y.data()); },
           error_kind::invalid_argument,
           {"batch 536870912 x seq 536870912 x row width 32", "overflows std::size_t"}},
          {"x null", [&] { layer.forward(nullptr, 3, 5, y.data()); }, error_kind::invalid_argument, {"x or y is null"}},
      },
      [&] { return bits_text(y); });
  // A moved-from layer refuses every use by name (it crashed).
  kvhead::attention_layer moved(good, weights);
  const kvhead::attention_layer taken(std::move(moved));
  CHECK_THROWS_WITH_AS(moved.config(), doctest::Contains("attention_layer::config: the layer was moved from"),
                       std::logic_error);
  CHECK_THROWS_WITH_AS(moved.forward(x.data(), 3, 5, y.data()), doctest::Contains("was moved from"), std::logic_error);
  CHECK_THROWS_WITH_AS(moved.forward(x.data(), 3, 5, false, y.data()), doctest::Contains("was moved from"),
                       std::logic_error);
  kvhead::kv_cache cache({1, kv_heads, head_dim, 16, std::size_t(1) << 20});
  const kvhead::sequence_id id = cache.create();
  cache.append(id, 1);
  CHECK_THROWS_WITH_AS(moved.forward(cache, 0, {{id, 1}}, x.data(), y.data()),
                       doctest::Contains("attention_layer::forward (cache): the layer was moved from"),
                       std::logic_error);
  moved = kvhead::attention_layer(good, weights);  // assigned to: usable again
  CHECK(moved.config().num_heads == heads);
  CHECK(taken.config().num_heads == heads);
  // rope_scaling is ignored without RoPE, so not checked either.
  kvhead::attention_config no_rope = good;
  no_rope.rope_theta = 0.0;
  no_rope.rope_scaling.type = kvhead::rope_scaling::kind::yarn;  // original length 0: invalid with RoPE
  CHECK_NOTHROW(kvhead::attention_layer(no_rope, weights));
  // Every refusal above left the layer and this thread's scratch working.
  layer.forward(x.data(), 3, 5, y.data());
  CHECK(std::all_of(y.begin(), y.end(), [](float value) { return std::isfinite(value) && value != 7.0f; }));
}

// -------------------------------------------------------------------- cache

TEST_CASE("bad input: kv_cache and the layer over a cache") {
  const std::size_t d_model = 16, heads = 4, kv_heads = 2, head_dim = 8, block = 32;
  std::mt19937 generator(9);
  const auto wq = kvhead::testing::random_values(heads * head_dim * d_model, generator, 0.3f);
  const auto wkv = kvhead::testing::random_values(kv_heads * head_dim * d_model, generator, 0.3f);
  const auto wo = kvhead::testing::random_values(d_model * heads * head_dim, generator, 0.3f);
  const kvhead::attention_layer layer({heads, kv_heads, head_dim, d_model, std::nullopt, true, 0.0},
                                      {{wq.data()}, {wkv.data()}, {wkv.data()}, {wo.data()}});
  kvhead::kv_cache_config config{2, kv_heads, head_dim, block, 0};
  {
    const kvhead::kv_cache probe({2, kv_heads, head_dim, block, 1 << 20});
    config.capacity_bytes = 4 * probe.block_bytes();  // 4 blocks, 128 tokens
  }
  kvhead::kv_cache cache(config);
  const kvhead::sequence_id a = cache.create(), b = cache.create(), freed = cache.create();
  cache.append(a, 40);
  cache.append(b, 10);
  cache.free(freed);
  const std::vector<float> x(64 * d_model, 0.25f);
  std::vector<float> y(x.size(), 3.0f);
  auto forward = [&](std::size_t layer_index, std::vector<kvhead::sequence_tokens> batch) {
    return [&, layer_index, batch] { layer.forward(cache, layer_index, batch, x.data(), y.data()); };
  };
  auto cache_config = [&](auto change) {
    kvhead::kv_cache_config bad = config;
    change(bad);
    return [bad] { const kvhead::kv_cache c(bad); };
  };
  using cfg = kvhead::kv_cache_config;
  const std::string freed_text = "sequence " + std::to_string(freed);
  check_table(
      {
          {"append to an unknown id", [&] { cache.append(999, 1); }, error_kind::cache_error,
           {"append", "sequence 999"}},
          {"append to a freed id", [&] { cache.append(freed, 1); }, error_kind::cache_error,
           {"append", freed_text}},
          {"fork of a freed sequence", [&] { cache.fork(freed); }, error_kind::cache_error, {"fork", freed_text}},
          {"free twice", [&] { cache.free(freed); }, error_kind::cache_error, {"free", freed_text}},
          {"length of an unknown id", [&] { (void)cache.length(12345); }, error_kind::cache_error,
           {"sequence 12345"}},
          {"truncate beyond the length", [&] { cache.truncate(b, 11); }, error_kind::cache_error,
           {"truncate", "length 11 exceeds sequence"}},
          {"append 0 tokens", [&] { cache.append(a, 0); }, error_kind::cache_error, {"0 tokens"}},
          {"cache exhausted mid-batch (a fits, b does not)", [&] { cache.append(b, 100); }, error_kind::cache_error,
           {"out of capacity", "sequence " + std::to_string(b)}},
          {"append overflowing the length", [&] { cache.append(a, size_max); }, error_kind::cache_error,
           {"append"}},
          {"forward: unknown sequence", forward(0, {{999, 1}}), error_kind::cache_error, {"sequence 999"}},
          {"forward: freed sequence", forward(0, {{freed, 1}}), error_kind::cache_error, {freed_text}},
          {"forward: more tokens than appended", forward(0, {{b, 11}}), error_kind::invalid_argument,
           {"11 new tokens, but it has 10"}},
          {"forward: 0 tokens", forward(0, {{a, 0}}), error_kind::invalid_argument, {"0 new tokens"}},
          {"forward: sequence listed twice", forward(0, {{a, 1}, {a, 1}}), error_kind::invalid_argument,
           {"listed twice"}},
          {"forward: layer out of range", forward(2, {{a, 1}}), error_kind::invalid_argument,
           {"layer 2 is out of range"}},
          {"cache num_kv_heads 0", cache_config([](cfg& c) { c.num_kv_heads = 0; }), error_kind::invalid_argument,
           {"num_kv_heads must be at least 1"}},
          {"cache head_dim 0", cache_config([](cfg& c) { c.head_dim = 0; }), error_kind::invalid_argument,
           {"head_dim must be at least 1"}},
          {"cache block_size 48", cache_config([](cfg& c) { c.block_size = 48; }), error_kind::invalid_argument,
           {"block_size"}},
          {"cache capacity below one block", cache_config([](cfg& c) { c.capacity_bytes = 1; }),
           error_kind::invalid_argument, {"capacity_bytes"}},
          {"cache geometry overflowing size_t", cache_config([](cfg& c) { c.num_layers = size_max / 2; }),
           error_kind::invalid_argument, {"too large (block_bytes overflows)"}},
      },
      [&] {
        std::string text = std::to_string(cache.length(a)) + " " + std::to_string(cache.length(b)) + " " +
                           std::to_string(cache.free_blocks()) + " " + std::to_string(cache.bytes_in_use()) + " " +
                           std::to_string(cache.blocks_used(a)) + " " + std::to_string(cache.blocks_used(b));
        return text + bits_text(y);
      });
  // A layer whose geometry differs from the cache's.
  const kvhead::attention_layer other({heads, heads, head_dim, d_model, std::nullopt, true, 0.0},
                                      {{wq.data()}, {wq.data()}, {wq.data()}, {wo.data()}});
  CHECK_THROWS_WITH_AS(other.forward(cache, 0, {{a, 1}}, x.data(), y.data()),
                       doctest::Contains("the cache holds 2 kv heads of dim 8, the layer 4 of dim 8"),
                       std::invalid_argument);
}

// -------------------------------------------------------------------- files

namespace {

std::size_t open_descriptors() {
  return std::size_t(std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                   std::filesystem::directory_iterator()));
}

}  // namespace

TEST_CASE("bad input: safetensors, .npy and the layer loader") {
  using namespace kvhead::test;
  temp_dir dir;
  const std::string path = dir.file("input");
  const std::string f32_2 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\0');
  auto safetensors = [&](std::string bytes) {
    return [&path, bytes] {
      write_file(path, bytes);
      const kvhead::io::safetensors_file file(path);
    };
  };
  auto npy = [&](std::string bytes) {
    return [&path, bytes] {
      write_file(path, bytes);
      (void)kvhead::io::read_npy(path);
    };
  };
  const std::string shape_23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  // A layer file: H = 2 heads of d 4, G = 1, d_model 8; o_proj is given a
  // wrong shape in one row.
  auto layer_file = [&](std::vector<std::size_t> o_shape, std::size_t num_heads) {
    std::vector<st_tensor> tensors = {{"q_proj.weight", "F32", {8, 8}, f32_bytes(std::vector<float>(64, 0.1f))},
                                      {"k_proj.weight", "F32", {4, 8}, f32_bytes(std::vector<float>(32, 0.1f))},
                                      {"v_proj.weight", "F32", {4, 8}, f32_bytes(std::vector<float>(32, 0.1f))}};
    std::size_t count = 1;
    for (const std::size_t extent : o_shape) count *= extent;
    tensors.push_back({"o_proj.weight", "F32", o_shape, f32_bytes(std::vector<float>(count, 0.1f))});
    const std::string bytes = safetensors_bytes(tensors);
    return [&path, bytes, num_heads] {
      write_file(path, bytes);
      const kvhead::io::safetensors_file file(path);
      kvhead::io::layer_load_options options;
      options.num_heads = num_heads;
      (void)kvhead::io::load_attention_layer(file, options);
    };
  };
  // The file and the descriptors are the state; each row writes its own file.
  const std::size_t descriptors = open_descriptors();
  check_table(
      {
          {"safetensors shorter than 8 bytes", safetensors(std::string("\x02\0\0", 3)), error_kind::file_error,
           {"3 bytes, too short"}},
          {"safetensors header length beyond the file", safetensors(little_endian(1000, 8) + "{}"),
           error_kind::file_error, {"header length 1000 goes beyond the end of the file (10 bytes)"}},
          {"safetensors bad JSON", safetensors(safetensors_bytes("{\"a\":", "")), error_kind::file_error,
           {"header is not valid JSON"}},
          {"safetensors offsets outside the data",
           safetensors(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", eight)),
           error_kind::file_error, {"data_offsets [4, 12] end beyond the data section (8 bytes)"}},
          {"safetensors overlapping tensors",
           safetensors(safetensors_bytes("{" + f32_2 + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                         eight)),
           error_kind::file_error, {"tensors 'a' [0, 8] and 'b' [4, 8] overlap"}},
          {"safetensors gap between tensors",
           safetensors(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                         R"("b":{"dtype":"F16","shape":[1],"data_offsets":[6,8]}})",
                                         eight)),
           error_kind::file_error, {"data bytes [4, 6] before tensor 'b' [6, 8] belong to no tensor"}},
          {"safetensors trailing bytes", safetensors(safetensors_bytes("{" + f32_2 + "}", eight + "!!")),
           error_kind::file_error, {"data section is 10 bytes, but the tensors end at byte 8: trailing bytes"}},
          {"safetensors wrong dtype",
           safetensors(safetensors_bytes(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", eight)),
           error_kind::file_error, {"tensor 'a' has unsupported dtype 'F64'"}},
          {"safetensors shape/byte mismatch",
           safetensors(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight)),
           error_kind::file_error, {"span 8 bytes, but shape [3] of F32 needs 12"}},
          {"safetensors negative extent",
           safetensors(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight)),
           error_kind::file_error, {"shape is not an array of non-negative integers"}},
          {"safetensors truncated data", safetensors(safetensors_bytes("{" + f32_2 + "}", "1234")),
           error_kind::file_error, {"end beyond the data section (4 bytes)"}},
          {".npy wrong dtype (<f8)",
           npy(npy_bytes(1, 0, npy_header("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }"), eight + eight)),
           error_kind::file_error, {"dtype '<f8' is not float32"}},
          {".npy wrong byte order (>f4)",
           npy(npy_bytes(1, 0, npy_header("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }"), eight)),
           error_kind::file_error, {"dtype '>f4' is not float32 ('<f4')"}},
          {".npy rank beyond 64",
           npy(npy_bytes(1, 0, npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                                          [] {
                                            std::string s;
                                            for (int i = 0; i < 65; ++i) s += "1,";
                                            return s;
                                          }() + "), }"),
                         "abcd")),
           error_kind::file_error, {"shape has more than 64 dimensions"}},
          {".npy negative extent",
           npy(npy_bytes(1, 0, npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }"), eight)),
           error_kind::file_error, {"shape is not a tuple of non-negative integers"}},
          {".npy truncated data", npy(npy_bytes(1, 0, npy_header(shape_23), std::string(20, '\0'))),
           error_kind::file_error, {"data is 20 bytes, but shape (2, 3) of float32 needs 24 (file truncated)"}},
          {".npy Fortran order",
           npy(npy_bytes(1, 0, npy_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }"), eight)),
           error_kind::file_error, {"Fortran order is not supported"}},
          {"layer: o_proj d_model mismatch", layer_file({7, 8}, 2), error_kind::file_error,
           {"'o_proj.weight' has shape [7, 8], expected [8, 8]"}},
          {"layer: heads do not divide q_proj rows", layer_file({8, 8}, 3), error_kind::file_error,
           {"'q_proj.weight' has 8 rows, not a multiple of num_heads 3"}},
      },
      [&] { return std::to_string(open_descriptors()); });
  CHECK(open_descriptors() == descriptors);
}
