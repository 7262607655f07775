// The softmax entry points: flag-free wrappers that pick the kernels of one
// SIMD path (instantiated in engine/arch/<isa>.cpp). Preconditions are the
// caller's (internal API): pointers valid for the stated lengths.
#include "engine/softmax/softmax.hpp"

#include <cassert>
#include <cmath>

#include "engine/arch/dispatch.hpp"

namespace kvhead::engine {

void exp_floats(const float* in, float* out, std::size_t n, simd_path path) {
  assert(n == 0 || (in != nullptr && out != nullptr));
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::exp_floats(in, out, n); });
}

void tanh_floats(const float* in, float* out, std::size_t n, simd_path path) {
  assert(n == 0 || (in != nullptr && out != nullptr));
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::tanh_floats(in, out, n); });
}

void softcap_floats(float* values, std::size_t n, float cap, simd_path path) {
  assert(n == 0 || values != nullptr);
  assert(cap > 0.0f && std::isfinite(cap));
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::softcap_floats(values, n, cap); });
}

void softmax_row(float* row, std::size_t n, simd_path path) {
  assert(n == 0 || row != nullptr);
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::softmax_row(row, n, -INFINITY); });
}

void softmax_row_with_sink(float* row, std::size_t n, float sink, simd_path path) {
  assert(n == 0 || row != nullptr);
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::softmax_row(row, n, sink); });
}

float online_softmax_block(float* scores, std::size_t n, softmax_partial& state, simd_path path) {
  assert(n == 0 || scores != nullptr);
  return dispatch(path,
                  [&](auto arch) { return softmax_kernels<decltype(arch)>::online_softmax_block(scores, n, state); });
}

void scale_floats(float* values, std::size_t n, float factor, simd_path path) {
  assert(n == 0 || values != nullptr);
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::scale_floats(values, n, factor); });
}

void multiply_floats(float* values, const float* factors, std::size_t n, simd_path path) {
  assert(n == 0 || (values != nullptr && factors != nullptr));
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::multiply_floats(values, factors, n); });
}

void round_floats_to_bf16(const float* in, float* out, std::size_t n, simd_path path) {
  assert(n == 0 || (in != nullptr && out != nullptr));
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::round_floats_to_bf16(in, out, n); });
}

void merge_partials(softmax_partial& a, float* acc_a, const softmax_partial& b, const float* acc_b, std::size_t d,
                    simd_path path) {
  assert(d == 0 || (acc_a != nullptr && acc_b != nullptr));
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::merge_partials(a, acc_a, b, acc_b, d); });
}

void normalize_row(const float* acc, float sum, float* out, std::size_t d, simd_path path) {
  assert(d == 0 || (acc != nullptr && out != nullptr));
  dispatch(path, [&](auto arch) { softmax_kernels<decltype(arch)>::normalize_row(acc, sum, out, d); });
}

void normalize_row_with_sink(const float* acc, const softmax_partial& state, float sink, float* out, std::size_t d,
                             simd_path path) {
  assert(d == 0 || (acc != nullptr && out != nullptr));
  assert(std::isfinite(sink));
  dispatch(path,
           [&](auto arch) { softmax_kernels<decltype(arch)>::normalize_row_with_sink(acc, state, sink, out, d); });
}

}  // namespace kvhead::engine
