// `kvhead run`: the layer_job steps (layer_job.hpp) with one cache-free
// forward pass over the whole input.
#include "tools/run_command.hpp"

#include <cstdio>

#include "tools/cli_args.hpp"
#include "tools/layer_job.hpp"

namespace kvhead::tools {

std::string run_help_text() {
  return std::string(
             "kvhead run: one attention layer (q/k/v/o projections, optional RoPE, scaled dot-product\n"
             "attention with grouped kv heads, output projection) on a float32 input.\n"
             "\n"
             "usage: kvhead run --weights W.safetensors --input X.npy --output Y.npy --heads H\n"
             "                  [--kv-heads G] [--causal] [--rope-theta T] [--prefix P] [--scale S]\n"
             "                  [--threads N] [--precision f32|bf16]\n"
             "       kvhead run --model DIR --layer N --input X.npy --output Y.npy [--threads N]\n"
             "                  [--precision f32|bf16]\n"
             "\n") +
         layer_job_help("  --causal        token i attends to tokens 0..i only (switch, no value).\n");
}

int run_command(std::span<const char* const> args) {
  return run_guarded("kvhead run", [&] {
    const parsed_flags flags = parse_flags(args, layer_job_flags);
    if (flags.help()) {
      std::fputs(run_help_text().c_str(), stdout);
      return exit_ok;
    }
    return run_layer_job(parse_layer_job(flags),
                         [](const attention_layer& layer, const input_dims& dims, const float* x, float* y) {
                           layer.forward(x, dims.batch, dims.seq, y);
                         });
  });
}

}  // namespace kvhead::tools
