// kvhead: one attention layer of a Hugging Face model folder, so that a server
// never parses config.json itself.
//
// A folder holds config.json, and model.safetensors or
// model.safetensors.index.json with its shards. Layer N is
// model.layers.N.self_attn.*: its input is the attention block's input hidden
// states (after the input norm), its output the block's output after o_proj
// (before the residual add); attention is causal and every sequence starts at
// position 0. Families: llama (RoPE scaling default, linear, llama3, yarn),
// mistral, qwen2, qwen3 (QK-norm), phi3 (fused qkv_proj, partial rotary),
// gemma2 (query_pre_attn_scalar, logit soft-capping attn_logit_softcapping:
// absent 50, null none) and gpt_oss (attention sinks self_attn.sinks, all four
// biases, yarn RoPE); weights F32, F16 or BF16 (BF16 kept as bf16 for
// attention_config::precision bf16, else widened to f32 exactly).
// Sliding-window layers (Mistral's sliding_window, Qwen 2's
// use_sliding_window from max_window_layers on, Gemma 2's and gpt-oss's even
// layers, layer_types "sliding_attention") get attention_config::sliding_window;
// when every layer slides, kv_cache::drop_outside_window frees the blocks no
// future query sees. RoPE default, linear, llama3, yarn and longrope (Phi-3's
// su and yarn read as longrope, as HF does). What kvhead does not implement
// (rope type "dynamic", MLA, another model_type) is an error naming the
// field, never an approximation.
// README's "Model folders" section lists the fields read.
//
// Errors: std::runtime_error with one line "<file>: <problem>" (no folder, no
// config.json, a missing shard, a tensor in two shards, a layer index at or
// beyond num_hidden_layers, a head count that does not divide, an
// unsupported field or value).
#pragma once

#include <cstddef>
#include <string>

#include "kvhead/attention.hpp"
#include "kvhead/export.h"

namespace kvhead {

/// The configuration of layer `layer` of the model folder, from its
/// config.json alone (no weight file is opened).
KVHEAD_API attention_config model_layer_config(const std::string& folder, std::size_t layer);

/// Layer `layer` of the model folder, its weights loaded and packed.
KVHEAD_API attention_layer load_model_layer(const std::string& folder, std::size_t layer);

/// The same, computing in `compute` (attention_config::precision): with bf16,
/// a BF16 checkpoint's weights are packed as they are, never widened.
KVHEAD_API attention_layer load_model_layer(const std::string& folder, std::size_t layer, precision compute);

}  // namespace kvhead
