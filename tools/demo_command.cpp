// `kvhead demo`: decoding through a stack of attention layers over one KV cache.
//
// The model, a stand-in for a transformer without its MLPs, embeddings and
// logits (all sizes from the flags; defaults in demo_options):
//   L attention_layers, each H query heads, G kv heads, head_dim d, d_model D,
//   RoPE theta 10000, causal, no biases, weights ~ N(0, 1/D) (std
//   1/sqrt(D)) drawn from --seed;
//   per token, pre-norm residual:   h = x;  h = h + attn_l(rmsnorm(h)), l = 0..L-1;
//   the next token's input:         x' = rmsnorm(h)   (the last layer's output);
//   rmsnorm(v) = v * (1 / sqrt(mean(v^2) + 1e-6)), mean in double, no weight.
// Every row of h stays O(1): each layer adds the output of a normalized row,
// and each token starts from a normalized row.
//
// Passes (B sequences of a P-token random prompt, N(0, 1) embeddings):
//   1. flags;
//   2. one kv_cache with num_layers = L, of --kv-dtype and --block-size, sized for B
//      sequences of P + T tokens; layers and prompt from the seed (fill_normal streams);
//   3. prefill: append(seq, P) for each sequence, then one batched forward
//      per layer over the cache (B * P rows);
//   4. decode T steps: per step append(seq, 1) for each sequence, then each
//      layer's forward over the cache (B rows), with a progress line;
//   5. the last S = min(16, T) steps again WITHOUT a cache: per step the
//      whole prefix (B sequences of position + 1 tokens) through the
//      cache-free causal forward of every layer, feeding its own outputs
//      back; with an f32 cache its outputs must equal the cached ones bit
//      for bit (other dtypes: the difference is reported);
//   6. summary, and the --csv file of per-token latencies.
// --kv-dtype all runs 2-6 once per dtype, --precision all once per precision
// (both: every pair), then prints a table comparing the runs' decoded outputs
// with the first run's (f32 layers, f32 cache).
#include "tools/demo_command.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "engine/io/file_error.hpp"
#include "engine/io/output_file.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "kvhead/kv_cache.hpp"
#include "tools/block_size_flag.hpp"
#include "tools/cache_sizing.hpp"
#include "tools/cli_args.hpp"
#include "tools/kv_dtype_flag.hpp"
#include "tools/layer_job.hpp"
#include "tools/precision_flag.hpp"

namespace kvhead::tools {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr double rope_theta = 10000.0;
constexpr double rms_epsilon = 1e-6;
constexpr std::size_t window = 16;          // latency medians and the cache-free stretch
constexpr std::size_t plain_progress = 32;  // steps between progress lines when not a terminal

struct demo_options {
  std::size_t layers = 4, d_model = 2048, heads = 32, kv_heads = 8, head_dim = 64;
  std::size_t prompt = 256, tokens = 256, batch = 1, threads = 1;
  std::size_t block_size = 0;  // the cache's tokens per block; 0: its default
  std::uint64_t seed = 42;
  std::optional<std::string> csv;
  std::vector<kv_dtype> dtypes = {kv_dtype::f32};        // one run each (--kv-dtype all: every dtype)
  std::vector<precision> precisions = {precision::f32};  // per dtype, one run each (--precision all: both)
};

constexpr flag_spec demo_flags[] = {
    {"--layers", true}, {"--d-model", true},  {"--heads", true},     {"--kv-heads", true},   {"--head-dim", true},
    {"--prompt", true}, {"--tokens", true},   {"--batch", true},     {"--threads", true},    {"--seed", true},
    {"--csv", true},    {"--kv-dtype", true}, {"--precision", true}, {"--block-size", true},
};

// ------------------------------------------------------------------ 1. flags

std::uint64_t parse_seed(std::string_view text) {
  std::uint64_t value = 0;
  const char* const end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end)
    throw usage_error("--seed needs a whole number from 0 to 18446744073709551615, got " + quote_arg(text));
  return value;
}

