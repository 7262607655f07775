// The attention of one layer of a Hugging Face model, from its config.json,
// for the families kvhead implements, following each family's modeling_*.py:
//
//   model_type  biases                  projections        extra
//   llama       q,k,v,o if attention_bias q,k,v,o_proj     rope_scaling (llama3, linear, yarn)
//   mistral     none                    q,k,v,o_proj       every layer slides by sliding_window (absent:
//                                                          4096, null: no window)
//   qwen2       q,k,v (always)          q,k,v,o_proj       sliding per use_sliding_window, max_window_layers
//   qwen3       q,k,v,o if attention_bias q,k,v,o_proj     QK-norm (q_norm, k_norm, eps rms_norm_eps)
//   phi3        none                    qkv_proj, o_proj   partial_rotary_factor; sliding_window (null: none)
//   gemma2      q,k,v,o if attention_bias q,k,v,o_proj     scale query_pre_attn_scalar^-0.5 (default 256);
//                                                          soft-capping attn_logit_softcapping (absent:
//                                                          50, null: none); even layers slide
//                                                          (sliding_window, absent: 4096)
//   gpt_oss     q,k,v,o if attention_bias q,k,v,o_proj     sinks [H]; rope absent: yarn factor 32,
//               (default true)                             beta 32/1, orig 4096, truncate false;
//                                                          theta absent: 150000; even layers slide
//                                                          (sliding_window, absent: 128)
//
// A sliding layer (layer_types "sliding_attention" when given, else the
// family's rule) gets config.sliding_window = sliding_window: key j visible
// to query i only if i - j < sliding_window, as HF's sliding mask.
//
// Fields read: model_type, hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads and head_dim (absent: the family's HF default,
// hf_defaults_of in model_config.cpp; null: MHA, and hidden_size / heads, which
// must divide), rope_theta (absent: 10000), rope_scaling or rope_parameters
// (rope_type / type: default, linear, llama3, yarn; phi3 default only),
// partial_rotary_factor, attention_bias, sliding_window, use_sliding_window,
// max_window_layers, layer_types (gemma2, gpt_oss, qwen2, qwen3: the families
// whose HF code reads it), query_pre_attn_scalar,
// attn_logit_softcapping, rms_norm_eps, max_position_embeddings, torch_dtype /
// dtype. Attention is causal, positions start at 0.
//
// What kvhead does not implement is an error naming the field, never an
// approximation: another model_type, rope types "dynamic", "longrope" and
// the rest, a sliding layer without a window, attn_logit_softcapping outside
// gemma2, MLA (kv_lora_rank, q_lora_rank), cross-attention, an unknown key
// inside rope_scaling. Every problem throws file_error
// "<dir>/config.json: <problem>".
#pragma once

#include <cstddef>
#include <string>

#include "kvhead/attention.hpp"

namespace kvhead::io {

struct model_layer_spec {
  std::string model_type;
  std::size_t num_hidden_layers = 0;
  attention_config config;  // d_model = hidden_size; causal; num_kv_heads, rotary_dim and scale set
  bool fused_qkv = false;   // one qkv_proj.weight [(H + 2G) d, hidden] (phi3), split at load
  bool qkv_bias = false;    // q_proj, k_proj, v_proj have biases
  bool o_bias = false;      // o_proj has a bias
  bool sinks = false;       // self_attn.sinks [H] (gpt_oss)
};

/// num_hidden_layers of the config.json at `config_path` (nothing else is checked).
std::size_t read_num_hidden_layers(const std::string& config_path);

/// The spec of layer `layer` from the config.json at `config_path`.
model_layer_spec read_model_config(const std::string& config_path, std::size_t layer);

}  // namespace kvhead::io
