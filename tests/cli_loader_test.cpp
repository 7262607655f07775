// io::load_attention_layer (engine/io/layer_loader.hpp), in process: shapes
// derived from the file, every shape check, and the messages.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/layer_loader.hpp"
#include "tests/cli_test_util.hpp"

namespace kvhead::cli_test {
namespace {

/// The file_error message of load_attention_layer on `tensors`, or "" when
/// it loads.
std::string load_error(const std::vector<tensor>& tensors, const io::layer_load_options& options) {
  scratch_dir dir;
  const std::string path = dir.file("w.safetensors");
  write_safetensors(path, tensors);
  const io::safetensors_file file(path);
  try {
    (void)io::load_attention_layer(file, options);
  } catch (const io::file_error& error) {
    const std::string message = error.what();
    CHECK(message.starts_with(path + ": "));
    CHECK(message.find('\n') == std::string::npos);
    return message.substr(path.size() + 2);
  }
  return "";
}

io::layer_load_options heads(std::size_t h, std::optional<std::size_t> g = std::nullopt) {
  io::layer_load_options options;
  options.num_heads = h;
  options.num_kv_heads = g;
  return options;
}

tensor* find(std::vector<tensor>& tensors, const std::string& name) {
  for (tensor& t : tensors)
    if (t.name == name) return &t;
  FAIL("no tensor " << name);
  return nullptr;
}

TEST_CASE("loader_derives_the_configuration") {
  // H = 6, G = 2, d = 3, d_model = 5 (not H d), with biases and a prefix.
  scratch_dir dir;
  const std::string path = dir.file("w.safetensors");
  std::vector<tensor> tensors = layer_tensors(6, 2, 3, 5, "layers.7.attn.", true);
  tensors.push_back({"unrelated.tensor", {2}, {1.0f, 2.0f}});
  write_safetensors(path, tensors);
  const io::safetensors_file file(path);
  io::layer_load_options options = heads(6);
  options.prefix = "layers.7.attn.";
  options.causal = true;
  options.scale = 0.5f;
  const io::loaded_layer layer = io::load_attention_layer(file, options);
  CHECK(layer.config.num_heads == 6);
  CHECK(layer.config.num_kv_heads == 2);
  CHECK(layer.config.head_dim == 3);
  CHECK(layer.config.d_model == 5);
  CHECK(layer.config.causal);
  CHECK(layer.config.scale == 0.5f);
  CHECK(layer.q_proj.weight == find(tensors, "layers.7.attn.q_proj.weight")->values);
  CHECK(layer.k_proj.bias == find(tensors, "layers.7.attn.k_proj.bias")->values);
  CHECK(layer.o_proj.weight == find(tensors, "layers.7.attn.o_proj.weight")->values);
  CHECK(layer.weights().v_proj.bias == layer.v_proj.bias.data());
  // It builds and runs.
  const attention_layer built = layer.build();
  std::vector<float> x(2 * 4 * 5, 0.5f), y(x.size());
  built.forward(x.data(), 2, 4, y.data());
  for (float value : y) CHECK(std::isfinite(value));
}

TEST_CASE("loader_without_biases") {
  scratch_dir dir;
  const std::string path = dir.file("w.safetensors");
  write_safetensors(path, layer_tensors(2, 1, 4, 8));
  const io::loaded_layer layer = io::load_attention_layer(io::safetensors_file(path), heads(2, 1));
  CHECK(layer.q_proj.bias.empty());
  CHECK(layer.weights().o_proj.bias == nullptr);
  CHECK(layer.config.num_kv_heads == 1);
}

TEST_CASE("loader_rejects_bad_shapes") {
  using edit = std::function<void(std::vector<tensor>&)>;
  struct bad_case {
    const char* what;
    edit change;
    io::layer_load_options options;
    std::string mention;
  };
  const auto reshape = [](const char* name, std::vector<std::size_t> shape) {
    return edit([=](std::vector<tensor>& tensors) {
      tensor* t = find(tensors, name);
      t->shape = shape;
      t->values.assign(product(shape), 0.25f);
    });
  };
  const auto remove = [](const char* name) {
    return edit(
        [=](std::vector<tensor>& tensors) { std::erase_if(tensors, [&](const tensor& t) { return t.name == name; }); });
  };
  const edit none = [](std::vector<tensor>&) {};
  io::layer_load_options bad_theta = heads(4), bad_scale = heads(4), odd_rope = heads(4);
  bad_theta.rope_theta = -1.0;
  bad_scale.scale = std::numeric_limits<float>::infinity();
  odd_rope.rope_theta = 10000.0;
  // Base layer: H = 4, G = 2, d = 2, d_model = 6, with biases.
  const std::vector<bad_case> cases = {
      {"q rank 1", reshape("q_proj.weight", {48}), heads(4), "'q_proj.weight' has shape [48], expected rank 2"},
      {"q rank 3", reshape("q_proj.weight", {2, 4, 6}), heads(4), "expected rank 2"},
      {"q empty", reshape("q_proj.weight", {0, 6}), heads(4), "is empty"},
      {"q rows vs heads", none, heads(3), "'q_proj.weight' has 8 rows, not a multiple of num_heads 3"},
      {"k columns", reshape("k_proj.weight", {4, 5}), heads(4), "'k_proj.weight' has 5 columns"},
      {"k rows vs head_dim", reshape("k_proj.weight", {3, 6}), heads(4), "not a positive multiple of head_dim 2"},
      {"kv heads given", none, heads(4, 4), "but num_kv_heads is 4"},
      {"kv heads zero", none, heads(4, 0), "num_kv_heads must be positive"},
      {"heads zero", none, heads(0), "num_heads must be positive"},
      {"H % G", reshape("k_proj.weight", {6, 6}), heads(4), "num_heads 4 is not a multiple of num_kv_heads 3"},
      {"v shape", reshape("v_proj.weight", {2, 6}), heads(4), "'v_proj.weight' has shape [2, 6]"},
      {"o shape", reshape("o_proj.weight", {6, 7}), heads(4), "expected [6, 8]"},
      {"o transposed", reshape("o_proj.weight", {8, 6}), heads(4), "'o_proj.weight' has shape [8, 6]"},
      {"bias length", reshape("q_proj.bias", {7}), heads(4), "'q_proj.bias' has shape [7], expected [8]"},
      {"bias rank", reshape("o_proj.bias", {1, 6}), heads(4), "'o_proj.bias' has shape [1, 6]"},
      {"missing o", remove("o_proj.weight"), heads(4), "no tensor 'o_proj.weight'"},
      {"missing k", remove("k_proj.weight"), heads(4), "no tensor 'k_proj.weight'"},
      {"theta", none, bad_theta, "rope_theta"},
      {"scale", none, bad_scale, "scale must be finite"},
  };
  for (const bad_case& c : cases) {
    CAPTURE(c.what);
    std::vector<tensor> tensors = layer_tensors(4, 2, 2, 6, "", true);
    c.change(tensors);
    const std::string message = load_error(tensors, c.options);
    CHECK_MESSAGE(message.find(c.mention) != std::string::npos, message);
  }
  std::vector<tensor> odd = layer_tensors(2, 2, 3, 6);
  CHECK(load_error(odd, odd_rope).empty() == false);
  odd_rope.num_heads = 2;
  CHECK(load_error(odd, odd_rope).find("RoPE needs an even head_dim, but head_dim is 3") != std::string::npos);
  CHECK(load_error(layer_tensors(4, 2, 2, 6), heads(4)).empty());
}

TEST_CASE("loader_prefix_matching_nothing") {
  std::vector<tensor> tensors;
  for (int i = 0; i < 7; ++i) tensors.push_back({"t" + std::to_string(i), {1}, {0.0f}});
  io::layer_load_options options = heads(1);
  options.prefix = "model.";
  CHECK(load_error(tensors, options) ==
        "no tensor name starts with prefix 'model.' (tensors: 't0', 't1', 't2', 't3', 't4', ... 7 in all)");
  tensors.resize(2);
  CHECK(load_error(tensors, options) == "no tensor name starts with prefix 'model.' (tensors: 't0', 't1')");
  CHECK(load_error({}, options) == "the file holds no tensors");
}

}  // namespace
}  // namespace kvhead::cli_test