demo_options parse_demo_options(const parsed_flags& flags) {
  demo_options o;
  o.layers = flags.count("--layers", 1024).value_or(o.layers);
  o.d_model = flags.count("--d-model", std::size_t(1) << 20).value_or(o.d_model);
  o.heads = flags.count("--heads", std::size_t(1) << 16).value_or(o.heads);
  o.kv_heads = flags.count("--kv-heads", std::size_t(1) << 16).value_or(o.kv_heads);
  o.head_dim = flags.count("--head-dim", std::size_t(1) << 16).value_or(o.head_dim);
  o.prompt = flags.count("--prompt", std::size_t(1) << 24).value_or(o.prompt);
  o.tokens = flags.count("--tokens", std::size_t(1) << 24).value_or(o.tokens);
  o.batch = flags.count("--batch", std::size_t(1) << 16).value_or(o.batch);
  o.threads =
      flags.count("--threads", max_threads).value_or(std::size_t(std::max(1, tbb::info::default_concurrency())));
  if (const std::optional<std::string> seed = flags.value("--seed")) o.seed = parse_seed(*seed);
  if (flags.has("--csv")) o.csv = flags.required("--csv");
  if (const std::optional<std::string> dtype = flags.value("--kv-dtype")) {
    if (*dtype == "all")
      o.dtypes.assign(std::begin(kv_dtypes), std::end(kv_dtypes));
    else
      o.dtypes = {parse_kv_dtype(*dtype, "all")};
  }
  o.block_size = parse_block_size(flags);
  if (const std::optional<std::string> name = flags.value("--precision")) {
    if (*name == "all")
      o.precisions.assign(std::begin(precisions), std::end(precisions));
    else
      o.precisions = {parse_precision(*name, "all")};
  }
  if (o.heads % o.kv_heads != 0)
    throw usage_error("--kv-heads " + std::to_string(o.kv_heads) + (flags.has("--kv-heads") ? "" : " (the default)") +
                      " must divide --heads " + std::to_string(o.heads));
  if (o.head_dim % 2 != 0)
    throw usage_error("--head-dim must be even (RoPE rotates pairs), got " + std::to_string(o.head_dim));
  return o;
}

// ----------------------------------------------------------------- helpers

/// a * b * ...; std::bad_alloc ("out of memory") when the float count or its
/// bytes overflow.
std::size_t floats_for(std::initializer_list<std::size_t> extents) {
  std::size_t count = 1;
  for (std::size_t extent : extents)
    if (__builtin_mul_overflow(count, extent, &count)) throw std::bad_alloc();
  if (count > std::size_t(PTRDIFF_MAX) / sizeof(float)) throw std::bad_alloc();
  return count;
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + std::ptrdiff_t(middle), values.end());
  const double upper = values[middle];
  if (values.size() % 2 != 0) return upper;
  return (*std::max_element(values.begin(), values.begin() + std::ptrdiff_t(middle)) + upper) / 2.0;
}

std::string format(const char* pattern, auto... values) {
  char buffer[512];
  const int size = std::snprintf(buffer, sizeof buffer, pattern, values...);
  return std::string(buffer, std::size_t(std::clamp(size, 0, int(sizeof buffer) - 1)));
}

std::string format_bytes(std::size_t bytes) {
  if (bytes >= (std::size_t(1) << 30)) return format("%.2f GiB", double(bytes) / double(1 << 30));
  if (bytes >= (std::size_t(1) << 20)) return format("%.1f MiB", double(bytes) / double(1 << 20));
  return format("%.1f KiB", double(bytes) / 1024.0);
}

std::string format_seconds(double seconds) {
  return seconds >= 1.0 ? format("%.2f s", seconds) : format("%.1f ms", seconds * 1e3);
}

/// rmsnorm of `rows` rows of `width` floats (see the top of the file). Each
/// row is computed on its own, in a fixed order: the same row gives the same
/// bits whatever the batch it is in.
void rms_norm(const float* x, std::size_t rows, std::size_t width, float* y) {
  for (std::size_t r = 0; r < rows; ++r, x += width, y += width) {
    double sum = 0.0;
    for (std::size_t i = 0; i < width; ++i) sum += double(x[i]) * double(x[i]);
    const float inverse = float(1.0 / std::sqrt(sum / double(width) + rms_epsilon));
    for (std::size_t i = 0; i < width; ++i) y[i] = x[i] * inverse;
  }
}

void add_to(float* h, const float* a, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) h[i] += a[i];
}

/// The layers and the scratch rows of one pass through the stack.
struct stack {
  std::vector<attention_layer> layers;
  std::size_t d_model = 0;
  std::vector<float> normed, out;  // resized on demand

  void reserve_rows(std::size_t rows) {
    // Exactly: a resize alone may double the capacity (check_memory_need).
    normed.reserve(floats_for({rows, d_model}));
    normed.resize(floats_for({rows, d_model}));
    out.reserve(normed.size());
    out.resize(normed.size());
  }

