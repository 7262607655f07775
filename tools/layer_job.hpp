// What `kvhead run` and `kvhead decode` share: one attention layer loaded from
// safetensors, applied to a float32 .npy input, the result written atomically
// as .npy. Only the forward pass differs (run: one cache-free forward;
// decode: chunked steps over a KV cache), so the commands pass it in as a
// callback and everything else lives here once:
//   1. flags (layer_job_flags, parse_layer_job),
//   2. SIMD path (KVHEAD_ISA), 3. output folder, 4. weights, 5. input,
//   6. the layer and the caller's forward pass in a task arena of --threads,
//   7. atomic write of the output (run_layer_job).
// The error contract (exit codes, one stderr line, output untouched on any
// failure) is described by layer_job_help().
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/io/layer_loader.hpp"
#include "kvhead/attention.hpp"
#include "tools/cli_args.hpp"

namespace kvhead::tools {

/// The flags of `kvhead run`; `kvhead decode` adds --chunk.
inline constexpr flag_spec layer_job_flags[] = {
    {"--weights", true}, {"--input", true},      {"--output", true},    {"--heads", true},    {"--kv-heads", true},
    {"--causal", false}, {"--rope-theta", true}, {"--prefix", true},    {"--scale", true},    {"--threads", true},
    {"--model", true},   {"--layer", true},      {"--precision", true}, {"--longrope", true}, {"--alibi", true},
};

/// --longrope's choices (rope_scaling::longrope_factors) as the flag names them.
struct longrope_choice {
  rope_scaling::longrope_pick pick;
  const char* name;
};
inline std::string to_string(longrope_choice choice) { return choice.name; }
inline constexpr longrope_choice longrope_choices[] = {{rope_scaling::longrope_pick::per_call, "per-call"},
                                                       {rope_scaling::longrope_pick::short_factors, "short"},
                                                       {rope_scaling::longrope_pick::long_factors, "long"}};

/// With --model: the layer flags that were also given, each checked against
/// config.json (a contradiction is a usage error).
struct model_flag_checks {
  std::optional<std::size_t> heads, kv_heads;
  std::optional<double> rope_theta;
  std::optional<float> scale;
};

struct layer_job {
  std::string weights, input, output;
  io::layer_load_options layer;
  std::optional<std::string> model;  // a Hugging Face folder instead of --weights
  std::size_t model_layer = 0;       // --layer
  model_flag_checks checks;
  std::size_t threads = 1;
  kvhead::precision precision = kvhead::precision::f32;  // --precision
  std::optional<rope_scaling::longrope_pick> longrope;   // --longrope (with --model)
  std::optional<double> alibi_max_bias;                  // --alibi (with --weights): BLOOM's and MPT's slopes
};

/// The options of layer_job_flags; throws usage_error.
layer_job parse_layer_job(const parsed_flags& flags);

/// The input's shape: [batch, seq, d_model] ([seq, d_model] reads as batch 1).
struct input_dims {
  std::size_t batch, seq, d_model;
};

/// y = layer(x) for x and y [batch, seq, d_model] row-major; runs inside the
/// job's task arena. May throw (the output is then not written).
using layer_forward =
    std::function<void(const attention_layer& layer, const input_dims& dims, const float* x, float* y)>;

/// Steps 2 to 7 above; returns exit_ok or throws (run_guarded maps it).
int run_layer_job(const layer_job& job, const layer_forward& forward);

/// A file that a command reads, and the flag naming it (--model: each file
/// io::model_folder_files lists).
struct read_path {
  const char* flag;
  std::string_view path;
};

/// Fails early (io::file_error) when `output` cannot possibly be written: a
/// folder, or a file in a folder that does not exist, or when it is one of
/// the files the command reads (`inputs`), which writing it would destroy.
/// The write itself is still checked.
void check_output_path(const std::string& output, const std::vector<read_path>& inputs = {});

/// Help paragraphs shared by run and decode: the flags from --weights to
/// --help (`causal_line` replaces the --causal description), the flag
/// syntax, the exit status and the environment.
std::string layer_job_help(const char* causal_line);

}  // namespace kvhead::tools
