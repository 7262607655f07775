// Vectorized exp and softmax, and the online-softmax building blocks of tiled
// (flash) attention. Safe to include without ISA flags; the kernels are
// written once with xsimd in softmax_impl.hpp and instantiated per ISA in
// engine/arch/<isa>.cpp.
//
// exp accuracy (xsimd 8.1's float exp, step for step, its multiply-adds
// fused on avx512 as xsimd fuses them on avx2 (softmax_impl.hpp's
// exp_lanes): avx512 and avx2 give the same bits for all 2^32 inputs but
// NaN, where the two paths' NaN outputs may differ in sign (checked once,
// 2026-12-03, and again after avx512's 2^k became a vscalefps, 2026-12-05;
// tests/exp_test.cpp on a sweep). Measured on
// avx2 and sse2 against a double std::exp rounded to float, over every one
// of the 2.24e9 floats in the range, and re-checked on a 3.6M-input sweep by
// tests/exp_test.cpp):
//   x in [-87.33, 88.37]: within 2 ULP (1.53 ULP at worst; all but 2 inputs
//     on sse2, and 27 on avx2 and avx512, are within 1 ULP).
//   x >= 88.3762589 (xsimd's maxlog) -> +inf, although the true result is
//     finite up to 88.7228; x in (88.37, 88.3762589) is still accurate.
//   x in (-87.6831284, -87.3365402): subnormal results (the true exp is below
//     FLT_MIN there), within 1 ULP of the subnormals (2^-149).
//   x <= -87.6831284 -> exactly +0 (the true result is a subnormal down to
//     -103.28): results below ~8.4e-39 are flushed to 0.
//   exp(-inf) = +0, exp(+inf) = +inf, exp(NaN) = NaN, exp(+-0) = 1.
// Softmax only feeds it x - max <= 0, so only the lower end matters: a
// probability below ~1e-38 of the largest one becomes 0 (or loses precision).
//
// tanh accuracy (xsimd 8.1's float tanh: x + x^3 P(x^2) for |x| < 0.625,
// else 1 - 2 / (1 + exp(2|x|)), sign restored; checked by tests/tanh_test.cpp
// against a double std::tanh rounded to float): within 6 ULP for every float
// (the bound derived there; 1 ULP at most on its 3.2M-input sweep, every
// path). tanh(+-0) = +-0, tiny and subnormal x give x, |x| >= 9.1 gives +-1
// exactly, tanh(+-inf) = +-1, tanh(NaN) = NaN.
//
// Masking and special values, for every function here:
//   -inf is a masked score: its probability is exactly 0.
//   A row (or everything folded so far) with every score -inf has no
//     visible key: its probabilities are all 0, never NaN.
//   NaN in a row makes every output of that row NaN (the max pass skips NaN,
//     the exp pass turns it into a NaN sum). +inf in a row does the same
//     (inf - inf), as softmax is undefined there.
//
// Determinism: on one SIMD path every function does the same arithmetic for a
// given n, whatever the buffer's address or its neighbours. Elements are
// processed in W-wide vectors (W = 16 / 8 / 4 floats on avx512 / avx2 / sse2);
// the last n % W go through the same vector code on a copy padded to W (with
// -inf where the padding enters a max or a sum, so it adds exactly 0). Sums
// use one vector accumulator: lane l adds elements l, l + W, l + 2W, ... in
// increasing order, then one xsimd::hadd. No FMA is used outside the exp
// (the build is -ffp-contract=off). Across paths: scale_floats and
// normalize_row give the same bits on every path; exp gives the same bits on
// avx512 and avx2 and others on sse2 (no FMA there), so does everything
// built on it, and sums differ (their order depends on W).
#pragma once

#include <cmath>
#include <cstddef>

#include "kvhead/config.hpp"