  /// h [rows, D] := the stack applied to h, each layer over the cache.
  void over_cache(kv_cache& cache, const std::vector<sequence_tokens>& entries, std::size_t rows, float* h) {
    reserve_rows(rows);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      rms_norm(h, rows, d_model, normed.data());
      layers[l].forward(cache, l, entries, normed.data(), out.data());
      add_to(h, out.data(), rows * d_model);
    }
  }

  /// h [batch, seq, D] := the stack applied to h with the cache-free forward.
  void without_cache(std::size_t batch, std::size_t seq, float* h) {
    const std::size_t rows = batch * seq;
    reserve_rows(rows);
    for (const attention_layer& layer : layers) {
      rms_norm(h, rows, d_model, normed.data());
      layer.forward(normed.data(), batch, seq, out.data());
      add_to(h, out.data(), rows * d_model);
    }
  }
};

/// `count` values ~ N(0, sigma^2) into `values`, in blocks of 2^16 values,
/// each from its own generator seeded with (seed, stream, block): the same
/// values for any thread count.
void fill_normal(float* values, std::size_t count, float sigma, std::uint64_t seed, std::uint64_t stream) {
  constexpr std::size_t block = std::size_t(1) << 16;
  tbb::parallel_for(std::size_t(0), (count + block - 1) / block, [&](std::size_t index) {
    std::seed_seq sequence{std::uint32_t(seed),         std::uint32_t(seed >> 32), std::uint32_t(stream),
                           std::uint32_t(stream >> 32), std::uint32_t(index),      std::uint32_t(index >> 32)};
    std::mt19937_64 generator(sequence);
    std::normal_distribution<float> normal(0.0f, sigma);
    const std::size_t end = std::min(count, (index + 1) * block);
    for (std::size_t i = index * block; i < end; ++i) values[i] = normal(generator);
  });
}

/// The layers from the seed: streams 4 l + 0..3 are q, k, v, o of layer l.
stack make_stack(const demo_options& o, precision compute) {
  attention_config config;
  config.precision = compute;
  config.num_heads = o.heads;
  config.num_kv_heads = o.kv_heads;
  config.head_dim = o.head_dim;
  config.d_model = o.d_model;
  config.causal = true;
  config.rope_theta = rope_theta;
  const float sigma = float(1.0 / std::sqrt(double(o.d_model)));
  std::vector<float> q(floats_for({o.heads, o.head_dim, o.d_model})),
      k(floats_for({o.kv_heads, o.head_dim, o.d_model}));
  std::vector<float> v(k.size()), out(q.size());
  stack result;
  result.d_model = o.d_model;
  for (std::size_t l = 0; l < o.layers; ++l) {
    std::uint64_t stream = 4 * l;
    for (std::vector<float>* weights : {&q, &k, &v, &out})
      fill_normal(weights->data(), weights->size(), sigma, o.seed, stream++);
    result.layers.emplace_back(
        config,
        attention_weights{{q.data(), nullptr}, {k.data(), nullptr}, {v.data(), nullptr}, {out.data(), nullptr}});
  }
  return result;
}

/// One line of progress: redrawn in place on a terminal ('\r', padded over
/// the previous line) at most every 50 ms and on the last update; otherwise
/// printed as a plain line when `plain` is true.
class progress_line {
 public:
  explicit progress_line(bool terminal) : terminal_(terminal) {}

  void show(const std::string& line, bool plain, bool last) {
    if (terminal_) {
      const clock_type::time_point now = clock_type::now();
      if (!last && width_ != 0 && now - drawn_ < std::chrono::milliseconds(50)) return;
      drawn_ = now;
      std::string text = "\r" + line;
      if (line.size() < width_) text.append(width_ - line.size(), ' ');
      width_ = line.size();
      std::fputs(text.c_str(), stdout);
      if (last) std::fputc('\n', stdout);
    } else if (plain || last) {
      std::puts(line.c_str());
    }
    std::fflush(stdout);
  }

 private:
  bool terminal_;
  std::size_t width_ = 0;
  clock_type::time_point drawn_;
};

// --------------------------------------------------------------- the demo

/// Bytes of the stack's weights as the layers store them.
std::size_t weight_bytes(const demo_options& o, precision compute) {
  const std::size_t elements = floats_for({o.layers, 2 * (o.heads + o.kv_heads), o.head_dim, o.d_model});  // q, o; k, v
  return elements * (compute == precision::bf16 ? 2 : 4);
}

