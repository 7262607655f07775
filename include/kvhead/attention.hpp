// kvhead: scaled-dot-product attention for CPUs, in PyTorch / Hugging Face
// conventions. Two entry points:
//
//   scaled_dot_product_attention()  already-projected Q, K, V (callers that own
//                                   their projections and RoPE);
//   attention_layer                 one whole attention layer of a transformer:
//                                   projections (nn.Linear layout), RoPE,
//                                   attention, output projection.
//
// Heads. num_heads query heads H share num_kv_heads key/value heads G (G must
// divide H): MHA when G = H, MQA when G = 1, GQA between. Query head h reads
// kv head h / (H / G). K and V are never copied per query head.
//
// Masks, one rule. Query row i has the absolute position q_offset + i. Batch
// element b has valid_len[b] keys (right padding; default kv_len). Key j is
// visible to query i iff j < valid_len[b], when causal j <= q_offset + i, and
// with a sliding window W (sliding_window > 0) (q_offset + i) - j < W, Hugging
// Face's boundary: each query sees at most its W newest keys, itself included.
// An optional additive float mask [q_len, kv_len] (row-major, shared by every
// batch element and head) is added to the scaled scores; -inf there hides a
// key too. A query row with no visible key yields zeros, never NaN.
//
// Variants (all off by default, as Hugging Face's eager attention computes
// them; its SDPA path drops soft-capping and sinks):
//   logit soft-capping (Gemma 2): with cap > 0, each scaled score becomes
//     s = cap * tanh(s / cap) before the additive mask (and the masks),
//     so |s| <= cap; an infinite score becomes +-cap.
//   attention sinks (gpt-oss): one finite logit per query head that joins
//     each row's softmax denominator and contributes no value:
//       p_j = exp(s_j - m) / (sum_k exp(s_k - m) + exp(sink_h - m)),
//       m = max(max_k s_k, sink_h),
//     so the probabilities sum to less than 1. A row with no visible key
//     yields zeros (the sink takes all the mass).
//   ALiBi (BLOOM, MPT, Falcon-RW, Baichuan 13B; vLLM's alibi_slopes): one
//     finite slope per query head; each scaled score gets
//       s += slope_h * float(j - (q_offset + i)),
//     the key's distance from its query times the slope (<= 0 before the
//     query), after soft-capping and before the additive mask. HF's BLOOM
//     adds slope_h * j, which differs from this by a constant per row: the
//     same softmax, with smaller numbers to round. alibi_slopes() gives the
//     slopes those models use.
// All keep the bit-identity across thread counts, chunking and batching.
//
// Special values. NaN or Inf in the inputs reach only the outputs that attend
// to them (keys hidden by causality, valid_len or the window are never
// multiplied into the output); a key hidden only by the additive mask still contributes 0 * v,
// so a NaN or Inf value there propagates.
// Magnitudes, as in any fp32 attention that does not rescale its inputs: a
// score is (q . k) * scale, the dot product summed in fp32 first, so a q . k
// beyond FLT_MAX is Inf before the scale applies, and a score that
// overflows to -Inf counts as masked (a row of only such scores yields zeros,
// as a row with no visible key). The output sum(exp(s - max) v) / sum(exp(s -
// max)) is divided last, so V whose |v| times the keys seen approaches FLT_MAX
// overflows to Inf, though the exact output is at most max |v|. The exp
// returns 0 below 2^-126 (FLT_MIN; every path), so a key whose score is more
// than about 87 below its row's largest weighs nothing, however large its v.
// Over an int8 KV cache, scale times q . (k / k's scale) is summed before
// K's scale applies (k / k's scale up to 127): it must stay within FLT_MAX,
// or the row is NaN (scale 1e36 with keys near 1e-37, say). Over a bf16
// cache, and in bf16 precision, on vdpbf16ps (AVX512-BF16) the products and
// sums flush subnormal values to zero: scores whose terms are below FLT_MIN
// are lost there (the fp32 kernels keep them).
//
// Threads. Work runs on oneTBB in the caller's task arena (or the one
// set_num_threads configured): to bound the threads, call from inside a
// tbb::task_arena of that size. What may be called concurrently, from any
// threads: scaled_dot_product_attention, always (no call's output may
// overlap another concurrent call's inputs or output);
// the const members of one attention_layer (config, both forwards: the layer
// is immutable after construction, its scratch per thread); forwards over one
// kv_cache as kv_cache.hpp's "Threads" allows (batches naming disjoint
// sequences). Moving, assigning or destroying a layer must not overlap a call
// on it. Results do not depend on the thread count or on concurrent callers.
//
// Floating-point environment. kvhead ignores the caller's: every call
// computes, in every thread it uses, in the default environment (round to
// nearest, flush-to-zero and denormals-are-zero off, all exceptions masked),
// and restores the caller's (flags included) on return. So a caller that
// enabled FTZ/DAZ or another rounding mode, in some threads or all, gets the
// same bits as one that did not, for any thread count; denormal inputs and
// results of the fp32 arithmetic are kept (the exp's results below FLT_MIN
// and vdpbf16ps's subnormals excepted: "Magnitudes" above).
//
// Errors. Bad shapes or arguments throw std::invalid_argument naming the
// problem; nothing is written then. Memory that cannot be had throws
// std::bad_alloc, a worker thread that cannot be started (a limit on
// threads) std::system_error with errc::resource_unavailable_try_again; a
// later call may succeed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kvhead/export.h"
#include "kvhead/kv_cache.hpp"

