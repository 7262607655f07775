// The C API (include/kvhead/kvhead.h) through the shared library, as an
// embedder sees it:
//   - bad input, table-driven: each row's status, that kvh_last_error names
//     the problem, and that the cache is unchanged (lengths, free tokens, and
//     at the end that decoding continues bit-identically);
//   - decoding (one layer, several layers, forks, a cache outliving its
//     layer, per-layer threads, concurrent callers, calls in the tasks of a
//     caller's oneTBB loop) against
//     kvh_layer_forward with causal = 1, bit for bit;
//   - the last-error, id and options (ABI) rules.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "kvhead/kvhead.h"
#include "tests/io_test_files.hpp"
#include "tests/random_values.hpp"

namespace {

using kvhead::test::temp_dir;

// H = 4 query heads, G = 2 kv heads, head_dim 8, d_model 12, RoPE.
constexpr int32_t heads = 4, kv_heads = 2, head_dim = 8, d_model = 12;
constexpr float rope_theta = 10000.0f;
// Bytes of one 256-token block of one layer (kv_cache.hpp, "Block layout":
// head_dim padded to 32 floats).
constexpr std::size_t block_bytes = 2 * kv_heads * 256 * 32 * sizeof(float);

kvhead::test::st_tensor tensor(const std::string& name, std::size_t rows, std::size_t columns, std::mt19937& random) {
  std::vector<std::size_t> shape{rows};
  if (columns != 0) shape.push_back(columns);
  return {
      name, "F32", shape,
      kvhead::test::f32_bytes(kvhead::testing::random_values(rows * std::max<std::size_t>(columns, 1), random, 0.3f))};
}

/// A layer file of `kv` kv heads (other sizes as above), tensors named
/// <prefix>q_proj.weight ...
std::string layer_file(const temp_dir& dir, const std::string& name, int32_t kv, const std::string& prefix = "") {
  std::mt19937 random(42 + unsigned(kv));
  const std::size_t q_rows = heads * head_dim, kv_rows = std::size_t(kv) * head_dim;
  const std::string path = dir.file(name);
  kvhead::test::write_file(path, kvhead::test::safetensors_bytes({
                                     tensor(prefix + "q_proj.weight", q_rows, d_model, random),
                                     tensor(prefix + "q_proj.bias", q_rows, 0, random),
                                     tensor(prefix + "k_proj.weight", kv_rows, d_model, random),
                                     tensor(prefix + "v_proj.weight", kv_rows, d_model, random),
                                     tensor(prefix + "o_proj.weight", d_model, q_rows, random),
                                 }));
  return path;
}

kvh_layer_options default_options() {
  kvh_layer_options options;
  kvh_layer_options_init(&options);
  options.num_heads = heads;
  options.num_kv_heads = kv_heads;
  options.rope_theta = rope_theta;
  return options;
}

kvh_layer* open_layer(const std::string& path, const kvh_layer_options& options = default_options()) {
  kvh_layer* layer = nullptr;
  const kvh_status status = kvh_layer_open(path.c_str(), &options, &layer);
  REQUIRE_MESSAGE(status == KVH_OK, kvh_last_error());
  return layer;
}

std::vector<float> inputs(std::size_t tokens, unsigned seed) {
  std::mt19937 random(seed);
  return kvhead::testing::random_values(tokens * d_model, random, 1.0f);
}

/// kvh_layer_forward(causal = 1) of one sequence.
std::vector<float> forward(const kvh_layer* layer, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  REQUIRE(kvh_layer_forward(layer, x.data(), 1, int64_t(x.size() / d_model), 1, y.data()) == KVH_OK);
  return y;
}

/// Rows [first, first + count) of a [tokens, d_model] array.
std::vector<float> rows(const std::vector<float>& x, std::size_t first, std::size_t count) {
  return {x.begin() + std::ptrdiff_t(first * d_model), x.begin() + std::ptrdiff_t((first + count) * d_model)};
}

/// Decodes `x` into `id` token by token with kvh_decode; returns all outputs.
std::vector<float> decode_tokens(const kvh_layer* layer, kvh_cache* cache, int64_t id, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  const int64_t one = 1;
  for (std::size_t t = 0; t < x.size() / d_model; ++t)
    REQUIRE_MESSAGE(kvh_decode(layer, cache, &id, &one, 1, x.data() + t * d_model, y.data() + t * d_model) == KVH_OK,
                    kvh_last_error());
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// What a failed call must not change.
struct cache_state {
  int64_t free_tokens;
  std::vector<int64_t> lengths;
  bool operator==(const cache_state&) const = default;
};

}  // namespace

TEST_CASE("C API: bad input gives its status, a message naming the problem, and an unchanged cache") {
  temp_dir dir;
  const std::string path = layer_file(dir, "layer.safetensors", kv_heads);
  const std::string path_mqa = layer_file(dir, "mqa.safetensors", 1);
  const std::string garbage = dir.file("garbage.safetensors");
  kvhead::test::write_file(garbage, "this is not a safetensors file");
  kvh_layer* layer = open_layer(path);
  kvh_layer* layer_mqa = open_layer(path_mqa, [] {
    kvh_layer_options options = default_options();
    options.num_kv_heads = 1;
    return options;
  }());

  // A cache of 3 blocks of 256 tokens: a (5 tokens) and c forked from it
  // share one, b (2 tokens) has one, one is free; f was freed.
  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(layer, std::size_t(3 * block_bytes), &cache) == KVH_OK);
  REQUIRE(kvh_cache_free_tokens(cache) == 3 * 256);
  int64_t a = 0, b = 0, c = 0, f = 0;
  REQUIRE(kvh_sequence_create(cache, &a) == KVH_OK);
  REQUIRE(kvh_sequence_create(cache, &b) == KVH_OK);
  REQUIRE(kvh_sequence_create(cache, &f) == KVH_OK);
  REQUIRE(kvh_sequence_free(cache, f) == KVH_OK);
  const std::vector<float> x_a = inputs(6, 1), x_b = inputs(2, 2);
  const std::vector<float> y_a_prefix = decode_tokens(layer, cache, a, rows(x_a, 0, 5));
  decode_tokens(layer, cache, b, x_b);
  REQUIRE(kvh_sequence_fork(cache, a, &c) == KVH_OK);
  kvh_cache* cache2 = nullptr;
  REQUIRE(kvh_cache_create_layers(layer, 2, 2 * 2 * block_bytes, &cache2) == KVH_OK);
  int64_t in2 = 0;
  REQUIRE(kvh_sequence_create(cache2, &in2) == KVH_OK);

