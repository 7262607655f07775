// Model folder loading: 1. config.json, 2. the weight files (one, or an index
// and its shards, each tensor in exactly one), 3. the layer's tensor names,
// 4. shapes against config.json, 5. load (q, k, v split out of a fused qkv).
#include "engine/io/model_folder.hpp"

#include "kvhead/model.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>
#include <vector>

#include "engine/io/json_file.hpp"
#include "engine/io/safetensors.hpp"

namespace kvhead::io {

namespace {

namespace fs = std::filesystem;

std::string number(std::size_t value) { return std::to_string(value); }

// Whether the folder has an entry of that name, a broken link included: it
// is then opened, and fails naming the real problem (a dangling link, a loop)
// instead of reading as absent (or a dangling model.safetensors falling back
// to the index).
bool present(const fs::path& path) {
  std::error_code error;
  return fs::symlink_status(path, error).type() != fs::file_type::not_found && !error;
}

// The index's weight_map, tensor -> shard file name, each name checked to be
// a plain file name in the folder; file_error otherwise.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  const nlohmann::json index = read_json_object(index_path);
  const auto map = index.find("weight_map");
  if (map == index.end() || !map->is_object())
    throw file_error(index_path, "has no object 'weight_map' (tensor name -> shard file)");
  std::map<std::string, std::string> shard_of;
  for (const auto& [tensor, shard] : map->items()) {
    if (!shard.is_string())
      throw file_error(index_path, "weight_map entry " + quote_name(tensor) + " is " + json_type_name(shard) +
                                       ", not a shard file name");
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos)  // a NUL would cut the path short: another file
      throw file_error(index_path, "shard " + quote_name(name) + " is not a plain file name in the folder");
    shard_of.emplace(tensor, name);
  }
  return shard_of;
}

// 2. The folder's tensors: each name in exactly one file.
class model_weights {
 public:
  explicit model_weights(const fs::path& folder) {
    const fs::path single = folder / "model.safetensors", index = folder / "model.safetensors.index.json";
    if (present(single)) {
      add(safetensors_file(single.string()));
    } else if (present(index)) {
      open_shards(folder, index.string());
    } else {
      throw file_error(folder.string(), "holds neither model.safetensors nor model.safetensors.index.json",
                       file_problem::access);
    }
  }

  bool contains(const std::string& name) const { return owner_.contains(name); }
  const safetensors_file& file_of(const std::string& name) const { return files_[owner_.at(name)]; }
  /// Every tensor name starting with `prefix`, sorted.
  std::vector<std::string> names_with(const std::string& prefix) const {
    std::vector<std::string> names;
    for (auto it = owner_.lower_bound(prefix); it != owner_.end() && it->first.starts_with(prefix); ++it)
      names.push_back(it->first);
    return names;
  }

 private:
  void add(safetensors_file file) {
    for (const std::string& name : file.tensor_names()) {
      const auto [found, inserted] = owner_.emplace(name, files_.size());
      if (!inserted)
        throw file_error(file.path(), "tensor " + quote_name(name) + " is also in " +
                                          quote_name(files_[found->second].path()) + " (a tensor in two shards)");
    }
    files_.push_back(std::move(file));
  }

  void open_shards(const fs::path& folder, const std::string& index_path) {
    const std::map<std::string, std::string> shard_of = read_weight_map(index_path);
    std::set<std::string> shards;
    for (const auto& entry : shard_of) shards.insert(entry.second);
    for (const std::string& shard : shards) {
      if (!present(folder / shard)) {
        const auto named =
            std::find_if(shard_of.begin(), shard_of.end(), [&](const auto& e) { return e.second == shard; });
        throw file_error(index_path,
                         "shard " + quote_name(shard) + " (named for tensor " + quote_name(named->first) +
                             ") does not exist in the folder",
                         file_problem::access);
      }
      add(safetensors_file((folder / shard).string()));
    }
    for (const auto& [tensor, shard] : shard_of) {
      if (!contains(tensor))
        throw file_error(index_path, "tensor " + quote_name(tensor) + " is mapped to shard " + quote_name(shard) +
                                         ", which does not hold it");
      if (fs::path(file_of(tensor).path()).filename() != shard)
        throw file_error(index_path, "tensor " + quote_name(tensor) + " is mapped to shard " + quote_name(shard) +
                                         " but is in " + quote_name(file_of(tensor).path()));
    }
  }

  std::vector<safetensors_file> files_;
  std::map<std::string, std::size_t> owner_;  // tensor name -> index into files_
};

class layer_reader {
 public:
  layer_reader(const model_weights& weights, const model_layer_spec& spec, const std::string& folder, std::size_t layer)
      : weights_(weights), spec_(spec), folder_(folder), prefix_("model.layers." + number(layer) + ".self_attn.") {}

