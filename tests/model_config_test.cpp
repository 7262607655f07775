// config.json to a layer configuration (engine/io/model_config.hpp) and a
// model folder to a loaded layer (engine/io/model_folder.hpp), through the C++
// API a server uses: each family's fields land where they should, and the
// older and newer spellings of RoPE scaling read alike.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/io/file_error.hpp"
#include "engine/io/model_config.hpp"
#include "engine/io/model_folder.hpp"
#include "kvhead/model.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// read_model_config on `config` written to a temporary config.json.
kvhead::io::model_layer_spec spec_of(const json& config, std::size_t layer = 0) {
  const fs::path path =
      fs::temp_directory_path() / ("kvhead-model-config-test-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << config.dump();
  struct remover {
    fs::path p;
    ~remover() { fs::remove(p); }
  } cleanup{path};
  return kvhead::io::read_model_config(path.string(), layer);
}

json llama() {
  return {{"model_type", "llama"},          {"hidden_size", 64},      {"num_attention_heads", 4},
          {"num_key_value_heads", 2},       {"num_hidden_layers", 2}, {"rope_theta", 500000.0},
          {"max_position_embeddings", 1024}};
}

std::string error_of(const json& config, std::size_t layer = 0) {
  try {
    spec_of(config, layer);
  } catch (const kvhead::io::file_error& error) {
    return error.what();
  }
  return "";
}

/// error_of for config.json's text as given (a value too deep for json::dump).
std::string error_of_text(const std::string& text) {
  const fs::path path =
      fs::temp_directory_path() / ("kvhead-model-config-text-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << text;
  struct remover {
    fs::path p;
    ~remover() { fs::remove(p); }
  } cleanup{path};
  try {
    kvhead::io::read_model_config(path.string(), 0);
  } catch (const kvhead::io::file_error& error) {
    return error.what();
  }
  return "";
}

bool names(const std::string& message, const std::string& part) { return message.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("model config: llama defaults, and the layer's shape") {
  const kvhead::io::model_layer_spec spec = spec_of(llama());
  CHECK(spec.model_type == "llama");
  CHECK(spec.config.num_heads == 4);
  CHECK(spec.config.num_kv_heads == 2);
  CHECK(spec.config.head_dim == 16);
  CHECK(spec.config.d_model == 64);
  CHECK(spec.config.rotary_dim == 16);
  CHECK(spec.config.causal);
  CHECK(spec.config.rope_theta == 500000.0);
  CHECK(spec.config.rope_scaling.type == kvhead::rope_scaling::kind::none);
  CHECK(*spec.config.scale == float(1.0 / std::sqrt(16.0)));
  CHECK(!spec.qkv_bias);
  CHECK(!spec.o_bias);
  CHECK(!spec.config.qk_norm_eps);
  json no_kv = llama();
  no_kv.erase("num_key_value_heads");
  no_kv.erase("rope_theta");
  CHECK(spec_of(no_kv).config.num_kv_heads == 4);      // absent: MHA
  CHECK(spec_of(no_kv).config.rope_theta == 10000.0);  // HF's default
  json biased = llama();
  biased["attention_bias"] = true;
  CHECK(spec_of(biased).qkv_bias);
  CHECK(spec_of(biased).o_bias);
}

TEST_CASE("model config: rope_scaling and rope_parameters, type and rope_type, read alike") {
  json old_style = llama();
  old_style["rope_scaling"] = {{"type", "yarn"},   {"factor", 4},   {"original_max_position_embeddings", 256},
                               {"beta_fast", 0},   {"mscale", 0.7}, {"mscale_all_dim", 0.9},
                               {"truncate", false}};
  json new_style = llama();
  new_style.erase("rope_theta");
  new_style["rope_parameters"] = old_style["rope_scaling"];
  new_style["rope_parameters"]["rope_theta"] = 500000.0;
  new_style["rope_parameters"].erase("type");
  new_style["rope_parameters"]["rope_type"] = "yarn";
  for (const json& config : {old_style, new_style}) {
    const kvhead::io::model_layer_spec spec = spec_of(config);
    const kvhead::rope_scaling& s = spec.config.rope_scaling;
    CHECK(spec.config.rope_theta == 500000.0);
    CHECK(s.type == kvhead::rope_scaling::kind::yarn);
    CHECK(s.factor == 4.0);
    CHECK(s.original_max_position_embeddings == 256.0);
    CHECK(s.beta_fast == 32.0);  // HF: `get("beta_fast") or 32`
    CHECK(s.beta_slow == 1.0);
    CHECK(s.mscale == 0.7);
    CHECK(s.mscale_all_dim == 0.9);
    CHECK(!s.truncate);
    CHECK(!s.attention_factor);
  }
  json no_factor = llama();
  no_factor["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 256}};
  CHECK(spec_of(no_factor).config.rope_scaling.factor == 4.0);  // 1024 / 256
  json both = old_style;
  both["rope_parameters"] = {{"rope_type", "default"}};
  CHECK(error_of(both).find("both given") != std::string::npos);
  json llama3 = llama();
  llama3["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}};
  CHECK(error_of(llama3).find("'rope_scaling.high_freq_factor' is missing") != std::string::npos);
  // YaRN at theta 1 divides by ln 1 (HF: ZeroDivisionError): refused, where it
  // gave NaN frequencies and NaN outputs. Plain RoPE at theta 1 is fine.
  json yarn_theta_1 = old_style;
  yarn_theta_1["rope_theta"] = 1.0;
  CHECK(error_of(yarn_theta_1).find("needs rope_theta other than 1") != std::string::npos);
  json plain_theta_1 = llama();
  plain_theta_1["rope_theta"] = 1.0;
  CHECK(spec_of(plain_theta_1).config.rope_theta == 1.0);
}

TEST_CASE("model config: each family's twists") {
  json qwen3 = llama();
  qwen3["model_type"] = "qwen3";
  qwen3["head_dim"] = 24;
  qwen3["rms_norm_eps"] = 1e-5;
  const kvhead::io::model_layer_spec q3 = spec_of(qwen3);
  CHECK(q3.config.head_dim == 24);
  CHECK(*q3.config.qk_norm_eps == 1e-5f);
  CHECK(*q3.config.scale == float(1.0 / std::sqrt(24.0)));
  json qwen2 = llama();
  qwen2["model_type"] = "qwen2";
  qwen2["use_sliding_window"] = true;
  qwen2["sliding_window"] = 128;
  qwen2["max_window_layers"] = 1;
  CHECK(spec_of(qwen2, 0).qkv_bias);  // below max_window_layers: full attention
  CHECK(!spec_of(qwen2, 0).o_bias);
  CHECK(spec_of(qwen2, 0).config.sliding_window == 0);
  CHECK(spec_of(qwen2, 1).config.sliding_window == 128);  // from max_window_layers on
  qwen2["use_sliding_window"] = false;
  CHECK(spec_of(qwen2, 1).config.sliding_window == 0);
  qwen2["layer_types"] = {"full_attention", "sliding_attention"};
  CHECK(error_of(qwen2, 1).find("'use_sliding_window' is not true") != std::string::npos);
  qwen2["use_sliding_window"] = true;
  CHECK(spec_of(qwen2, 1).config.sliding_window == 128);
  json phi3 = llama();
  phi3["model_type"] = "phi3";
  phi3["partial_rotary_factor"] = 0.75;
  CHECK(spec_of(phi3).fused_qkv);
  CHECK(spec_of(phi3).config.rotary_dim == 12);
  phi3["partial_rotary_factor"] = 0.7;  // int(16 * 0.7) = 11: odd
  CHECK(error_of(phi3).find("must be even") != std::string::npos);
  json partial_llama = llama();
  partial_llama["partial_rotary_factor"] = 0.5;
  CHECK(error_of(partial_llama).find("partial_rotary_factor") != std::string::npos);
  json gemma2 = llama();
  gemma2["model_type"] = "gemma2";
  gemma2["attn_logit_softcapping"] = nullptr;
  gemma2["query_pre_attn_scalar"] = 144;
  CHECK(*spec_of(gemma2, 1).config.scale == float(1.0 / 12.0));
  CHECK(spec_of(gemma2, 0).config.sliding_window == 4096);  // even layers slide; absent: 4096
  CHECK(spec_of(gemma2, 1).config.sliding_window == 0);
  CHECK(spec_of(gemma2, 1).config.logit_softcap == 0.0f);  // null: none
  gemma2.erase("attn_logit_softcapping");  // HF's default is 50
  CHECK(spec_of(gemma2, 1).config.logit_softcap == 50.0f);
  gemma2["attn_logit_softcapping"] = 30.5;
  CHECK(spec_of(gemma2, 1).config.logit_softcap == 30.5f);
  for (const json& bad : {json(0.0), json(-1.0), json("50"), json(1e300)}) {
    gemma2["attn_logit_softcapping"] = bad;
    CHECK(error_of(gemma2, 1).find("'attn_logit_softcapping'") != std::string::npos);
  }
  json capped_llama = llama();
  capped_llama["attn_logit_softcapping"] = 50.0;
  CHECK(error_of(capped_llama).find("only gemma2") != std::string::npos);
  capped_llama["attn_logit_softcapping"] = nullptr;
  CHECK(spec_of(capped_llama).config.logit_softcap == 0.0f);
  json mistral = llama();
  mistral["model_type"] = "mistral";
  CHECK(spec_of(mistral).config.sliding_window == 4096);  // absent: 4096
  mistral["sliding_window"] = 5;
  CHECK(spec_of(mistral, 1).config.sliding_window == 5);
  mistral["sliding_window"] = 0;
  CHECK(error_of(mistral).find("'sliding_window' must be a positive whole number") != std::string::npos);
  mistral["sliding_window"] = nullptr;
  CHECK(spec_of(mistral).config.num_heads == 4);
  CHECK(spec_of(mistral).config.sliding_window == 0);
  // layer_types is read where HF's code reads it (Gemma 2, gpt-oss, Qwen 2/3);
  // Mistral's HF code warns and ignores it, Llama's never slides.
  json typed = llama();
  typed["model_type"] = "gemma2";
  typed["head_dim"] = 16;
  typed["layer_types"] = {"full_attention", "sliding_attention"};
  typed["sliding_window"] = nullptr;
  CHECK(error_of(typed, 1).find("'sliding_window' is null") != std::string::npos);
  typed["sliding_window"] = 7;
  CHECK(spec_of(typed, 0).config.sliding_window == 0);
  CHECK(spec_of(typed, 1).config.sliding_window == 7);
  // A bad entry is refused whichever layer is asked for (HF validates the list).
  json misspelt = typed;
  misspelt["layer_types"] = {"sliding", "full_attention"};
  CHECK(error_of(misspelt, 1).find("'layer_types' entry 0 is 'sliding'") != std::string::npos);
  typed["model_type"] = "llama";
  CHECK(spec_of(typed, 1).config.sliding_window == 0);
  typed["model_type"] = "mistral";
  CHECK(spec_of(typed, 0).config.sliding_window == 7);  // every layer, whatever layer_types says
}

TEST_CASE("model config: HF's per-family defaults for absent shapes and windows") {
  // configuration_*.py: num_key_value_heads (absent) Mistral 8, Qwen 2/3 32,
  // Gemma 2 4, gpt-oss 8, Llama and Phi-3 the heads (null: the heads);
  // head_dim (absent) Gemma 2 256, Qwen 3 128, gpt-oss 64, else hidden / heads.
  json wide = llama();
  wide["hidden_size"] = 2048;
  wide["num_attention_heads"] = 32;
  wide.erase("num_key_value_heads");
  const std::pair<const char*, std::pair<std::size_t, std::size_t>> families[] = {
      {"llama", {32, 64}},  {"phi3", {32, 64}},   {"mistral", {8, 64}}, {"qwen2", {32, 64}},
      {"qwen3", {32, 128}}, {"gemma2", {4, 256}}, {"gpt_oss", {8, 64}}};
  for (const auto& entry : families) {  // no structured binding: INFO's lambda captures it (clang 14)
    const std::string family = entry.first;
    json config = wide;
    config["model_type"] = family;
    const kvhead::attention_config c = spec_of(config, 1).config;
    INFO(family);
    CHECK(c.num_kv_heads == entry.second.first);
    CHECK(c.head_dim == entry.second.second);
    config["num_key_value_heads"] = nullptr;  // null: MHA in every family
    config["head_dim"] = nullptr;             // null: hidden / heads
    CHECK(spec_of(config, 1).config.num_kv_heads == 32);
    CHECK(spec_of(config, 1).config.head_dim == 64);
  }
  json mistral = wide;
  mistral["model_type"] = "mistral";
  mistral["num_attention_heads"] = 12;  // not a multiple of the default 8
  CHECK(error_of(mistral).find("num_key_value_heads 8 (absent: mistral's default in HF)") != std::string::npos);
  // Qwen 2/3 with use_sliding_window and no sliding_window: HF's 4096, from max_window_layers on.
  json qwen = llama();
  qwen["model_type"] = "qwen2";
  qwen["use_sliding_window"] = true;
  qwen["max_window_layers"] = 1;
  CHECK(spec_of(qwen, 0).config.sliding_window == 0);
  CHECK(spec_of(qwen, 1).config.sliding_window == 4096);
  qwen["sliding_window"] = nullptr;  // null: no window anywhere
  CHECK(spec_of(qwen, 1).config.sliding_window == 0);
  // Phi-3 takes no rope type but default and longrope (HF reads su and yarn as longrope, refuses the others).
  json phi3 = llama();
  phi3["model_type"] = "phi3";
  phi3["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  CHECK(error_of(phi3).find("Phi-3 in HF takes default or longrope") != std::string::npos);
  phi3["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 512}};
  CHECK(error_of(phi3).find("'rope_scaling.short_factor' is missing (needed by rope type 'longrope')") !=
        std::string::npos);
}

TEST_CASE("model config: longrope (Phi-3, Phi-4-mini) as HF reads it") {
  using kvhead::rope_scaling;
  const std::vector<double> short_factor = {1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5},
                            long_factor = {1.0, 1.5, 3.0, 8.0, 16.0, 24.0, 40.0, 60.0};
  json phi3 = llama();  // hidden 64, 4 heads: head_dim 16, 8 rotated pairs
  phi3["model_type"] = "phi3";
  phi3["max_position_embeddings"] = 131072;
  phi3["original_max_position_embeddings"] = 4096;
  phi3["rope_scaling"] = {{"type", "su"}, {"short_factor", short_factor}, {"long_factor", long_factor}};
  const rope_scaling s = spec_of(phi3).config.rope_scaling;
  CHECK(s.type == rope_scaling::kind::longrope);
  CHECK(s.short_factor == short_factor);
  CHECK(s.long_factor == long_factor);
  CHECK(s.original_max_position_embeddings == 4096.0);
  CHECK(s.factor == 32.0);  // max_position_embeddings / original: HF's, for the attention factor
  CHECK(!s.attention_factor);
  CHECK(s.longrope_factors == rope_scaling::longrope_pick::per_call);
  phi3["rope_scaling"]["type"] = "longrope";
  phi3["rope_scaling"]["attention_factor"] = 1.25;
  CHECK(*spec_of(phi3).config.rope_scaling.attention_factor == 1.25);
  // Phi3Config's defaults: both lengths 4096, so a factor of 1.
  json defaults = phi3;
  defaults.erase("max_position_embeddings");
  defaults.erase("original_max_position_embeddings");
  CHECK(spec_of(defaults).config.rope_scaling.original_max_position_embeddings == 4096.0);
  CHECK(spec_of(defaults).config.rope_scaling.factor == 1.0);
  // Partial rotary (Phi-4-mini): one factor per rotated pair.
  json partial = phi3;
  partial["partial_rotary_factor"] = 0.75;  // rotary_dim 12: 6 pairs
  CHECK(error_of(partial).find("short_factor must hold rotary_dim / 2 = 6 numbers, got 8") != std::string::npos);
  partial["rope_scaling"]["short_factor"] = std::vector<double>(6, 1.0);
  partial["rope_scaling"]["long_factor"] = std::vector<double>(6, 4.0);
  CHECK(spec_of(partial).config.rotary_dim == 12);
  // Other families: rope_type longrope, L from rope_scaling or max_position_embeddings.
  json llama_long = llama();  // max_position_embeddings 1024
  llama_long["rope_scaling"] = {
      {"rope_type", "longrope"}, {"short_factor", short_factor}, {"long_factor", long_factor}};
  CHECK(spec_of(llama_long).config.rope_scaling.original_max_position_embeddings == 1024.0);
  CHECK(spec_of(llama_long).config.rope_scaling.factor == 1.0);
  llama_long["rope_scaling"]["original_max_position_embeddings"] = 256;
  CHECK(spec_of(llama_long).config.rope_scaling.factor == 4.0);
  llama_long["rope_scaling"]["factor"] = 3.0;  // no top-level L: 4.x and 5 both read the factor
  CHECK(spec_of(llama_long).config.rope_scaling.factor == 3.0);
  // Where transformers 4.x and 5 would read different numbers, or none makes sense.
  json both = phi3;
  both["rope_scaling"]["original_max_position_embeddings"] = 2048;
  CHECK(error_of(both).find("disagree: transformers 4.x reads the second, 5 the first") != std::string::npos);
  json factor = phi3;
  factor["rope_scaling"]["factor"] = 16.0;
  CHECK(error_of(factor).find("'rope_scaling.factor' (16) is not max_position_embeddings") != std::string::npos);
  json bad = phi3;
  bad["rope_scaling"]["long_factor"] = 4.0;
  CHECK(error_of(bad).find("'rope_scaling.long_factor' must be a list of numbers") != std::string::npos);
  bad["rope_scaling"]["long_factor"] = {1.0, "2", 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};
  CHECK(error_of(bad).find("must be a list of finite numbers, got '2'") != std::string::npos);
  bad["rope_scaling"]["long_factor"] = std::vector<double>(8, -1.0);
  CHECK(error_of(bad).find("long_factor must be positive and finite, got -1") != std::string::npos);
  bad["rope_scaling"] = {
      {"type", "longrope"}, {"short_factor", short_factor}, {"long_factor", long_factor}, {"low_freq_factor", 1.0}};
  CHECK(error_of(bad).find("'rope_scaling.low_freq_factor' is not understood for rope type 'longrope'") !=
        std::string::npos);
  bad = phi3;
  bad["original_max_position_embeddings"] = 1;  // the attention factor divides by ln 1
  CHECK(error_of(bad).find("original_max_position_embeddings must be above 1, got 1") != std::string::npos);
}

TEST_CASE("model config: gpt_oss defaults (HF GptOssConfig): yarn RoPE, theta 150000, all four biases, sinks") {
  json oss = {{"model_type", "gpt_oss"},          {"hidden_size", 64}, {"num_attention_heads", 8},
              {"num_key_value_heads", 2},         {"head_dim", 16},    {"num_hidden_layers", 4},
              {"max_position_embeddings", 131072}};
  const kvhead::io::model_layer_spec spec = spec_of(oss, 1);
  CHECK(spec.sinks);
  CHECK(spec.qkv_bias);  // attention_bias absent: true for gpt-oss
  CHECK(spec.o_bias);
  CHECK(spec.config.rope_theta == 150000.0);
  const kvhead::rope_scaling& yarn = spec.config.rope_scaling;
  CHECK(yarn.type == kvhead::rope_scaling::kind::yarn);
  CHECK(yarn.factor == 32.0);
  CHECK(yarn.beta_fast == 32.0);
  CHECK(yarn.beta_slow == 1.0);
  CHECK(!yarn.truncate);
  CHECK(yarn.original_max_position_embeddings == 4096.0);
  CHECK(*spec.config.scale == 0.25f);  // head_dim^-0.5
  CHECK(spec.config.logit_softcap == 0.0f);
  // Even layers slide (HF: layer_types from (i + 1) % 2), window absent: 128.
  CHECK(spec_of(oss, 0).config.sliding_window == 128);
  CHECK(spec_of(oss, 2).config.sliding_window == 128);
  CHECK(spec_of(oss, 1).config.sliding_window == 0);
  oss["layer_types"] = {"full_attention", "full_attention", "full_attention", "sliding_attention"};
  CHECK(spec_of(oss, 0).sinks);
  CHECK(spec_of(oss, 0).config.sliding_window == 0);
  oss["sliding_window"] = 64;
  CHECK(spec_of(oss, 3).config.sliding_window == 64);
  oss["attention_bias"] = false;
  CHECK(!spec_of(oss, 1).qkv_bias);
  CHECK(!spec_of(oss, 1).o_bias);
  oss["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 2048}};
  oss["rope_theta"] = 10000.0;
  CHECK(spec_of(oss, 1).config.rope_scaling.factor == 8.0);
  CHECK(spec_of(oss, 1).config.rope_scaling.truncate);  // given without truncate: HF's default, true
  CHECK(spec_of(oss, 1).config.rope_theta == 10000.0);
}

TEST_CASE("model config: null, zero and conflicting fields are read as Hugging Face reads them") {
  // A null HF computes with (None in arithmetic) is refused, not read as the default.
  json qwen3 = llama();
  qwen3["model_type"] = "qwen3";
  qwen3["rms_norm_eps"] = nullptr;
  CHECK(names(error_of(qwen3), "field 'rms_norm_eps' is null"));
  json theta = llama();
  theta["rope_theta"] = nullptr;
  CHECK(names(error_of(theta), "field 'rope_theta' is null"));
  theta.erase("rope_theta");
  theta["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", nullptr}};
  CHECK(names(error_of(theta), "field 'rope_parameters.rope_theta' is null"));
  json gemma2 = llama();
  gemma2["model_type"] = "gemma2";
  gemma2["query_pre_attn_scalar"] = nullptr;
  CHECK(names(error_of(gemma2), "field 'query_pre_attn_scalar' is null"));
  json phi3 = llama();
  phi3["model_type"] = "phi3";
  phi3["partial_rotary_factor"] = nullptr;
  CHECK(names(error_of(phi3), "field 'partial_rotary_factor' is null"));
  // A null HF tests for truth: false. yarn's truncate (`get("truncate", True)`, then `if truncate:`):
  json yarn = llama();
  yarn["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 64}, {"truncate", nullptr}};
  CHECK(!spec_of(yarn).config.rope_scaling.truncate);
  yarn["rope_scaling"].erase("truncate");
  CHECK(spec_of(yarn).config.rope_scaling.truncate);
  // attention_bias null: nn.Linear(bias=None), no biases, in gpt-oss (default true) too.
  json oss = llama();
  oss["model_type"] = "gpt_oss";
  oss["attention_bias"] = nullptr;
  CHECK(!spec_of(oss).qkv_bias);
  CHECK(!spec_of(oss).o_bias);
  // type and rope_type both given and different: transformers 4.x and 5 disagree.
  json both = llama();
  both["rope_scaling"] = {
      {"rope_type", "linear"}, {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 256}};
  CHECK(names(error_of(both), "fields 'rope_scaling.rope_type' ('linear') and 'rope_scaling.type' ('yarn') disagree"));
  both["rope_scaling"]["rope_type"] = "yarn";  // the same: read
  CHECK(spec_of(both).config.rope_scaling.type == kvhead::rope_scaling::kind::yarn);
  // gpt-oss's rope_scaling null: no scaling in transformers 4.55-4.57, its default yarn later.
  json oss_null = llama();
  oss_null["model_type"] = "gpt_oss";
  oss_null["rope_scaling"] = nullptr;
  CHECK(names(error_of(oss_null), "field 'rope_scaling' is null"));
  oss_null.erase("rope_scaling");
  CHECK(spec_of(oss_null).config.rope_scaling.factor == 32.0);
  oss_null["rope_parameters"] = nullptr;  // not read by 4.55-4.57, the default yarn later: the yarn either way
  CHECK(spec_of(oss_null).config.rope_scaling.factor == 32.0);
  // Qwen 2: max_window_layers 0 (every layer slides), and null only where it is read.
  json qwen2 = llama();
  qwen2["model_type"] = "qwen2";
  qwen2["sliding_window"] = 96;
  qwen2["max_window_layers"] = 0;
  CHECK(spec_of(qwen2, 0).config.sliding_window == 0);  // use_sliding_window absent: no window
  qwen2["use_sliding_window"] = true;
  CHECK(spec_of(qwen2, 0).config.sliding_window == 96);
  qwen2["max_window_layers"] = nullptr;
  CHECK(names(error_of(qwen2, 0), "field 'max_window_layers' is null"));
  qwen2["use_sliding_window"] = false;
  CHECK(spec_of(qwen2, 0).config.sliding_window == 0);
  // No head_dim: hidden_size // num_attention_heads, a remainder or not.
  json uneven = llama();
  uneven["hidden_size"] = 66;
  CHECK(spec_of(uneven).config.head_dim == 16);
  CHECK(spec_of(uneven).config.d_model == 66);
  uneven["hidden_size"] = 3;
  CHECK(names(error_of(uneven), "hidden_size 3 // num_attention_heads 4 is 0"));
  // llama3: a factor below 1 and frequency factors out of order, which HF only warns about.
  json llama3 = llama();
  llama3["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 0.5},
                            {"low_freq_factor", 4.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}};
  CHECK(spec_of(llama3).config.rope_scaling.factor == 0.5);
}

TEST_CASE("model config: fields of the wrong type or value name the field") {
  json bad = llama();
  bad["num_attention_heads"] = "4";
  CHECK(error_of(bad).find("'num_attention_heads' must be a positive whole number") != std::string::npos);
  bad = llama();
  bad["hidden_size"] = -64;
  CHECK(error_of(bad).find("'hidden_size'") != std::string::npos);
  bad = llama();
  bad["torch_dtype"] = "float8_e4m3fn";
  CHECK(error_of(bad).find("'torch_dtype'") != std::string::npos);
  bad = llama();
  bad["kv_lora_rank"] = 512;
  CHECK(error_of(bad).find("latent attention") != std::string::npos);
  bad = llama();
  bad.erase("model_type");
  CHECK(error_of(bad).find("'model_type' is missing") != std::string::npos);
}

TEST_CASE("model config: a hostile value is named briefly, never serialized") {
  // An array nested 100000 deep where a count belongs, and as a layer_types
  // entry: json::dump recursed once per level and overflowed the stack.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string head =
      R"({"model_type": "gemma2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, )"
      R"("head_dim": 16, )";
  const std::string count_error = error_of_text(head + R"("num_hidden_layers": )" + deep + "}");
  CHECK(names(count_error, "'num_hidden_layers' must be a positive whole number, got an array"));
  CHECK(count_error.size() < 400);
  const std::string entry_error = error_of_text(head + R"("num_hidden_layers": 1, "layer_types": [)" + deep + "]}");
  CHECK(names(entry_error, "'layer_types' entry 0 is an array"));
  CHECK(entry_error.size() < 400);
  // A byte order mark before valid JSON: refused, as Hugging Face's json.loads does.
  CHECK(names(error_of_text("\xEF\xBB\xBF" + llama().dump()), "begins with a UTF-8 byte order mark"));
  json bad = llama();
  bad["rope_theta"] = std::string(100000, 'x');
  const std::string text_error = error_of(bad);
  CHECK(names(text_error, "'rope_theta' must be a finite number, got 'xxx"));
  CHECK(text_error.size() < 400);
}

TEST_CASE("model config: values the layer would refuse are refused here, naming the field") {
  json bad = llama();
  bad["head_dim"] = std::numeric_limits<std::uint64_t>::max();  // 2^64 - 1: its weights' sizes wrap
  CHECK(names(error_of(bad), "head_dim 18446744073709551615 and hidden_size 64 make weights too large"));
  bad = llama();
  bad["num_attention_heads"] = bad["num_key_value_heads"] = bad["head_dim"] = std::uint64_t{1} << 32;
  CHECK(names(error_of(bad), "too large to address"));
  bad = llama();
  bad["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0.0}};
  CHECK(names(error_of(bad), "field 'rope_scaling': rope_scaling factor must be positive"));
  bad = llama();
  bad["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 0.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  CHECK(names(error_of(bad), "field 'rope_scaling': llama3 rope_scaling needs positive low_freq_factor"));
  bad = llama();
  bad["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 1e-308}};  // every angle past position 1 infinite
  CHECK(names(error_of(bad), "field 'rope_scaling': rope_scaling factor 1e-308 is too small"));
  bad = llama();
  bad["rope_theta"] = 1e-40;
  bad["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};  // frequencies up to 1 / theta / 2
  CHECK(names(error_of(bad), "field 'rope_theta': rope_theta 1e-40 is too small"));
  bad["rope_theta"] = 1e-30;
  bad["rope_scaling"]["factor"] = 1e-10;  // theta fine alone, not over this factor
  CHECK(names(error_of(bad), "rope_scaling factor 1e-10 is too small"));
  bad = llama();
  bad["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 0}};
  CHECK(names(error_of(bad), "field 'rope_parameters': rope_scaling original_max_position_embeddings"));
  json gemma2 = llama();
  gemma2["model_type"] = "gemma2";
  gemma2["attn_logit_softcapping"] = 1e-300;  // positive, but 0 as a float: "none", silently
  CHECK(names(error_of(gemma2),
              "'attn_logit_softcapping' must be a positive float (or null: no soft-capping), "
              "got 1e-300"));
  gemma2["attn_logit_softcapping"] = 1e-30;  // a float's subnormal range: kept
  CHECK(spec_of(gemma2).config.logit_softcap == float(1e-30));
  gemma2["query_pre_attn_scalar"] = 1e-300;  // 1 / sqrt of it is 1e150: no float
  CHECK(names(error_of(gemma2), "'query_pre_attn_scalar' = 1e-300 makes the scale"));
  json qwen3 = llama();
  qwen3["model_type"] = "qwen3";
  qwen3["rms_norm_eps"] = 1e300;
  CHECK(names(error_of(qwen3), "'rms_norm_eps' must be >= 0 and within a float's range, got 1e+300"));
}

TEST_CASE("model folder: the C++ API loads a layer that builds") {
  const kvhead::io::model_layer model =
      kvhead::io::load_model_layer((fs::path(KVHEAD_MODELS_DIR) / "phi3_partial").string(), 1);
  CHECK(model.spec.fused_qkv);
  CHECK(model.layer.q_proj.weight.size() == 64 * 64);
  CHECK(model.layer.k_proj.weight.size() == 64 * 64);
  CHECK(model.layer.v_proj.weight.size() == 64 * 64);
  CHECK(model.layer.config.rotary_dim == 12);
  const kvhead::attention_layer layer = model.layer.build();
  CHECK(layer.config().rotary_dim == 12);
  const kvhead::io::model_layer qwen3 =
      kvhead::io::load_model_layer((fs::path(KVHEAD_MODELS_DIR) / "qwen3_qk_norm").string(), 0);
  CHECK(qwen3.layer.q_norm.size() == 16);
  CHECK(qwen3.layer.k_norm.size() == 16);
  const kvhead::io::model_layer oss =
      kvhead::io::load_model_layer((fs::path(KVHEAD_MODELS_DIR) / "gpt_oss_sinks").string(), 1);
  CHECK(oss.layer.sinks.size() == 8);
  CHECK(oss.layer.o_proj.bias.size() == 64);
  CHECK(kvhead::model_layer_config((fs::path(KVHEAD_MODELS_DIR) / "gemma2_softcap").string(), 1).logit_softcap == 1.5f);
}
