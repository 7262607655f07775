// One attention layer of a Hugging Face model folder, the way a server loads
// it without parsing config.json itself:
//
//   DIR/config.json                       the model's configuration (model_config.hpp)
//   DIR/model.safetensors                 every tensor, or
//   DIR/model.safetensors.index.json      {"weight_map": {"<tensor>": "<shard file>", ...}}
//   DIR/<shard files>                     plain file names in DIR
//
// (model.safetensors wins when both are present, as in Hugging Face.) Layer N's
// tensors are model.layers.N.self_attn.* in nn.Linear layout:
// q_proj/k_proj/v_proj/o_proj.weight (or qkv_proj.weight, rows q then k then v,
// for phi3, split at load), the biases its family has, q_norm/k_norm.weight
// [head_dim] for qwen3, sinks [num_attention_heads] (finite) for gpt_oss.
// F32, F16 and BF16 are widened to f32 exactly. Other tensors of the layer
// are errors (a bias the family has not, sinks outside gpt_oss), except
// rotary_emb.inv_freq, which old checkpoints store and Hugging Face recomputes.
//
// Every problem throws file_error naming the file: no config.json, no
// weights, a shard named in the index but absent, a tensor in two shards or not
// where the index says, a missing tensor, a shape that disagrees with
// config.json, and all of read_model_config's.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/io/layer_loader.hpp"
#include "engine/io/model_config.hpp"

namespace kvhead::io {

struct model_layer {
  model_layer_spec spec;
  loaded_layer layer;  // layer.config == spec.config
};

/// The files load_model_layer may read in DIR: config.json, model.safetensors,
/// the index and the shards it names (whether they exist or not; a bad
/// index names no shard). Never throws file_error.
std::vector<std::string> model_folder_files(const std::string& folder);

/// DIR/config.json; file_error when DIR is not a folder or has none.
std::string model_config_path(const std::string& folder);

/// Reads DIR/config.json and layer `layer`'s weights.
model_layer load_model_layer(const std::string& folder, std::size_t layer);

}  // namespace kvhead::io