  loaded_layer read() {
    const attention_config& c = spec_.config;
    const std::size_t q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;
    // 3. The expected names and shapes (and nothing else).
    std::map<std::string, std::vector<std::size_t>> expected;
    if (spec_.fused_qkv) {
      expected["qkv_proj.weight"] = {q_rows + 2 * kv_rows, c.d_model};
    } else {
      expected["q_proj.weight"] = {q_rows, c.d_model};
      expected["k_proj.weight"] = {kv_rows, c.d_model};
      expected["v_proj.weight"] = {kv_rows, c.d_model};
    }
    expected["o_proj.weight"] = {c.d_model, q_rows};
    if (spec_.qkv_bias) {
      expected["q_proj.bias"] = {q_rows};
      expected["k_proj.bias"] = {kv_rows};
      expected["v_proj.bias"] = {kv_rows};
    }
    if (spec_.o_bias) expected["o_proj.bias"] = {c.d_model};
    if (c.qk_norm_eps) expected["q_norm.weight"] = expected["k_norm.weight"] = {c.head_dim};
    if (spec_.sinks) expected["sinks"] = {c.num_heads};

    const std::vector<std::string> present = weights_.names_with(prefix_);
    if (present.empty()) fail(folder_, "no tensor of this layer (" + prefix_ + "*)");
    for (const std::string& name : present) {
      const std::string suffix = name.substr(prefix_.size());
      if (suffix == "rotary_emb.inv_freq" || expected.contains(suffix)) continue;
      fail(weights_.file_of(name).path(), "unexpected tensor " + quote_name(name) + " for model_type " +
                                              quote_name(spec_.model_type) + " (config.json gives it no such " +
                                              "attention tensor; attention_bias and the family decide the biases)");
    }
    // 4. Shapes.
    for (const auto& [suffix, shape] : expected) {
      const std::string name = prefix_ + suffix;
      if (!weights_.contains(name)) fail(folder_, "missing tensor " + quote_name(name));
      const tensor_info& info = weights_.file_of(name).info(name);
      if (info.shape != shape)
        fail(weights_.file_of(name).path(), quote_name(name) + " has shape " + shape_text(info.shape) +
                                                ", but config.json implies " + shape_text(shape));
    }
    // 5. Load.
    loaded_layer result;
    result.config = c;
    if (spec_.fused_qkv) {
      owned_linear qkv;
      load_weight_of("qkv_proj.weight", qkv);
      const auto split = [&](auto& all, auto owned_linear::*member) {
        const auto rows = [&](std::size_t first, std::size_t count) {
          return std::vector(all.begin() + std::ptrdiff_t(first * c.d_model),
                             all.begin() + std::ptrdiff_t((first + count) * c.d_model));
        };
        result.q_proj.*member = rows(0, q_rows);
        result.k_proj.*member = rows(q_rows, kv_rows);
        result.v_proj.*member = rows(q_rows + kv_rows, kv_rows);
      };
      if (qkv.weight_bf16.empty())
        split(qkv.weight, &owned_linear::weight);
      else
        split(qkv.weight_bf16, &owned_linear::weight_bf16);
    } else {
      load_weight_of("q_proj.weight", result.q_proj);
      load_weight_of("k_proj.weight", result.k_proj);
      load_weight_of("v_proj.weight", result.v_proj);
    }
    load_weight_of("o_proj.weight", result.o_proj);
    if (spec_.qkv_bias) {
      result.q_proj.bias = load("q_proj.bias");
      result.k_proj.bias = load("k_proj.bias");
      result.v_proj.bias = load("v_proj.bias");
    }
    if (spec_.o_bias) result.o_proj.bias = load("o_proj.bias");
    if (c.qk_norm_eps) {
      result.q_norm = load("q_norm.weight");
      result.k_norm = load("k_norm.weight");
    }
    if (spec_.sinks) {
      result.sinks = load("sinks");
      for (std::size_t h = 0; h < result.sinks.size(); ++h)
        if (!std::isfinite(result.sinks[h]))
          fail(weights_.file_of(prefix_ + "sinks").path(),
               quote_name(prefix_ + "sinks") + " entry " + number(h) + " is not finite");
    }
    return result;
  }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& problem) {
    throw file_error(path, problem);
  }

  void load_weight_of(const std::string& suffix, owned_linear& target) const {
    const std::string name = prefix_ + suffix;
    load_weight(weights_.file_of(name), name, target);
  }

  std::vector<float> load(const std::string& suffix) const {
    const std::string name = prefix_ + suffix;
    return weights_.file_of(name).load_f32(name);
  }

  const model_weights& weights_;
  const model_layer_spec& spec_;
  const std::string& folder_;
  std::string prefix_;
};

}  // namespace

std::vector<std::string> model_folder_files(const std::string& folder) {
  const fs::path root(folder), single = root / "model.safetensors", index = root / "model.safetensors.index.json";
  std::vector<std::string> files = {(root / "config.json").string(), single.string(), index.string()};
  if (present(single) || !present(index)) return files;
  try {
    for (const auto& entry : read_weight_map(index.string())) files.push_back((root / entry.second).string());
  } catch (const file_error&) {
    // A bad index fails the load itself, before any output is written.
  }
  return files;
}

std::string model_config_path(const std::string& folder) {
  std::error_code error;
  if (!fs::is_directory(fs::path(folder), error))
    throw file_error(folder, "is not a folder (a Hugging Face model folder)", file_problem::access);
  const fs::path config = fs::path(folder) / "config.json";
  if (!present(config))
    throw file_error(folder, "has no config.json (not a Hugging Face model folder)", file_problem::access);
  return config.string();
}

model_layer load_model_layer(const std::string& folder, std::size_t layer) {
  model_layer result;
  // 1-2. The configuration before the weights: a bad config opens no shard.
  result.spec = read_model_config(model_config_path(folder), layer);
  const model_weights weights{fs::path(folder)};
  result.layer = layer_reader(weights, result.spec, folder, layer).read();
  return result;
}

}  // namespace kvhead::io

namespace kvhead {

attention_config model_layer_config(const std::string& folder, std::size_t layer) {
  return io::read_model_config(io::model_config_path(folder), layer).config;
}

attention_layer load_model_layer(const std::string& folder, std::size_t layer) {
  return load_model_layer(folder, layer, precision::f32);
}

attention_layer load_model_layer(const std::string& folder, std::size_t layer, precision compute) {
  io::model_layer model = io::load_model_layer(folder, layer);
  model.layer.config.precision = compute;
  return model.layer.build();
}

}  // namespace kvhead