/// The demo's cache geometry over `dtype` (its pool sized by make_sized_cache).
kv_cache_config cache_geometry(const demo_options& o, kv_dtype dtype) {
  kv_cache_config geometry;
  geometry.num_layers = o.layers;
  geometry.num_kv_heads = o.kv_heads;
  geometry.head_dim = o.head_dim;
  geometry.dtype = dtype;
  geometry.block_size = o.block_size;
  return geometry;
}

/// What one decode run leaves for the --kv-dtype all / --precision all table.
struct demo_run {
  precision compute;
  kv_dtype dtype;
  double decode_tokens_per_second;
  std::size_t bytes_per_token, bytes_in_use;
  std::vector<float> decoded;  // every decode step's output rows [T, B, D]
};

/// Passes 2-6 over a cache of `dtype`, the layers computing in `compute`.
demo_run run_one(const demo_options& o, precision compute, kv_dtype dtype, simd_path path, tbb::task_arena& arena) {
  const std::size_t B = o.batch, P = o.prompt, T = o.tokens, D = o.d_model, context = P + T;
  const std::size_t S = std::min(window, T);

  // 2. Cache, prompt, layers (allocations first: a size too large fails
  // before any output). history[b][p] is the input row of position p of
  // sequence b: the prompt, then each decoded token's fed-back input.
  kv_cache cache = make_sized_cache(cache_geometry(o, dtype), B, context);
  const std::size_t history_rows = context + 1;
  std::vector<float> history(floats_for({B, history_rows, D}));
  const auto row = [&](std::size_t b, std::size_t p) { return history.data() + (b * history_rows + p) * D; };

  std::printf("kvhead %s decoding demo: SIMD path %s, %zu thread(s)\n", version(), to_string(path), o.threads);
  std::printf(
      "model:  %zu attention layers, d_model %zu, %zu query heads, %zu kv heads, head_dim %zu,\n"
      "        RoPE theta %.0f, causal; weights ~ N(0, 1/%zu) from seed %llu, no biases\n"
      "        precision %s (weights %s in all)\n"
      "        per token: h = x; h += attn(rmsnorm(h)) for each layer; next input = rmsnorm(h)\n"
      "        (rmsnorm(v) = v / sqrt(mean(v^2) + 1e-6), no weight)\n",
      o.layers, D, o.heads, o.kv_heads, o.head_dim, rope_theta, D, (unsigned long long)o.seed, to_string(compute),
      format_bytes(weight_bytes(o, compute)).c_str());
  std::printf("run:    %zu sequence(s): prompt %zu random tokens (N(0, 1) embeddings), then %zu decoded tokens\n", B, P,
              T);
  std::printf(
      "        KV cache: %s, %zu bytes per token (all layers); %zu block(s) of %zu tokens x %zu layers,\n"
      "        %s each (%s pool)\n",
      to_string(dtype), cache.bytes_per_token(), cache.total_blocks(), cache.config().block_size, o.layers,
      format_bytes(cache.block_bytes()).c_str(), format_bytes(cache.total_blocks() * cache.block_bytes()).c_str());
  std::fflush(stdout);

  std::optional<stack> model;
  const clock_type::time_point setup_start = clock_type::now();
  arena.execute([&] {
    model.emplace(make_stack(o, compute));
    // The prompt: stream 2^63 + b for sequence b.
    for (std::size_t b = 0; b < B; ++b) fill_normal(row(b, 0), P * D, 1.0f, o.seed, (std::uint64_t(1) << 63) + b);
  });
  std::printf("setup:  weights and prompt generated in %s\n", format_seconds(seconds_since(setup_start)).c_str());
  std::vector<sequence_tokens> entries(B);
  for (sequence_tokens& entry : entries) entry.sequence = cache.create();

  // 3. Prefill.
  double prefill_seconds = 0.0;
  {
    std::vector<float> h(floats_for({B, P, D}));
    for (std::size_t b = 0; b < B; ++b) std::memcpy(h.data() + b * P * D, row(b, 0), P * D * sizeof(float));
    const clock_type::time_point start = clock_type::now();
    arena.execute([&] {
      for (sequence_tokens& entry : entries) {
        cache.append(entry.sequence, P);
        entry.tokens = P;
      }
      model->over_cache(cache, entries, B * P, h.data());
      for (std::size_t b = 0; b < B; ++b) rms_norm(h.data() + (b * P + P - 1) * D, 1, D, row(b, P));
    });
    prefill_seconds = seconds_since(start);
  }
  std::printf("prefill: %zu x %zu tokens in %s (%.0f tokens/s), KV cache %s in use\n", B, P,
              format_seconds(prefill_seconds).c_str(), double(B * P) / prefill_seconds,
              format_bytes(cache.bytes_in_use()).c_str());
  std::fflush(stdout);

  // 4. Decode, one token per sequence per step. The last S steps keep the
  // stack's output rows (before the final rmsnorm) for the check in 5.
  std::vector<double> latency(T);
  std::vector<float> decoded(floats_for({T, B, D}));
  {
    progress_line progress(::isatty(::fileno(stdout)) == 1);
    std::vector<float> h(floats_for({B, D}));
    for (sequence_tokens& entry : entries) entry.tokens = 1;
    double elapsed = 0.0;
    for (std::size_t step = 0; step < T; ++step) {
      const std::size_t position = P + step;
      const clock_type::time_point start = clock_type::now();
      arena.execute([&] {
        for (std::size_t b = 0; b < B; ++b) {
          std::memcpy(h.data() + b * D, row(b, position), D * sizeof(float));
          cache.append(entries[b].sequence, 1);
        }
        model->over_cache(cache, entries, B, h.data());
        for (std::size_t b = 0; b < B; ++b) rms_norm(h.data() + b * D, 1, D, row(b, position + 1));
      });
      latency[step] = seconds_since(start);
      elapsed += latency[step];
      std::memcpy(&decoded[step * B * D], h.data(), B * D * sizeof(float));
      const std::size_t done = step + 1;
      progress.show(
          format("decode %zu/%zu tokens x %zu seq | %.1f tokens/s | last token %.2f ms | KV cache %s", done, T, B,
                 double(done * B) / elapsed, latency[step] * 1e3, format_bytes(cache.bytes_in_use()).c_str()),
          done % plain_progress == 0, done == T);
    }
  }
  double decode_seconds = 0.0;
  for (double seconds : latency) decode_seconds += seconds;

  // 5. The last S steps without a cache, from the same inputs up to the
  // stretch's first position; every later input is its own output fed back.
  // Both the stack's output rows and the fed-back inputs must equal the
  // cached decode's, bit for bit.
  const std::size_t first = context - S;  // first recomputed position
  std::vector<double> recompute_latency(S);
  std::size_t differing = 0, compared = 0;
  float max_difference = 0.0f;
  const auto compare = [&](const float* mine, const float* cached) {
    for (std::size_t e = 0; e < D; ++e, ++compared) {
      if (std::memcmp(mine + e, cached + e, sizeof(float)) == 0) continue;
      ++differing;
      const float difference = std::fabs(mine[e] - cached[e]);
      max_difference = std::isnan(difference) ? difference : std::max(max_difference, difference);
    }
  };
  {
    std::vector<float> own(history);  // rows after `first` are overwritten below
    const auto own_row = [&](std::size_t b, std::size_t p) { return own.data() + (b * history_rows + p) * D; };
    std::vector<float> h;
    h.reserve(floats_for({B, context, D}));  // its largest: growing it would double the capacity
    for (std::size_t i = 0; i < S; ++i) {
      const std::size_t position = first + i, seq = position + 1;
      const clock_type::time_point start = clock_type::now();
      h.resize(floats_for({B, seq, D}));
      for (std::size_t b = 0; b < B; ++b) std::memcpy(h.data() + b * seq * D, own_row(b, 0), seq * D * sizeof(float));
      arena.execute([&] {
        model->without_cache(B, seq, h.data());
        for (std::size_t b = 0; b < B; ++b) rms_norm(h.data() + (b * seq + seq - 1) * D, 1, D, own_row(b, seq));
      });
      recompute_latency[i] = seconds_since(start);
      for (std::size_t b = 0; b < B; ++b) {
        compare(h.data() + (b * seq + seq - 1) * D, &decoded[((T - S + i) * B + b) * D]);
        compare(own_row(b, seq), row(b, seq));
      }
    }
  }

  // 6. Summary.
  const std::vector<double> early(latency.begin(), latency.begin() + std::ptrdiff_t(S));
  const std::vector<double> late(latency.end() - std::ptrdiff_t(S), latency.end());
  double cached_stretch = 0.0, recompute_stretch = 0.0;
  for (double seconds : late) cached_stretch += seconds;
  for (double seconds : recompute_latency) recompute_stretch += seconds;
  const std::size_t blocks_in_use = cache.total_blocks() - cache.free_blocks();
  std::printf("summary:\n");
  std::printf("  prefill   %zu tokens (%zu x %zu) in %s: %.0f tokens/s\n", B * P, B, P,
              format_seconds(prefill_seconds).c_str(), double(B * P) / prefill_seconds);
  std::printf("  decode    %zu tokens (%zu x %zu) in %s: %.1f tokens/s\n", B * T, B, T,
              format_seconds(decode_seconds).c_str(), double(B * T) / decode_seconds);
  std::printf(
      "  latency   per token step (%zu seq): median %.2f ms over the first %zu (positions %zu-%zu),\n"
      "            %.2f ms over the last %zu (positions %zu-%zu)\n",
      B, median(early) * 1e3, S, P, P + S - 1, median(late) * 1e3, S, first, context - 1);
  std::printf(
      "  KV cache  %s, %zu bytes per token; %zu of %zu block(s) in use (%zu tokens x %zu layers each),\n"
      "            %s (%s per block)\n",
      to_string(dtype), cache.bytes_per_token(), blocks_in_use, cache.total_blocks(), cache.config().block_size,
      o.layers, format_bytes(cache.bytes_in_use()).c_str(), format_bytes(cache.block_bytes()).c_str());
  std::printf(
      "  no cache  the last %zu steps (positions %zu-%zu) recomputing the whole prefix per token:\n"
      "            %.2f ms per step vs %.2f ms cached: %.1fx speed-up with the cache\n",
      S, first, context - 1, recompute_stretch / double(S) * 1e3, cached_stretch / double(S) * 1e3,
      recompute_stretch / cached_stretch);
  // Bit for bit where the cache stores K/V as the layers computed them (an
  // f32 cache, or a bf16 cache under bf16 layers, which round K/V to bf16)
  // and the sums run in the fixed order (KVHEAD_REDUCTION=fastest lets the
  // cached and the recomputed passes split them differently).
  const bool stored_exactly = dtype == kv_dtype::f32 || (dtype == kv_dtype::bf16 && compute == precision::bf16);
  const bool fixed_order = current_reduction_order() == reduction_order::fixed;
  const bool exact = stored_exactly && fixed_order;
  const char* const why_not_exact = stored_exactly ? "KVHEAD_REDUCTION=fastest" : "the cache rounds K/V";
  if (!exact && differing == 0)
    std::printf(
        "  check     cached (%s K/V) and recomputed (%s layers, no cache) outputs: identical here, %zu\n"
        "            values (%s: bit-identity is not promised)\n",
        to_string(dtype), to_string(compute), compared, why_not_exact);
  else if (!exact)
    std::printf(
        "  check     cached (%s K/V) and recomputed (%s layers, no cache) outputs: %zu of %zu values\n"
        "            differ, max |diff| %g (%s: not bit-identical by design)\n",
        to_string(dtype), to_string(compute), differing, compared, double(max_difference), why_not_exact);
  else if (differing == 0)
    std::printf(
        "  check     cached and recomputed outputs: identical, bit for bit (%zu tokens x %zu seq;\n"
        "            the last layer's output rows and the fed-back inputs, %zu floats)\n",
        S, B, compared);
  else
    std::printf("  check     cached and recomputed outputs: DIFFERENT in %zu of %zu values (max |diff| %g)\n",
                differing, compared, double(max_difference));
  std::fflush(stdout);

  if (o.csv) {
    std::string text = "seq,position,latency_ms\n";
    for (std::size_t step = 0; step < T; ++step)
      for (std::size_t b = 0; b < B; ++b) text += format("%zu,%zu,%.4f\n", b, P + step, latency[step] * 1e3);
    io::output_file file(*o.csv);
    file.write(text.data(), text.size());
    file.commit();
  }
  if (exact && differing != 0)
    throw std::runtime_error("the cached decode and the recomputed one differ in " + std::to_string(differing) +
                             " values (an engine bug)");
  return {compute,           dtype, double(B * T) / decode_seconds, cache.bytes_per_token(), cache.bytes_in_use(),
          std::move(decoded)};
}

