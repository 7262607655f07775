#include "tools/layer_job.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include "engine/io/model_folder.hpp"
#include "engine/io/npy.hpp"
#include "engine/io/safetensors.hpp"
#include "kvhead/config.hpp"
#include "tools/precision_flag.hpp"

namespace kvhead::tools {

namespace {

// Counts far beyond any real model are still accepted here; the weights
// decide (a --heads that does not divide q_proj's rows is a file error).
constexpr std::size_t max_heads = std::size_t(1) << 32;

/// [batch, seq, d_model] or [seq, d_model] (batch 1), at least one token.
input_dims check_input(const std::string& path, const io::npy_array& input) {
  const std::vector<std::size_t>& shape = input.shape;
  std::string shape_text = "[";
  for (std::size_t i = 0; i < shape.size() && i < 8; ++i) {
    if (i != 0) shape_text += ", ";
    shape_text += std::to_string(shape[i]);
  }
  shape_text += shape.size() > 8 ? ", ...]" : "]";
  if (shape.size() != 2 && shape.size() != 3)
    throw io::file_error(path, "shape " + shape_text + " has rank " + std::to_string(shape.size()) +
                                   "; expected [batch, seq, d_model] or [seq, d_model]");
  const input_dims dims =
      shape.size() == 3 ? input_dims{shape[0], shape[1], shape[2]} : input_dims{1, shape[0], shape[1]};
  if (dims.batch == 0 || dims.seq == 0) throw io::file_error(path, "shape " + shape_text + " holds no tokens");
  return dims;
}

/// --layer: a whole number >= 0 (layer 0 is the first), plain digits.
std::size_t parse_layer_index(std::string_view text) {
  std::size_t value = 0;
  const char* const end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || stop != end || error != std::errc())
    throw usage_error("--layer needs a whole number >= 0, got " + quote_arg(text));
  return value;
}

/// A --model flag that disagrees with config.json: a usage error naming both.
template <class T>
void check_flag(const char* flag, const std::optional<T>& given, T actual, const char* field) {
  // Numbers in full (std::to_string's 6 decimals printed 0.250000 for both
  // sides of 0.2500001 against 0.25).
  auto text = [](T value) {
    if constexpr (std::is_integral_v<T>) {
      return std::to_string(value);
    } else {
      char buffer[40];
      std::snprintf(buffer, sizeof buffer, "%.*g", std::numeric_limits<T>::max_digits10, double(value));
      return std::string(buffer);
    }
  };
  if (given && *given != actual)
    throw usage_error(std::string(flag) + " " + text(*given) + " contradicts config.json's " + field + " (" +
                      text(actual) + ")");
}

/// Step 4: the layer from --weights and the layer flags, or from --model.
io::loaded_layer load_layer(const layer_job& job) {
  if (!job.model) {
    io::loaded_layer loaded = io::load_attention_layer(io::safetensors_file(job.weights), job.layer);
    loaded.config.precision = job.precision;
    if (job.alibi_max_bias) loaded.config.alibi_slopes = alibi_slopes(loaded.config.num_heads, *job.alibi_max_bias);
    return loaded;
  }
  io::model_layer model = io::load_model_layer(*job.model, job.model_layer);
  model.layer.config.precision = job.precision;
  if (job.longrope) {
    if (model.layer.config.rope_scaling.type != rope_scaling::kind::longrope)
      throw usage_error("--longrope needs a model whose RoPE is longrope; config.json's is not");
    model.layer.config.rope_scaling.longrope_factors = *job.longrope;
  }
  const attention_config& config = model.layer.config;
  check_flag("--heads", job.checks.heads, config.num_heads, "num_attention_heads");
  check_flag("--kv-heads", job.checks.kv_heads, config.num_kv_heads, "num_key_value_heads");
  check_flag("--rope-theta", job.checks.rope_theta, config.rope_theta, "rope_theta");
  check_flag("--scale", job.checks.scale, *config.scale, "attention scale");
  return std::move(model.layer);
}

}  // namespace

