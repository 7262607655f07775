// The C API's layer functions (include/kvhead/kvhead.h): options, open,
// queries, the cache-free forward, close.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <memory>

#include <tbb/info.h>

#include "engine/capi/handles.hpp"
#include "engine/capi/status.hpp"
#include "engine/io/layer_loader.hpp"
#include "engine/io/model_folder.hpp"
#include "engine/io/safetensors.hpp"

namespace kvhead::capi {

namespace {

/// The struct as version 0.1 defined it: the smallest struct_size accepted.
constexpr std::size_t first_options_size = offsetof(kvh_layer_options, threads) + sizeof(int32_t);
static_assert(first_options_size <= sizeof(kvh_layer_options));

constexpr int32_t max_threads = 4096;  // as kvhead::set_num_threads

/// Every field at its default (kvhead.h), struct_size = this library's.
constexpr kvh_layer_options default_options() {
  kvh_layer_options options{};
  options.struct_size = sizeof(kvh_layer_options);
  options.num_heads = 0;
  options.num_kv_heads = 0;
  options.rope_theta = 0.0f;
  options.scale = 0.0f;
  options.prefix = nullptr;
  options.threads = 0;
  options.kv_dtype = KVH_KV_F32;
  options.logit_softcap = 0.0f;
  options.sinks = nullptr;
  options.precision = KVH_PRECISION_F32;
  options.sliding_window = 0;
  options.kv_block_size = 0;
  options.alibi_slopes = nullptr;
  return options;
}

/// The caller's options as this library's struct: the fields its
/// struct_size covers, defaults for the later ones.
///
/// Adding a field (kvhead.h's ABI rule): append it to kvh_layer_options,
/// give its default in default_options(), validate it in load_options() or
/// where it is used. Nothing else changes: an older caller's struct_size
/// stops before the field, which then keeps its default. A field that fits
/// in the old struct's tail padding (an int32 after threads: sizeof stays
/// 40) is covered by the old struct_size too, and holds its default there,
/// because kvh_layer_options_init_sized, run by this library, wrote it.
kvh_layer_options read_options(const kvh_layer_options& given) {
  const std::size_t size = given.struct_size;
  check(size >= first_options_size, KVH_ERR_INVALID_ARGUMENT, [&] {
    return "options->struct_size = " + std::to_string(size) +
           ": initialize the options with kvh_layer_options_init first";
  });
  check(size <= sizeof(kvh_layer_options), KVH_ERR_INVALID_ARGUMENT, [&] {
    return "options->struct_size = " + std::to_string(size) + " is from a newer kvhead (this library knows " +
           std::to_string(sizeof(kvh_layer_options)) + " bytes of options, version " + kvh_version() + ")";
  });
  kvh_layer_options options = default_options();
  std::memcpy(&options, &given, size);
  return options;
}

/// The loader's options from validated C options.
io::layer_load_options load_options(const kvh_layer_options& options) {
  const auto invalid = [](const std::string& problem) { throw capi_error(KVH_ERR_INVALID_ARGUMENT, problem); };
  if (options.num_heads < 1) invalid("options->num_heads = " + std::to_string(options.num_heads) + " (must be >= 1)");
  if (options.num_kv_heads < 0)
    invalid("options->num_kv_heads = " + std::to_string(options.num_kv_heads) + " (must be >= 0; 0 = num_heads)");
  const int32_t kv_heads = options.num_kv_heads == 0 ? options.num_heads : options.num_kv_heads;
  if (options.num_heads % kv_heads != 0)
    invalid("options->num_heads = " + std::to_string(options.num_heads) +
            " is not a multiple of num_kv_heads = " + std::to_string(kv_heads));
  if (!std::isfinite(options.rope_theta) || options.rope_theta < 0.0f)
    invalid("options->rope_theta must be 0 (no RoPE) or a positive finite number, got " +
            std::to_string(options.rope_theta));
  if (!std::isfinite(options.scale))
    invalid("options->scale must be finite (0 = 1/sqrt(head_dim)), got " + std::to_string(options.scale));
  if (options.threads < 0 || options.threads > max_threads)
    invalid("options->threads = " + std::to_string(options.threads) + " (must be 0 to " + std::to_string(max_threads) +
            "; 0 = all cores)");
  io::layer_load_options load;
  load.prefix = options.prefix != nullptr ? options.prefix : "";
  load.num_heads = std::size_t(options.num_heads);
  load.num_kv_heads = std::size_t(kv_heads);
  if (options.scale != 0.0f) load.scale = options.scale;
  load.causal = false;  // per call (kvh_layer_forward); decoding is always causal
  load.rope_theta = options.rope_theta;
  return load;
}

/// The layer's sliding window from the C options (0: none).
std::size_t sliding_window_of(const kvh_layer_options& options) {
  check(options.sliding_window >= 0, KVH_ERR_INVALID_ARGUMENT, [&] {
    return "options->sliding_window = " + std::to_string(options.sliding_window) + " (must be >= 0; 0 = none)";
  });
  return std::size_t(options.sliding_window);
}

/// The layer's precision from validated C options.
precision precision_of(const kvh_layer_options& options) {
  check(options.precision == KVH_PRECISION_F32 || options.precision == KVH_PRECISION_BF16, KVH_ERR_INVALID_ARGUMENT,
        [&] {
          return "options->precision = " + std::to_string(options.precision) +
                 " (must be KVH_PRECISION_F32 or KVH_PRECISION_BF16)";
        });
  static_assert(int(precision::f32) == KVH_PRECISION_F32 && int(precision::bf16) == KVH_PRECISION_BF16);
  return precision(options.precision);
}

/// A kvh_layer around `layer`, with its own arena when options.threads > 0.
std::unique_ptr<kvh_layer> wrap(attention_layer layer, const kvh_layer_options& options) {
  check(options.kv_dtype >= KVH_KV_F32 && options.kv_dtype <= KVH_KV_INT8, KVH_ERR_INVALID_ARGUMENT, [&] {
    return "options->kv_dtype = " + std::to_string(options.kv_dtype) +
           " (must be KVH_KV_F32, KVH_KV_BF16, KVH_KV_F16 or KVH_KV_INT8)";
  });
  static_assert(int(kv_dtype::f32) == KVH_KV_F32 && int(kv_dtype::bf16) == KVH_KV_BF16 &&
                int(kv_dtype::f16) == KVH_KV_F16 && int(kv_dtype::int8) == KVH_KV_INT8);
  check(options.kv_block_size == 0 || std::ranges::find(kv_cache_block_sizes, std::size_t(options.kv_block_size)) !=
                                          std::end(kv_cache_block_sizes),
        KVH_ERR_INVALID_ARGUMENT, [&] {
          return "options->kv_block_size = " + std::to_string(options.kv_block_size) +
                 " (must be 16, 32, 64, 128 or 256; 0 = " + std::to_string(kv_cache_default_block_size) + ")";
        });
  std::unique_ptr<kvh_layer> wrapped(
      new kvh_layer{std::move(layer), kv_dtype(options.kv_dtype), std::size_t(options.kv_block_size), nullptr});
  if (options.threads > 0) {
    const int threads = std::min<int>(options.threads, std::max(1, tbb::info::default_concurrency()));
    wrapped->arena = std::make_unique<tbb::task_arena>(threads);
    wrapped->arena->initialize();
  }
  return wrapped;
}

/// kvh_layer_open_model's checks of the options against config.json.
void check_model_options(const kvh_layer_options& options, const attention_config& config) {
  const auto agree = [&](bool given, bool same, const char* field, const std::string& value) {
    check(!given || same, KVH_ERR_INVALID_ARGUMENT,
          [&] { return std::string("options->") + field + " contradicts config.json, which gives " + value; });
  };
  agree(options.num_heads != 0, std::size_t(options.num_heads) == config.num_heads, "num_heads",
        std::to_string(config.num_heads));
  agree(options.num_kv_heads != 0, std::size_t(options.num_kv_heads) == config.num_kv_heads, "num_kv_heads",
        std::to_string(config.num_kv_heads));
  agree(options.rope_theta != 0.0f, double(options.rope_theta) == double(float(config.rope_theta)), "rope_theta",
        std::to_string(config.rope_theta));
  agree(options.scale != 0.0f, config.scale && options.scale == *config.scale, "scale",
        config.scale ? std::to_string(*config.scale) : std::string("the default"));
  agree(options.logit_softcap != 0.0f, options.logit_softcap == config.logit_softcap, "logit_softcap",
        std::to_string(config.logit_softcap));
  agree(options.sliding_window != 0, std::uint64_t(options.sliding_window) == config.sliding_window, "sliding_window",
        std::to_string(config.sliding_window) + " for this layer");
  check(options.prefix == nullptr, KVH_ERR_INVALID_ARGUMENT,
        [] { return std::string("options->prefix must be NULL with a model folder (layers are model.layers.N)"); });
  check(options.sinks == nullptr, KVH_ERR_INVALID_ARGUMENT, [] {
    return std::string("options->sinks must be NULL with a model folder (sinks come from its self_attn.sinks)");
  });
  check(options.alibi_slopes == nullptr, KVH_ERR_INVALID_ARGUMENT, [] {
    return std::string("options->alibi_slopes must be NULL with a model folder (no family it reads uses ALiBi)");
  });
  check(options.threads >= 0 && options.threads <= max_threads, KVH_ERR_INVALID_ARGUMENT, [&] {
    return "options->threads = " + std::to_string(options.threads) + " (must be 0 to " + std::to_string(max_threads) +
           "; 0 = all cores)";
  });
}

int32_t layer_dimension(const kvh_layer* layer, std::size_t attention_config::*field) {
  return layer == nullptr ? 0 : int32_t(layer->layer.config().*field);
}

}  // namespace

}  // namespace kvhead::capi