/// The memory this process may use: the machine's, or less under a limit on
/// the address space (ulimit -v).
std::size_t usable_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  std::size_t usable = pages > 0 && page > 0 ? std::size_t(pages) * std::size_t(page) : SIZE_MAX;
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    usable = std::min<std::size_t>(usable, limit.rlim_cur);
  return usable;
}

/// Fails at once, naming the parts, when the largest run's weights, cache and
/// rows cannot fit this process's memory (rather than generating gigabytes of
/// weights first, or the system's OOM killer ending the process).
void check_memory_need(const demo_options& o) {
  std::size_t weights = 0, cache = 0;
  for (const precision compute : o.precisions) weights = std::max(weights, weight_bytes(o, compute));
  for (const kv_dtype dtype : o.dtypes)
    cache = std::max(cache, sized_cache_pool(cache_geometry(o, dtype), o.batch, o.prompt + o.tokens).bytes);
  // At the recomputed stretch's last step, the peak: the history and its
  // copy, every run's decoded rows, and over the whole context the inputs,
  // the stack's normed and output rows, and a layer's q, k, v and
  // attention output (the prefill's rows are fewer).
  const std::size_t runs = o.precisions.size() * o.dtypes.size(), context = o.prompt + o.tokens;
  const std::size_t layer_width = (2 * o.heads + 2 * o.kv_heads) * o.head_dim;
  const std::size_t rows =
      sizeof(float) *
      (2 * floats_for({o.batch, context + 1, o.d_model}) + floats_for({runs, o.batch, o.tokens, o.d_model}) +
       3 * floats_for({o.batch, context, o.d_model}) + floats_for({o.batch, context, layer_width}));
  std::size_t need = 0;
  const bool wrapped = __builtin_add_overflow(weights, cache, &need) || __builtin_add_overflow(need, rows, &need);
  const std::size_t usable = usable_memory_bytes();
  if (wrapped) need = SIZE_MAX;
  if (need > usable)
    throw std::runtime_error("needs about " + format_bytes(need) + " of memory (weights " + format_bytes(weights) +
                             ", KV cache " + format_bytes(cache) + ", activations " + format_bytes(rows) +
                             "), more than the " + format_bytes(usable) + " this process may use");
}