layer_job parse_layer_job(const parsed_flags& flags) {
  layer_job job;
  job.input = flags.required("--input");
  job.output = flags.required("--output");
  job.threads =
      flags.count("--threads", max_threads).value_or(std::size_t(std::max(1, tbb::info::default_concurrency())));
  if (const std::optional<std::string> name = flags.value("--precision")) job.precision = parse_precision(*name);
  if (const std::optional<std::string> name = flags.value("--longrope")) {
    if (!flags.has("--model")) throw usage_error("--longrope needs --model");
    job.longrope = parse_named("--longrope", longrope_choices, *name).pick;
  }
  if (flags.has("--model")) {
    for (const char* name : {"--weights", "--prefix", "--alibi"})
      if (flags.has(name)) throw usage_error(std::string(name) + " cannot be given with --model");
    job.model = flags.required("--model");
    const std::optional<std::string> layer = flags.value("--layer");
    if (!layer) throw usage_error("missing required flag --layer (with --model)");
    job.model_layer = parse_layer_index(*layer);
    job.checks = {flags.count("--heads", max_heads), flags.count("--kv-heads", max_heads),
                  flags.non_negative_double("--rope-theta"), flags.finite_float("--scale")};
    job.layer.causal = true;
    return job;
  }
  if (flags.has("--layer")) throw usage_error("--layer needs --model");
  job.weights = flags.required("--weights");
  const std::optional<std::size_t> heads = flags.count("--heads", max_heads);
  if (!heads) throw usage_error("missing required flag --heads");
  job.layer.num_heads = *heads;
  job.layer.num_kv_heads = flags.count("--kv-heads", max_heads);
  job.layer.causal = flags.has("--causal");
  job.layer.rope_theta = flags.non_negative_double("--rope-theta").value_or(0.0);
  job.layer.prefix = flags.value("--prefix").value_or("");
  job.layer.scale = flags.finite_float("--scale");
  job.alibi_max_bias = flags.non_negative_double("--alibi");
  if (job.alibi_max_bias && *job.alibi_max_bias == 0.0)
    throw usage_error("--alibi needs a max bias above 0 (8: BLOOM's)");
  return job;
}

void check_output_path(const std::string& output, const std::vector<read_path>& inputs) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path path(output);
  if (fs::is_directory(path, error)) throw io::file_error(output, "is a directory, not a file name");
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(folder, error))
    throw io::file_error(output, "cannot write: folder " + quote_arg(folder.string()) + " does not exist");
  // A name the folder cannot hold fails now, not after the work (the output is written last).
  const long name_max = ::pathconf(folder.c_str(), _PC_NAME_MAX);
  if (name_max > 0 && path.filename().string().size() > std::size_t(name_max))
    throw io::file_error(output, "cannot write: its name is longer than the " + std::to_string(name_max) +
                                     " bytes a name in its folder may have");
  if (!fs::exists(path, error)) return;
  for (const read_path& input : inputs)
    if (fs::equivalent(fs::path(input.path), path, error))
      throw io::file_error(output, std::string("is a file that ") + input.flag +
                                       " names, which this command reads: the output would destroy it");
}

int run_layer_job(const layer_job& job, const layer_forward& forward) {
  // 2. An unknown or unsupported KVHEAD_ISA, KVHEAD_CONFIG or KVHEAD_REDUCTION fails here, before any work.
  (void)active_simd_path();
  (void)current_reduction_order();
  // 3. Output folder.
  const std::vector<std::string> model_files =
      job.model ? io::model_folder_files(*job.model) : std::vector<std::string>{};
  std::vector<read_path> inputs = {{"--input", job.input}};
  if (!job.model) inputs.push_back({"--weights", job.weights});
  for (const std::string& file : model_files) inputs.push_back({"--model", file});
  check_output_path(job.output, inputs);

  // Let the arena really have `threads` threads (oneTBB otherwise caps it at
  // the CPU count and warns on stderr).
  const int threads = int(job.threads);
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism,
                                  std::size_t(std::max(threads, tbb::info::default_concurrency())));
  tbb::task_arena arena(threads);

  std::vector<float> output;
  io::npy_array input;
  arena.execute([&] {
    // 4. Weights: every shape checked against the flags.
    std::optional<attention_layer> layer;
    input_dims dims{};
    {
      const io::loaded_layer loaded = load_layer(job);
      // 5. Input.
      input = io::read_npy(job.input);
      dims = check_input(job.input, input);
      if (dims.d_model != loaded.config.d_model)
        throw io::file_error(job.input, "d_model " + std::to_string(dims.d_model) +
                                            " (last axis) does not match the weights' d_model " +
                                            std::to_string(loaded.config.d_model) + " (" +
                                            (job.model ? *job.model + "/config.json hidden_size" : job.weights) + ")");
      // 6. The layer copies the weights; the loaded arrays go out of scope.
      layer.emplace(loaded.build());
    }
    output.resize(input.values.size());
    forward(*layer, dims, input.values.data(), output.data());
  });

  // 7. Same shape as the input; temporary file then rename.
  io::write_npy(job.output, input.shape, output.data());
  return exit_ok;
}

