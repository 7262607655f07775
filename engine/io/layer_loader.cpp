// Attention layer loader: 1. arguments, 2. prefix, 3. q_proj (head_dim,
// d_model), 4. k_proj and v_proj (num_kv_heads), 5. o_proj, 6. biases,
// 7. RoPE and scale, 8. load. Every shape is checked before any tensor is
// converted, so a bad file costs no large allocation.
#include "engine/io/layer_loader.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

namespace kvhead::io {

namespace {

std::string number(std::size_t value) { return std::to_string(value); }

class loader {
 public:
  loader(const safetensors_file& file, const layer_load_options& options) : file_(file), options_(options) {}

  loaded_layer load() {
    // 1. Arguments (a caller's mistake, but reported like the rest).
    const std::size_t heads = options_.num_heads;
    if (heads == 0) fail("num_heads must be positive");
    if (options_.num_kv_heads && *options_.num_kv_heads == 0) fail("num_kv_heads must be positive");
    check_prefix();

    // 2. q_proj [H d, d_model] gives head_dim and d_model.
    const tensor_info& q = weight_info("q_proj");
    const std::size_t q_rows = q.shape[0], d_model = q.shape[1];
    if (q_rows == 0 || d_model == 0) fail(quote("q_proj.weight") + " is empty, shape " + shape_text(q.shape));
    if (q_rows % heads != 0)
      fail(quote("q_proj.weight") + " has " + number(q_rows) + " rows, not a multiple of num_heads " + number(heads));
    const std::size_t head_dim = q_rows / heads;

    // 3. k_proj and v_proj [G d, d_model] give num_kv_heads.
    const tensor_info& k = weight_info("k_proj");
    if (k.shape[1] != d_model)
      fail(quote("k_proj.weight") + " has " + number(k.shape[1]) + " columns, but q_proj.weight has " +
           number(d_model) + " (d_model)");
    if (k.shape[0] == 0 || k.shape[0] % head_dim != 0)
      fail(quote("k_proj.weight") + " has " + number(k.shape[0]) + " rows, not a positive multiple of head_dim " +
           number(head_dim) + " (q_proj.weight rows " + number(q_rows) + " / num_heads " + number(heads) + ")");
    const std::size_t kv_heads = k.shape[0] / head_dim;
    if (options_.num_kv_heads && *options_.num_kv_heads != kv_heads)
      fail(quote("k_proj.weight") + " has " + number(k.shape[0]) + " rows = " + number(kv_heads) +
           " kv heads of head_dim " + number(head_dim) + ", but num_kv_heads is " + number(*options_.num_kv_heads));
    if (heads % kv_heads != 0)
      fail("num_heads " + number(heads) + " is not a multiple of num_kv_heads " + number(kv_heads) +
           " (k_proj.weight has " + number(k.shape[0]) + " rows of head_dim " + number(head_dim) + ")");
    const tensor_info& v = weight_info("v_proj");
    if (v.shape != k.shape)
      fail(quote("v_proj.weight") + " has shape " + shape_text(v.shape) + ", but k_proj.weight has " +
           shape_text(k.shape));

    // 4. o_proj [d_model, H d].
    const tensor_info& o = weight_info("o_proj");
    if (o.shape[0] != d_model || o.shape[1] != q_rows)
      fail(quote("o_proj.weight") + " has shape " + shape_text(o.shape) + ", expected [" + number(d_model) + ", " +
           number(q_rows) + "] (d_model, num_heads * head_dim)");

    // 5. Optional biases: rank 1, one value per output feature.
    for (const auto& [name, rows] : {std::pair<const char*, std::size_t>{"q_proj", q_rows},
                                     {"k_proj", k.shape[0]},
                                     {"v_proj", v.shape[0]},
                                     {"o_proj", d_model}}) {
      const std::string bias = options_.prefix + name + ".bias";
      if (!file_.contains(bias)) continue;
      const tensor_info& info = file_.info(bias);
      if (info.shape.size() != 1 || info.shape[0] != rows)
        fail(quote(std::string(name) + ".bias") + " has shape " + shape_text(info.shape) + ", expected [" +
             number(rows) + "]");
    }

    // 6. RoPE and scale.
    if (!std::isfinite(options_.rope_theta) || options_.rope_theta < 0.0)
      fail("rope_theta must be 0 (no RoPE) or a positive finite number");
    if (options_.rope_theta > 0.0 && head_dim % 2 != 0)
      fail("RoPE needs an even head_dim, but head_dim is " + number(head_dim) + " (q_proj.weight rows " +
           number(q_rows) + " / num_heads " + number(heads) + ")");
    if (options_.scale && !std::isfinite(*options_.scale)) fail("scale must be finite");

    // 7. Load (BF16 weights as bits, the rest as f32).
    loaded_layer layer;
    layer.config.num_heads = heads;
    layer.config.num_kv_heads = kv_heads;
    layer.config.head_dim = head_dim;
    layer.config.d_model = d_model;
    layer.config.scale = options_.scale;
    layer.config.causal = options_.causal;
    layer.config.rope_theta = options_.rope_theta;
    layer.q_proj = load_linear("q_proj");
    layer.k_proj = load_linear("k_proj");
    layer.v_proj = load_linear("v_proj");
    layer.o_proj = load_linear("o_proj");
    return layer;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const { throw file_error(file_.path(), problem); }

  /// The tensor's name as the file spells it, quoted.
  std::string quote(const std::string& suffix) const { return quote_name(options_.prefix + suffix); }

  void check_prefix() const {
    const std::vector<std::string> names = file_.tensor_names();
    if (names.empty()) fail("the file holds no tensors");
    const bool found = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return std::string_view(name).starts_with(options_.prefix);
    });
    if (found) return;
    std::string problem = "no tensor name starts with prefix " + quote_name(options_.prefix) + " (tensors: ";
    constexpr std::size_t shown = 5;
    for (std::size_t i = 0; i < names.size() && i < shown; ++i) {
      if (i != 0) problem += ", ";
      problem += quote_name(names[i]);
    }
    if (names.size() > shown) problem += ", ... " + number(names.size()) + " in all";
    fail(problem + ")");
  }

  /// <prefix><proj>.weight, which must exist and be rank 2.
  const tensor_info& weight_info(const char* proj) const {
    const std::string name = options_.prefix + proj + ".weight";
    if (!file_.contains(name)) fail("no tensor " + quote_name(name) + " (a " + proj + " weight is required)");
    const tensor_info& info = file_.info(name);
    if (info.shape.size() != 2)
      fail(quote_name(name) + " has shape " + shape_text(info.shape) + ", expected rank 2 [out_features, in_features]");
    return info;
  }

  owned_linear load_linear(const char* proj) const {
    owned_linear result;
    load_weight(file_, options_.prefix + proj + ".weight", result);
    const std::string bias = options_.prefix + proj + ".bias";
    if (file_.contains(bias)) result.bias = file_.load_f32(bias);
    return result;
  }

  const safetensors_file& file_;
  const layer_load_options& options_;
};

}  // namespace

void load_weight(const safetensors_file& file, const std::string& name, owned_linear& target) {
  if (file.info(name).dtype == dtype::bf16)
    target.weight_bf16 = file.load_bf16_bits(name);
  else
    target.weight = file.load_f32(name);
}

loaded_layer load_attention_layer(const safetensors_file& file, const layer_load_options& options) {
  return loader(file, options).load();
}

}  // namespace kvhead::io
