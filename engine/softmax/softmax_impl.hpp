// The softmax kernels (contracts in softmax.hpp), written once with xsimd for
// every ISA. Include only from engine/arch/<isa>.cpp.
//
// Every kernel walks its rows in W-wide vectors, W = batch::size. xsimd 8.1
// has no masked loads, so the last n % W elements are copied into a W-float
// aligned buffer padded with a neutral value, run through the same vector
// code, and copied back: the tail gets exactly the arithmetic of a full
// vector, and nothing outside [0, n) is read or written.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "engine/arch/dispatch.hpp"
#include "engine/arch/multiply_add.hpp"
#include "engine/softmax/softmax.hpp"

namespace kvhead::engine {
namespace softmax_detail {

inline constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

// The block walkers below are always inlined: out of line, GCC 12 reached
// the body's captures through a pointer and, since `out` may alias them,
// loaded and stored exp_shift_sum's running sum around every block (a
// store-to-load chain per 16 floats). Inlined, the sum stays in a register:
// softmax_row 7-10% faster (Zen 4), the same instructions otherwise.

// Calls body(x) for each W-wide block x of in[0:n], the tail padded with `pad`.
template <class Arch, class Body>
[[gnu::always_inline]] inline void read_blocks(const float* in, std::size_t n, float pad, Body&& body) {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::size_t width = batch::size;
  const std::size_t full = n - n % width;
  for (std::size_t i = 0; i < full; i += width) body(batch::load_unaligned(in + i));
  if (full == n) return;
  alignas(Arch::alignment()) float tail[width];
  std::fill(tail, tail + width, pad);
  std::copy(in + full, in + n, tail);
  body(batch::load_aligned(tail));
}

// out[block] = body(in[block]) for each W-wide block of [0, n), the tail
// through a copy padded with `pad`. out may be in (each block is loaded
// before it is stored).
template <class Arch, class Body>
[[gnu::always_inline]] inline void map_blocks(const float* in, float* out, std::size_t n, float pad, Body&& body) {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::size_t width = batch::size;
  const std::size_t full = n - n % width;
  for (std::size_t i = 0; i < full; i += width) body(batch::load_unaligned(in + i)).store_unaligned(out + i);
  if (full == n) return;
  alignas(Arch::alignment()) float tail[width];
  std::fill(tail, tail + width, pad);
  std::copy(in + full, in + n, tail);
  body(batch::load_aligned(tail)).store_aligned(tail);
  std::copy(tail, tail + (n - full), out + full);
}

// out[block] = body(x[block], y[block]) for each W-wide block, tails padded with 0.
template <class Arch, class Body>
[[gnu::always_inline]] inline void map_blocks2(const float* x, const float* y, float* out, std::size_t n, Body&& body) {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::size_t width = batch::size;
  const std::size_t full = n - n % width;
  for (std::size_t i = 0; i < full; i += width)
    body(batch::load_unaligned(x + i), batch::load_unaligned(y + i)).store_unaligned(out + i);
  if (full == n) return;
  alignas(Arch::alignment()) float x_tail[width] = {};
  alignas(Arch::alignment()) float y_tail[width] = {};
  std::copy(x + full, x + n, x_tail);
  std::copy(y + full, y + n, y_tail);
  body(batch::load_aligned(x_tail), batch::load_aligned(y_tail)).store_aligned(x_tail);
  std::copy(x_tail, x_tail + (n - full), out + full);
}

// What the caller of exp_lanes knows of its arguments.
enum class exp_arguments {
  any,
  // Every lane <= 0 or NaN (x - max, as the softmax passes take it): the
  // overflow to +inf from maxlog up cannot happen, and its select is left out.
  non_positive,
};

// e * 2^k for exp_lanes' integral k, as xsimd 8.1's ldexp computes it there
// (e times the float whose exponent field is k + 127), and 0 where x <=
// minlog. On avx512 a vscalefps takes k as a float: three instructions
// fewer than ldexp's conversion, add, shift and multiply, and the same bits
// for all 2^32 x, NaN payloads included (checked once, Zen 5, 2026-12-05):
// both are e * 2^k rounded once where k >= -126; where k <= -127 ldexp's
// 2^k is 0, as is every result from minlog down, so vscalefps's zero mask on
// k <= -127 gives both zeros. k enters it clamped, never NaN, so a NaN x's
// result is e's NaN on any CPU, as ldexp's is. Elsewhere ldexp itself.
template <class Arch>
xsimd::batch<float, Arch> times_two_to_the(const xsimd::batch<float, Arch>& e, const xsimd::batch<float, Arch>& k,
                                           const xsimd::batch<float, Arch>& x) {
  using batch = xsimd::batch<float, Arch>;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<Arch, xsimd::avx512bw>) {
    const __m512 lowest = batch(-127.0f);
    const __mmask16 nonzero = _mm512_cmp_ps_mask(k, lowest, _CMP_NLE_UQ);  // k > -127, or NaN
    return batch(_mm512_maskz_scalef_ps(nonzero, e, _mm512_max_ps(k, lowest)));
  }
#endif
  return xsimd::select(x <= xsimd::constants::minlog<batch>(), batch(0.0f), xsimd::ldexp(e, xsimd::to_int(k)));
}

// exp of every lane: xsimd 8.1's float exp step for step (Cephes: k =
// round(x / ln 2), r = x - k ln 2 in two parts, 1 + r + r^2 P(r) with P of
// degree 4 in Horner form, times 2^k; 0 from minlog down, +inf from maxlog
// up), its multiply-adds fused on every path with FMA (multiply_add.hpp).
// xsimd's own fuses them on avx2 only; on avx512 it ran 7 of them as
// separate multiplies and adds, on a longer dependency chain (exp_floats on
// Zen 5: 5.6 -> 8.3 G elements/s). The same bits as xsimd::exp on avx2 and
// sse2; on avx512 the same bits as avx2, lane for lane.
template <class Arch, exp_arguments arguments = exp_arguments::any>
xsimd::batch<float, Arch> exp_lanes(const xsimd::batch<float, Arch>& x) {
  using batch = xsimd::batch<float, Arch>;
  namespace constants = xsimd::constants;
  const batch k = xsimd::nearbyint(constants::invlog_2<batch>() * x);
  batch r = multiply_add(-k, constants::log_2hi<batch>(), x);
  r = multiply_add(-k, constants::log_2lo<batch>(), r);
  // P's coefficients, xsimd 8.1's bits (exp_reduction<float, A, exp_tag>), highest degree first.
  batch poly(std::bit_cast<float>(0x3ab778cfu));
  for (const std::uint32_t coefficient : {0x3c098d8bu, 0x3d2aa957u, 0x3e2aa9a5u, 0x3f000000u})
    poly = multiply_add(r, poly, batch(std::bit_cast<float>(coefficient)));
  const batch e = multiply_add(poly, r * r, r) + batch(1.0f);
  const batch scaled = times_two_to_the(e, k, x);
  if constexpr (arguments == exp_arguments::non_positive) return scaled;
  return xsimd::select(x >= constants::maxlog<batch>(), constants::infinity<batch>(), scaled);
}

// exp of one scalar through the vector exp, so a correction factor rounds
// exactly like the scores it rescales.
template <class Arch>
float exp_scalar(float x) {
  using batch = xsimd::batch<float, Arch>;
  alignas(Arch::alignment()) float lanes[batch::size];
  exp_lanes(batch(x)).store_aligned(lanes);
  return lanes[0];
}

// Pass "max" of softmax: max over x[0:n] ignoring NaN, -inf when n = 0 or all
// are -inf. Shapes: one row, contiguous. Two vector running maxima from -inf
// (even and odd blocks: two dependency chains; the -inf padding never
// wins), then their W lanes halved pairwise down to one (xsimd 8.1 has no
// reduce_max; a tree, not a chain of W compares: a 256-key row's softmax
// 10% faster on Zen 5). max(x, running) maps to maxps(x, running), which
// returns `running` when x is NaN, so no lane ever holds NaN. The maximum of
// non-NaN floats is the same in any order; only the sign of a zero maximum
// may follow the order, and no caller can tell: x - (+0) and x - (-0) are
// equal for every x but a zero, where both are zeros and exp gives 1.
template <class Arch>
float row_max(const float* x, std::size_t n) {
  using batch = xsimd::batch<float, Arch>;
  constexpr std::size_t width = batch::size;
  batch even(minus_infinity), odd(minus_infinity);
  std::size_t i = 0;
  for (; i + 2 * width <= n; i += 2 * width) {
    even = xsimd::max(batch::load_unaligned(x + i), even);
    odd = xsimd::max(batch::load_unaligned(x + i + width), odd);
  }
  read_blocks<Arch>(x + i, n - i, minus_infinity, [&](const batch& v) { even = xsimd::max(v, even); });
  alignas(Arch::alignment()) float lanes[width];
  xsimd::max(odd, even).store_aligned(lanes);
#pragma GCC unroll 4
  for (std::size_t half = width / 2; half > 0; half /= 2)
#pragma GCC unroll 8
    for (std::size_t lane = 0; lane < half; ++lane)
      lanes[lane] = lanes[lane + half] > lanes[lane] ? lanes[lane + half] : lanes[lane];
  return lanes[0];
}

// Pass "exp and sum": x[j] = exp(x[j] - shift) in place, returns the sum of
// the new x in the fixed order of softmax.hpp (lane-wise in increasing j,
// then hadd). The -inf padding becomes exp(-inf) = 0 and adds exactly 0.
// shift is at least every x[j] but NaN (the callers' max, or 0 when every
// x[j] is -inf or NaN), so each argument is <= 0 or NaN.
template <class Arch>
float exp_shift_sum(float* x, std::size_t n, float shift) {
  using batch = xsimd::batch<float, Arch>;
  const batch shift_v(shift);
  batch sum(0.0f);
  map_blocks<Arch>(x, x, n, minus_infinity, [&](const batch& v) {
    const batch e = exp_lanes<Arch, exp_arguments::non_positive>(v - shift_v);
    sum += e;
    return e;
  });
  return xsimd::hadd(sum);
}

// Templated on Arch like every helper here: this header is compiled with
// different ISA flags in several TUs, so it holds no non-template function
// (one inline definition built three ways would break the ODR).
template <class Arch>
void fill_zeros(float* out, std::size_t n) {
  std::fill(out, out + n, 0.0f);
}

}  // namespace softmax_detail