std::string layer_job_help(const char* causal_line) {
  std::string text =
      "  --weights W     safetensors file (F32, F16 or BF16) holding <P>q_proj.weight [H*d, d_model],\n"
      "                  <P>k_proj.weight and <P>v_proj.weight [G*d, d_model], <P>o_proj.weight\n"
      "                  [d_model, H*d], and optionally <P>{q,k,v,o}_proj.bias (nn.Linear layout).\n"
      "                  head_dim d = rows of q_proj / H.\n"
      "  --model DIR     instead of --weights and the layer flags: a Hugging Face model folder\n"
      "                  (config.json, model.safetensors or model.safetensors.index.json and its\n"
      "                  shards) of model_type llama, mistral, qwen2, qwen3, phi3, gemma2 or\n"
      "                  gpt_oss; the layer is model.layers.N.self_attn.*, causal, every sequence\n"
      "                  from position 0, with the family's RoPE scaling, partial rotary, QK-norm,\n"
      "                  biases, scale, sliding window, soft-capping and sinks from config.json\n"
      "                  and the weights. --heads, --kv-heads, --rope-theta and --scale may still\n"
      "                  be given but must agree with it (else exit 2); --weights and --prefix may\n"
      "                  not. What kvhead does not implement (rope type dynamic, ...) is error 1.\n"
      "  --layer N       with --model: the layer index, 0 to num_hidden_layers - 1.\n"
      "  --input X       float32 .npy, [batch, seq, d_model] or [seq, d_model] (batch 1); with\n"
      "                  --model the attention block's input (after the input norm), d_model =\n"
      "                  hidden_size; the output is after o_proj, before the residual add.\n"
      "  --output Y      float32 .npy written with the input's shape (an existing file is\n"
      "                  replaced atomically; on any error it is left untouched; a link is\n"
      "                  followed, a device or FIFO written in place; an input is refused).\n"
      "  --heads H       number of query heads (required without --model).\n"
      "  --kv-heads G    number of key/value heads; default rows of k_proj / d. Must match the\n"
      "                  file and divide H (G = H: MHA, G = 1: MQA).\n";
  text += causal_line;
  text +=
      "  --rope-theta T  RoPE base (Hugging Face Llama rotate_half, positions from 0); 0, the\n"
      "                  default, means no RoPE; T > 0 needs an even d.\n"
      "  --alibi B       ALiBi with BLOOM's and MPT's slopes of max bias B (8 in both): head h's\n"
      "                  scores plus slope_h * (j - i); not with --model. README, Model folders.\n"
      "  --prefix P      prepended verbatim to every tensor name, e.g. model.layers.0.self_attn.\n"
      "  --scale S       multiplies q.k; default 1/sqrt(d). Must be finite.\n"
      "  --threads N     run in a oneTBB task arena of N threads, 1 to 1024; default: the\n"
      "                  number of CPUs this process may use.\n"
      "  --longrope L    with --model, a longrope RoPE (Phi-3 128k, Phi-4-mini): per-call (the\n"
      "                  default, as HF: a call's tokens take the long factors when their\n"
      "                  sequence is longer than original_max_position_embeddings at the end of\n"
      "                  the call, so the cut into calls matters), short or long (always those:\n"
      "                  the same bits however the tokens are cut). README, Model folders.\n"
      "  --precision P   f32 (default) or bf16: weights stored bf16 (BF16 tensors as they are),\n"
      "                  each projection's input and q, k, v and the attention probabilities\n"
      "                  rounded to bf16, fp32 accumulation and outputs (README, Precision).\n"
      "  --help, -h      print this help and exit 0.\n"
      "\n"
      "Flags take their value as --flag value or --flag=value (use the second form for a\n"
      "value starting with --). Counts are plain decimal digits; --scale and --rope-theta\n"
      "decimal numbers (0.125, 1e4); nothing else around them.\n"
      "\n"
      "exit status (any failure prints exactly one line on stderr and leaves --output\n"
      "untouched):\n"
      "  0  success; NaN or Inf in the input is not an error (it reaches only the outputs\n"
      "     that attend to it).\n"
      "  1  file or data error, the message names the file: missing or unreadable file, bad\n"
      "     format, wrong dtype or rank, no tokens, d_model of the input differs from the\n"
      "     weights, H not a multiple of G, --kv-heads disagreeing with the file, odd d with\n"
      "     RoPE, a prefix matching no tensor, an output that cannot be written or that is\n"
      "     one of the input files, out of memory.\n"
      "  2  usage error: unknown flag, missing required flag, flag given twice or missing its\n"
      "     value, a value that is not a number, a count <= 0 (or --threads > 1024), a\n"
      "     non-finite --scale, a negative or non-finite --rope-theta, an unknown --precision,\n"
      "     --longrope without --model, an unknown one, or for a model without longrope, an\n"
      "     --alibi not above 0 or with --model.\n"
      "\n"
      "environment:\n"
      "  KVHEAD_ISA=amx|avx512bf16|avx512|avx2|sse2\n"
      "                                force a SIMD path, or the avx512 path with that bf16\n"
      "                                unit (default: the best this CPU and OS run); an unknown\n"
      "                                or unsupported name is error 1.\n"
      "  KVHEAD_CONFIG=<name>          force a kernel configuration row (kvhead kernels lists\n"
      "                                them) and its SIMD path.\n"
      "  KVHEAD_REDUCTION=fixed|fastest  how a split key range is merged: fixed (default,\n"
      "                                bit-identical for any thread count) or fastest.\n";
  return text;
}

}  // namespace kvhead::tools