namespace kvhead {

/// A 4-D tensor [batch, heads, seq, head_dim] whose last axis is contiguous,
/// with the other strides in floats: element (b, h, s, e) is at
/// data[b * batch_stride + h * head_stride + s * seq_stride + e].
template <class T>
struct head_tensor {
  T* data = nullptr;
  std::size_t batch_stride = 0, head_stride = 0, seq_stride = 0;

  /// Layout [batch, heads, seq, head_dim] (PyTorch's SDPA layout).
  static head_tensor bhsd(T* data, std::size_t heads, std::size_t seq, std::size_t head_dim) {
    return {data, heads * seq * head_dim, seq * head_dim, head_dim};
  }
  /// Layout [batch, seq, heads, head_dim] (what a projection writes).
  static head_tensor bshd(T* data, std::size_t heads, std::size_t seq, std::size_t head_dim) {
    return {data, seq * heads * head_dim, head_dim, heads * head_dim};
  }
};

struct attention_dims {
  std::size_t batch = 1;
  std::size_t num_heads = 1;     // H
  std::size_t num_kv_heads = 1;  // G, divides H
  std::size_t q_len = 0;
  std::size_t kv_len = 0;
  std::size_t head_dim = 0;
};

struct attention_options {
  /// Multiplies q . k; default 1 / sqrt(head_dim).
  std::optional<float> scale;
  bool causal = false;
  /// Absolute position of query row 0; default kv_len - q_len (the queries
  /// are the last positions: causal aligns bottom-right, as a KV cache and
  /// Hugging Face's decoding do, where torch's scaled_dot_product_attention
  /// with is_causal aligns top-left: pass 0 for that). Required when causal
  /// and q_len > kv_len; not causal with q_len > kv_len, the default is 0
  /// (it matters only with a sliding window).
  std::optional<std::size_t> q_offset;
  /// [batch] visible key counts (each <= kv_len); null: kv_len for all.
  const std::size_t* valid_len = nullptr;
  /// [q_len, kv_len] added to the scaled scores; null: none.
  const float* additive_mask = nullptr;
  /// Sliding window W (Mistral, Qwen 2, Gemma 2, gpt-oss): key j visible to
  /// query i only if (q_offset + i) - j < W (see "Masks"); 0: no window. The
  /// key chunks wholly outside every query's window are skipped, never read,
  /// so a decode step costs the window, not the past.
  std::size_t sliding_window = 0;
  /// When set, also writes the attention probabilities [batch, num_heads,
  /// q_len, kv_len] (row-major) through a separate materialized pass: meant
  /// for small sizes and debugging (it stores q_len x kv_len per head). The
  /// output itself is the same, bit for bit, with or without it (soft-capped
  /// and with the sink in the denominator when those are set).
  float* probabilities = nullptr;
  /// Logit soft-capping: 0 (the default) none; else finite and > 0, each
  /// scaled score becomes cap * tanh(score / cap) before the additive mask.
  float logit_softcap = 0.0f;
  /// Attention sinks: [num_heads] finite logits, head h's at sinks[h]; null
  /// (the default): none. See "Variants" above.
  const float* sinks = nullptr;
  /// ALiBi: [num_heads] finite slopes, head h's at alibi_slopes[h]; null
  /// (the default): none. See "Variants" above.
  const float* alibi_slopes = nullptr;
  /// How the attention computes, as attention_config::precision's attention:
  ///   f32   (the default) fp32 throughout; every contract in this file is
  ///         that of f32.
  ///   bf16  q, k and v rounded to nearest even bfloat16 as they enter (NaN
  ///         and Inf kept, finite values past bf16's largest become Inf):
  ///         q as each query tile reads its rows, k and v as they are
  ///         packed for the products (once per call, in per-thread scratch:
  ///         release_scratch, kvhead/config.hpp; only the rows some query
  ///         reads: a sliding window's decode step packs its window, not the
  ///         past), no copy of the inputs otherwise (with probabilities
  ///         asked for, rounded copies of q and k for them); q kᵀ of the
  ///         rounded values with fp32 sums; scale,
  ///         soft-capping, masks, softmax, the running max and sum and the
  ///         merge of chunks in fp32; the probabilities, unnormalized
  ///         (exp(s - the max of their 256-key chunk)), rounded to bf16 for
  ///         p v (the softmax's sum is that of the unrounded ones). On CPUs
  ///         with AVX512-BF16 (AMD Zen 4, Intel from Cooper Lake) q kᵀ and
  ///         p v run on vdpbf16ps (bf16 products, fp32 sums in pairs of
  ///         terms, subnormals flushed to zero), on the Xeons with AMX on
  ///         its tiles (fp32 sums in tiles of 32 terms; a decode step's few
  ///         rows on FMAs in the tiles' order, the same bits), elsewhere on
  ///         the fp32 kernels over the rounded values; they sum in
  ///         different orders, so their last bits differ (`kvhead kernels`
  ///         prints which runs). So, with
  ///         p_j the exact probabilities of the rounded inputs, each output
  ///         element is within 2^-8 sum_j p_j |v_j| (the rounding of p) plus
  ///         fp32 rounding of that exact attention on the rounded inputs
  ///         (tests/sdpa_bf16_test.cpp checks this bound). Against f32 on the
  ///         same (unrounded) inputs: max |out_bf16 - out_f32| / max |out_f32|
  ///         measured 2.6e-3 (32/8 heads, head_dim 128, 300 tokens, causal,
  ///         N(0, 1) inputs; on AVX2, on Zen 4's vdpbf16ps and on a Xeon's
  ///         AMX tiles alike; tests/sdpa_bf16_test.cpp, ceiling 2e-2).
  ///         `probabilities`, when set, receives the fp32 softmax of the
  ///         rounded q and k's scores (not rounded to bf16): bit for bit what
  ///         f32 gives on inputs rounded beforehand. As for f32, results are
  ///         bit-identical for any thread count and batching, and the output
  ///         is the same with or without `probabilities`.
  kvhead::precision precision = kvhead::precision::f32;
};

/// out = softmax(scale * q kᵀ + masks) v, per head. q and out have num_heads
/// heads and q_len positions, k and v num_kv_heads heads and kv_len
/// positions; all have head_dim floats per row. out may not overlap the
/// inputs. Checked (std::invalid_argument, out untouched): every view's
/// seq_stride >= head_dim (the rows along seq do not overlap); the rows of out
/// do not overlap one another at all (its axes, sorted by stride, nest: each
/// stride at least the span of the axes inside it, as in every dense layout);
/// no view addresses beyond the end of memory; q_offset + q_len, and the
/// sizes of the mask and the probabilities, fit std::size_t; logit_softcap
/// finite and >= 0; every sink and ALiBi slope finite; precision f32 or bf16 (and with bf16
/// the sizes of dense copies of q, k and v fit std::size_t).
KVHEAD_API void scaled_dot_product_attention(const attention_dims& dims, head_tensor<const float> q,
                                             head_tensor<const float> k, head_tensor<const float> v,
                                             head_tensor<float> out, const attention_options& options = {});

/// How RoPE's inverse frequencies and cos/sin are scaled, as Hugging Face's
/// modeling_rope_utils computes them (rope_type in config.json's
/// rope_scaling / rope_parameters). With r = rotary_dim and i < r/2, the
/// unscaled inv_freq_i = theta^(-2i/r); angle = position * inv_freq_i.
///   none    inv_freq as above, cos and sin unscaled ("default").
///   linear  inv_freq_i / factor (positions divided by factor).
///   llama3  wavelen_i = 2 pi / inv_freq_i, with L = original_max_position_embeddings:
///           wavelen_i > L / low_freq_factor: inv_freq_i / factor;
///           wavelen_i < L / high_freq_factor: unchanged; in between
///           (1 - s) inv_freq_i / factor + s inv_freq_i with
///           s = (L / wavelen_i - low_freq_factor) / (high_freq_factor - low_freq_factor);
///           no such band when high_freq_factor <= low_freq_factor (HF warns
///           and computes the same).
///   yarn    HF _compute_yarn_parameters: the correction range [low, high] of
///           beta_fast and beta_slow rotations over L (floored / ceiled when
///           truncate, clamped to [0, r - 1]), a linear ramp over i between
///           them mixing inv_freq_i / factor (ramp 1) and inv_freq_i (ramp 0);
///           cos and sin multiplied by attention_factor, which defaults to
///           mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both
///           are non-zero, else mscale(factor, 1), where
///           mscale(s, m) = 1 for s <= 1, else 0.1 m ln(s) + 1.
///   longrope  HF _compute_longrope_parameters (Phi-3, Phi-4-mini): with L =
///           original_max_position_embeddings, inv_freq_i / short_factor[i]
///           while a sequence is at most L tokens long and inv_freq_i /
///           long_factor[i] once it is longer; cos and sin multiplied by
///           attention_factor, which defaults to 1 for factor <= 1, else
///           sqrt(1 + ln(factor) / ln(L)). longrope_factors says how:
///           per_call (the default) as HF's dynamic update does: every token
///           of a forward call rotates with the factors of its sequence's
///           length at the end of the call (a cached sequence's past and new
///           tokens; each sequence of a batch by its own, where HF takes
///           the batch's longest), so a prompt longer than L prefilled in
///           one call is long throughout, the tokens of a shorter one stay
///           short in the cache when the sequence later grows past L, and a
///           prompt crossing L cut into several calls gives other results
///           than in one call (as in HF: the one exception to "Determinism"
///           in README); short_factors or long_factors: always those
///           (llama.cpp picks one set by its context size), the same bits
///           however the tokens are cut.
/// Defaults are those of HF; every number must be finite, max(1, 1 /
/// rope_theta) / factor at most FLT_MAX (every scaled frequency a float's:
/// rope_theta below 1 / FLT_MAX is refused with or without scaling; for
/// longrope the same over the smallest short or long factor), llama3's
/// frequency factors > 0, the original length > 0 for llama3 and yarn and > 1
/// for longrope, yarn's rope_theta not 1 (its range divides by ln theta), and
/// longrope's short_factor and long_factor rotary_dim / 2 positive numbers.
struct rope_scaling {
  enum class kind { none, linear, llama3, yarn, longrope };
  kind type = kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double original_max_position_embeddings = 0.0;         // llama3, yarn, longrope
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  std::optional<double> attention_factor;                // yarn, longrope; unset: from mscale or factor
  double mscale = 0.0, mscale_all_dim = 0.0;             // yarn; 0: unset
  bool truncate = true;                                  // yarn
  std::vector<double> short_factor{}, long_factor{};     // longrope: [rotary_dim / 2] each
  enum class longrope_pick { per_call, short_factors, long_factors };
  longrope_pick longrope_factors = longrope_pick::per_call;  // longrope
};

/// The ALiBi slopes of num_heads heads as BLOOM's and MPT's code computes
/// them (alibi_bias_max / max_bias 8 in both): with n the largest power of two
/// at or below num_heads, head h < n takes 2^(-max_bias (h + 1) / n), and the
/// heads past n take the odd ones of 2n heads, 2^(-max_bias (2 k + 1) / (2n))
/// for k = 0, 1, ... (in float, from double). num_heads >= 1 and max_bias
/// finite and > 0, else std::invalid_argument.
KVHEAD_API std::vector<float> alibi_slopes(std::size_t num_heads, double max_bias = 8.0);

struct attention_config {
  std::size_t num_heads = 0;     // H
  std::size_t num_kv_heads = 0;  // G; 0 means H (MHA)
  std::size_t head_dim = 0;      // d
  std::size_t d_model = 0;       // need not equal H * d
  std::optional<float> scale;    // default 1 / sqrt(d)
  bool causal = false;
  double rope_theta = 0.0;  // 0: no RoPE; else needs an even rotary_dim
  /// RoPE scaling (ignored without RoPE); default none: plain RoPE.
  kvhead::rope_scaling rope_scaling{};
  /// Floats of each head that RoPE rotates: the first rotary_dim, pairs
  /// (i, i + rotary_dim/2); the rest pass through (HF partial_rotary_factor).
  /// 0 (the default): head_dim. Else even and <= head_dim.
  std::size_t rotary_dim = 0;
  /// Set: QK-norm (Qwen 3), each query and key head RMS-normalized over its d
  /// floats before RoPE, x_e * w_e / sqrt(mean(x^2) + eps), with the weights
  /// attention_weights::q_norm and k_norm. Unset (the default): none.
  std::optional<float> qk_norm_eps{};
  /// Sliding window W: key j visible to the query at position i only if
  /// i - j < W (with causality, as in Hugging Face's sliding-window layers),
  /// in both forwards; 0 (the default): every past key.
  std::size_t sliding_window = 0;
  /// Logit soft-capping (Gemma 2 attn_logit_softcapping): 0 (the default)
  /// none; else finite and > 0: each scaled score becomes
  /// cap * tanh(score / cap) before the causal mask.
  float logit_softcap = 0.0f;
  /// ALiBi slopes, one finite slope per query head (num_heads of them), as
  /// scaled_dot_product_attention's "Variants" say, in both forwards; empty
  /// (the default): none. alibi_slopes() gives BLOOM's and MPT's.
  std::vector<float> alibi_slopes{};
  /// How the layer computes (both forwards):
  ///   f32   (the default) fp32 throughout; every contract in this file is
  ///         that of f32.
  ///   bf16  weights stored as bfloat16 (bf16 weights kept as given, fp32
  ///         ones rounded to nearest even once, at construction) and packed
  ///         once; each projection's input rounded to bf16 as it enters its
  ///         GEMM; products of bf16 values accumulated in fp32, biases and
  ///         outputs fp32. Attention: q after QK-norm and RoPE (both fp32),
  ///         and k and v, rounded to bf16 (k and v before a KV cache stores
  ///         them, whatever its kv_dtype); q kᵀ of the rounded values with
  ///         fp32 sums; scale, masks, softmax, the running max and sum and
  ///         the merge of chunks in fp32; the probabilities, unnormalized
  ///         (exp(s - the max of their 256-key chunk)), rounded to bf16 for
  ///         p v (the softmax's sum is that of the unrounded ones); q kᵀ and
  ///         p v on AMX tiles or vdpbf16ps where the CPU has them (above),
  ///         over the cache
  ///         as stored (f32, bf16 or f16; an int8 cache on the fp32 kernels),
  ///         as scaled_dot_product_attention's precision says. The
  ///         weight bytes halve (decode, bound by them, speeds up); on CPUs
  ///         with AMX or AVX512-BF16 the projections run on those units
  ///         (kvhead kernels prints which), elsewhere on the fp32 kernels
  ///         with the same results as rounding then computing in fp32.
  ///         Accuracy: max |y_bf16 - y_f32| / max |y_f32| measured 3.1e-3 on
  ///         a Llama-like layer (d_model 4096, 32/8 heads, head_dim 128, 300
  ///         tokens; tests/bf16_layer_test.cpp, ceiling 2e-2; 3.1e-3 also on
  ///         Zen 4 with AVX512-BF16 and on a Xeon with AMX), at most 7.6e-3
  ///         on the PyTorch golden cases (fp32 fallback unit, AVX2; the bf16
  ///         units sum in another order). Results are bit-identical for any
  ///         thread count, chunking and batching, as for f32, on one machine
  ///         and bf16 unit.
  kvhead::precision precision = kvhead::precision::f32;
};

/// One nn.Linear: weight [out_features, in_features] row-major, y = x Wᵀ + b.
/// bias may be null. The weight is given either as floats (weight) or as
/// bfloat16 bit patterns (weight_bf16, the same layout; the top 16 bits of
/// each float), exactly one of them: a bf16 checkpoint's tensor is then used
/// as it is by a bf16 layer (attention_config::precision), and widened
/// exactly by an f32 one.
struct linear_weights {
  const float* weight = nullptr;
  const float* bias = nullptr;
  const std::uint16_t* weight_bf16 = nullptr;
};

/// q_proj [H d, d_model], k_proj and v_proj [G d, d_model], o_proj [d_model, H d];
/// q_norm and k_norm [d] each, required with qk_norm_eps and ignored without;
/// sinks [H] (gpt-oss self_attn.sinks), finite: query head h's attention
/// sink logit (see scaled_dot_product_attention's "Variants"); null: none.
struct attention_weights {
  linear_weights q_proj, k_proj, v_proj, o_proj;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* sinks = nullptr;
};

/// One sequence's share of a batched forward over a KV cache: its `tokens`
/// newest positions.
struct sequence_tokens {
  sequence_id sequence = 0;
  std::size_t tokens = 0;
};

/// One attention layer. The constructor validates the configuration, copies
/// and packs the weights (the caller's arrays may be freed afterwards).
///
/// RoPE follows Hugging Face Llama: rotate_half (pairs (i, i + r/2) of the
/// first r = rotary_dim floats of each head), inv_freq_i = theta^(-2i/r)
/// scaled as rope_scaling says, angle = position * inv_freq_i, cos and sin
/// computed in double (times the attention factor of yarn and longrope) and rounded to
/// float; positions are absolute, 0 for the first token of each sequence.
/// The cos and sin of positions below 2^17 come from a table (rotary_dim *
/// 4 bytes a position: up to 64 MiB at rotary_dim 128) shared by the layers
/// with the same frequencies and freed with the last of them; later positions
/// compute theirs on the spot, with the same bits.
/// QK-norm, when configured, comes before RoPE. Soft-capping and sinks, when
/// configured, as scaled_dot_product_attention's "Variants" say, in both
/// forwards. With H = G, no RoPE and no mask the
/// result equals torch.nn.MultiheadAttention with in_proj = [Wq; Wk; Wv].
class KVHEAD_API attention_layer {
 public:
  /// Errors (std::invalid_argument naming the field): num_heads, head_dim or
  /// d_model 0, num_kv_heads not dividing num_heads, a non-finite scale or
  /// rope_theta, RoPE with an odd head_dim, weight sizes overflowing
  /// std::size_t, a null weight, a weight given neither or both ways
  /// (weight, weight_bf16), a logit_softcap negative or not finite, a sink
  /// not finite, alibi_slopes neither empty nor num_heads finite slopes, a
  /// precision other than f32 or bf16.
  attention_layer(const attention_config& config, const attention_weights& weights);
  ~attention_layer();
  /// A moved-from layer may be destroyed or assigned to; any other use
  /// throws std::logic_error.
  attention_layer(attention_layer&&) noexcept;
  attention_layer& operator=(attention_layer&&) noexcept;

