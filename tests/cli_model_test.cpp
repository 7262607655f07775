// `kvhead run --model` and `kvhead decode --model` on Hugging Face model
// folders (tests/data/models, written by tools/make_model_goldens.py from each
// family's HF formulas): within 1e-4 of expected.npy relative to
// max|expected| on every SIMD path this CPU runs, decode bit-identical to run
// for several chunkings and thread counts, and bad folders rejected with one
// line, exit 1 (contradicting flags: exit 2).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/io/npy.hpp"
#include "kvhead/config.hpp"
#include "tests/cli_test_util.hpp"

namespace kvhead::cli_test {
namespace {

constexpr int exit_failure = 1, exit_usage = 2;

std::string model_dir(const std::string& name) { return (fs::path(KVHEAD_MODELS_DIR) / name).string(); }

/// The case's --layer flag (its args file: "--layer N").
std::string case_layer(const std::string& name) {
  const std::string text = read_bytes((fs::path(model_dir(name)) / "args").string());
  return text.substr(text.find(' ') + 1, text.find('\n') - text.find(' ') - 1);
}

std::vector<std::string> model_flags(const std::string& folder, const std::string& layer, const std::string& input) {
  return {"--model", folder, "--layer", layer, "--input", input};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void expect_clean(const cli_result& result) {
  INFO("stderr: " << result.err);
  CHECK(result.signal == 0);
  CHECK(result.exit_code == 0);
  CHECK(result.out.empty());
  CHECK(result.err.empty());
}

/// max |got - expected| / max |expected| (NaN when the shapes differ or a value is not finite).
double relative_error(const std::string& got_path, const std::string& expected_path) {
  const io::npy_array got = io::read_npy(got_path), expected = io::read_npy(expected_path);
  if (got.shape != expected.shape) return NAN;
  double scale = 0.0, worst = 0.0;
  for (float value : expected.values) scale = std::fmax(scale, std::fabs(double(value)));
  for (std::size_t i = 0; i < got.values.size(); ++i) {
    const double diff = std::fabs(double(got.values[i]) - double(expected.values[i]));
    if (!std::isfinite(diff)) return NAN;
    worst = std::fmax(worst, diff);
  }
  return worst / scale;
}

TEST_CASE("model_folders_match_their_goldens_on_every_simd_path_and_decode_matches_run") {
  const std::vector<std::string> cases = entries(KVHEAD_MODELS_DIR);
  REQUIRE(cases.size() >= 10);
  for (const simd_path path : supported_simd_paths()) {
    const std::vector<std::string> env = {std::string("KVHEAD_ISA=") + to_string(path)};
    for (const std::string& name : cases) {
      CAPTURE(name);
      CAPTURE(to_string(path));
      scratch_dir dir;
      const std::vector<std::string> flags =
          model_flags(model_dir(name), case_layer(name), (fs::path(model_dir(name)) / "input.npy").string());
      const std::string run_output = dir.file("run.npy");
      expect_clean(run_kvhead(with({"run", "--output", run_output}, flags), env));
      const double error = relative_error(run_output, (fs::path(model_dir(name)) / "expected.npy").string());
      MESSAGE(name << " on " << std::string(to_string(path)) << ": max relative error " << error);
      CHECK(error <= 1e-4);  // NaN fails
      const std::string reference = read_bytes(run_output);
      // The one exception to "the same bits however the prompt is cut":
      // longrope picks its factors per call as HF does, so a prompt longer
      // than original_max_position_embeddings (23 tokens over 16) decoded in
      // calls that end before it rotates its first tokens with the short
      // factors, where one call rotates them all with the long ones.
      const bool cut_changes_factors = name == "phi3_longrope_long";
      for (const std::vector<std::string>& variant : {std::vector<std::string>{"--chunk", "1", "--threads", "2"},
                                                      {"--chunk", "5", "--threads", "1"},
                                                      {"--chunk", "1000", "--threads", "2"}}) {
        CAPTURE(variant[1]);
        const std::string decoded = dir.file("decode-" + variant[1] + ".npy");
        expect_clean(run_kvhead(with(with({"decode", "--output", decoded}, flags), variant), env));
        if (cut_changes_factors && variant[1] != "1000")
          CHECK(read_bytes(decoded) != reference);
        else
          CHECK(read_bytes(decoded) == reference);
      }
      const std::string threaded = dir.file("run-3.npy");
      expect_clean(run_kvhead(with({"run", "--output", threaded, "--threads", "3"}, flags), env));
      CHECK(read_bytes(threaded) == reference);
    }
  }
}

TEST_CASE("longrope_flag_pins_the_factors_so_any_cut_gives_the_bits_of_one_call") {
  scratch_dir dir;
  const std::string folder = model_dir("phi3_longrope_long");  // 23 tokens over L = 16
  const std::vector<std::string> flags = model_flags(folder, "0", (fs::path(folder) / "input.npy").string());
  auto output = [&](const std::string& command, const std::vector<std::string>& extra) {
    const std::string file = dir.file(command + "-" + std::to_string(extra.size()) + "-" + extra.back() + ".npy");
    expect_clean(run_kvhead(with(with({command, "--output", file}, flags), extra)));
    return read_bytes(file);
  };
  const std::string per_call = output("run", {"--longrope", "per-call"});
  CHECK(per_call == output("run", {"--threads", "1"}));  // the default
  for (const char* pick : {"short", "long"}) {
    CAPTURE(pick);
    const std::string one_call = output("run", {"--longrope", pick});
    for (const char* chunk : {"1", "5"}) CHECK(output("decode", {"--chunk", chunk, "--longrope", pick}) == one_call);
    // One call over 23 tokens takes the long factors per call as well.
    CHECK((one_call == per_call) == (std::string(pick) == "long"));
  }
}

TEST_CASE("longrope_flag_errors") {
  scratch_dir dir;
  const std::string input = (fs::path(model_dir("phi3_longrope")) / "input.npy").string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with(model_flags(model_dir("phi3_longrope"), "1", input), {"--longrope", "medium"}),
       "--longrope needs per-call, short or long, got 'medium'"},
      {with(model_flags(model_dir("llama_yarn"), "1", input), {"--longrope", "long"}),
       "--longrope needs a model whose RoPE is longrope"},
      {{"--weights", "w.safetensors", "--heads", "4", "--input", input, "--longrope", "long"},
       "--longrope needs --model"}};
  for (const auto& entry : cases) {
    const std::string expected = entry.second;  // not a structured binding: clang 14 cannot capture those
    CAPTURE(expected);
    const cli_result result = run_kvhead(with({"run", "--output", dir.file("y.npy")}, entry.first));
    CHECK(result.exit_code == exit_usage);
    CHECK(result.err.find(expected) != std::string::npos);
    CHECK(!fs::exists(dir.file("y.npy")));
  }
}

// ------------------------------------------------------------ bad folders

/// A copy of model case `name` in `dir`, config.json edited by `edit`.
std::string copy_case(const scratch_dir& dir, const std::string& name,
                      const std::function<void(nlohmann::json&)>& edit = {}) {
  const fs::path folder = dir.path() / name;
  fs::copy(model_dir(name), folder);
  if (edit) {
    nlohmann::json config = nlohmann::json::parse(read_bytes((folder / "config.json").string()));
    edit(config);
    write_bytes((folder / "config.json").string(), config.dump(2));
  }
  return folder.string();
}

/// `kvhead run` (and decode) on `folder` must fail with exactly one stderr
/// line holding every one of `mentions`, and write no output.
void expect_model_failure(const std::string& folder, const std::string& layer, int exit_code,
                          const std::vector<std::string>& mentions, const std::vector<std::string>& extra = {}) {
  for (const char* command : {"run", "decode"}) {
    CAPTURE(command);
    scratch_dir out;
    const std::string input = (fs::path(model_dir("llama_linear")) / "input.npy").string();
    const cli_result result =
        run_kvhead(with(with({command, "--output", out.file("y.npy")}, model_flags(folder, layer, input)), extra));
    INFO("stderr: " << result.err);
    CHECK(result.signal == 0);
    CHECK(result.exit_code == exit_code);
    CHECK(result.out.empty());
    CHECK(!result.err.empty());
    CHECK(result.err.find('\n') == result.err.size() - 1);  // one line
    for (const std::string& text : mentions) CHECK(result.err.find(text) != std::string::npos);
    CHECK(entries(out.path()).empty());
  }
}

TEST_CASE("model_folder_errors") {
  scratch_dir dir;
  SUBCASE("missing config.json") {
    const std::string folder = copy_case(dir, "llama_linear");
    fs::remove(fs::path(folder) / "config.json");
    expect_model_failure(folder, "0", exit_failure, {"config.json"});
  }
  SUBCASE("no weights") {
    const std::string folder = copy_case(dir, "llama_linear");
    fs::remove(fs::path(folder) / "model.safetensors");
    expect_model_failure(folder, "0", exit_failure, {"model.safetensors"});
  }
  SUBCASE("the output is one of the folder's files") {
    const std::string folder = copy_case(dir, "llama3_sharded");
    const std::string input = (fs::path(folder) / "input.npy").string();
    for (const char* file : {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"}) {
      CAPTURE(file);
      const std::string output = (fs::path(folder) / file).string(), bytes = read_bytes(output);
      const cli_result result = run_kvhead(with({"run", "--output", output}, model_flags(folder, "2", input)));
      CHECK(result.exit_code == exit_failure);
      CHECK(result.err.find("is a file that --model names, which this command reads") != std::string::npos);
      CHECK(read_bytes(output) == bytes);
    }
    // Any other name in the folder is an ordinary output, written again on a second run.
    const std::string output = (fs::path(folder) / "y.npy").string();
    for (int run = 0; run < 2; ++run)
      CHECK(run_kvhead(with({"run", "--output", output}, model_flags(folder, "2", input))).exit_code == 0);
  }
  SUBCASE("a shard named in the index but absent") {
    const std::string folder = copy_case(dir, "llama3_sharded");
    fs::remove(fs::path(folder) / "model-00002-of-00002.safetensors");
    expect_model_failure(folder, "2", exit_failure, {"model-00002-of-00002.safetensors", "does not exist"});
  }
  SUBCASE("broken links are named, not read as absent") {
    // A dangling model.safetensors next to an index fell back to the index.
    const std::string sharded = copy_case(dir, "llama3_sharded");
    fs::create_symlink("no-such-file.safetensors", fs::path(sharded) / "model.safetensors");
    expect_model_failure(sharded, "2", exit_failure, {"model.safetensors", "No such file"});
    // A link loop as config.json read as "has no config.json".
    const std::string looped = copy_case(dir, "llama_linear");
    fs::remove(fs::path(looped) / "config.json");
    fs::create_symlink("config.json", fs::path(looped) / "config.json");
    expect_model_failure(looped, "0", exit_failure, {"config.json", "symbolic links"});
  }
  SUBCASE("a shard name holding a NUL (C would open another file)") {
    const std::string folder = copy_case(dir, "llama3_sharded");
    const std::string index_path = (fs::path(folder) / "model.safetensors.index.json").string();
    nlohmann::json index = nlohmann::json::parse(read_bytes(index_path));
    for (auto& entry : index["weight_map"].items())
      entry.value() = entry.value().get<std::string>() + std::string(1, '\0') + "x";
    write_bytes(index_path, index.dump());
    expect_model_failure(folder, "2", exit_failure, {"is not a plain file name"});
  }
  SUBCASE("a tensor in two shards") {
    const std::string folder = copy_case(dir, "llama3_sharded");
    const std::string shard = (fs::path(folder) / "model-00002-of-00002.safetensors").string();
    // Shard 2 rewritten to hold one tensor that shard 1 holds too.
    const std::string name = "model.embed_tokens.weight";
    write_safetensors(shard, {{name, {32, 64}, std::vector<float>(32 * 64, 0.5f)}});
    expect_model_failure(folder, "2", exit_failure, {"in two shards", name});
  }
  SUBCASE("a layer index beyond num_hidden_layers") {
    expect_model_failure(copy_case(dir, "llama_linear"), "2", exit_failure, {"num_hidden_layers 2"});
  }
  SUBCASE("a head count that does not divide") {
    const std::string folder = copy_case(dir, "llama_linear", [](nlohmann::json& c) { c["num_key_value_heads"] = 3; });
    expect_model_failure(folder, "0", exit_failure, {"num_attention_heads 4", "num_key_value_heads 3"});
    const std::string no_head_dim = copy_case(dir, "qwen25_bias", [](nlohmann::json& c) {
      c["num_attention_heads"] = 5;
      c["num_key_value_heads"] = 1;
    });
    // head_dim 48 // 5 = 9, as in HF, whose RoPE then fails on the odd size.
    expect_model_failure(no_head_dim, "0", exit_failure, {"head_dim 9 is odd"});
  }
  SUBCASE("unsupported rope types") {
    for (const char* type : {"dynamic", "ntk"}) {
      CAPTURE(type);
      const std::string folder = copy_case(dir, "llama_linear", [&](nlohmann::json& c) {
        c["rope_scaling"] = {{"rope_type", type}, {"factor", 2.0}};
      });
      expect_model_failure(folder, "0", exit_failure, {"rope_scaling.rope_type", type, "not implement"});
      fs::remove_all(folder);
    }
  }
  SUBCASE("--alibi with a model folder") {
    expect_model_failure(model_dir("llama_linear"), "0", exit_usage, {"--alibi cannot be given with --model"},
                         {"--alibi", "8"});
  }
  SUBCASE("longrope without its factors") {
    const std::string folder = copy_case(dir, "llama_linear", [&](nlohmann::json& c) {
      c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
    });
    expect_model_failure(folder, "0", exit_failure, {"rope_scaling.short_factor", "is missing"});
  }
  SUBCASE("an unknown key in rope_scaling") {
    const std::string folder =
        copy_case(dir, "llama_linear", [](nlohmann::json& c) { c["rope_scaling"]["low_freq_factor"] = 1.0; });
    expect_model_failure(folder, "0", exit_failure, {"rope_scaling.low_freq_factor"});
  }
  SUBCASE("a sliding layer without a window") {
    const std::string types = copy_case(dir, "gemma2_full", [](nlohmann::json& c) {
      c["layer_types"] = {"full_attention", "sliding_attention"};
      c["sliding_window"] = nullptr;
    });
    expect_model_failure(types, "1", exit_failure, {"layer 1", "'sliding_window' is null"});
    const std::string zero = copy_case(dir, "mistral_window", [](nlohmann::json& c) { c["sliding_window"] = 0; });
    expect_model_failure(zero, "1", exit_failure, {"'sliding_window' must be a positive whole number"});
  }
  SUBCASE("soft-capping outside gemma2") {
    const std::string softcap =
        copy_case(dir, "phi3_partial", [](nlohmann::json& c) { c["attn_logit_softcapping"] = 50.0; });
    expect_model_failure(softcap, "1", exit_failure, {"attn_logit_softcapping", "only gemma2"});
    const std::string unknown =
        copy_case(dir, "llama_linear", [](nlohmann::json& c) { c["model_type"] = "deepseek_v3"; });
    expect_model_failure(unknown, "0", exit_failure, {"model_type 'deepseek_v3'"});
  }
  SUBCASE("a sinks tensor") {
    const std::string folder = copy_case(dir, "llama_linear");
    fs::remove(fs::path(folder) / "model.safetensors");
    std::vector<tensor> tensors;
    for (const char* proj : {"q_proj", "o_proj"})
      tensors.push_back(
          {std::string("model.layers.0.self_attn.") + proj + ".weight", {64, 64}, std::vector<float>(64 * 64, 0.0f)});
    for (const char* proj : {"k_proj", "v_proj"})
      tensors.push_back(
          {std::string("model.layers.0.self_attn.") + proj + ".weight", {32, 64}, std::vector<float>(32 * 64, 0.0f)});
    tensors.push_back({"model.layers.0.self_attn.sinks", {4}, std::vector<float>(4, 0.0f)});
    write_safetensors((fs::path(folder) / "model.safetensors").string(), tensors);
    expect_model_failure(folder, "0", exit_failure, {"unexpected tensor", "self_attn.sinks", "llama"});
  }
  SUBCASE("gpt_oss without its sinks, or with a sink that is not finite") {
    const auto as_gpt_oss = [](nlohmann::json& c) {
      c["model_type"] = "gpt_oss";
      c["attention_bias"] = false;
      c["head_dim"] = 16;  // hidden / heads (absent: gpt-oss's 64)
    };
    const std::string folder = copy_case(dir, "llama_linear", as_gpt_oss);
    expect_model_failure(folder, "1", exit_failure, {"missing tensor", "model.layers.1.self_attn.sinks"});
    fs::remove(fs::path(folder) / "model.safetensors");
    std::vector<tensor> tensors;
    for (const char* proj : {"q_proj", "o_proj"})
      tensors.push_back(
          {std::string("model.layers.1.self_attn.") + proj + ".weight", {64, 64}, std::vector<float>(64 * 64, 0.0f)});
    for (const char* proj : {"k_proj", "v_proj"})
      tensors.push_back(
          {std::string("model.layers.1.self_attn.") + proj + ".weight", {32, 64}, std::vector<float>(32 * 64, 0.0f)});
    tensors.push_back({"model.layers.1.self_attn.sinks", {4}, {0.0f, 1.0f, INFINITY, 0.0f}});
    write_safetensors((fs::path(folder) / "model.safetensors").string(), tensors);
    expect_model_failure(folder, "1", exit_failure, {"self_attn.sinks", "entry 2", "not finite"});
  }
  SUBCASE("a bias the family does not have") {
    const std::string folder = copy_case(dir, "llama_yarn", [](nlohmann::json& c) { c["attention_bias"] = false; });
    expect_model_failure(folder, "1", exit_failure, {"unexpected tensor", "bias"});
  }
  SUBCASE("flags that contradict config.json, and flags that cannot go with --model") {
    const std::string folder = model_dir("llama_linear");
    expect_model_failure(folder, "0", exit_usage, {"--heads 5", "num_attention_heads"}, {"--heads", "5"});
    expect_model_failure(folder, "0", exit_usage, {"--kv-heads"}, {"--kv-heads", "4"});
    expect_model_failure(folder, "0", exit_usage, {"--rope-theta"}, {"--rope-theta", "500000"});
    expect_model_failure(folder, "0", exit_usage, {"--weights"}, {"--weights", "w.safetensors"});
    expect_model_failure(folder, "0", exit_usage, {"--prefix"}, {"--prefix", "x."});
    expect_model_failure(folder, "-1", exit_usage, {"--layer"});
  }
}

TEST_CASE("model_flags_that_agree_with_config_json_are_accepted") {
  scratch_dir dir;
  const std::string name = "llama_linear";
  const std::string output = dir.file("y.npy");
  expect_clean(run_kvhead(
      with({"run", "--output", output, "--heads", "4", "--kv-heads", "2", "--rope-theta", "10000", "--causal"},
           model_flags(model_dir(name), "0", (fs::path(model_dir(name)) / "input.npy").string()))));
  CHECK(relative_error(output, (fs::path(model_dir(name)) / "expected.npy").string()) <= 1e-4);
}

}  // namespace
}  // namespace kvhead::cli_test
