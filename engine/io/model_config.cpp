// config.json to model_layer_spec: 1. model_type, 2. shapes, 3. layer kind
// (sliding, with its window, or full), 4. unsupported variants, 5. RoPE, 6. scale, biases,
// QK-norm.
#include "engine/io/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "engine/arch/checked_size.hpp"
#include "engine/arch/require.hpp"
#include "engine/attention/rope_scaling.hpp"
#include "engine/io/file_error.hpp"
#include "engine/io/json_file.hpp"

namespace kvhead::io {

namespace {

using engine::real_text;
using json = nlohmann::json;

std::string number(std::size_t value) { return std::to_string(value); }

/// Typed reads of config.json fields: absent and null are "not given"
/// (refuse_null first where HF has no value for a null to take).
class config_fields {
 public:
  config_fields(const std::string& path, const json& object) : path_(path), object_(object) {}

  [[noreturn]] void fail(const std::string& problem) const { throw file_error(path_, problem); }

  const json* find(const json& object, const std::string& key) const {
    const auto found = object.find(key);
    return found == object.end() || found->is_null() ? nullptr : &*found;
  }
  bool given(const std::string& key) const { return find(object_, key) != nullptr; }
  static bool is_null(const json& object, const std::string& key) {
    const auto found = object.find(key);
    return found != object.end() && found->is_null();
  }
  /// A field HF reads as a number (or a flag) with no meaning for None: it
  /// computes with None and fails (or, in newer releases, refuses the
  /// config), so a null is refused rather than read as the default.
  void refuse_null(const json& object, const std::string& key, const std::string& label) const {
    if (is_null(object, key))
      fail("field " + quote_name(label) +
           " is null; Hugging Face cannot compute with it: give a value or leave it out");
  }
  void refuse_null(const std::string& key) const { refuse_null(object_, key, key); }

  std::optional<std::string> text(const std::string& key) const {
    const json* value = find(object_, key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) fail("field " + quote_name(key) + " must be a string, got " + json_type_name(*value));
    return value->get<std::string>();
  }
  /// A whole number >= 1.
  std::optional<std::size_t> count(const std::string& key) const { return count_in(object_, key, key); }
  std::optional<std::size_t> count_in(const json& object, const std::string& key, const std::string& label) const {
    return whole_in(object, key, label, 1);
  }
  /// A whole number >= 0.
  std::optional<std::size_t> whole(const std::string& key) const { return whole_in(object_, key, key, 0); }
  std::optional<std::size_t> whole_in(const json& object, const std::string& key, const std::string& label,
                                      std::int64_t least) const {
    const json* value = find(object, key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number_integer() || (!value->is_number_unsigned() && value->get<std::int64_t>() < least) ||
        (value->is_number_unsigned() && value->get<std::uint64_t>() < std::uint64_t(least)))
      fail("field " + quote_name(label) + " must be a " + (least == 0 ? "whole number >= 0" : "positive whole number") +
           ", got " + json_value_text(*value));
    return std::size_t(value->get<std::uint64_t>());
  }
  std::optional<double> real(const std::string& key) const { return real_in(object_, key, key); }
  std::optional<double> real_in(const json& object, const std::string& key, const std::string& label) const {
    const json* value = find(object, key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number() || !std::isfinite(value->get<double>()))
      fail("field " + quote_name(label) + " must be a finite number, got " + json_value_text(*value));
    return value->get<double>();
  }
  std::optional<bool> flag(const std::string& key) const { return flag_in(object_, key, key); }
  std::optional<bool> flag_in(const json& object, const std::string& key, const std::string& label) const {
    const json* value = find(object, key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean())
      fail("field " + quote_name(label) + " must be true or false, got " + json_value_text(*value));
    return value->get<bool>();
  }
  std::size_t required_count(const std::string& key) const {
    const std::optional<std::size_t> value = count(key);
    if (!value) fail("field " + quote_name(key) + " is missing");
    return *value;
  }
  const json& object() const { return object_; }