  const attention_config& config() const;

  /// y = layer(x): x and y are [batch, seq, d_model] row-major; y may not
  /// overlap x. Every sequence starts at position 0; causal as configured.
  /// batch x seq x the widest row (d_model or (H + 2G) d) must fit
  /// std::size_t (std::invalid_argument otherwise, y untouched). NaN or Inf
  /// in x is not an error: it propagates to the outputs that attend to its
  /// row (see "Special values" above), never a crash.
  void forward(const float* x, std::size_t batch, std::size_t seq, float* y) const;
  /// The same with the causality chosen per call (config().causal ignored).
  void forward(const float* x, std::size_t batch, std::size_t seq, bool causal, float* y) const;

  /// Incremental decoding over a KV cache, as layer `layer` of the cache.
  /// For each entry of `batch`, its sequence's `tokens` newest positions are
  /// new: the caller reserved them first with cache.append(sequence, tokens)
  /// (once for all layers). Their rows of x are consecutive, in entry order:
  /// x and y are [sum of tokens, d_model]. The layer writes their K and V
  /// (after RoPE, at their absolute positions) into the cache, then each new
  /// token attends causally over its sequence's whole past (within the
  /// sliding window, when configured: blocks before it are not read). One call can mix
  /// a prefill chunk of one sequence with single-token steps of others.
  /// Results are bit-identical to forward() with causal = true over each
  /// whole sequence, however the tokens were chunked or batched (longrope
  /// per call, as HF: however they were batched, and chunked into calls
  /// that all end on the same side of its original length; rope_scaling).
  /// Isolation (kv_cache.hpp, "Writing"): `tokens` must be exactly
  /// length - mark, the positions this layer has not written yet, and the
  /// blocks holding them must belong to that sequence alone; on success the
  /// layer's mark becomes the length. So each layer runs once per append, a
  /// layer skipped (or a step abandoned by an exception) is refused on the
  /// next step until its positions are written, and re-running a forward
  /// after truncate or fork without a new append is refused.
  /// Errors (std::invalid_argument, nothing written, no mark moved): a cache
  /// geometry that does not match (num_kv_heads, head_dim), a layer index out
  /// of range, a sequence listed twice, tokens = 0 or more than the
  /// sequence's length, tokens other than length - mark (the message names
  /// the sequence, the layer, the mark and the length), unwritten positions
  /// in a block shared with another sequence, a new query that would see a
  /// position dropped by kv_cache::drop_outside_window; an unknown sequence id throws
  /// kv_cache_error. A call that fails later (std::bad_alloc) moves no mark
  /// and may be repeated.
  void forward(kv_cache& cache, std::size_t layer, const std::vector<sequence_tokens>& batch, const float* x,
               float* y) const;

 private:
  struct KVHEAD_HIDDEN impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace kvhead