// exp_floats: in[0:n] -> out[0:n], one pass, elementwise, so each out[i]
// depends on in[i] alone. Tail padded with 0 (any finite value would do).
template <class Arch>
void softmax_kernels<Arch>::exp_floats(const float* in, float* out, std::size_t n) {
  using batch = xsimd::batch<float, Arch>;
  softmax_detail::map_blocks<Arch>(in, out, n, 0.0f, [](const batch& v) { return softmax_detail::exp_lanes(v); });
}

// tanh_floats: in[0:n] -> out[0:n], elementwise (xsimd::tanh), tail padded with 0.
template <class Arch>
void softmax_kernels<Arch>::tanh_floats(const float* in, float* out, std::size_t n) {
  using batch = xsimd::batch<float, Arch>;
  softmax_detail::map_blocks<Arch>(in, out, n, 0.0f, [](const batch& v) { return xsimd::tanh(v); });
}

// softcap_floats: values[0:n] in place, one pass, each W-wide block divided,
// tanh'd and multiplied in registers. Tail padded with 0 (tanh(0) = 0).
template <class Arch>
void softmax_kernels<Arch>::softcap_floats(float* values, std::size_t n, float cap) {
  using batch = xsimd::batch<float, Arch>;
  const batch cap_v(cap);
  softmax_detail::map_blocks<Arch>(values, values, n, 0.0f,
                                   [&](const batch& v) { return xsimd::tanh(v / cap_v) * cap_v; });
}