namespace kvhead::engine {

/// Running statistics of one query row across key blocks (online softmax):
/// the largest score seen so far and the sum of exp(score - max) over them.
/// The default state means "nothing seen yet" (every score masked).
struct softmax_partial {
  float max = -INFINITY;
  float sum = 0.0f;
};

/// out[i] = exp(in[i]), i < n. out may be in itself (in place); the two
/// ranges must not overlap otherwise.
void exp_floats(const float* in, float* out, std::size_t n, simd_path path = active_simd_path());

/// out[i] = tanh(in[i]), i < n; in place allowed, other overlaps not.
void tanh_floats(const float* in, float* out, std::size_t n, simd_path path = active_simd_path());

/// Logit soft-capping (Gemma 2) in place: values[i] = cap * tanh(values[i] /
/// cap), i < n: a true division, then tanh, then a multiply, each rounded, as
/// Hugging Face's eager attention computes it. cap > 0 and finite (the
/// caller's check). |result| <= cap; +-inf becomes +-cap, NaN stays NaN.
void softcap_floats(float* values, std::size_t n, float cap, simd_path path = active_simd_path());

/// In place, a numerically stable softmax of row[0:n]:
///   row[i] = exp(row[i] - max) / sum_j exp(row[j] - max).
/// Passes: (1) max, (2) exp and sum, (3) scale by 1 / sum (one reciprocal,
/// then a multiply per element). A fully masked row (all -inf) gives zeros;
/// n = 0 does nothing.
void softmax_row(float* row, std::size_t n, simd_path path = active_simd_path());

/// softmax_row with an attention sink (gpt-oss): a logit `sink` (finite)
/// that joins the denominator and has no entry of its own:
///   m = max(max_j row[j], sink), row[i] = exp(row[i] - m) / (sum_j exp(row[j] - m) + exp(sink - m)).
/// A fully masked row gives zeros (the sink takes all the mass). sink = -inf
/// gives softmax_row's bits exactly.
void softmax_row_with_sink(float* row, std::size_t n, float sink, simd_path path = active_simd_path());

/// Folds a block of n scores (already scaled; masked ones are -inf) into a
/// row's running statistics:
///   new_max     = max(state.max, max_j scores[j])
///   scores[j]   = exp(scores[j] - new_max)            (masked ones become 0)
///   correction  = exp(state.max - new_max)            (returned)
///   state.sum   = state.sum * correction + sum_j scores[j]   (two roundings)
///   state.max   = new_max
/// The caller rescales its unnormalized accumulator by the returned
/// correction (scale_floats) before adding scores * V. When new_max is -inf
/// (everything so far masked) the scores become 0, the state is unchanged and
/// the correction is 1. n = 0 leaves the state unchanged and returns 1. A
/// NaN (or +inf) score makes state.sum NaN, so the row normalizes to NaN.
float online_softmax_block(float* scores, std::size_t n, softmax_partial& state, simd_path path = active_simd_path());

/// values[i] *= factor, i < n (a plain multiply: 0 * inf would be NaN).
void scale_floats(float* values, std::size_t n, float factor, simd_path path = active_simd_path());

/// values[i] *= factors[i], i < n (a plain multiply each, as the scalar
/// loop: int8 KV scales applied to scores and probabilities). factors may
/// not overlap values.
void multiply_floats(float* values, const float* factors, std::size_t n, simd_path path = active_simd_path());

/// out[i] = in[i] rounded to the nearest even bf16, as an fp32, i < n: the
/// bits of round_to_bf16 (engine/gemm/stored_element.hpp) on every path
/// (integer arithmetic on the patterns; NaN made quiet, Inf kept, finite
/// values past bf16's largest to Inf, subnormals rounded as they are). out
/// may be in (in place). bf16 precision's rounding of q, k and v.
void round_floats_to_bf16(const float* in, float* out, std::size_t n, simd_path path = active_simd_path());

/// Merges partial b and its unnormalized accumulator acc_b[0:d] into a and
/// acc_a[0:d] (split-K attention, two threads' halves of a key range):
///   m      = max(a.max, b.max)
///   fa     = exp(a.max - m), fb = exp(b.max - m)
///   acc_a  = (acc_a * fa) + (acc_b * fb)          (two products, then one add)
///   a.sum  = (a.sum * fa) + (b.sum * fb)
///   a.max  = m
/// When a side's max is -inf (it saw nothing visible: its accumulator is
/// 0 * v, zeros or NaN), the other side's accumulator passes through bit for
/// bit (a -0 included) except where the masked side holds NaN, which stays;
/// a.sum = a.sum + b.sum (a NaN sum, from scores that were all NaN, carries
/// on) and a.max = m. So merging the empty partial changes nothing, and a NaN
/// value behind a mask reaches the output wherever the chunk boundaries
/// fall. acc_b may not overlap acc_a.
void merge_partials(softmax_partial& a, float* acc_a, const softmax_partial& b, const float* acc_b, std::size_t d,
                    simd_path path = active_simd_path());

/// out[i] = acc[i] * (1 / sum), i < d: one reciprocal, then a multiply per
/// element. sum == 0 (a row with no visible key) gives zeros, never NaN.
/// out may be acc itself.
void normalize_row(const float* acc, float sum, float* out, std::size_t d, simd_path path = active_simd_path());

/// The final normalization with an attention sink (finite logit `sink`,
/// value 0) joining the row's softmax, from its merged partial `state`:
///   m  = max(state.max, sink)
///   f  = exp(state.max - m)  (0 when state.max is -inf: nothing visible)
///   out[i] = acc[i] * (f / (state.sum * f + exp(sink - m))), i < d
/// one division, then a multiply per element. Nothing visible gives zeros
/// (the sink takes all the mass); a NaN sum gives NaN. out may be acc.
void normalize_row_with_sink(const float* acc, const softmax_partial& state, float sink, float* out, std::size_t d,
                             simd_path path = active_simd_path());

/// Per-ISA kernels behind the functions above (same contracts); defined in
/// softmax_impl.hpp and explicitly instantiated in engine/arch/<isa>.cpp.
template <class Arch>
struct softmax_kernels {
  static void exp_floats(const float* in, float* out, std::size_t n);
  static void tanh_floats(const float* in, float* out, std::size_t n);
  static void softcap_floats(float* values, std::size_t n, float cap);
  static void softmax_row(float* row, std::size_t n, float sink);
  static float online_softmax_block(float* scores, std::size_t n, softmax_partial& state);
  static void scale_floats(float* values, std::size_t n, float factor);
  static void multiply_floats(float* values, const float* factors, std::size_t n);
  static void round_floats_to_bf16(const float* in, float* out, std::size_t n);
  static void merge_partials(softmax_partial& a, float* acc_a, const softmax_partial& b, const float* acc_b,
                             std::size_t d);
  static void normalize_row(const float* acc, float sum, float* out, std::size_t d);
  static void normalize_row_with_sink(const float* acc, const softmax_partial& state, float sink, float* out,
                                      std::size_t d);
};

}  // namespace kvhead::engine