int run_demo(const demo_options& o) {
  const simd_path path = active_simd_path();  // KVHEAD_ISA and KVHEAD_REDUCTION errors first
  (void)current_reduction_order();
  if (o.csv) check_output_path(*o.csv);
  check_memory_need(o);
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism,
                                  std::max(o.threads, std::size_t(std::max(1, tbb::info::default_concurrency()))));
  tbb::task_arena arena(int(o.threads));
  std::vector<demo_run> runs;
  for (const precision compute : o.precisions)
    for (const kv_dtype dtype : o.dtypes) {
      if (!runs.empty()) std::printf("\n");
      // The --csv file holds the first run's latencies (f32 with --kv-dtype all).
      demo_options run_options = o;
      if (!runs.empty()) run_options.csv.reset();
      runs.push_back(run_one(run_options, compute, dtype, path, arena));
    }
  if (runs.size() > 1) {
    // The same decode per run: every run's decoded outputs against the first
    // run's (the first precision asked for, over the first dtype: f32 with all).
    const std::vector<float>& reference = runs.front().decoded;
    float reference_max = 0.0f;
    for (const float value : reference) reference_max = std::max(reference_max, std::fabs(value));
    std::printf(
        "\nruns: the same decode (%zu x %zu tokens after a %zu-token prompt) per precision and cache dtype;\n"
        "each run's outputs against the first run's (%s layers, %s cache), max |diff| / max |first's|\n",
        o.batch, o.tokens, o.prompt, to_string(runs.front().compute), to_string(runs.front().dtype));
    std::printf("  %-9s %-6s %12s %14s %10s %26s %11s\n", "precision", "dtype", "tokens/s", "bytes/token", "cache MiB",
                "max|diff| / max|first's|", "weight MiB");
    for (const demo_run& run : runs) {
      float difference = 0.0f;
      for (std::size_t i = 0; i < reference.size(); ++i) {
        const float d = std::fabs(run.decoded[i] - reference[i]);
        difference = std::isnan(d) ? d : std::max(difference, d);
      }
      std::printf("  %-9s %-6s %12.1f %14zu %10.2f %26.3g %11.1f\n", to_string(run.compute), to_string(run.dtype),
                  run.decode_tokens_per_second, run.bytes_per_token, double(run.bytes_in_use) / double(1 << 20),
                  reference_max > 0.0f ? double(difference / reference_max) : double(difference),
                  double(weight_bytes(o, run.compute)) / double(1 << 20));
    }
    std::fflush(stdout);
  }
  return exit_ok;
}

}  // namespace