using namespace kvhead::capi;

extern "C" {

void kvh_layer_options_init_sized(kvh_layer_options* options, size_t struct_size) {
  if (options == nullptr || struct_size < first_options_size) return;
  const kvh_layer_options defaults = default_options();
  std::memcpy(options, &defaults, std::min(struct_size, sizeof defaults));
  options->struct_size = struct_size;
}

// The exported function behind the macro of the same name (kvhead.h), for
// callers that cannot use the macro (ctypes, cffi, bindgen).
void(kvh_layer_options_init)(kvh_layer_options* options) {
  kvh_layer_options_init_sized(options, sizeof(kvh_layer_options));
}

kvh_status kvh_layer_open(const char* safetensors_path, const kvh_layer_options* options, kvh_layer** out) {
  return guarded("kvh_layer_open", [&] {
    not_null(safetensors_path, "safetensors_path");
    not_null(options, "options");
    not_null(out, "out");
    const kvh_layer_options checked = read_options(*options);
    const kvhead::io::layer_load_options load = load_options(checked);
    const kvhead::precision compute = precision_of(checked);
    const std::size_t window = sliding_window_of(checked);
    // Missing, unreadable or not a regular file: KVH_ERR_IO; the contents:
    // KVH_ERR_FORMAT (guarded, from the file_error's kind).
    std::unique_ptr<kvh_layer> layer;
    {
      const kvhead::io::safetensors_file file(safetensors_path);
      kvhead::io::loaded_layer loaded = kvhead::io::load_attention_layer(file, load);
      loaded.config.logit_softcap = checked.logit_softcap;  // checked by the layer
      if (checked.sinks != nullptr) loaded.sinks.assign(checked.sinks, checked.sinks + loaded.config.num_heads);
      if (checked.alibi_slopes != nullptr)  // checked by the layer
        loaded.config.alibi_slopes.assign(checked.alibi_slopes, checked.alibi_slopes + loaded.config.num_heads);
      loaded.config.precision = compute;
      loaded.config.sliding_window = window;
      layer = wrap(loaded.build(), checked);
    }
    *out = layer.release();
  });
}

kvh_status kvh_layer_open_model(const char* folder, int32_t layer_index, const kvh_layer_options* options,
                                kvh_layer** out) {
  return guarded("kvh_layer_open_model", [&] {
    not_null(folder, "folder");
    not_null(options, "options");
    not_null(out, "out");
    const kvh_layer_options checked = read_options(*options);
    const kvhead::precision compute = precision_of(checked);
    sliding_window_of(checked);
    check(layer_index >= 0, KVH_ERR_INVALID_ARGUMENT,
          [&] { return "layer_index = " + std::to_string(layer_index) + " (must be >= 0)"; });
    const std::string config_path = kvhead::io::model_config_path(folder);  // not a folder, no config.json: KVH_ERR_IO
    const std::size_t layers = kvhead::io::read_num_hidden_layers(config_path);
    check(std::size_t(layer_index) < layers, KVH_ERR_INVALID_ARGUMENT, [&] {
      return "layer_index = " + std::to_string(layer_index) + ", but " + config_path + " has num_hidden_layers " +
             std::to_string(layers);
    });
    kvhead::io::model_layer model = kvhead::io::load_model_layer(folder, std::size_t(layer_index));
    check_model_options(checked, model.layer.config);
    model.layer.config.precision = compute;
    *out = wrap(model.layer.build(), checked).release();
  });
}

int32_t kvh_layer_d_model(const kvh_layer* layer) { return layer_dimension(layer, &kvhead::attention_config::d_model); }
int32_t kvh_layer_num_heads(const kvh_layer* layer) {
  return layer_dimension(layer, &kvhead::attention_config::num_heads);
}
int32_t kvh_layer_num_kv_heads(const kvh_layer* layer) {
  return layer_dimension(layer, &kvhead::attention_config::num_kv_heads);
}
int32_t kvh_layer_head_dim(const kvh_layer* layer) {
  return layer_dimension(layer, &kvhead::attention_config::head_dim);
}

kvh_status kvh_layer_forward(const kvh_layer* layer, const float* x, int64_t batch, int64_t seq, int causal, float* y) {
  return guarded("kvh_layer_forward", [&] {
    not_null(layer, "layer");
    not_null(x, "x");
    not_null(y, "y");
    const std::size_t batches = positive_count("batch", batch), tokens = positive_count("seq", seq);
    const std::size_t floats =
        checked_product({batches, tokens, layer->layer.config().d_model}, "batch * seq * d_model");
    check_disjoint(x, y, floats);
    layer->run([&] { layer->layer.forward(x, batches, tokens, causal != 0, y); });
  });
}

void kvh_layer_close(kvh_layer* layer) { delete layer; }

}  // extern "C"
