// `kvhead decode`: the layer_job steps of `kvhead run` (layer_job.hpp) with the
// forward pass replaced by decoding over one KV cache:
//   1. one cache (num_layers 1, the layer's kv geometry, --block-size (the
//      default: the cache's), --kv-dtype) sized for every sequence: batch *
//      round_up(seq, block_size) tokens; batch element b is sequence b;
//   2. per step, every sequence takes its next `chunk` tokens (the last step
//      may be shorter): cache.append(sequence, n) for each, then ONE
//      layer.forward over the cache with all sequences' rows concatenated in
//      entry order;
//   3. the output rows go back to their [batch, seq, d_model] places.
// With an f32 cache the layer guarantees the result equals the causal
// cache-free forward bit for bit, whatever the chunking, batching or thread
// count (and block size); with bf16, f16 or int8 it is independent of those
// too, and differs from the f32 result by the rounding of the stored K/V.
#include "tools/decode_command.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kvhead/attention.hpp"
#include "kvhead/kv_cache.hpp"
#include "tools/block_size_flag.hpp"
#include "tools/cache_sizing.hpp"
#include "tools/cli_args.hpp"
#include "tools/kv_dtype_flag.hpp"
#include "tools/layer_job.hpp"

namespace kvhead::tools {

namespace {

/// The cache decode_forward keeps K and V in.
struct cache_choice {
  kv_dtype dtype = kv_dtype::f32;
  std::size_t block_size = 0;  // 0: the cache's default
};

/// y = layer(x), causal, fed `chunk` tokens per sequence per step.
void decode_forward(std::size_t chunk, cache_choice cache_kind, const attention_layer& layer, const input_dims& dims,
                    const float* x, float* y) {
  const attention_config& config = layer.config();
  const std::size_t d_model = dims.d_model;
  // 1. The cache.
  kv_cache_config geometry;
  geometry.num_layers = 1;
  geometry.num_kv_heads = config.num_kv_heads != 0 ? config.num_kv_heads : config.num_heads;
  geometry.head_dim = config.head_dim;
  geometry.dtype = cache_kind.dtype;
  geometry.block_size = cache_kind.block_size;
  kv_cache cache = make_sized_cache(geometry, dims.batch, dims.seq);
  std::vector<sequence_tokens> entries(dims.batch);
  for (sequence_tokens& entry : entries) entry.sequence = cache.create();

  // 2. Steps of n <= chunk tokens per sequence.
  const std::size_t step_tokens = std::min(chunk, dims.seq);
  std::vector<float> x_rows(dims.batch * step_tokens * d_model), y_rows(x_rows.size());
  for (std::size_t start = 0; start < dims.seq;) {
    const std::size_t n = std::min(chunk, dims.seq - start);
    const std::size_t floats = n * d_model;
    for (std::size_t b = 0; b < dims.batch; ++b) {
      cache.append(entries[b].sequence, n);
      entries[b].tokens = n;
      std::memcpy(x_rows.data() + b * floats, x + (b * dims.seq + start) * d_model, floats * sizeof(float));
    }
    layer.forward(cache, 0, entries, x_rows.data(), y_rows.data());
    // 3. Back to [batch, seq, d_model].
    for (std::size_t b = 0; b < dims.batch; ++b)
      std::memcpy(y + (b * dims.seq + start) * d_model, y_rows.data() + b * floats, floats * sizeof(float));
    start += n;
  }
}

}  // namespace

std::string decode_help_text(bool full) {
  std::string text =
      "kvhead decode: the layer of kvhead run --causal, computed by incremental decoding over a\n"
      "paged KV cache: each batch element of the input is one sequence of one cache, and all\n"
      "sequences are fed --chunk tokens at a time (the last chunk may be shorter), one batched\n"
      "layer call per step. With the default f32 cache the output is bit-identical to kvhead\n"
      "run --causal on the same input, for any --chunk, --block-size and --threads.\n"
      "\n"
      "usage: kvhead decode --weights W.safetensors --input X.npy --output Y.npy --heads H\n"
      "                     [--chunk N] [--kv-dtype T] [--block-size B] [--kv-heads G] [--causal]\n"
      "                     [--rope-theta T] [--prefix P] [--scale S] [--threads N]\n"
      "                     [--precision f32|bf16]\n"
      "       kvhead decode --model DIR --layer N --input X.npy --output Y.npy [--chunk N]\n"
      "                     [--kv-dtype T] [--block-size B] [--threads N] [--precision f32|bf16]\n"
      "\n"
      "  --chunk N       tokens per sequence per step, a positive whole number; default 1\n"
      "                  (token by token). Larger than the sequence: one prefill step.\n"
      "  --kv-dtype T    how the cache stores K and V: f32 (default), bf16, f16 or int8 (one\n"
      "                  scale per token and kv head). Other than f32, the output differs from\n"
      "                  run --causal by the rounding of K/V, and is still the same for any\n"
      "                  --chunk and --threads.\n" +
      block_size_help();
  if (!full)
    return text +
           "  --causal        accepted; decoding is always causal.\n"
           "  The other flags, the exit status and the environment are those of kvhead run\n"
           "  (--chunk 0 or a non-number, an unknown --kv-dtype or another --block-size is a\n"
           "  usage error, exit 2).\n";
  return text + layer_job_help("  --causal        accepted (switch, no value); decoding is always causal.\n");
}

int decode_command(std::span<const char* const> args) {
  return run_guarded("kvhead decode", [&] {
    std::vector<flag_spec> specs(std::begin(layer_job_flags), std::end(layer_job_flags));
    specs.push_back({"--chunk", true});
    specs.push_back({"--kv-dtype", true});
    specs.push_back({"--block-size", true});
    const parsed_flags flags = parse_flags(args, specs);
    if (flags.help()) {
      std::fputs(decode_help_text(true).c_str(), stdout);
      return exit_ok;
    }
    layer_job job = parse_layer_job(flags);
    job.layer.causal = true;
    const std::size_t chunk = flags.count("--chunk", std::numeric_limits<std::size_t>::max()).value_or(1);
    const std::optional<std::string> dtype_name = flags.value("--kv-dtype");
    const cache_choice cache_kind{dtype_name ? parse_kv_dtype(*dtype_name) : kv_dtype::f32, parse_block_size(flags)};
    return run_layer_job(job, [chunk, cache_kind](const attention_layer& layer, const input_dims& dims, const float* x,
                                                  float* y) { decode_forward(chunk, cache_kind, layer, dims, x, y); });
  });
}

}  // namespace kvhead::tools