// softmax_row: row[0:n] in place, contiguous; sink -inf when there is none.
//   Pass 1: m = max(row, sink), NaN skipped; -inf when the row is fully
//           masked and there is no sink.
//   Pass 2: row[j] = exp(row[j] - shift), sum = fixed-order sum, where
//           shift = m, or 0 when m = -inf (so masked -inf stays -inf and
//           becomes 0 instead of the NaN of -inf - -inf). Subtracting the max
//           keeps every argument <= 0: no overflow, and sum >= 1 unless the
//           row is fully masked (sum = 0) or holds NaN / +inf (sum = NaN).
//           A sink adds exp(sink - shift) to the sum (without one, nothing:
//           the bits of the plain softmax).
//   Pass 3: sum = 0 -> zeros; otherwise row[j] *= 1 / sum.
// Three passes over the row (the exp pass is the cost; a row of up to a few
// thousand floats stays in L1/L2 between them).
template <class Arch>
void softmax_kernels<Arch>::softmax_row(float* row, std::size_t n, float sink) {
  using batch = xsimd::batch<float, Arch>;
  constexpr float minus_infinity = softmax_detail::minus_infinity;
  if (n == 0) return;
  const float row_max = softmax_detail::row_max<Arch>(row, n);
  const float max = sink > row_max ? sink : row_max;
  const float shift = max == minus_infinity ? 0.0f : max;
  float sum = softmax_detail::exp_shift_sum<Arch>(row, n, shift);
  if (sink != minus_infinity) sum += softmax_detail::exp_scalar<Arch>(sink - shift);
  if (sum == 0.0f) {
    softmax_detail::fill_zeros<Arch>(row, n);
    return;
  }
  const batch inverse(1.0f / sum);
  softmax_detail::map_blocks<Arch>(row, row, n, 0.0f, [&](const batch& v) { return v * inverse; });
}

