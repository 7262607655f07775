// libFuzzer target: io::read_model_config (a Hugging Face config.json) on
// arbitrary bytes, for the layer index in the input's first byte.
//
// Either the reader throws io::file_error with a one-line message naming the
// file, or the spec it returns is one the layer can be built from: the layer
// index below num_hidden_layers, head counts that divide, a head_dim and
// d_model of at least 1, rotary_dim within head_dim and even when RoPE is on,
// a finite positive scale, causal attention.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/io/file_error.hpp"
#include "engine/io/model_config.hpp"
#include "tests/fuzz/memory_file.hpp"

namespace {

void check(bool property) {
  if (!property) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvhead::io;
  if (size == 0) return 0;
  const std::size_t layer = data[0] % 8;
  static kvhead::fuzz::memory_file input;
  input.assign(data + 1, size - 1);
  model_layer_spec spec;
  try {
    spec = read_model_config(input.path(), layer);
  } catch (const file_error& error) {
    const std::string_view message = error.what();
    check(message.starts_with(input.path() + ": ") && message.find('\n') == std::string_view::npos);
    return 0;
  }
  const kvhead::attention_config& config = spec.config;
  check(layer < spec.num_hidden_layers);
  check(config.num_heads >= 1 && config.num_kv_heads >= 1 && config.num_heads % config.num_kv_heads == 0);
  check(config.head_dim >= 1 && config.d_model >= 1 && config.causal);
  check(config.rotary_dim <= config.head_dim);
  check(config.rope_theta == 0.0 || (std::isfinite(config.rope_theta) && config.rope_theta > 0.0));
  check(!config.scale || (std::isfinite(*config.scale) && *config.scale > 0.0f));
  return 0;
}
