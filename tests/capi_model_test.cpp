// Model folders through the C API (kvh_layer_open_model) and the public C++
// API (kvhead/model.hpp), as an embedder links them: the shared library only.
// The two give the same bits; decoding token by token over a cache equals the
// causal forward pass; each bad call gets its status and a message naming the
// problem. The folders' numbers against the Hugging Face formulas are checked
// by the golden_model tests (cli_model_test.cpp).
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kvhead/kvhead.h"
#include "kvhead/model.hpp"
#include "tests/io_test_files.hpp"
#include "tests/random_values.hpp"

namespace {

const std::string llama3 = std::string(KVHEAD_MODELS_DIR) + "/llama3_sharded";  // 3 layers, 4/2 heads, d_model 64

kvh_layer_options defaults() {
  kvh_layer_options options;
  kvh_layer_options_init(&options);
  return options;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("C API model folder: kvh_layer_open_model equals kvhead::load_model_layer, and decoding equals forward") {
  const kvh_layer_options options = defaults();
  kvh_layer* layer = nullptr;
  REQUIRE_MESSAGE(kvh_layer_open_model(llama3.c_str(), 2, &options, &layer) == KVH_OK, kvh_last_error());
  CHECK(kvh_layer_d_model(layer) == 64);
  CHECK(kvh_layer_num_heads(layer) == 4);
  CHECK(kvh_layer_num_kv_heads(layer) == 2);

  const kvhead::attention_config config = kvhead::model_layer_config(llama3, 2);
  CHECK(config.d_model == 64);
  CHECK(config.causal);
  const kvhead::attention_layer cpp_layer = kvhead::load_model_layer(llama3, 2);

  constexpr std::size_t tokens = 9;
  std::mt19937 random(5);
  const std::vector<float> x = kvhead::testing::random_values(tokens * 64, random, 1.0f);
  std::vector<float> c_out(x.size()), cpp_out(x.size()), decoded(x.size());
  REQUIRE(kvh_layer_forward(layer, x.data(), 1, tokens, 1, c_out.data()) == KVH_OK);
  cpp_layer.forward(x.data(), 1, tokens, cpp_out.data());
  CHECK(same_bits(c_out, cpp_out));

  kvh_cache* cache = nullptr;
  REQUIRE(kvh_cache_create(layer, std::size_t{8} << 20, &cache) == KVH_OK);
  int64_t id = 0;
  REQUIRE(kvh_sequence_create(cache, &id) == KVH_OK);
  const int64_t one = 1;
  for (std::size_t t = 0; t < tokens; ++t)
    REQUIRE_MESSAGE(kvh_decode(layer, cache, &id, &one, 1, x.data() + t * 64, decoded.data() + t * 64) == KVH_OK,
                    kvh_last_error());
  CHECK(same_bits(decoded, c_out));
  kvh_cache_destroy(cache);
  kvh_layer_close(layer);
}

TEST_CASE("C API model folder: bad calls give their status and name the problem, and *out stays NULL") {
  const kvhead::test::temp_dir dir;  // empty
  struct row {
    const char* what;
    std::string folder;
    int32_t layer_index;
    kvh_layer_options options;
    kvh_status status;
    const char* message;  // a part of kvh_last_error()
  };
  kvh_layer_options heads_wrong = defaults(), prefix_set = defaults(), theta_wrong = defaults();
  heads_wrong.num_heads = 8;
  prefix_set.prefix = "model.layers.0.self_attn.";
  theta_wrong.rope_theta = 500000.0f;
  kvh_layer_options softcap_wrong = defaults(), sinks_set = defaults();
  softcap_wrong.logit_softcap = 2.0f;
  const float sinks[8] = {};
  sinks_set.sinks = sinks;
  const std::string gemma2 = std::string(KVHEAD_MODELS_DIR) + "/gemma2_softcap";
  const std::vector<row> rows = {
      {"no such folder", dir.file("absent"), 0, defaults(), KVH_ERR_IO, "not a folder"},
      {"a folder without config.json", dir.path().string(), 0, defaults(), KVH_ERR_IO, "no config.json"},
      {"layer -1", llama3, -1, defaults(), KVH_ERR_INVALID_ARGUMENT, "layer_index = -1"},
      {"layer beyond num_hidden_layers", llama3, 3, defaults(), KVH_ERR_INVALID_ARGUMENT, "num_hidden_layers 3"},
      {"num_heads contradicting config.json", llama3, 0, heads_wrong, KVH_ERR_INVALID_ARGUMENT, "num_heads"},
      {"rope_theta contradicting config.json", llama3, 0, theta_wrong, KVH_ERR_INVALID_ARGUMENT, "rope_theta"},
      {"a prefix", llama3, 0, prefix_set, KVH_ERR_INVALID_ARGUMENT, "prefix"},
      {"logit_softcap contradicting config.json", gemma2, 1, softcap_wrong, KVH_ERR_INVALID_ARGUMENT, "logit_softcap"},
      {"sinks with a model folder", gemma2, 1, sinks_set, KVH_ERR_INVALID_ARGUMENT, "sinks"},
  };
  for (const row& r : rows) {
    INFO(r.what);
    kvh_layer* layer = nullptr;
    CHECK(kvh_layer_open_model(r.folder.c_str(), r.layer_index, &r.options, &layer) == r.status);
    CHECK(layer == nullptr);
    CHECK(std::string(kvh_last_error()).find(r.message) != std::string::npos);
  }
  const kvhead::test::temp_dir malformed;
  kvhead::test::write_file(malformed.file("config.json"), "{\"model_type\": \"llama\",");
  kvh_layer* layer = nullptr;
  const kvh_layer_options options = defaults();
  CHECK(kvh_layer_open_model(malformed.path().string().c_str(), 0, &options, &layer) == KVH_ERR_FORMAT);
  CHECK(std::string(kvh_last_error()).find("not valid JSON") != std::string::npos);
  CHECK(kvh_layer_open_model(nullptr, 0, &options, &layer) == KVH_ERR_INVALID_ARGUMENT);
  // A file the folder names that cannot be had is KVH_ERR_IO, as in kvh_layer_open, not FORMAT.
  const kvhead::test::temp_dir sharded;
  for (const auto& entry : std::filesystem::directory_iterator(llama3))
    std::filesystem::copy(entry.path(), sharded.path() / entry.path().filename());
  const std::string shard = sharded.file("model-00002-of-00002.safetensors");
  std::filesystem::remove(shard);
  CHECK(kvh_layer_open_model(sharded.path().string().c_str(), 2, &options, &layer) == KVH_ERR_IO);
  CHECK(std::string(kvh_last_error()).find("does not exist") != std::string::npos);
  std::filesystem::create_directory(shard);  // a shard that is a folder
  CHECK(kvh_layer_open_model(sharded.path().string().c_str(), 2, &options, &layer) == KVH_ERR_IO);
  CHECK(std::string(kvh_last_error()).find("is a directory") != std::string::npos);
  const kvhead::test::temp_dir piped;
  REQUIRE(::mkfifo(piped.file("config.json").c_str(), 0600) == 0);  // not a regular file, and no hang
  CHECK(kvh_layer_open_model(piped.path().string().c_str(), 0, &options, &layer) == KVH_ERR_IO);
  CHECK(std::string(kvh_last_error()).find("not a regular file") != std::string::npos);
  CHECK(layer == nullptr);
  CHECK_THROWS_AS(kvhead::load_model_layer(dir.file("absent"), 0), std::runtime_error);
  CHECK_THROWS_AS(kvhead::model_layer_config(llama3, 3), std::runtime_error);
}

TEST_CASE("C API kv_dtype: a bf16 or int8 cache decodes within its rounding of forward, a bad value is refused") {
  for (const int32_t dtype : {int32_t(KVH_KV_BF16), int32_t(KVH_KV_F16), int32_t(KVH_KV_INT8)}) {
    INFO("kv_dtype " << dtype);
    kvh_layer_options options = defaults();
    options.kv_dtype = dtype;
    kvh_layer* layer = nullptr;
    REQUIRE_MESSAGE(kvh_layer_open_model(llama3.c_str(), 1, &options, &layer) == KVH_OK, kvh_last_error());
    constexpr std::size_t tokens = 6;
    std::mt19937 random(9);
    const std::vector<float> x = kvhead::testing::random_values(tokens * 64, random, 1.0f);
    std::vector<float> forward(x.size()), decoded(x.size());
    REQUIRE(kvh_layer_forward(layer, x.data(), 1, tokens, 1, forward.data()) == KVH_OK);
    kvh_cache* cache = nullptr;
    REQUIRE(kvh_cache_create(layer, std::size_t{8} << 20, &cache) == KVH_OK);
    int64_t id = 0;
    REQUIRE(kvh_sequence_create(cache, &id) == KVH_OK);
    const int64_t all = tokens;
    REQUIRE(kvh_decode(layer, cache, &id, &all, 1, x.data(), decoded.data()) == KVH_OK);
    float largest = 0.0f, difference = 0.0f;
    for (std::size_t i = 0; i < x.size(); ++i) {
      largest = std::max(largest, std::abs(forward[i]));
      difference = std::max(difference, std::abs(forward[i] - decoded[i]));
    }
    // The ceilings on max |diff| / max |f32 output| (kv_cache.hpp
    // derives tighter bounds; this checks that the dtype reached the cache
    // and that it is not f32's bits).
    const float ceiling = dtype == KVH_KV_BF16 ? 1e-2f : dtype == KVH_KV_F16 ? 2e-3f : 3e-2f;
    CHECK(difference <= ceiling * largest);
    CHECK(difference > 0.0f);
    kvh_cache_destroy(cache);
    kvh_layer_close(layer);
  }
  kvh_layer_options options = defaults();
  options.kv_dtype = 7;
  kvh_layer* layer = nullptr;
  CHECK(kvh_layer_open_model(llama3.c_str(), 0, &options, &layer) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(layer == nullptr);
  CHECK(std::string(kvh_last_error()).find("kv_dtype") != std::string::npos);
}

TEST_CASE("C API variants: a folder's soft-capping and sinks as in C++, and logit_softcap and sinks in the options") {
  for (const auto& entry : {std::pair{"gemma2_softcap", 1}, std::pair{"gpt_oss_sinks", 1}}) {
    const std::string name = entry.first;  // not a structured binding: clang 14 cannot capture those
    const int32_t layer_index = entry.second;
    CAPTURE(name);
    const std::string folder = std::string(KVHEAD_MODELS_DIR) + "/" + name;
    kvh_layer_options options = defaults();
    if (name == "gemma2_softcap") options.logit_softcap = 1.5f;  // agrees with config.json
    kvh_layer* layer = nullptr;
    REQUIRE_MESSAGE(kvh_layer_open_model(folder.c_str(), layer_index, &options, &layer) == KVH_OK, kvh_last_error());
    const kvhead::attention_layer cpp_layer = kvhead::load_model_layer(folder, std::size_t(layer_index));
    const std::size_t d_model = std::size_t(kvh_layer_d_model(layer)), tokens = 7;
    std::mt19937 random(8);
    const std::vector<float> x = kvhead::testing::random_values(tokens * d_model, random, 3.0f);
    std::vector<float> c_out(x.size()), cpp_out(x.size());
    REQUIRE(kvh_layer_forward(layer, x.data(), 1, int64_t(tokens), 1, c_out.data()) == KVH_OK);
    cpp_layer.forward(x.data(), 1, tokens, cpp_out.data());
    CHECK(same_bits(c_out, cpp_out));
    kvh_layer_close(layer);
  }

  // kvh_layer_open: sinks far below every score change no bit; real ones and
  // a cap change the output; decoding equals the forward pass with both.
  const std::string weights = std::string(KVHEAD_MODELS_DIR) + "/gpt_oss_sinks/model.safetensors";
  kvh_layer_options options = defaults();
  options.num_heads = 8;
  options.num_kv_heads = 2;
  options.rope_theta = 10000.0f;
  options.prefix = "model.layers.1.self_attn.";
  constexpr std::size_t tokens = 11, d_model = 64;
  std::mt19937 random(9);
  const std::vector<float> x = kvhead::testing::random_values(tokens * d_model, random, 3.0f);
  auto forward = [&](const kvh_layer_options& o) {
    kvh_layer* layer = nullptr;
    REQUIRE_MESSAGE(kvh_layer_open(weights.c_str(), &o, &layer) == KVH_OK, kvh_last_error());
    std::vector<float> y(x.size()), decoded(x.size());
    REQUIRE(kvh_layer_forward(layer, x.data(), 1, int64_t(tokens), 1, y.data()) == KVH_OK);
    kvh_cache* cache = nullptr;
    REQUIRE(kvh_cache_create(layer, std::size_t{8} << 20, &cache) == KVH_OK);
    int64_t id = 0;
    REQUIRE(kvh_sequence_create(cache, &id) == KVH_OK);
    const int64_t first = 4, rest = int64_t(tokens) - first;
    REQUIRE(kvh_decode(layer, cache, &id, &first, 1, x.data(), decoded.data()) == KVH_OK);
    REQUIRE(kvh_decode(layer, cache, &id, &rest, 1, x.data() + first * d_model, decoded.data() + first * d_model) ==
            KVH_OK);
    CHECK(same_bits(decoded, y));
    kvh_cache_destroy(cache);
    kvh_layer_close(layer);
    return y;
  };
  const std::vector<float> plain = forward(options);
  const std::vector<float> far_below(8, -1e30f);
  options.sinks = far_below.data();
  CHECK(same_bits(forward(options), plain));
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, 3.0f, -2.0f, 0.25f};
  options.sinks = sinks.data();
  const std::vector<float> with_sinks = forward(options);
  CHECK(!same_bits(with_sinks, plain));
  options.logit_softcap = 1.0f;
  CHECK(!same_bits(forward(options), with_sinks));

  // A caller built before logit_softcap and sinks: their bytes, garbage
  // here, lie past its struct_size and are never read.
  kvh_layer_options older = options;
  older.struct_size = offsetof(kvh_layer_options, logit_softcap);
  older.logit_softcap = -1.0f;
  older.sinks = reinterpret_cast<const float*>(std::uintptr_t{1});
  options.sinks = nullptr;
  options.logit_softcap = 0.0f;
  CHECK(same_bits(forward(older), plain));

  kvh_layer* layer = nullptr;
  options.logit_softcap = -1.0f;
  CHECK(kvh_layer_open(weights.c_str(), &options, &layer) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(std::string(kvh_last_error()).find("logit_softcap") != std::string::npos);
  options.logit_softcap = 0.0f;
  const std::vector<float> bad_sinks = {0.0f, 0.0f, NAN, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  options.sinks = bad_sinks.data();
  CHECK(kvh_layer_open(weights.c_str(), &options, &layer) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(std::string(kvh_last_error()).find("sinks[2]") != std::string::npos);
  CHECK(layer == nullptr);

  // ALiBi slopes: zeros change no bit, BLOOM's change the output, decoding
  // equals the forward pass with them (in `forward`); an older caller's
  // bytes past its struct_size are never read; a bad slope is refused, a
  // model folder takes none.
  options.sinks = nullptr;
  const std::vector<float> zeros(8, 0.0f), slopes = kvhead::alibi_slopes(8);
  options.alibi_slopes = zeros.data();
  CHECK(same_bits(forward(options), plain));
  options.alibi_slopes = slopes.data();
  CHECK(!same_bits(forward(options), plain));
  older = options;
  older.struct_size = offsetof(kvh_layer_options, alibi_slopes);
  older.alibi_slopes = reinterpret_cast<const float*>(std::uintptr_t{1});
  CHECK(same_bits(forward(older), plain));
  std::vector<float> bad_slopes = slopes;
  bad_slopes[5] = INFINITY;
  options.alibi_slopes = bad_slopes.data();
  CHECK(kvh_layer_open(weights.c_str(), &options, &layer) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(std::string(kvh_last_error()).find("alibi_slopes[5]") != std::string::npos);
  kvh_layer_options model_options = defaults();
  model_options.alibi_slopes = slopes.data();
  CHECK(kvh_layer_open_model((std::string(KVHEAD_MODELS_DIR) + "/gpt_oss_sinks").c_str(), 1, &model_options, &layer) ==
        KVH_ERR_INVALID_ARGUMENT);
  CHECK(std::string(kvh_last_error()).find("alibi_slopes must be NULL with a model folder") != std::string::npos);
  CHECK(layer == nullptr);
}

TEST_CASE("C API precision: bf16 layers equal kvhead::load_model_layer's, decode as they forward, within 2e-2 of f32") {
  const std::string qwen3 = std::string(KVHEAD_MODELS_DIR) + "/qwen3_qk_norm";  // BF16 weights, kept as bf16
  for (const std::string& folder : {llama3, qwen3}) {
    CAPTURE(folder);
    const int32_t index = 1;
    const kvhead::attention_config config = kvhead::model_layer_config(folder, index);
    kvh_layer_options options = defaults();
    CHECK(options.precision == KVH_PRECISION_F32);
    kvh_layer *f32 = nullptr, *bf16 = nullptr;
    REQUIRE_MESSAGE(kvh_layer_open_model(folder.c_str(), index, &options, &f32) == KVH_OK, kvh_last_error());
    options.precision = KVH_PRECISION_BF16;
    REQUIRE_MESSAGE(kvh_layer_open_model(folder.c_str(), index, &options, &bf16) == KVH_OK, kvh_last_error());
    const kvhead::attention_layer cpp_layer = kvhead::load_model_layer(folder, index, kvhead::precision::bf16);
    CHECK(cpp_layer.config().precision == kvhead::precision::bf16);

    constexpr std::size_t tokens = 9;
    const std::size_t d_model = config.d_model;
    std::mt19937 random(5);
    const std::vector<float> x = kvhead::testing::random_values(tokens * d_model, random, 1.0f);
    std::vector<float> y32(x.size()), y16(x.size()), cpp_out(x.size()), decoded(x.size());
    REQUIRE(kvh_layer_forward(f32, x.data(), 1, tokens, 1, y32.data()) == KVH_OK);
    REQUIRE(kvh_layer_forward(bf16, x.data(), 1, tokens, 1, y16.data()) == KVH_OK);
    cpp_layer.forward(x.data(), 1, tokens, cpp_out.data());
    CHECK(same_bits(y16, cpp_out));
    float largest = 0.0f, difference = 0.0f;
    for (std::size_t i = 0; i < x.size(); ++i) {
      largest = std::max(largest, std::abs(y32[i]));
      difference = std::max(difference, std::abs(y16[i] - y32[i]));
    }
    CHECK(difference <= 2e-2f * largest);
    CHECK(difference > 0.0f);

    kvh_cache* cache = nullptr;
    REQUIRE(kvh_cache_create(bf16, std::size_t{8} << 20, &cache) == KVH_OK);
    int64_t id = 0;
    REQUIRE(kvh_sequence_create(cache, &id) == KVH_OK);
    for (std::size_t t = 0; t < tokens; ++t) {
      const int64_t one = 1;
      REQUIRE(kvh_decode(bf16, cache, &id, &one, 1, x.data() + t * d_model, decoded.data() + t * d_model) == KVH_OK);
    }
    CHECK(same_bits(decoded, y16));
    kvh_cache_destroy(cache);
    kvh_layer_close(bf16);
    kvh_layer_close(f32);
  }
  kvh_layer_options options = defaults();
  options.precision = 2;
  kvh_layer* layer = nullptr;
  CHECK(kvh_layer_open_model(llama3.c_str(), 0, &options, &layer) == KVH_ERR_INVALID_ARGUMENT);
  CHECK(layer == nullptr);
  CHECK(std::string(kvh_last_error()).find("options->precision = 2") != std::string::npos);
}