std::string demo_help_text() {
  return "kvhead demo: token-by-token decoding through a stack of attention layers over one paged\n"
         "KV cache, with seeded random weights and prompt (no files needed). Model: per token\n"
         "h = x, then h += attn(rmsnorm(h)) for each layer; the next token's input is rmsnorm(h)\n"
         "(rmsnorm(v) = v / sqrt(mean(v^2) + 1e-6), no weight); attention layers with RoPE\n"
         "(theta 10000), causal, weights ~ N(0, 1/d_model). The prompt is prefilled (one batched\n"
         "forward per layer), then each step appends one token per sequence and runs each layer\n"
         "over the cache. Progress: redrawn in place on a terminal, a line every 32 tokens\n"
         "otherwise. At the end: prefill and decode speed, per-token latency early and late in\n"
         "the context (medians of the first and last 16 steps), cache blocks and bytes, and the\n"
         "last 16 steps redone without a cache (the whole prefix per token through the\n"
         "cache-free forward): its speed and a bit-for-bit check against the cached decode.\n"
         "\n"
         "usage: kvhead demo [--layers L] [--d-model D] [--heads H] [--kv-heads G] [--head-dim d]\n"
         "                   [--prompt P] [--tokens T] [--batch B] [--threads N] [--seed S]\n"
         "                   [--csv FILE] [--kv-dtype f32|bf16|f16|int8|all] [--precision f32|bf16|all]\n"
         "                   [--block-size B]\n"
         "\n"
         "  --layers L      attention layers, default 4 (at most 1024).\n"
         "  --d-model D     model width, default 2048; need not equal H * d.\n"
         "  --heads H       query heads, default 32.\n"
         "  --kv-heads G    key/value heads, default 8; must divide H.\n"
         "  --head-dim d    per-head width, default 64; must be even (RoPE).\n"
         "  --prompt P      prompt tokens per sequence, default 256.\n"
         "  --tokens T      decoded tokens per sequence, default 256.\n"
         "  --batch B       independent sequences decoded together (batched calls), default 1.\n"
         "  --threads N     oneTBB task arena of N threads, 1 to 1024; default: the CPU count.\n"
         "  --seed S        seed of the weights and the prompt, 0 to 2^64-1, default 42.\n"
         "  --csv FILE      also write seq,position,latency_ms: a header line, then one row per\n"
         "                  decoded token per sequence (written at the end, atomically).\n"
         "  --kv-dtype T    how the cache stores K and V: f32 (default), bf16, f16 or int8 (one\n"
         "                  scale per token and kv head); the run prints the bytes per token.\n"
         "                  Other than f32 (and bf16 under --precision bf16, which stores what the\n"
         "                  layers compute) the no-cache check reports the difference instead of\n"
         "                  requiring identical bits. all: the same decode once per dtype, then a\n"
         "                  table of tokens/s, bytes per token, cache MiB in use and the max |diff|\n"
         "                  of the decoded outputs from the f32 cache's run relative to its max\n"
         "                  (--csv: that run's latencies).\n"
         "  --precision P   how the layers compute: f32 (default) or bf16 (weights stored bf16, the\n"
         "                  GEMM inputs, q, k, v and the probabilities rounded to bf16, fp32\n"
         "                  accumulation; README, Precision). all: the decode once per precision\n"
         "                  (and per --kv-dtype), then the table above, one row per run, each\n"
         "                  compared with the first run's outputs (f32 layers over an f32 cache\n"
         "                  with all and all); weight MiB is what the layers store.\n" +
         block_size_help() +
         "  --help, -h      print this help and exit 0.\n"
         "\n"
         "exit status: 0 success; 1 an error (KVHEAD_ISA, KVHEAD_CONFIG or KVHEAD_REDUCTION, a\n"
         "--csv that cannot be written, out of memory, cached and recomputed outputs differing);\n"
         "2 usage error (unknown flag, a value that is not a positive whole number or above its\n"
         "limit, G not dividing H, odd d, an unknown --kv-dtype or --precision, another\n"
         "--block-size).\n"
         "Any failure prints one line on stderr.\n";
}

int demo_command(std::span<const char* const> args) {
  return run_guarded("kvhead demo", [&] {
    const parsed_flags flags = parse_flags(args, demo_flags);
    if (flags.help()) {
      std::fputs(demo_help_text().c_str(), stdout);
      return exit_ok;
    }
    return run_demo(parse_demo_options(flags));
  });
}

}  // namespace kvhead::tools