  const auto state = [&] {
    return cache_state{kvh_cache_free_tokens(cache),
                       {kvh_sequence_length(cache, a), kvh_sequence_length(cache, b), kvh_sequence_length(cache, c),
                        kvh_cache_free_tokens(cache2), kvh_sequence_length(cache2, in2)}};
  };
  const cache_state before = state();
  REQUIRE(before.free_tokens == 256);
  REQUIRE(before.lengths == std::vector<int64_t>{5, 2, 5, 512, 0});

  kvh_layer_options options = default_options();
  const auto with = [&](const std::function<void(kvh_layer_options&)>& change) {
    options = default_options();
    change(options);
    return &options;
  };
  std::vector<float> x(16 * d_model, 0.5f), y(16 * d_model);
  const int64_t one = 1, none = 0, many = 600;
  const int64_t ids_ab[] = {a, b}, ids_aa[] = {a, a}, tokens_11[] = {1, 1};
  const int64_t unknown = 999, zero_id = 0, negative_id = -5;
  kvh_layer* out_layer = nullptr;
  kvh_cache* out_cache = nullptr;
  int64_t out_id = -7;

  struct bad_call {
    const char* what;
    std::function<kvh_status()> call;
    kvh_status status;
    const char* message;  // must appear in kvh_last_error()
  };
  const std::vector<bad_call> table = {
      // NULL pointers.
      {"open: NULL path", [&] { return kvh_layer_open(nullptr, with([](auto&) {}), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "safetensors_path is NULL"},
      {"open: NULL options", [&] { return kvh_layer_open(path.c_str(), nullptr, &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "options is NULL"},
      {"open: NULL out", [&] { return kvh_layer_open(path.c_str(), with([](auto&) {}), nullptr); },
       KVH_ERR_INVALID_ARGUMENT, "out is NULL"},
      {"forward: NULL layer", [&] { return kvh_layer_forward(nullptr, x.data(), 1, 1, 1, y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "layer is NULL"},
      {"forward: NULL x", [&] { return kvh_layer_forward(layer, nullptr, 1, 1, 1, y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "x is NULL"},
      {"forward: NULL y", [&] { return kvh_layer_forward(layer, x.data(), 1, 1, 1, nullptr); },
       KVH_ERR_INVALID_ARGUMENT, "y is NULL"},
      {"cache_create: NULL layer", [&] { return kvh_cache_create(nullptr, 1 << 20, &out_cache); },
       KVH_ERR_INVALID_ARGUMENT, "layer is NULL"},
      {"cache_create: NULL out", [&] { return kvh_cache_create(layer, 1 << 20, nullptr); }, KVH_ERR_INVALID_ARGUMENT,
       "out is NULL"},
      {"sequence_create: NULL cache", [&] { return kvh_sequence_create(nullptr, &out_id); }, KVH_ERR_INVALID_ARGUMENT,
       "cache is NULL"},
      {"sequence_create: NULL id", [&] { return kvh_sequence_create(cache, nullptr); }, KVH_ERR_INVALID_ARGUMENT,
       "seq_id is NULL"},
      {"fork: NULL child", [&] { return kvh_sequence_fork(cache, a, nullptr); }, KVH_ERR_INVALID_ARGUMENT,
       "child is NULL"},
      {"decode: NULL layer", [&] { return kvh_decode(nullptr, cache, &a, &one, 1, x.data(), y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "layer is NULL"},
      {"decode: NULL cache", [&] { return kvh_decode(layer, nullptr, &a, &one, 1, x.data(), y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "cache is NULL"},
      {"decode: NULL ids", [&] { return kvh_decode(layer, cache, nullptr, &one, 1, x.data(), y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "seq_ids is NULL"},
      {"decode: NULL tokens", [&] { return kvh_decode(layer, cache, &a, nullptr, 1, x.data(), y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "num_tokens is NULL"},
      {"decode: NULL x", [&] { return kvh_decode(layer, cache, &a, &one, 1, nullptr, y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "x is NULL"},
      {"decode: NULL y", [&] { return kvh_decode(layer, cache, &a, &one, 1, x.data(), nullptr); },
       KVH_ERR_INVALID_ARGUMENT, "y is NULL"},
      {"append: NULL cache", [&] { return kvh_sequence_append(nullptr, &in2, &one, 1); }, KVH_ERR_INVALID_ARGUMENT,
       "cache is NULL"},
      {"length: NULL cache", [&] { return kvh_sequence_length(nullptr, a) == -1 ? KVH_ERR_INVALID_ARGUMENT : KVH_OK; },
       KVH_ERR_INVALID_ARGUMENT, "cache is NULL"},
      // Sizes < 1 and options out of range.
      {"forward: batch 0", [&] { return kvh_layer_forward(layer, x.data(), 0, 1, 1, y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "batch = 0"},
      {"forward: seq -1", [&] { return kvh_layer_forward(layer, x.data(), 1, -1, 1, y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "seq = -1"},
      {"forward: x and y overlap", [&] { return kvh_layer_forward(layer, x.data(), 1, 2, 1, x.data() + d_model); },
       KVH_ERR_INVALID_ARGUMENT, "overlap"},
      {"cache_create: budget 0", [&] { return kvh_cache_create(layer, 0, &out_cache); }, KVH_ERR_INVALID_ARGUMENT,
       "byte_budget = 0"},
      {"cache_create: budget below one block", [&] { return kvh_cache_create(layer, 100, &out_cache); },
       KVH_ERR_INVALID_ARGUMENT, "capacity_bytes = 100"},
      {"cache_create_layers: 0 layers", [&] { return kvh_cache_create_layers(layer, 0, 1 << 20, &out_cache); },
       KVH_ERR_INVALID_ARGUMENT, "num_layers = 0"},
      {"open: num_heads 0",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.num_heads = 0; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "num_heads = 0"},
      {"open: num_kv_heads -1",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.num_kv_heads = -1; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "num_kv_heads = -1"},
      {"open: num_kv_heads not dividing",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.num_kv_heads = 3; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "not a multiple of num_kv_heads = 3"},
      {"open: rope_theta NaN",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.rope_theta = std::nanf(""); }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "rope_theta"},
      {"open: scale inf",
       [&] {
         return kvh_layer_open(path.c_str(), with([](auto& o) { o.scale = std::numeric_limits<float>::infinity(); }),
                               &out_layer);
       },
       KVH_ERR_INVALID_ARGUMENT, "scale must be finite"},
      {"open: threads -1",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.threads = -1; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "threads = -1"},
      {"open: kv_block_size 7",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.kv_block_size = 7; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "options->kv_block_size = 7 (must be 16, 32, 64, 128 or 256; 0 = 256)"},
      {"open: kv_block_size 512",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.kv_block_size = 512; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "options->kv_block_size = 512"},
      {"open: precision -1",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.precision = -1; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "options->precision = -1"},
      {"open: options not initialized",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.struct_size = 0; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "kvh_layer_options_init"},
      {"open: options of a newer kvhead",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.struct_size = sizeof o + 8; }), &out_layer); },
       KVH_ERR_INVALID_ARGUMENT, "newer kvhead"},
      {"decode: 0 sequences", [&] { return kvh_decode(layer, cache, &a, &one, 0, x.data(), y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "num_seqs = 0"},
      {"decode: 0 tokens", [&] { return kvh_decode(layer, cache, &a, &none, 1, x.data(), y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "num_tokens[0] = 0"},
      {"decode: an id twice", [&] { return kvh_decode(layer, cache, ids_aa, tokens_11, 2, x.data(), y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "listed twice"},
      {"decode: x and y overlap",
       [&] { return kvh_decode(layer, cache, ids_ab, tokens_11, 2, x.data(), x.data() + 1); }, KVH_ERR_INVALID_ARGUMENT,
       "overlap"},
      {"decode: layer of another geometry",
       [&] { return kvh_decode(layer_mqa, cache, &a, &one, 1, x.data(), y.data()); }, KVH_ERR_INVALID_ARGUMENT,
       "num_kv_heads 1"},
      {"decode: a two-layer cache", [&] { return kvh_decode(layer, cache2, &in2, &one, 1, x.data(), y.data()); },
       KVH_ERR_INVALID_ARGUMENT, "kvh_decode_layer"},
      {"decode_layer: layer_index 2",
       [&] { return kvh_decode_layer(layer, cache2, 2, &in2, &one, 1, x.data(), y.data()); }, KVH_ERR_INVALID_ARGUMENT,
       "layer_index = 2"},
      {"decode_layer: tokens not reserved",
       [&] { return kvh_decode_layer(layer, cache2, 0, &in2, &one, 1, x.data(), y.data()); }, KVH_ERR_INVALID_ARGUMENT,
       "kvh_sequence_append"},
      {"append: an id twice", [&] { return kvh_sequence_append(cache, ids_aa, tokens_11, 2); },
       KVH_ERR_INVALID_ARGUMENT, "listed twice"},
      {"append: 0 tokens", [&] { return kvh_sequence_append(cache2, &in2, &none, 1); }, KVH_ERR_INVALID_ARGUMENT,
       "num_tokens[0] = 0"},
      {"truncate: beyond the length", [&] { return kvh_sequence_truncate(cache, a, 6); }, KVH_ERR_INVALID_ARGUMENT,
       "beyond"},
      {"truncate: negative", [&] { return kvh_sequence_truncate(cache, a, -1); }, KVH_ERR_INVALID_ARGUMENT,
       "length = -1"},
      // Files.
      {"open: missing file",
       [&] { return kvh_layer_open(dir.file("missing.safetensors").c_str(), with([](auto&) {}), &out_layer); },
       KVH_ERR_IO, "missing.safetensors: cannot open"},
      {"open: a directory", [&] { return kvh_layer_open(dir.path().c_str(), with([](auto&) {}), &out_layer); },
       KVH_ERR_IO, "is a directory"},
      {"open: malformed file", [&] { return kvh_layer_open(garbage.c_str(), with([](auto&) {}), &out_layer); },
       KVH_ERR_FORMAT, "garbage.safetensors"},
      {"open: prefix matching no tensor",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.prefix = "model.layers.7."; }), &out_layer); },
       KVH_ERR_FORMAT, "no tensor name starts with prefix 'model.layers.7.'"},
      {"open: num_kv_heads the file disagrees with",
       [&] { return kvh_layer_open(path.c_str(), with([](auto& o) { o.num_kv_heads = 4; }), &out_layer); },
       KVH_ERR_FORMAT, "num_kv_heads is 4"},
      // Unknown or freed ids.
      {"decode: unknown id", [&] { return kvh_decode(layer, cache, &unknown, &one, 1, x.data(), y.data()); },
       KVH_ERR_NOT_FOUND, "sequence 999 is unknown"},
      {"decode: freed id", [&] { return kvh_decode(layer, cache, &f, &one, 1, x.data(), y.data()); }, KVH_ERR_NOT_FOUND,
       "unknown or was freed"},
      {"decode: id 0", [&] { return kvh_decode(layer, cache, &zero_id, &one, 1, x.data(), y.data()); },
       KVH_ERR_NOT_FOUND, "sequence 0"},
      {"decode: second id unknown",
       [&] {
         const int64_t ids[] = {a, unknown};
         return kvh_decode(layer, cache, ids, tokens_11, 2, x.data(), y.data());
       },
       KVH_ERR_NOT_FOUND, "sequence 999"},
      {"fork: freed parent", [&] { return kvh_sequence_fork(cache, f, &out_id); }, KVH_ERR_NOT_FOUND, "freed"},
      {"truncate: negative id", [&] { return kvh_sequence_truncate(cache, negative_id, 0); }, KVH_ERR_NOT_FOUND,
       "sequence -5"},
      {"free: freed twice", [&] { return kvh_sequence_free(cache, f); }, KVH_ERR_NOT_FOUND, "freed"},
      {"length: freed id", [&] { return kvh_sequence_length(cache, f) == -1 ? KVH_ERR_NOT_FOUND : KVH_OK; },
       KVH_ERR_NOT_FOUND, "freed"},
      {"append: unknown id", [&] { return kvh_sequence_append(cache2, &unknown, &one, 1); }, KVH_ERR_NOT_FOUND,
       "sequence 999"},
      // No room.
      {"decode: more tokens than the pool holds",
       [&] {
         std::vector<float> big_x(many * d_model), big_y(big_x.size());
         return kvh_decode(layer, cache, &b, &many, 1, big_x.data(), big_y.data());
       },
       KVH_ERR_CAPACITY, "no room"},
      {"decode: two sequences that fit only alone (precheck)",
       [&] {
         const int64_t ids[] = {b, a}, tokens[] = {300, 300};
         std::vector<float> big_x(600 * d_model), big_y(big_x.size());
         return kvh_decode(layer, cache, ids, tokens, 2, big_x.data(), big_y.data());
       },
       KVH_ERR_CAPACITY, "no room"},
      {"append: more than the pool holds", [&] { return kvh_sequence_append(cache2, &in2, &many, 1); },
       KVH_ERR_CAPACITY, "no room"},
  };

  const std::string earlier = "earlier failure marker";
  for (const bad_call& row : table) {
    const std::string what = row.what;
    CAPTURE(what);
    out_layer = nullptr;
    out_cache = nullptr;
    out_id = -7;
    const kvh_status status = row.call();
    CHECK(status == row.status);
    const std::string message = kvh_last_error();
    CAPTURE(message);
    CHECK(message.find(row.message) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(out_layer == nullptr);  // nothing written through output pointers
    CHECK(out_cache == nullptr);
    CHECK(out_id == -7);
    CHECK(state() == before);
  }

  // The cache still decodes as if nothing had happened: a's 6th token equals
  // the forward pass over all 6.
  std::vector<float> y_last(d_model);
  REQUIRE(kvh_decode(layer, cache, &a, &one, 1, x_a.data() + 5 * d_model, y_last.data()) == KVH_OK);
  const std::vector<float> expected = forward(layer, x_a);
  CHECK(same_bits(y_a_prefix, rows(expected, 0, 5)));
  CHECK(same_bits(y_last, rows(expected, 5, 1)));

  kvh_cache_destroy(cache2);
  kvh_cache_destroy(cache);
  kvh_layer_close(layer_mqa);
  kvh_layer_close(layer);
}

TEST_CASE("C API: a failed decode that ran out of room part way truncates back what it reserved") {
  // Pool of 2 blocks: p (3 tokens) and its forks c1, c2 share block 0; 1 free.
  // Decoding p and c1 by one token each: p copies the shared block (the
  // last free one), then c1 needs a copy too and fails: p goes back to 3
  // tokens, keeping its private copy (kvhead.h, kvh_decode).
  temp_dir dir;
  kvh_layer* layer = open_layer(layer_file(dir, "layer.safetensors", kv_heads));
  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(layer, 2 * block_bytes, &cache) == KVH_OK);
  int64_t p = 0, c1 = 0, c2 = 0;
  REQUIRE(kvh_sequence_create(cache, &p) == KVH_OK);
  const std::vector<float> x_p = inputs(3, 7);
  const std::vector<float> y_p = decode_tokens(layer, cache, p, x_p);
  REQUIRE(kvh_sequence_fork(cache, p, &c1) == KVH_OK);
  REQUIRE(kvh_sequence_fork(cache, p, &c2) == KVH_OK);
  REQUIRE(kvh_cache_free_tokens(cache) == 256);

  const int64_t ids[] = {p, c1}, tokens[] = {1, 1};
  std::vector<float> x(2 * d_model, 0.25f), y(x.size());
  CHECK(kvh_decode(layer, cache, ids, tokens, 2, x.data(), y.data()) == KVH_ERR_CAPACITY);
  CHECK(std::string(kvh_last_error()).find("out of capacity") != std::string::npos);
  CHECK(kvh_sequence_length(cache, p) == 3);
  CHECK(kvh_sequence_length(cache, c1) == 3);
  CHECK(kvh_sequence_length(cache, c2) == 3);
  CHECK(kvh_cache_free_tokens(cache) == 0);  // p's private copy
  // p's copy holds the same tokens: its 4th token matches the forward pass.
  const std::vector<float> x_p4 = [&] {
    std::vector<float> all = x_p;
    all.insert(all.end(), x.begin(), x.begin() + d_model);
    return all;
  }();
  std::vector<float> y_4(d_model);
  const int64_t one = 1;
  REQUIRE(kvh_decode(layer, cache, &p, &one, 1, x.data(), y_4.data()) == KVH_OK);
  CHECK(same_bits(y_4, rows(forward(layer, x_p4), 3, 1)));
  kvh_cache_destroy(cache);
  kvh_layer_close(layer);
}

TEST_CASE("C API: decoding token by token, batched and chunked, equals the causal forward pass") {
  temp_dir dir;
  const std::string path = layer_file(dir, "layer.safetensors", kv_heads, "model.layers.0.self_attn.");
  kvh_layer_options options = default_options();
  options.prefix = "model.layers.0.self_attn.";
  kvh_layer* layer = open_layer(path, options);
  REQUIRE(kvh_layer_d_model(layer) == d_model);
  REQUIRE(kvh_layer_num_heads(layer) == heads);
  REQUIRE(kvh_layer_num_kv_heads(layer) == kv_heads);
  REQUIRE(kvh_layer_head_dim(layer) == head_dim);
  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(layer, std::size_t(8) << 20, &cache) == KVH_OK);

  // Three sequences, 7, 1 and 300 tokens: a prefill chunk of 5 for the
  // first, then one token per step for every sequence with tokens left, in
  // one call per step.
  const std::vector<std::size_t> lengths{7, 1, 300};
  std::vector<std::vector<float>> x, y;
  std::vector<int64_t> ids(lengths.size());
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    x.push_back(inputs(lengths[s], unsigned(10 + s)));
    y.emplace_back(x.back().size());
    REQUIRE(kvh_sequence_create(cache, &ids[s]) == KVH_OK);
  }
  std::vector<std::size_t> done(lengths.size(), 0);
  for (bool first = true;; first = false) {
    std::vector<int64_t> step_ids, step_tokens;
    std::vector<float> step_x;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      if (done[s] == lengths[s]) continue;
      const std::size_t n = first && s == 0 ? 5 : 1;
      step_ids.push_back(ids[s]);
      step_tokens.push_back(int64_t(n));
      const std::vector<float> part = rows(x[s], done[s], n);
      step_x.insert(step_x.end(), part.begin(), part.end());
    }
    if (step_ids.empty()) break;
    std::vector<float> step_y(step_x.size());
    REQUIRE(kvh_decode(layer, cache, step_ids.data(), step_tokens.data(), int64_t(step_ids.size()), step_x.data(),
                       step_y.data()) == KVH_OK);
    std::size_t row = 0;
    for (std::size_t i = 0; i < step_ids.size(); ++i) {
      const std::size_t s = std::size_t(std::find(ids.begin(), ids.end(), step_ids[i]) - ids.begin());
      const std::size_t n = std::size_t(step_tokens[i]);
      std::copy_n(step_y.begin() + std::ptrdiff_t(row * d_model), n * d_model,
                  y[s].begin() + std::ptrdiff_t(done[s] * d_model));
      done[s] += n;
      row += n;
    }
  }
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    CAPTURE(s);
    CHECK(kvh_sequence_length(cache, ids[s]) == int64_t(lengths[s]));
    CHECK(same_bits(y[s], forward(layer, x[s])));
  }

  SUBCASE("a fork continues from its parent's tokens") {
    int64_t child = 0;
    REQUIRE(kvh_sequence_fork(cache, ids[0], &child) == KVH_OK);
    REQUIRE(kvh_sequence_truncate(cache, child, 4) == KVH_OK);
    const std::vector<float> extra = inputs(3, 99);
    const std::vector<float> y_child = decode_tokens(layer, cache, child, extra);
    std::vector<float> whole = rows(x[0], 0, 4);
    whole.insert(whole.end(), extra.begin(), extra.end());
    CHECK(same_bits(y_child, rows(forward(layer, whole), 4, 3)));
    CHECK(kvh_sequence_length(cache, ids[0]) == 7);  // the parent is untouched
  }
  SUBCASE("the cache outlives its layer and serves another layer object of the same geometry") {
    kvh_layer_close(layer);
    layer = open_layer(path, options);
    const std::vector<float> extra = inputs(2, 98);
    const std::vector<float> y_more = decode_tokens(layer, cache, ids[1], extra);
    std::vector<float> whole = x[1];
    whole.insert(whole.end(), extra.begin(), extra.end());
    CHECK(same_bits(y_more, rows(forward(layer, whole), 1, 2)));
  }
  SUBCASE("threads = 1 and 2 give the same bits") {
    for (const int32_t threads : {1, 2}) {
      options.threads = threads;
      kvh_layer* threaded = open_layer(path, options);
      CHECK(same_bits(forward(threaded, x[2]), y[2]));
      kvh_layer_close(threaded);
    }
  }
  kvh_cache_destroy(cache);
  kvh_layer_close(layer);
}

TEST_CASE("C API: options->kv_block_size: caches of smaller blocks, the same bits") {
  temp_dir dir;
  const std::string path = layer_file(dir, "layer.safetensors", kv_heads);
  // One 16-token block of one layer over f32: head_dim 8 padded to 32 floats per key.
  constexpr std::size_t small_block_bytes = 2 * kv_heads * 16 * 32 * sizeof(float);
  const std::vector<float> x = inputs(70, 21);
  for (const int32_t dtype : {KVH_KV_F32, KVH_KV_INT8}) {
    CAPTURE(dtype);
    std::vector<float> expected;
    for (const int32_t block_size : {0, 16, 32, 64, 128, 256}) {
      CAPTURE(block_size);
      kvh_layer_options options = default_options();
      options.kv_block_size = block_size;
      options.kv_dtype = dtype;
      kvh_layer* layer = open_layer(path, options);
      kvh_cache* cache = nullptr;
      REQUIRE(kvh_cache_create(layer, 32 * small_block_bytes, &cache) == KVH_OK);
      int64_t id = 0, other = 0;
      REQUIRE(kvh_sequence_create(cache, &id) == KVH_OK);
      REQUIRE(kvh_sequence_create(cache, &other) == KVH_OK);
      const std::vector<float> y = decode_tokens(layer, cache, id, x);
      if (expected.empty()) expected = dtype == KVH_KV_F32 ? forward(layer, x) : y;
      CHECK(same_bits(y, expected));
      decode_tokens(layer, cache, other, rows(x, 0, 1));
      if (dtype == KVH_KV_F32) {
        // 512 tokens of f32 blocks; 70 tokens and 1 hold whole blocks of their own.
        const int64_t size = block_size == 0 ? 256 : block_size;
        CHECK(kvh_cache_free_tokens(cache) == (512 / size - (70 + size - 1) / size - 1) * size);
      }
      kvh_cache_destroy(cache);
      kvh_layer_close(layer);
    }
  }
  // A caller built before the field: its struct ends before kv_block_size, whatever lies there is not read, and
  // the caches have the default blocks (one 256-token block holds the 70 tokens).
  kvh_layer_options older = default_options();
  older.struct_size = offsetof(kvh_layer_options, kv_block_size);
  older.kv_block_size = 7;
  kvh_layer* layer = open_layer(path, older);
  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(layer, 32 * small_block_bytes, &cache) == KVH_OK);
  int64_t id = 0;
  REQUIRE(kvh_sequence_create(cache, &id) == KVH_OK);
  CHECK(same_bits(decode_tokens(layer, cache, id, x), forward(layer, x)));
  CHECK(kvh_cache_free_tokens(cache) == 256);
  kvh_cache_destroy(cache);
  kvh_layer_close(layer);
}

TEST_CASE("C API: options->sliding_window, and kvh_sequence_drop_outside_window") {
  temp_dir dir;
  const std::string path = layer_file(dir, "layer.safetensors", kv_heads);
  constexpr int64_t window = 5;
  kvh_layer_options options = default_options();
  options.sliding_window = window;
  kvh_layer* sliding = open_layer(path, options);
  kvh_layer* full = open_layer(path);
  const std::size_t tokens = 610, before_drop = 600;
  const std::vector<float> x = inputs(tokens, 77);
  const std::vector<float> expected = forward(sliding, x);
  CHECK_FALSE(same_bits(expected, forward(full, x)));  // the option is applied

  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(sliding, 4 * block_bytes, &cache) == KVH_OK);
  int64_t id = 0;
  REQUIRE(kvh_sequence_create(cache, &id) == KVH_OK);
  const std::vector<float> first = decode_tokens(sliding, cache, id, rows(x, 0, before_drop));
  CHECK(same_bits(first, rows(expected, 0, before_drop)));

  // The next query is position 600: keys below 596 are outside every
  // window still to come, so the two whole blocks [0, 512) go back.
  const int64_t free_before = kvh_cache_free_tokens(cache);
  int64_t dropped = -1;
  REQUIRE(kvh_sequence_drop_outside_window(cache, id, window, &dropped) == KVH_OK);
  CHECK(dropped == 512);
  CHECK(kvh_cache_free_tokens(cache) == free_before + 512);
  CHECK(kvh_sequence_length(cache, id) == int64_t(before_drop));
  CHECK(kvh_sequence_drop_outside_window(cache, id, window, nullptr) == KVH_OK);  // nothing more to drop

  // Refused, naming the problem, the cache unchanged: a layer that would
  // see the dropped keys, a truncate below them, a window of 0.
  const int64_t one = 1;
  std::vector<float> y(d_model);
  CHECK(kvh_decode(full, cache, &id, &one, 1, x.data() + before_drop * d_model, y.data()) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(std::string(kvh_last_error()).find("dropped") != std::string::npos);
  CHECK(kvh_sequence_truncate(cache, id, 100) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(std::string(kvh_last_error()).find("dropped") != std::string::npos);
  CHECK(kvh_sequence_drop_outside_window(cache, id, 0, nullptr) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(std::string(kvh_last_error()).find("window") != std::string::npos);
  CHECK(kvh_sequence_drop_outside_window(cache, id + 100, window, nullptr) == KVH_ERR_NOT_FOUND);
  CHECK(kvh_sequence_length(cache, id) == int64_t(before_drop));

  // Decoding goes on over the kept blocks with the bits of the forward pass.
  const std::vector<float> rest = decode_tokens(sliding, cache, id, rows(x, before_drop, tokens - before_drop));
  CHECK(same_bits(rest, rows(expected, before_drop, tokens - before_drop)));

  options.sliding_window = -1;
  kvh_layer* bad = nullptr;
  CHECK(kvh_layer_open(path.c_str(), &options, &bad) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(std::string(kvh_last_error()).find("sliding_window") != std::string::npos);
  CHECK(bad == nullptr);
  kvh_cache_destroy(cache);
  kvh_layer_close(full);
  kvh_layer_close(sliding);
}

TEST_CASE("C API: a two-layer cache, one reservation per step, equals two stacked forward passes") {
  temp_dir dir;
  kvh_layer* first = open_layer(layer_file(dir, "first.safetensors", kv_heads));
  kvh_layer* second = open_layer(layer_file(dir, "second.safetensors", kv_heads, "l1."), [] {
    kvh_layer_options options = default_options();
    options.prefix = "l1.";
    return options;
  }());
  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create_layers(first, 2, std::size_t(4) << 20, &cache) == KVH_OK);
  REQUIRE(kvh_cache_num_layers(cache) == 2);
  const std::vector<std::size_t> lengths{4, 9};
  std::vector<int64_t> ids(2);
  std::vector<std::vector<float>> x, y;
  for (std::size_t s = 0; s < 2; ++s) {
    REQUIRE(kvh_sequence_create(cache, &ids[s]) == KVH_OK);
    x.push_back(inputs(lengths[s], unsigned(20 + s)));
    y.emplace_back(x.back().size());
  }
  for (std::size_t t = 0; t < 9; ++t) {
    std::vector<int64_t> step_ids, step_tokens;
    std::vector<float> step_x;
    for (std::size_t s = 0; s < 2; ++s)
      if (t < lengths[s]) {
        step_ids.push_back(ids[s]);
        step_tokens.push_back(1);
        step_x.insert(step_x.end(), x[s].begin() + std::ptrdiff_t(t * d_model),
                      x[s].begin() + std::ptrdiff_t((t + 1) * d_model));
      }
    const int64_t count = int64_t(step_ids.size());
    std::vector<float> hidden(step_x.size()), step_y(step_x.size());
    REQUIRE(kvh_sequence_append(cache, step_ids.data(), step_tokens.data(), count) == KVH_OK);
    REQUIRE(kvh_decode_layer(first, cache, 0, step_ids.data(), step_tokens.data(), count, step_x.data(),
                             hidden.data()) == KVH_OK);
    REQUIRE(kvh_decode_layer(second, cache, 1, step_ids.data(), step_tokens.data(), count, hidden.data(),
                             step_y.data()) == KVH_OK);
    for (std::size_t i = 0, s = 0; s < 2; ++s)
      if (t < lengths[s]) {
        std::copy_n(step_y.begin() + std::ptrdiff_t(i * d_model), d_model, y[s].begin() + std::ptrdiff_t(t * d_model));
        ++i;
      }
  }
  for (std::size_t s = 0; s < 2; ++s) CHECK(same_bits(y[s], forward(second, forward(first, x[s]))));
  kvh_cache_destroy(cache);
  kvh_layer_close(second);
  kvh_layer_close(first);
}

TEST_CASE("C API: threads decoding distinct sequences of one cache concurrently") {
  temp_dir dir;
  kvh_layer* layer = open_layer(layer_file(dir, "layer.safetensors", kv_heads));
  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(layer, std::size_t(8) << 20, &cache) == KVH_OK);
  constexpr std::size_t callers = 4, tokens = 40;
  std::vector<std::vector<float>> x, y(callers);
  std::vector<int64_t> ids(callers);
  for (std::size_t i = 0; i < callers; ++i) {
    x.push_back(inputs(tokens, unsigned(30 + i)));
    REQUIRE(kvh_sequence_create(cache, &ids[i]) == KVH_OK);
  }
  std::vector<std::thread> threads;
  std::vector<int> failures(callers, 0);
  for (std::size_t i = 0; i < callers; ++i)
    threads.emplace_back([&, i] {
      std::vector<float> out(x[i].size());
      const int64_t one = 1;
      for (std::size_t t = 0; t < tokens; ++t)
        failures[i] +=
            kvh_decode(layer, cache, &ids[i], &one, 1, x[i].data() + t * d_model, out.data() + t * d_model) != KVH_OK;
      y[i] = std::move(out);
    });
  for (std::thread& thread : threads) thread.join();
  for (std::size_t i = 0; i < callers; ++i) {
    CHECK(failures[i] == 0);
    CHECK(same_bits(y[i], forward(layer, x[i])));
  }
  kvh_cache_destroy(cache);
  kvh_layer_close(layer);
}

TEST_CASE("C API: kvh_decode in each iteration of a user's parallel_for, one sequence each") {
  // threads = 0: the calls run in the caller's arena. A thread waiting for
  // its call's tasks took another iteration of the user's loop and started a
  // second kvh_decode on its stack, which overwrote the first's per-thread
  // batch: the first then marked the other sequences' K/V written (refusing
  // later calls) or its own not. The layer is large enough that a call runs
  // many tasks.
  temp_dir dir;
  constexpr std::size_t wide = 512, wide_heads = 8, wide_kv_heads = 2, wide_head_dim = 64;
  std::mt19937 random(5);
  const std::string path = dir.file("wide.safetensors");
  kvhead::test::write_file(path, kvhead::test::safetensors_bytes({
                                     tensor("q_proj.weight", wide_heads * wide_head_dim, wide, random),
                                     tensor("k_proj.weight", wide_kv_heads * wide_head_dim, wide, random),
                                     tensor("v_proj.weight", wide_kv_heads * wide_head_dim, wide, random),
                                     tensor("o_proj.weight", wide, wide_heads * wide_head_dim, random),
                                 }));
  kvh_layer_options options = default_options();
  options.num_heads = wide_heads;
  options.num_kv_heads = wide_kv_heads;
  kvh_layer* layer = open_layer(path, options);
  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(layer, std::size_t(256) << 20, &cache) == KVH_OK);
  constexpr std::size_t sequences = 16, steps = 40, chunk = 16;
  std::vector<int64_t> ids(sequences);
  std::vector<std::size_t> prompts(sequences);
  std::vector<std::vector<float>> x(sequences), y(sequences);
  for (std::size_t s = 0; s < sequences; ++s) {
    REQUIRE(kvh_sequence_create(cache, &ids[s]) == KVH_OK);
    prompts[s] = 100 + 37 * s;
    x[s] = kvhead::testing::random_values((prompts[s] + steps * chunk) * wide, random, 1.0f);
    y[s].resize(x[s].size());
    const int64_t tokens = int64_t(prompts[s]);
    REQUIRE(kvh_decode(layer, cache, &ids[s], &tokens, 1, x[s].data(), y[s].data()) == KVH_OK);
  }
  std::vector<std::string> errors(sequences);
  // More threads than CPUs (as a server's pool may have), so that threads
  // often wait in a call while iterations are left to take.
  const tbb::global_control oversubscribed(tbb::global_control::max_allowed_parallelism, 8);
  tbb::task_arena user_arena(8);
  for (std::size_t step = 0; step < steps; ++step)
    user_arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, sequences, 1),
          [&](const tbb::blocked_range<std::size_t>& range) {
            for (std::size_t s = range.begin(); s != range.end(); ++s) {
              const int64_t tokens = chunk;
              const std::size_t row = (prompts[s] + step * chunk) * wide;
              if (kvh_decode(layer, cache, &ids[s], &tokens, 1, x[s].data() + row, y[s].data() + row) != KVH_OK &&
                  errors[s].empty())
                errors[s] = kvh_last_error();
            }
          },
          tbb::simple_partitioner());
    });
  for (std::size_t s = 0; s < sequences; ++s) {
    CAPTURE(s);
    CHECK(errors[s] == "");
    CHECK(kvh_sequence_length(cache, ids[s]) == int64_t(prompts[s] + steps * chunk));
    std::vector<float> expected(x[s].size());
    REQUIRE(kvh_layer_forward(layer, x[s].data(), 1, int64_t(x[s].size() / wide), 1, expected.data()) == KVH_OK);
    CHECK(same_bits(y[s], expected));
  }
  kvh_cache_destroy(cache);
  kvh_layer_close(layer);
}

TEST_CASE("C API: kvh_last_error is per thread and left alone by successes, and ids are never reused") {
  temp_dir dir;
  kvh_layer* layer = open_layer(layer_file(dir, "layer.safetensors", kv_heads));
  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(layer, std::size_t(1) << 20, &cache) == KVH_OK);
  REQUIRE(kvh_sequence_free(cache, 12345) == KVH_ERR_NOT_FOUND);
  const std::string message = kvh_last_error();
  CHECK(message.rfind("kvh_sequence_free: sequence 12345", 0) == 0);
  int64_t first = 0, second = 0;
  REQUIRE(kvh_sequence_create(cache, &first) == KVH_OK);
  CHECK(kvh_last_error() == message);  // a success leaves it alone
  std::string other_thread_before, other_thread_after;
  std::thread([&] {
    other_thread_before = kvh_last_error();
    kvh_sequence_truncate(cache, first, 5);
    other_thread_after = kvh_last_error();
  }).join();
  CHECK(other_thread_before.empty());
  CHECK(other_thread_after.find("kvh_sequence_truncate: length 5 is beyond") == 0);
  CHECK(kvh_last_error() == message);

  REQUIRE(kvh_sequence_free(cache, first) == KVH_OK);
  REQUIRE(kvh_sequence_create(cache, &second) == KVH_OK);
  CHECK(second > first);
  CHECK(kvh_sequence_length(cache, first) == -1);
  CHECK(std::string(kvh_status_name(KVH_ERR_CAPACITY)) == "KVH_ERR_CAPACITY");
  CHECK(std::string(kvh_version()) == KVHEAD_VERSION_STRING);
  kvh_cache_destroy(cache);
  kvh_layer_close(layer);
  kvh_layer_close(nullptr);  // ignored, like free(NULL)
  kvh_cache_destroy(nullptr);
}

TEST_CASE("C API: options ABI, struct_size and kvh_layer_options_init") {
  kvh_layer_options options;
  std::memset(&options, 0xab, sizeof options);
  kvh_layer_options_init(&options);  // the macro: this program's sizeof
  CHECK(options.struct_size == sizeof(kvh_layer_options));
  CHECK(options.num_heads == 0);
  CHECK(options.num_kv_heads == 0);
  CHECK(options.rope_theta == 0.0f);
  CHECK(options.scale == 0.0f);
  CHECK(options.prefix == nullptr);
  CHECK(options.threads == 0);
  CHECK(options.kv_dtype == KVH_KV_F32);
  CHECK(options.logit_softcap == 0.0f);
  CHECK(options.sinks == nullptr);
  CHECK(options.precision == KVH_PRECISION_F32);
  CHECK(options.sliding_window == 0);
  CHECK(options.kv_block_size == 0);
  CHECK(options.alibi_slopes == nullptr);
  // A program built before `precision` was added: its bytes are left alone
  // (the library reads the field as its default, f32).
  std::memset(&options, 0xab, sizeof options);
  kvh_layer_options_init_sized(&options, offsetof(kvh_layer_options, precision));
  CHECK(options.kv_dtype == KVH_KV_F32);
  CHECK(options.sinks == nullptr);
  CHECK(options.precision == int32_t(0xabababab));
  // Before `kv_block_size`: the field is left alone, read as its default.
  std::memset(&options, 0xab, sizeof options);
  kvh_layer_options_init_sized(&options, offsetof(kvh_layer_options, kv_block_size));
  CHECK(options.sliding_window == 0);
  CHECK(options.kv_block_size == int32_t(0xabababab));
  // Before `alibi_slopes` (past kv_block_size's padding): left alone too.
  std::memset(&options, 0xab, sizeof options);
  kvh_layer_options_init_sized(&options, offsetof(kvh_layer_options, alibi_slopes));
  CHECK(options.kv_block_size == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(options.alibi_slopes) == std::uintptr_t(0xabababababababab));
  std::memset(&options, 0xab, sizeof options);
  (kvh_layer_options_init)(&options);  // the exported function, as ctypes calls it
  CHECK(options.struct_size == sizeof(kvh_layer_options));
  CHECK(options.threads == 0);
  // A struct of an older, smaller layout is filled only up to its size.
  unsigned char bytes[sizeof(kvh_layer_options) + 16];
  std::memset(bytes, 0xab, sizeof bytes);
  kvh_layer_options_init_sized(reinterpret_cast<kvh_layer_options*>(bytes), sizeof(kvh_layer_options));
  for (std::size_t i = sizeof(kvh_layer_options); i < sizeof bytes; ++i) CHECK(bytes[i] == 0xab);
  kvh_layer_options_init_sized(nullptr, sizeof(kvh_layer_options));  // ignored
}
