#include "engine/attention/scaled_dot_product.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "engine/arch/scratch.hpp"
#include "engine/softmax/softmax.hpp"
#include "engine/scheduler/split_schedule.hpp"

namespace kvhead::engine {
namespace {

// Rows [first, end) along seq of every (batch, head) of `from` (head_dim
// floats each), rounded to bf16 into `to`, dense [batch, heads, seq,
// head_dim]; rows(b) gives (first, end) for batch element b. Returns the
// view of `to`. One task per (batch, head).
template <class Rows>
head_tensor<const float> rounded_copy(const head_tensor<const float>& from, std::size_t batch, std::size_t heads,
                                      std::size_t seq, std::size_t head_dim, const Rows& rows, float* to,
                                      simd_path path) {
  const head_tensor<const float> dense = head_tensor<const float>::bhsd(to, heads, seq, head_dim);
  run_indices(batch * heads, [&](std::size_t index) {
    const std::size_t b = index / heads, h = index % heads;
    const auto [first, end] = rows(b);
    for (std::size_t s = first; s < end; ++s)
      round_floats_to_bf16(from.data + b * from.batch_stride + h * from.head_stride + s * from.seq_stride,
                           to + b * dense.batch_stride + h * dense.head_stride + s * dense.seq_stride, head_dim,
                           path);
  });
  return dense;
}

void attend(const attention_problem& problem, float* probabilities) {
  flash_attention(problem);
  if (probabilities != nullptr) attention_probabilities(problem, probabilities);
}

}  // namespace

void scaled_dot_product(const attention_problem& problem, float* probabilities) {
  if (problem.precision != kvhead::precision::bf16) {
    attend(problem, probabilities);
    return;
  }
  const attention_dims& dims = problem.dims;
  const std::size_t d = dims.head_dim;
  // q is rounded as each tile gathers it (flash_attention.cpp), unless the
  // probabilities are asked for: they read it here.
  const scratch_lease q(probabilities != nullptr ? dims.batch * dims.num_heads * dims.q_len * d : 0);
  const scratch_lease k(dims.batch * dims.num_kv_heads * dims.kv_len * d);
  const scratch_lease v(dims.batch * dims.num_kv_heads * dims.kv_len * d);
  // The keys batch element b's queries read (flash_attention's packing):
  // from the chunk of the first key a query sees to the last one seen; every
  // key of k for the probabilities.
  auto keys_read = [&](std::size_t b) {
    attention_tile queries{};  // only the fields visible_begin and visible_end read
    queries.q_offset = problem.q_offset;
    queries.key_limit = problem.valid_len != nullptr ? problem.valid_len[b] : dims.kv_len;
    queries.causal = problem.causal;
    queries.window = problem.window;
    const std::size_t first = queries.visible_begin(0) / kv_chunk * kv_chunk;
    const std::size_t end = dims.q_len == 0 ? 0 : queries.visible_end(dims.q_len - 1);
    return std::pair{first, std::max(first, end)};
  };
  auto key_rows = [&](std::size_t b) {
    return probabilities != nullptr ? std::pair<std::size_t, std::size_t>{0, dims.kv_len} : keys_read(b);
  };
  auto query_rows = [&](std::size_t) { return std::pair<std::size_t, std::size_t>{0, dims.q_len}; };
  attention_problem rounded = problem;
  if (probabilities != nullptr)
    rounded.q = rounded_copy(problem.q, dims.batch, dims.num_heads, dims.q_len, d, query_rows, q.data(), problem.path);
  rounded.k = rounded_copy(problem.k, dims.batch, dims.num_kv_heads, dims.kv_len, d, key_rows, k.data(), problem.path);
  rounded.v = rounded_copy(problem.v, dims.batch, dims.num_kv_heads, dims.kv_len, d, keys_read, v.data(), problem.path);
  attend(rounded, probabilities);
}

}  // namespace kvhead::engine
