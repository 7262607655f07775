// The public attention API: validation at the boundary, then the engine.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "engine/arch/checked_size.hpp"
#include "engine/arch/require.hpp"
#include "engine/arch/scratch.hpp"
#include "engine/attention/flash_attention.hpp"
#include "engine/attention/layer_impl.hpp"
#include "engine/attention/rope_scaling.hpp"
#include "engine/attention/scaled_dot_product.hpp"
#include "engine/gemm/gemm.hpp"
#include "engine/scheduler/arena.hpp"
#include "engine/softmax/softmax.hpp"
#include "kvhead/attention.hpp"

namespace kvhead {

const char* to_string(precision value) {
  switch (value) {
    case precision::f32:
      return "f32";
    case precision::bf16:
      return "bf16";
  }
  return "unknown";
}

namespace {

float resolve_scale(const std::optional<float>& scale, std::size_t head_dim) {
  if (!scale) return float(1.0 / std::sqrt(double(head_dim)));
  engine::require(std::isfinite(*scale), [&] { return std::string("attention: scale must be finite"); });
  return *scale;
}

void validate_softcap(const char* where, float logit_softcap) {
  engine::require(std::isfinite(logit_softcap) && logit_softcap >= 0.0f, [&] {
    return std::string(where) + ": logit_softcap must be 0 (none) or finite and positive, got " +
           std::to_string(logit_softcap);
  });
}

// One finite number per query head (sinks, ALiBi slopes), or none.
void validate_per_head(const char* where, const char* name, const float* values, std::size_t num_heads) {
  if (values == nullptr) return;
  for (std::size_t h = 0; h < num_heads; ++h)
    engine::require(std::isfinite(values[h]), [&] {
      return std::string(where) + ": " + name + "[" + std::to_string(h) + "] is not finite (" +
             std::to_string(values[h]) + ")";
    });
}

void validate_precision(const char* where, precision value) {
  engine::require(value == precision::f32 || value == precision::bf16, [&] {
    return std::string(where) + ": precision must be f32 or bf16, got " + std::to_string(int(value));
  });
}

void validate_heads(const char* where, std::size_t num_heads, std::size_t num_kv_heads, std::size_t head_dim) {
  auto message = [&](const std::string& problem) { return std::string(where) + ": " + problem; };
  engine::require(num_heads > 0, [&] { return message("num_heads must be positive"); });
  engine::require(num_kv_heads > 0, [&] { return message("num_kv_heads must be positive"); });
  engine::require(head_dim > 0, [&] { return message("head_dim must be positive"); });
  engine::require(num_heads % num_kv_heads == 0, [&] {
    return message("num_heads (" + std::to_string(num_heads) + ") is not a multiple of num_kv_heads (" +
                   std::to_string(num_kv_heads) + ")");
  });
}

/// The floats a [batch, heads, seq, head_dim] view spans from its data
/// pointer (the last one it addresses, plus one), or nullopt when they do not
/// fit in memory after that pointer.
std::optional<std::size_t> addressed_floats(const head_tensor<const float>& tensor, std::size_t batch,
                                            std::size_t heads, std::size_t seq, std::size_t head_dim) {
  std::optional<std::size_t> end = head_dim;
  for (const auto& [extent, stride] : {std::pair{batch, tensor.batch_stride}, std::pair{heads, tensor.head_stride},
                                      std::pair{seq, tensor.seq_stride}}) {
    const std::optional<std::size_t> span = engine::checked_product({extent - 1, stride});
    end = span && end ? engine::checked_sum(*end, *span) : std::nullopt;
  }
  const std::optional<std::size_t> bytes = end ? engine::checked_product({*end, sizeof(float)}) : std::nullopt;
  if (!bytes || reinterpret_cast<std::uintptr_t>(tensor.data) > UINTPTR_MAX - *bytes) return std::nullopt;
  return end;
}

/// Whether the rows of a view are disjoint: with its axes of extent above 1
/// sorted by stride, each stride is at least the span of the axes inside it
/// (rows of head_dim floats innermost). Every dense layout (bhsd, bshd, any
/// permutation, padded or sliced) passes.
bool rows_disjoint(const head_tensor<float>& tensor, std::size_t batch, std::size_t heads, std::size_t seq,
                   std::size_t head_dim) {
  std::pair<std::size_t, std::size_t> axes[3];  // (stride, extent)
  std::size_t count = 0;
  for (const auto& [extent, stride] : {std::pair{batch, tensor.batch_stride}, std::pair{heads, tensor.head_stride},
                                      std::pair{seq, tensor.seq_stride}})
    if (extent > 1) axes[count++] = {stride, extent};
  for (std::size_t i = 1; i < count; ++i)  // sorted by stride: insertion sort of at most 3
    for (std::size_t j = i; j > 0 && axes[j] < axes[j - 1]; --j) std::swap(axes[j], axes[j - 1]);
  std::size_t inner = head_dim;  // floats spanned by the axes inside
  for (std::size_t i = 0; i < count; ++i) {
    if (axes[i].first < inner) return false;
    inner = engine::checked_product({axes[i].first, axes[i].second}).value_or(SIZE_MAX);
  }
  return true;
}

void validate_views(const attention_dims& dims, const head_tensor<const float>& q, const head_tensor<const float>& k,
                    const head_tensor<const float>& v, const head_tensor<float>& out) {
  auto message = [](const std::string& problem) { return "scaled_dot_product_attention: " + problem; };
  const struct {
    const char* name;
    head_tensor<const float> view;
    std::size_t heads, seq;
  } views[] = {{"q", q, dims.num_heads, dims.q_len},
               {"k", k, dims.num_kv_heads, dims.kv_len},
               {"v", v, dims.num_kv_heads, dims.kv_len},
               {"out", {out.data, out.batch_stride, out.head_stride, out.seq_stride}, dims.num_heads, dims.q_len}};
  for (const auto& entry : views) {
    if (entry.seq == 0) continue;
    engine::require(entry.view.seq_stride >= dims.head_dim, [&] {
      return message(std::string(entry.name) + " rows overlap (seq_stride " + std::to_string(entry.view.seq_stride) +
                     " < head_dim " + std::to_string(dims.head_dim) + ")");
    });
    engine::require(addressed_floats(entry.view, dims.batch, entry.heads, entry.seq, dims.head_dim).has_value(), [&] {
      return message(std::string(entry.name) + " strides address beyond the end of memory (batch " +
                     std::to_string(dims.batch) + ", heads " + std::to_string(entry.heads) + ", seq " +
                     std::to_string(entry.seq) + ")");
    });
  }
  engine::require(rows_disjoint(out, dims.batch, dims.num_heads, dims.q_len, dims.head_dim), [&] {
    return message("out rows overlap one another (batch_stride " + std::to_string(out.batch_stride) +
                   ", head_stride " + std::to_string(out.head_stride) + ", seq_stride " +
                   std::to_string(out.seq_stride) + ", head_dim " + std::to_string(dims.head_dim) + ")");
  });
}

}  // namespace

void scaled_dot_product_attention(const attention_dims& dims, head_tensor<const float> q, head_tensor<const float> k,
                                  head_tensor<const float> v, head_tensor<float> out,
                                  const attention_options& options) {
  const engine::default_fp_environment environment;  // for the scale (arena.hpp)
  validate_heads("scaled_dot_product_attention", dims.num_heads, dims.num_kv_heads, dims.head_dim);
  const bool empty_queries = dims.batch == 0 || dims.q_len == 0;
  engine::require(empty_queries || (q.data != nullptr && out.data != nullptr),
                  [&] { return std::string("scaled_dot_product_attention: q or out is null"); });
  engine::require(empty_queries || dims.kv_len == 0 || (k.data != nullptr && v.data != nullptr),
                  [&] { return std::string("scaled_dot_product_attention: k or v is null"); });
  std::size_t q_offset = 0;
  if (options.q_offset) {
    q_offset = *options.q_offset;
  } else {
    engine::require(!options.causal || dims.q_len <= dims.kv_len, [&] {
      return "scaled_dot_product_attention: causal with q_len (" + std::to_string(dims.q_len) + ") > kv_len (" +
             std::to_string(dims.kv_len) + ") needs an explicit q_offset";
    });
    q_offset = dims.q_len <= dims.kv_len ? dims.kv_len - dims.q_len : 0;
  }
  engine::require(q_offset <= SIZE_MAX - dims.q_len, [&] {
    return "scaled_dot_product_attention: q_offset " + std::to_string(q_offset) + " + q_len " +
           std::to_string(dims.q_len) + " overflows std::size_t";
  });
  engine::require(options.additive_mask == nullptr || engine::checked_product({dims.q_len, dims.kv_len}), [&] {
    return "scaled_dot_product_attention: the additive mask's q_len x kv_len overflows std::size_t";
  });
  engine::require(
      options.probabilities == nullptr ||
          engine::checked_product({dims.batch, dims.num_heads, dims.q_len, dims.kv_len}),
      [&] { return std::string("scaled_dot_product_attention: probabilities' size overflows std::size_t"); });
  if (options.valid_len != nullptr)
    for (std::size_t b = 0; b < dims.batch; ++b)
      engine::require(options.valid_len[b] <= dims.kv_len, [&] {
        return "scaled_dot_product_attention: valid_len[" + std::to_string(b) + "] (" +
               std::to_string(options.valid_len[b]) + ") exceeds kv_len (" + std::to_string(dims.kv_len) + ")";
      });
  validate_softcap("scaled_dot_product_attention", options.logit_softcap);
  validate_precision("scaled_dot_product_attention", options.precision);
  engine::require(
      options.precision != precision::bf16 ||
          (engine::checked_product({dims.batch, dims.num_heads, dims.q_len, dims.head_dim, sizeof(float)}) &&
           engine::checked_product({dims.batch, dims.num_kv_heads, dims.kv_len, dims.head_dim, sizeof(float)})),
      [&] { return std::string("scaled_dot_product_attention: the bf16 copies of q, k and v overflow std::size_t"); });
  if (empty_queries) return;
  validate_per_head("scaled_dot_product_attention", "sinks", options.sinks, dims.num_heads);
  validate_per_head("scaled_dot_product_attention", "alibi_slopes", options.alibi_slopes, dims.num_heads);
  validate_views(dims, q, k, v, out);

  const engine::attention_problem problem{dims,
                                          q,
                                          k,
                                          v,
                                          out,
                                          resolve_scale(options.scale, dims.head_dim),
                                          options.causal,
                                          q_offset,
                                          options.valid_len,
                                          options.additive_mask,
                                          active_simd_path(),
                                          options.sliding_window,
                                          {options.logit_softcap, options.sinks, options.alibi_slopes},
                                          options.precision};
  engine::run_in_arena([&] { engine::scaled_dot_product(problem, options.probabilities); });
}

std::vector<float> alibi_slopes(std::size_t num_heads, double max_bias) {
  engine::require(num_heads >= 1, [] { return std::string("alibi_slopes: num_heads must be at least 1"); });
  engine::require(std::isfinite(max_bias) && max_bias > 0.0, [&] {
    return "alibi_slopes: max_bias must be finite and positive, got " + std::to_string(max_bias);
  });
  const std::size_t powers = std::bit_floor(num_heads);  // n
  std::vector<float> slopes;
  for (std::size_t h = 0; h < num_heads; ++h) {
    const double exponent =
        h < powers ? double(h + 1) / double(powers) : double(2 * (h - powers) + 1) / double(2 * powers);
    slopes.push_back(float(std::exp2(-max_bias * exponent)));
  }
  return slopes;
}

// ---------------------------------------------------------------- the layer

namespace {

const float* non_null(const char* name, const float* weight) {
  engine::require(weight != nullptr, [&] { return std::string("attention_layer: ") + name + " weight is null"; });
  return weight;
}

// A projection's weight, given exactly one way.
void check_weight(const char* name, const linear_weights& weights) {
  engine::require(weights.weight == nullptr || weights.weight_bf16 == nullptr, [&] {
    return std::string("attention_layer: ") + name + " has both weight and weight_bf16 (give one)";
  });
  if (weights.weight_bf16 == nullptr) non_null(name, weights.weight);
}

attention_config validated(attention_config config) {
  if (config.num_kv_heads == 0) config.num_kv_heads = config.num_heads;
  validate_heads("attention_layer", config.num_heads, config.num_kv_heads, config.head_dim);
  engine::require(config.d_model > 0, [&] { return std::string("attention_layer: d_model must be positive"); });
  engine::require(std::isfinite(config.rope_theta) && config.rope_theta >= 0.0,
                  [&] { return std::string("attention_layer: rope_theta must be 0 (no RoPE) or positive"); });
  if (config.rotary_dim == 0) config.rotary_dim = config.head_dim;
  engine::require(config.rotary_dim <= config.head_dim, [&] {
    return "attention_layer: rotary_dim (" + std::to_string(config.rotary_dim) + ") exceeds head_dim (" +
           std::to_string(config.head_dim) + ")";
  });
  engine::require(config.rope_theta == 0.0 || config.rotary_dim % 2 == 0, [&] {
    return config.rotary_dim == config.head_dim
               ? "attention_layer: RoPE needs an even head_dim, got " + std::to_string(config.head_dim)
               : "attention_layer: RoPE needs an even rotary_dim, got " + std::to_string(config.rotary_dim);
  });
  // Ignored without RoPE (attention.hpp), so only checked with it.
  const std::string rope_problem =
      config.rope_theta == 0.0
          ? std::string()
          : engine::rope_scaling_problem(config.rope_scaling, config.rope_theta, config.rotary_dim);
  engine::require(rope_problem.empty(), [&] { return "attention_layer: " + rope_problem; });
  engine::require(!config.qk_norm_eps || (std::isfinite(*config.qk_norm_eps) && *config.qk_norm_eps >= 0.0f),
                  [&] { return std::string("attention_layer: qk_norm_eps must be finite and >= 0"); });
  validate_softcap("attention_layer", config.logit_softcap);
  engine::require(config.alibi_slopes.empty() || config.alibi_slopes.size() == config.num_heads, [&] {
    return "attention_layer: alibi_slopes holds " + std::to_string(config.alibi_slopes.size()) +
           " slopes, not one per query head (" + std::to_string(config.num_heads) + ")";
  });
  validate_per_head("attention_layer", "alibi_slopes",
                    config.alibi_slopes.empty() ? nullptr : config.alibi_slopes.data(), config.num_heads);
  const std::optional<std::size_t> qkv_width =
      engine::checked_product({config.num_heads + 2 * config.num_kv_heads, config.head_dim});
  engine::require(config.num_heads <= SIZE_MAX / 4 && qkv_width &&
                      engine::checked_product({*qkv_width, config.d_model, sizeof(float)}),
                  [&] {
                    return "attention_layer: the weights' sizes overflow std::size_t (num_heads " +
                           std::to_string(config.num_heads) + ", num_kv_heads " + std::to_string(config.num_kv_heads) +
                           ", head_dim " + std::to_string(config.head_dim) + ", d_model " +
                           std::to_string(config.d_model) + ")";
                  });
  validate_precision("attention_layer", config.precision);
  config.scale = resolve_scale(config.scale, config.head_dim);
  return config;
}

std::optional<engine::qk_norm> make_qk_norm(const attention_config& config, const attention_weights& weights) {
  if (!config.qk_norm_eps) return std::nullopt;
  const float* q_norm = non_null("q_norm", weights.q_norm);  // q checked first
  return engine::qk_norm(config.head_dim, *config.qk_norm_eps, q_norm, non_null("k_norm", weights.k_norm));
}

}  // namespace

namespace engine {

namespace {

// Element i of a part's weight [out, in], in the element type it is packed
// in: bf16 weights widened exactly (f32), fp32 ones rounded to nearest even
// (bf16).
float weight_element(const linear_weights& weights, std::size_t i, float) {
  return weights.weight != nullptr ? weights.weight[i] : widen_bf16({weights.weight_bf16[i]});
}
bf16_bits weight_element(const linear_weights& weights, std::size_t i, bf16_bits) {
  return weights.weight_bf16 != nullptr ? bf16_bits{weights.weight_bf16[i]} : encode_bf16(weights.weight[i]);
}

// The parts' weights stacked row-wise, [out_features, in_features], as Element.
template <class Element>
std::vector<Element> stacked(std::size_t in_features, std::size_t out_features,
                             std::initializer_list<linear_part> parts) {
  std::vector<Element> rows;
  rows.reserve(out_features * in_features);
  for (const linear_part& part : parts)
    for (std::size_t i = 0; i < part.out_features * in_features; ++i)
      rows.push_back(weight_element(part.weights, i, Element{}));
  return rows;
}

// Wᵀ of the stacked parts, packed for the precision (the stacked copy only
// while packing; none for one part already in the packed element type).
std::variant<packed_b, packed_bf16_b> pack_stacked(std::size_t in_features, std::initializer_list<linear_part> parts,
                                                   precision compute) {
  std::size_t out_features = 0;
  for (const linear_part& part : parts) {
    check_weight(part.name, part.weights);
    out_features += part.out_features;
  }
  const linear_weights& first = parts.begin()->weights;
  if (compute == precision::bf16) {
    if (parts.size() == 1 && first.weight_bf16 != nullptr)
      return packed_bf16_b(in_features, out_features, reinterpret_cast<const bf16_bits*>(first.weight_bf16),
                           in_features, transpose::yes);
    if (parts.size() == 1)  // rounded to nearest even as it is packed
      return packed_bf16_b(in_features, out_features, gemm_operand{first.weight, in_features, transpose::yes});
    const std::vector<bf16_bits> rows = stacked<bf16_bits>(in_features, out_features, parts);
    return packed_bf16_b(in_features, out_features, rows.data(), in_features, transpose::yes);
  }
  if (parts.size() == 1 && first.weight != nullptr)
    return packed_b(in_features, out_features, {first.weight, in_features, transpose::yes});
  const std::vector<float> rows = stacked<float>(in_features, out_features, parts);
  return packed_b(in_features, out_features, {rows.data(), in_features, transpose::yes});
}

std::vector<float> stacked_bias(std::initializer_list<linear_part> parts) {
  std::vector<float> bias;
  if (std::none_of(parts.begin(), parts.end(), [](const linear_part& part) { return part.weights.bias != nullptr; }))
    return bias;
  for (const linear_part& part : parts)
    if (part.weights.bias != nullptr)
      bias.insert(bias.end(), part.weights.bias, part.weights.bias + part.out_features);
    else
      bias.insert(bias.end(), part.out_features, -0.0f);
  return bias;
}

}  // namespace

linear::linear(std::size_t in_features, std::initializer_list<linear_part> parts, precision compute)
    : weight_(pack_stacked(in_features, parts, compute)), bias_(stacked_bias(parts)) {}

void linear::apply(const float* x, std::size_t rows, float* y) const {
  const auto [in_features, out_features] =
      std::visit([](const auto& weight) { return std::pair{weight.k(), weight.n()}; }, weight_);
  if (!bias_.empty())
    for (std::size_t row = 0; row < rows; ++row) std::copy(bias_.begin(), bias_.end(), y + row * out_features);
  const gemm_shape shape{rows, out_features, in_features};
  const gemm_operand input{x, in_features, transpose::no};
  const float beta = bias_.empty() ? 0.0f : 1.0f;
  if (const packed_b* weight = std::get_if<packed_b>(&weight_))
    gemm(shape, 1.0f, input, weight->view(), beta, y, out_features);
  else
    gemm_bf16(shape, input, std::get<packed_bf16_b>(weight_), beta, y, out_features);
}

}  // namespace engine

attention_layer::impl::impl(const attention_config& checked, const attention_weights& weights)
    : config(checked),
      qkv_proj(checked.d_model,
               {{"q_proj", weights.q_proj, checked.num_heads * checked.head_dim},
                {"k_proj", weights.k_proj, checked.num_kv_heads * checked.head_dim},
                {"v_proj", weights.v_proj, checked.num_kv_heads * checked.head_dim}},
               checked.precision),
      o_proj(checked.num_heads * checked.head_dim, {{"o_proj", weights.o_proj, checked.d_model}}, checked.precision),
      rotary(checked.head_dim, checked.rotary_dim, checked.rope_theta, checked.rope_scaling),
      norm(make_qk_norm(checked, weights)) {
  validate_per_head("attention_layer", "sinks", weights.sinks, checked.num_heads);
  if (weights.sinks != nullptr) sinks.assign(weights.sinks, weights.sinks + checked.num_heads);
}

std::size_t attention_layer::impl::qkv_width() const {
  return (config.num_heads + 2 * config.num_kv_heads) * config.head_dim;
}

void attention_layer::impl::project(const float* x, std::size_t rows, const std::size_t* positions,
                                    const std::size_t* lengths, float* qkv) const {
  qkv_proj.apply(x, rows, qkv);
  if (norm) norm->apply(qkv, rows, qkv_width(), config.num_heads, config.num_kv_heads);
  rotary.apply(qkv, rows, qkv_width(), config.num_heads + config.num_kv_heads, positions, lengths);
  if (config.precision == precision::bf16) engine::round_floats_to_bf16(qkv, qkv, rows * qkv_width());
}

attention_layer::attention_layer(const attention_config& config, const attention_weights& weights)
    : impl_([&] {
        const engine::default_fp_environment environment;  // for the scale and RoPE's frequencies (arena.hpp)
        return std::make_unique<impl>(validated(config), weights);
      }()) {}
attention_layer::~attention_layer() = default;
attention_layer::attention_layer(attention_layer&&) noexcept = default;
attention_layer& attention_layer::operator=(attention_layer&&) noexcept = default;

const attention_config& attention_layer::config() const { return impl::of(impl_, "attention_layer::config").config; }

namespace {

// The cache-free forward's row positions and their sequences' lengths
// (rope::apply), reused across calls on a thread.
struct forward_workspace {
  std::vector<std::size_t> positions, lengths;
};

}  // namespace

void attention_layer::forward(const float* x, std::size_t batch, std::size_t seq, float* y) const {
  forward(x, batch, seq, impl::of(impl_, "attention_layer::forward").config.causal, y);
}

void attention_layer::forward(const float* x, std::size_t batch, std::size_t seq, bool causal, float* y) const {
  const attention_config& config = impl::of(impl_, "attention_layer::forward").config;
  const std::size_t head_dim = config.head_dim, heads = config.num_heads, kv_heads = config.num_kv_heads;
  // qkv [batch, seq, H + 2G heads, d]: q, k and v are views into it.
  const std::size_t width = impl_->qkv_width();
  const std::optional<std::size_t> checked_rows = engine::checked_product({batch, seq});
  engine::require(
      checked_rows && engine::checked_product({*checked_rows, std::max(width, config.d_model), sizeof(float)}), [&] {
        return "attention_layer::forward: batch " + std::to_string(batch) + " x seq " + std::to_string(seq) +
               " x row width " + std::to_string(std::max(width, config.d_model)) +
               " floats overflows std::size_t bytes";
      });
  const std::size_t rows = *checked_rows;
  if (rows == 0) return;
  engine::require(x != nullptr && y != nullptr,
                  [&] { return std::string("attention_layer::forward: x or y is null"); });
  const engine::scratch_lease qkv(rows * width), attended(rows * heads * head_dim);
  const engine::reusable<forward_workspace> work;
  work->positions.resize(rows);
  for (std::size_t row = 0; row < rows; ++row) work->positions[row] = row % seq;
  work->lengths.assign(rows, seq);
  auto view = [&](std::size_t first_head) {
    return head_tensor<const float>{qkv.data() + first_head * head_dim, seq * width, head_dim, width};
  };
  const engine::attention_problem problem{{batch, heads, kv_heads, seq, seq, head_dim},
                                          view(0),
                                          view(heads),
                                          view(heads + kv_heads),
                                          head_tensor<float>::bshd(attended.data(), heads, seq, head_dim),
                                          *config.scale,
                                          causal,
                                          0,
                                          nullptr,
                                          nullptr,
                                          active_simd_path(),
                                          config.sliding_window,
                                          impl_->variants(),
                                          config.precision,
                                          true};  // project() rounds q, k and v in bf16 precision
  engine::run_in_arena([&] {
    // 1-2. Projections, and RoPE at positions 0..seq-1 of each sequence.
    impl_->project(x, rows, work->positions.data(), work->lengths.data(), qkv.data());
    // 3. Attention.
    engine::flash_attention(problem);
    // 4. Output projection.
    impl_->o_proj.apply(attended.data(), rows, y);
  });
}

}  // namespace kvhead