// online_softmax_block: scores[0:n] in place (one query row against one key
// block), state is that row's running (max, sum).
//   Pass 1: block max (NaN skipped); new_max = max(state.max, block max).
//   Pass 2: scores = exp(scores - shift) and their fixed-order sum, shift as
//           in softmax_row (0 when new_max = -inf, so masked scores give 0).
//   Then:   correction = exp(state.max - new_max) through the same vector exp
//           (1 when new_max = -inf); state.sum = state.sum * correction + sum.
template <class Arch>
float softmax_kernels<Arch>::online_softmax_block(float* scores, std::size_t n, softmax_partial& state) {
  if (n == 0) return 1.0f;
  const float block_max = softmax_detail::row_max<Arch>(scores, n);
  const float new_max = block_max > state.max ? block_max : state.max;
  const bool nothing_visible = new_max == softmax_detail::minus_infinity;
  const float shift = nothing_visible ? 0.0f : new_max;
  const float block_sum = softmax_detail::exp_shift_sum<Arch>(scores, n, shift);
  const float correction = nothing_visible ? 1.0f : softmax_detail::exp_scalar<Arch>(state.max - new_max);
  // Nothing visible: block_sum is 0 (or NaN from a NaN score) and the sum
  // stays as it was (or becomes NaN).
  state.sum = state.sum * correction + block_sum;
  state.max = new_max;
  return correction;
}

// scale_floats: values[0:n] *= factor, one pass.
template <class Arch>
void softmax_kernels<Arch>::scale_floats(float* values, std::size_t n, float factor) {
  using batch = xsimd::batch<float, Arch>;
  const batch factor_v(factor);
  softmax_detail::map_blocks<Arch>(values, values, n, 0.0f, [&](const batch& v) { return v * factor_v; });
}

// round_floats_to_bf16: in[0:n] -> out[0:n], one pass, encode_bf16's
// arithmetic on each lane's bit pattern (add 0x7fff plus the kept part's
// lowest bit, drop the low 16 bits; NaN: the quiet bit set instead). Tail
// padded with 0.
template <class Arch>
void softmax_kernels<Arch>::round_floats_to_bf16(const float* in, float* out, std::size_t n) {
  using batch = xsimd::batch<float, Arch>;
  using pattern = xsimd::batch<std::uint32_t, Arch>;
  softmax_detail::map_blocks<Arch>(in, out, n, 0.0f, [](const batch& v) {
    const pattern bits = xsimd::bitwise_cast<pattern>(v), high = pattern(0xffff0000u);
    const pattern rounded = (bits + (pattern(0x7fffu) + ((bits >> 16) & pattern(1u)))) & high;
    const pattern quiet = (bits | pattern(0x00400000u)) & high;
    return xsimd::select(xsimd::isnan(v), xsimd::bitwise_cast<batch>(quiet), xsimd::bitwise_cast<batch>(rounded));
  });
}

// multiply_floats: values[0:n] *= factors[0:n], one pass.
template <class Arch>
void softmax_kernels<Arch>::multiply_floats(float* values, const float* factors, std::size_t n) {
  using batch = xsimd::batch<float, Arch>;
  softmax_detail::map_blocks2<Arch>(values, factors, values, n, [](const batch& x, const batch& y) { return x * y; });
}