 private:
  const std::string& path_;
  const json& object_;
};

const std::set<std::string>& supported_types() {
  static const std::set<std::string> types = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gpt_oss"};
  return types;
}

std::string supported_list() {
  std::string list;
  for (const std::string& type : supported_types()) list += (list.empty() ? "" : ", ") + type;
  return list;
}

// 2. The shapes HF's configuration_*.py give a family when config.json has
// no such field (0: num_attention_heads, or hidden_size / heads).
struct hf_defaults {
  std::size_t num_kv_heads = 0, head_dim = 0;
};
hf_defaults hf_defaults_of(const std::string& type) {
  if (type == "mistral") return {8, 0};
  if (type == "qwen2") return {32, 0};
  if (type == "qwen3") return {32, 128};
  if (type == "gemma2") return {4, 256};
  if (type == "gpt_oss") return {8, 64};
  return {};  // llama, phi3
}

// 3. Whether layer `layer` is a sliding-window layer: by layer_types when
// given, for the families whose HF code reads it (Gemma 2, gpt-oss, Qwen 2/3;
// Mistral's warns and ignores it, Phi-3's is Mistral's, Llama's never slides),
// else by the family's rule.
bool is_sliding_layer(const config_fields& f, const std::string& type, std::size_t layer, std::size_t layers) {
  const bool reads_layer_types = type == "gemma2" || type == "gpt_oss" || type == "qwen2" || type == "qwen3";
  if (const json* types = reads_layer_types ? f.find(f.object(), "layer_types") : nullptr) {
    if (!types->is_array() || types->size() != layers)
      f.fail("field 'layer_types' must be an array of num_hidden_layers (" + number(layers) + ") strings");
    // Every entry checked, not only this layer's: HF validates the whole list.
    for (std::size_t index = 0; index < layers; ++index) {
      const json& entry = (*types)[index];
      if (entry != "sliding_attention" && entry != "full_attention")
        f.fail("field 'layer_types' entry " + number(index) + " is " + json_value_text(entry) +
               "; kvhead knows 'full_attention' and 'sliding_attention'");
    }
    return (*types)[layer] == "sliding_attention";
  }
  if (type == "gemma2" || type == "gpt_oss") return layer % 2 == 0;  // HF Gemma 2, gpt-oss: even layers slide
  if (type == "qwen2" || type == "qwen3") {
    // HF Qwen 2/3: sliding only with use_sliding_window, from max_window_layers
    // on, and not with sliding_window null (absent: 4096).
    const bool use = f.flag("use_sliding_window").value_or(false);
    const bool has_window = f.given("sliding_window") || !f.object().contains("sliding_window");
    if (!use || !has_window) return false;
    f.refuse_null("max_window_layers");
    return layer >= f.whole("max_window_layers").value_or(28);  // 0: every layer slides
  }
  if (type == "mistral") return !f.object().contains("sliding_window") || f.given("sliding_window");  // default 4096
  if (type == "phi3") return f.given("sliding_window");
  return false;  // llama: no sliding window
}

// The window of a sliding layer: sliding_window, else (absent) the family's
// default in HF (Mistral, Gemma 2, Qwen 2/3: 4096; gpt-oss: 128). Qwen 2/3 keep
// sliding_window only with use_sliding_window (HF sets it to None otherwise).
std::size_t sliding_window(const config_fields& f, const std::string& type, std::size_t layer) {
  if ((type == "qwen2" || type == "qwen3") && !f.flag("use_sliding_window").value_or(false))
    f.fail("layer " + number(layer) + " is a sliding-window layer (layer_types) but field 'use_sliding_window' is " +
           "not true, so it has no window");
  if (const std::optional<std::size_t> window = f.count("sliding_window")) return *window;
  if (!f.object().contains("sliding_window")) {
    if (type == "mistral" || type == "gemma2" || type == "qwen2" || type == "qwen3") return 4096;
    if (type == "gpt_oss") return 128;
  }
  f.fail("layer " + number(layer) + " is a sliding-window layer (layer_types) but field 'sliding_window' is null");
}

// longrope (HF _compute_longrope_parameters): the short and long factors;
// the original length L from rope_scaling (transformers 5), else the
// top-level field (4.x), else Phi-3's default 4096 or
// max_position_embeddings; the factor given, else max_position_embeddings /
// L (Phi-3's default max 4096). Where 4.x (which takes that ratio whenever
// the top-level L exists, and Phi-3 always has one) and 5 (the factor when
// given) would read different factors or lengths, the config is refused.
void read_longrope(const config_fields& f, const std::string& type, const json& r,
                   const std::function<std::string(const std::string&)>& label, rope_scaling& s) {
  for (const auto& [key, factors] : {std::pair{"short_factor", &s.short_factor}, {"long_factor", &s.long_factor}}) {
    const json* value = f.find(r, key);
    if (value == nullptr) f.fail("field " + quote_name(label(key)) + " is missing (needed by rope type 'longrope')");
    if (!value->is_array()) f.fail("field " + quote_name(label(key)) + " must be a list of numbers");
    factors->clear();
    for (const json& factor : *value) {
      if (!factor.is_number() || !std::isfinite(factor.get<double>()))
        f.fail("field " + quote_name(label(key)) + " must be a list of finite numbers, got " + json_value_text(factor));
      factors->push_back(factor.get<double>());
    }
  }
  const bool phi3 = type == "phi3";
  const std::optional<double> nested =
      f.real_in(r, "original_max_position_embeddings", label("original_max_position_embeddings"));
  f.refuse_null("original_max_position_embeddings");
  const std::optional<double> top_level = f.real("original_max_position_embeddings");
  if (nested && top_level && *nested != *top_level)
    f.fail("fields " + quote_name(label("original_max_position_embeddings")) + " (" + real_text(*nested) +
           ") and 'original_max_position_embeddings' (" + real_text(*top_level) +
           ") disagree: transformers 4.x reads the second, 5 the first");
  f.refuse_null("max_position_embeddings");
  const std::optional<std::size_t> given_max = f.count("max_position_embeddings");
  const std::optional<double> max_positions = given_max ? std::optional<double>(double(*given_max))
                                              : phi3    ? std::optional<double>(4096.0)
                                                        : std::nullopt;
  const std::optional<double> original = nested      ? nested
                                         : top_level ? top_level
                                         : phi3      ? std::optional<double>(4096.0)
                                                     : max_positions;
  if (!original) f.fail("longrope needs field 'original_max_position_embeddings' or 'max_position_embeddings'");
  s.original_max_position_embeddings = *original;
  if (!(*original > 0.0)) f.fail("field 'original_max_position_embeddings' must be positive");
  const std::optional<double> factor = f.real_in(r, "factor", label("factor"));
  const bool ratio_read = phi3 || top_level;  // 4.x takes max / L then
  if (factor && ratio_read && max_positions && *factor != *max_positions / *original)
    f.fail("field " + quote_name(label("factor")) + " (" + real_text(*factor) + ") is not max_position_embeddings / " +
           "original_max_position_embeddings (" + real_text(*max_positions / *original) +
           "): transformers 4.x reads the second, 5 the first");
  if (!factor && !max_positions)
    f.fail("longrope needs field " + quote_name(label("factor")) + " or 'max_position_embeddings'");
  s.factor = factor ? *factor : *max_positions / *original;
  s.attention_factor = f.real_in(r, "attention_factor", label("attention_factor"));
}

// 5. RoPE: theta, scaling and rotary_dim into `config`.
void read_rope(const config_fields& f, const std::string& type, attention_config& config) {
  const json* parameters = f.find(f.object(), "rope_parameters");
  const json* scaling = f.find(f.object(), "rope_scaling");
  if (parameters != nullptr && scaling != nullptr) f.fail("fields 'rope_parameters' and 'rope_scaling' are both given");
  const std::string field = parameters != nullptr ? "rope_parameters" : "rope_scaling";
  const json* rope = parameters != nullptr ? parameters : scaling;
  if (rope != nullptr && !rope->is_object())
    f.fail("field " + quote_name(field) + " must be an object, got " + json_type_name(*rope));
  const json empty = json::object();
  // HF GptOssConfig: no rope_scaling / rope_parameters means this yarn (and
  // rope_parameters null: 4.55-4.57 do not read it, later releases fill in
  // the yarn). rope_scaling null is refused: 4.55-4.57 read it as no
  // scaling, later releases as this yarn.
  if (type == "gpt_oss" && rope == nullptr && config_fields::is_null(f.object(), "rope_scaling"))
    f.fail(
        "field 'rope_scaling' is null, which transformers 4.55-4.57 read as no scaling and later releases as "
        "gpt-oss's default yarn: give it or leave it out");
  // Parsed, not built from an initializer list: nlohmann's list constructor
  // leaks what it built when an allocation fails part way (the parser's
  // result frees it).
  static const json gpt_oss_yarn = json::parse(R"({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
      "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096})");
  const json& r = rope != nullptr ? *rope : type == "gpt_oss" ? gpt_oss_yarn : empty;
  auto label = [&](const std::string& key) { return field + "." + key; };

  // Theta: rope_parameters.rope_theta, else the top-level rope_theta, else
  // the family's default (gpt-oss 150000, the others 10000).
  f.refuse_null(r, "rope_theta", label("rope_theta"));
  std::optional<double> theta = f.real_in(r, "rope_theta", label("rope_theta"));
  if (!theta) {
    f.refuse_null("rope_theta");
    theta = f.real("rope_theta");
  }
  config.rope_theta = theta.value_or(type == "gpt_oss" ? 150000.0 : 10000.0);
  if (!(config.rope_theta > 0.0)) f.fail("field 'rope_theta' must be positive");
  if (const std::string problem = engine::rope_theta_problem(config.rope_theta); !problem.empty())
    f.fail("field 'rope_theta': " + problem);

  // Partial rotary.
  f.refuse_null(r, "partial_rotary_factor", label("partial_rotary_factor"));
  std::optional<double> partial = f.real_in(r, "partial_rotary_factor", label("partial_rotary_factor"));
  if (!partial) {
    f.refuse_null("partial_rotary_factor");
    partial = f.real("partial_rotary_factor");
  }
  if (partial && (*partial <= 0.0 || *partial > 1.0))
    f.fail("field 'partial_rotary_factor' must be in (0, 1], got " + real_text(*partial));
  if (partial && *partial < 1.0 && type != "phi3")
    f.fail("field 'partial_rotary_factor' < 1 is not supported for model_type " + quote_name(type) +
           " (its attention rotates whole heads)");
  config.rotary_dim = std::size_t(double(config.head_dim) * partial.value_or(1.0));  // HF: int(head_dim * factor)
  if (!partial && config.rotary_dim % 2 != 0)
    f.fail("head_dim " + number(config.head_dim) + " is odd: RoPE rotates pairs of floats");
  if (config.rotary_dim == 0 || config.rotary_dim % 2 != 0)
    f.fail("rotary dimension int(head_dim " + number(config.head_dim) +
           " * partial_rotary_factor) = " + number(config.rotary_dim) + " must be even and positive");

  // Scaling kind: rope_type or the older type. Both given and different
  // are refused: transformers 4.x copies type over rope_type, 5 reads
  // rope_type first.
  std::string kind = "default";
  for (const char* key : {"rope_type", "type"}) {
    const json* value = f.find(r, key);
    if (value == nullptr) continue;
    if (!value->is_string()) f.fail("field " + quote_name(label(key)) + " must be a string");
    if (key == std::string("type") && f.find(r, "rope_type") != nullptr && value->get<std::string>() != kind)
      f.fail("fields " + quote_name(label("rope_type")) + " (" + quote_name(kind) + ") and " +
             quote_name(label("type")) + " (" + quote_name(value->get<std::string>()) +
             ") disagree: transformers 4.x computes the type, 5 the rope_type");
    kind = value->get<std::string>();
  }
  // HF's Phi-3 takes default or longrope alone (it reads su and yarn as longrope).
  if (type == "phi3" && (kind == "su" || kind == "yarn")) kind = "longrope";
  if (type == "phi3" && kind != "default" && kind != "longrope")
    f.fail("field " + quote_name(label("rope_type")) + " is " + quote_name(kind) +
           ": Phi-3 in HF takes default or longrope (su and yarn meaning longrope)");
  rope_scaling& s = config.rope_scaling;
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (kind == "default") {
    s.type = rope_scaling::kind::none;
  } else if (kind == "linear") {
    s.type = rope_scaling::kind::linear;
    allowed.insert("factor");
  } else if (kind == "llama3") {
    s.type = rope_scaling::kind::llama3;
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (kind == "yarn") {
    s.type = rope_scaling::kind::yarn;
    allowed.insert({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                    "attention_factor", "truncate"});
  } else if (kind == "longrope") {
    s.type = rope_scaling::kind::longrope;
    allowed.insert({"short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings"});
  } else {
    f.fail("field " + quote_name(label("rope_type")) + " is " + quote_name(kind) +
           ", which kvhead does not implement (it implements default, linear, llama3, yarn, longrope)");
  }
  for (const auto& [key, value] : r.items())
    if (!allowed.contains(key))
      f.fail("field " + quote_name(label(key)) + " is not understood for rope type " + quote_name(kind));

  auto required = [&](const std::string& key) {
    const std::optional<double> value = f.real_in(r, key, label(key));
    if (!value)
      f.fail("field " + quote_name(label(key)) + " is missing (needed by rope type " + quote_name(kind) + ")");
    return *value;
  };
  const std::optional<std::size_t> max_positions = f.count("max_position_embeddings");
  if (s.type == rope_scaling::kind::linear) s.factor = required("factor");
  if (s.type == rope_scaling::kind::llama3) {
    s.factor = required("factor");
    s.low_freq_factor = required("low_freq_factor");
    s.high_freq_factor = required("high_freq_factor");
    s.original_max_position_embeddings = required("original_max_position_embeddings");
  }
  if (s.type == rope_scaling::kind::yarn) {
    // HF (transformers main): original_max_position_embeddings defaults to
    // max_position_embeddings; a missing factor is their ratio.
    const std::optional<double> original =
        f.real_in(r, "original_max_position_embeddings", label("original_max_position_embeddings"));
    if (!original && !max_positions)
      f.fail("yarn needs field 'rope_scaling.original_max_position_embeddings' or 'max_position_embeddings'");
    s.original_max_position_embeddings = original.value_or(double(max_positions.value_or(0)));
    const std::optional<double> factor = f.real_in(r, "factor", label("factor"));
    if (!factor && !max_positions) f.fail("yarn needs field " + quote_name(label("factor")));
    s.factor = factor ? *factor : double(*max_positions) / s.original_max_position_embeddings;
    // HF: `get("beta_fast") or 32`: 0 means the default too.
    const double beta_fast = f.real_in(r, "beta_fast", label("beta_fast")).value_or(0.0);
    const double beta_slow = f.real_in(r, "beta_slow", label("beta_slow")).value_or(0.0);
    s.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
    s.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
    s.mscale = f.real_in(r, "mscale", label("mscale")).value_or(0.0);
    s.mscale_all_dim = f.real_in(r, "mscale_all_dim", label("mscale_all_dim")).value_or(0.0);
    s.attention_factor = f.real_in(r, "attention_factor", label("attention_factor"));
    // HF: `get("truncate", True)`, then `if truncate:`: null does not truncate.
    s.truncate = !config_fields::is_null(r, "truncate") && f.flag_in(r, "truncate", label("truncate")).value_or(true);
  }
  if (s.type == rope_scaling::kind::longrope) read_longrope(f, type, r, label, s);
  // The layer's own checks (factor > 0, llama3's frequency factors in order,
  // longrope's factors one per rotated pair, ...), here so that the message
  // names this file and the field.
  const std::string problem = engine::rope_scaling_problem(s, config.rope_theta, config.rotary_dim);
  if (!problem.empty()) f.fail("field " + quote_name(field) + ": " + problem);
}

}  // namespace

std::size_t read_num_hidden_layers(const std::string& config_path) {
  const json object = read_json_object(config_path);
  return config_fields(config_path, object).required_count("num_hidden_layers");
}

model_layer_spec read_model_config(const std::string& config_path, std::size_t layer) {
  const json object = read_json_object(config_path);
  const config_fields f(config_path, object);
  model_layer_spec spec;

  // 1. model_type.
  const std::optional<std::string> type = f.text("model_type");
  if (!type) f.fail("field 'model_type' is missing");
  spec.model_type = *type;
  if (!supported_types().contains(*type))
    f.fail("model_type " + quote_name(*type) + " is not supported (kvhead implements " + supported_list() + ")");

  // 2. Shapes.
  spec.num_hidden_layers = f.required_count("num_hidden_layers");
  if (layer >= spec.num_hidden_layers)
    f.fail("layer " + number(layer) + " is beyond num_hidden_layers " + number(spec.num_hidden_layers) +
           " (layers are 0 to " + number(spec.num_hidden_layers - 1) + ")");
  attention_config& config = spec.config;
  config.d_model = f.required_count("hidden_size");
  config.num_heads = f.required_count("num_attention_heads");
  // Absent, num_key_value_heads and head_dim take the family's default in HF's
  // configuration_*.py; num_key_value_heads null means MHA, head_dim null
  // hidden_size / num_attention_heads.
  const hf_defaults defaults = hf_defaults_of(*type);
  const bool kv_heads_absent = !object.contains("num_key_value_heads");
  config.num_kv_heads =
      f.count("num_key_value_heads")
          .value_or(kv_heads_absent && defaults.num_kv_heads ? defaults.num_kv_heads : config.num_heads);
  if (config.num_heads % config.num_kv_heads != 0)
    f.fail("num_attention_heads " + number(config.num_heads) + " is not a multiple of num_key_value_heads " +
           number(config.num_kv_heads) + (kv_heads_absent ? " (absent: " + *type + "'s default in HF)" : ""));
  if (const std::optional<std::size_t> head_dim = f.count("head_dim")) {
    config.head_dim = *head_dim;
  } else if (!object.contains("head_dim") && defaults.head_dim != 0) {
    config.head_dim = defaults.head_dim;
  } else {
    config.head_dim = config.d_model / config.num_heads;  // HF: hidden_size // num_attention_heads
    if (config.head_dim == 0)
      f.fail("hidden_size " + number(config.d_model) + " // num_attention_heads " + number(config.num_heads) +
             " is 0 (and no head_dim is given)");
  }
  // The weights' sizes must be addressable (a hostile head_dim near 2^64
  // would wrap the shapes the weights are checked against).
  const std::optional<std::size_t> kv_rows = engine::checked_product({2, config.num_kv_heads});
  const std::optional<std::size_t> heads = kv_rows ? engine::checked_sum(config.num_heads, *kv_rows) : std::nullopt;
  const std::optional<std::size_t> qkv_rows = heads ? engine::checked_product({*heads, config.head_dim}) : std::nullopt;
  if (!qkv_rows || !engine::checked_product({*qkv_rows, config.d_model, sizeof(float)}))
    f.fail("num_attention_heads " + number(config.num_heads) + ", num_key_value_heads " + number(config.num_kv_heads) +
           ", head_dim " + number(config.head_dim) + " and hidden_size " + number(config.d_model) +
           " make weights too large to address");
  config.causal = true;

  // 3. The layer's kind: a sliding layer gets its window.
  if (is_sliding_layer(f, *type, layer, spec.num_hidden_layers))
    config.sliding_window = sliding_window(f, *type, layer);

  // 4. Other variants kvhead does not implement.
  if (*type != "gemma2" && f.given("attn_logit_softcapping"))
    f.fail("field 'attn_logit_softcapping' is given, but model_type " + quote_name(*type) +
           " does not soft-cap attention logits (only gemma2 does); it must be null");
  for (const char* mla : {"kv_lora_rank", "q_lora_rank"})
    if (f.given(mla)) f.fail(std::string("field '") + mla + "': multi-head latent attention is not implemented");
  for (const char* cross : {"is_encoder_decoder", "add_cross_attention"})
    if (f.flag(cross).value_or(false)) f.fail(std::string("field '") + cross + "': cross-attention is not implemented");
  for (const char* key : {"torch_dtype", "dtype"}) {
    const std::optional<std::string> dtype = f.text(key);
    if (dtype && *dtype != "float32" && *dtype != "float16" && *dtype != "bfloat16")
      f.fail(std::string("field '") + key + "' is " + quote_name(*dtype) +
             "; kvhead reads float32, float16 and bfloat16 weights");
  }

  // 5. RoPE.
  read_rope(f, *type, config);

  // 6. Scale, soft-capping, biases, sinks, QK-norm, fused projections.
  if (*type == "gemma2") {
    f.refuse_null("query_pre_attn_scalar");
    const double scalar = f.real("query_pre_attn_scalar").value_or(256.0);
    if (!(scalar > 0.0)) f.fail("field 'query_pre_attn_scalar' must be positive");
    config.scale = float(1.0 / std::sqrt(scalar));
    if (!std::isfinite(*config.scale))
      f.fail("field 'query_pre_attn_scalar' = " + real_text(scalar) +
             " makes the scale 1 / sqrt of it overflow a float");
    // HF Gemma2Config: absent means 50, null means none.
    if (!object.contains("attn_logit_softcapping")) {
      config.logit_softcap = 50.0f;
    } else if (const std::optional<double> cap = f.real("attn_logit_softcapping")) {
      // float(cap) > 0 too: a cap that rounds to 0 would mean none, silently.
      if (!(*cap > 0.0 && *cap <= double(std::numeric_limits<float>::max()) && float(*cap) > 0.0f))
        f.fail("field 'attn_logit_softcapping' must be a positive float (or null: no soft-capping), got " +
               real_text(*cap));
      config.logit_softcap = float(*cap);
    }
  } else {
    config.scale = float(1.0 / std::sqrt(double(config.head_dim)));
  }
  // HF: attention_bias defaults to true for gpt-oss, false for the others;
  // null builds the projections without biases (nn.Linear's bias=None).
  const bool attention_bias =
      !config_fields::is_null(object, "attention_bias") && f.flag("attention_bias").value_or(*type == "gpt_oss");
  if (*type == "llama" || *type == "qwen3" || *type == "gemma2" || *type == "gpt_oss")
    spec.qkv_bias = spec.o_bias = attention_bias;
  spec.sinks = *type == "gpt_oss";
  if (*type == "qwen2") spec.qkv_bias = true;
  if (*type == "qwen3") {
    f.refuse_null("rms_norm_eps");
    const double eps = f.real("rms_norm_eps").value_or(1e-6);
    if (!(eps >= 0.0 && std::isfinite(float(eps))))
      f.fail("field 'rms_norm_eps' must be >= 0 and within a float's range, got " + real_text(eps));
    config.qk_norm_eps = float(eps);
  }
  spec.fused_qkv = *type == "phi3";
  return spec;
}

}  // namespace kvhead::io
