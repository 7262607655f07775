#include "engine/attention/scaled_dot_product.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "engine/arch/scratch.hpp"
#include "engine/softmax/softmax.hpp"
#include "engine/scheduler/split_schedule.hpp"

namespace kvhead::engine {
namespace {

// Rows of every (batch, head) of `from` (head_dim floats each), rounded to
// bf16 into `to`, dense [batch, heads, seq, head_dim]. Returns the view of
// `to`. One task per (batch, head).
head_tensor<const float> rounded_copy(const head_tensor<const float>& from, std::size_t batch, std::size_t heads,
                                      std::size_t seq, std::size_t head_dim, float* to, simd_path path) {
  const head_tensor<const float> dense = head_tensor<const float>::bhsd(to, heads, seq, head_dim);
  run_indices(batch * heads, [&](std::size_t index) {
    const std::size_t b = index / heads, h = index % heads;
    for (std::size_t s = 0; s < seq; ++s)
      round_floats_to_bf16(from.data + b * from.batch_stride + h * from.head_stride + s * from.seq_stride,
                           to + b * dense.batch_stride + h * dense.head_stride + s * dense.seq_stride, head_dim, path);
  });
  return dense;
}

}  // namespace

void scaled_dot_product(const attention_problem& problem, float* probabilities) {
  // flash_attention rounds what it reads in bf16 precision (q as a tile
  // gathers it, K and V as they are packed, p before p v).
  flash_attention(problem);
  if (probabilities == nullptr) return;
  if (problem.precision != kvhead::precision::bf16) {
    attention_probabilities(problem, probabilities);
    return;
  }
  // The probabilities of bf16 precision: the fp32 softmax of the rounded q
  // and k's scores, unrounded.
  const attention_dims& dims = problem.dims;
  const std::size_t d = dims.head_dim;
  const scratch_lease q(dims.batch * dims.num_heads * dims.q_len * d),
      k(dims.batch * dims.num_kv_heads * dims.kv_len * d);
  attention_problem rounded = problem;
  rounded.q = rounded_copy(problem.q, dims.batch, dims.num_heads, dims.q_len, d, q.data(), problem.path);
  rounded.k = rounded_copy(problem.k, dims.batch, dims.num_kv_heads, dims.kv_len, d, k.data(), problem.path);
  attention_probabilities(rounded, probabilities);
}

}  // namespace kvhead::engine