// merge_partials: acc_a[0:d], acc_b[0:d] unnormalized output rows of one
// query over two disjoint key ranges. Factors by the same vector exp as the
// scores, then one pass: acc_a = (acc_a * fa) + (acc_b * fb).
// A side that saw nothing visible (the empty partial, or keys all masked)
// holds only 0 * v in its accumulators: zeros, or NaN from a non-finite value
// behind a mask. Then the other side passes through bit for bit (merging the
// empty partial changes nothing, not even a -0, which x * 1 + 0 * 0 would
// turn into +0: a split tile's extra merge would change bits) and the masked
// side's NaN joins it, wherever the chunk boundaries fall (attention.hpp:
// masked keys still contribute 0 * v). Its sum is 0, or NaN when its scores
// were all NaN (the max pass skips NaN), so the sums simply add.
template <class Arch>
void softmax_kernels<Arch>::merge_partials(softmax_partial& a, float* acc_a, const softmax_partial& b,
                                           const float* acc_b, std::size_t d) {
  using batch = xsimd::batch<float, Arch>;
  constexpr float minus_infinity = softmax_detail::minus_infinity;
  if (a.max == minus_infinity || b.max == minus_infinity) {
    const bool a_masked = a.max == minus_infinity;
    softmax_detail::map_blocks2<Arch>(acc_a, acc_b, acc_a, d, [a_masked](const batch& x, const batch& y) {
      const batch& masked = a_masked ? x : y;
      return xsimd::select(xsimd::isnan(masked), masked, a_masked ? y : x);
    });
    a.sum = a.sum + b.sum;
    a.max = a_masked ? b.max : a.max;
    return;
  }
  const float max = b.max > a.max ? b.max : a.max;
  const float fa = softmax_detail::exp_scalar<Arch>(a.max - max);
  const float fb = softmax_detail::exp_scalar<Arch>(b.max - max);
  const batch fa_v(fa), fb_v(fb);
  softmax_detail::map_blocks2<Arch>(acc_a, acc_b, acc_a, d, [&](const batch& x, const batch& y) {
    const batch x_part = x * fa_v;
    const batch y_part = y * fb_v;
    return x_part + y_part;
  });
  const float a_part = a.sum * fa;
  const float b_part = b.sum * fb;
  a.sum = a_part + b_part;
  a.max = max;
}

// normalize_row: acc[0:d] -> out[0:d], one pass: out = acc * (1 / sum), or
// zeros when sum = 0 (no visible key).
template <class Arch>
void softmax_kernels<Arch>::normalize_row(const float* acc, float sum, float* out, std::size_t d) {
  using batch = xsimd::batch<float, Arch>;
  if (sum == 0.0f) {
    softmax_detail::fill_zeros<Arch>(out, d);
    return;
  }
  const batch inverse(1.0f / sum);
  softmax_detail::map_blocks<Arch>(acc, out, d, 0.0f, [&](const batch& v) { return v * inverse; });
}

// normalize_row_with_sink: acc[0:d] -> out[0:d], one pass: out = acc * factor,
// factor = f / (sum * f + g) from the scalars of softmax.hpp, f and g through
// the same vector exp as the scores. Nothing visible: f = 0, so zeros (the
// accumulator of such a row is 0), or NaN when the sum is NaN.
template <class Arch>
void softmax_kernels<Arch>::normalize_row_with_sink(const float* acc, const softmax_partial& state, float sink,
                                                    float* out, std::size_t d) {
  using batch = xsimd::batch<float, Arch>;
  const float max = sink > state.max ? sink : state.max;
  // Both exponentials in one vector exp (lanes 0 and 1): each lane rounds as
  // the scores' exp does.
  alignas(Arch::alignment()) float lanes[batch::size] = {state.max - max, sink - max};
  softmax_detail::exp_lanes(batch::load_aligned(lanes)).store_aligned(lanes);
  const float f = state.max == softmax_detail::minus_infinity ? 0.0f : lanes[0];
  const float g = lanes[1];
  const float kept = state.sum * f;
  const batch factor(f / (kept + g));
  softmax_detail::map_blocks<Arch>(acc, out, d, 0.0f, [&](const batch& v) { return v * factor; });
}

}  // namespace kvhead::engine
