#include "engine/attention/flash_attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <tbb/parallel_for.h>

#include "engine/arch/scratch.hpp"
#include "engine/gemm/gemm.hpp"
#include "engine/softmax/softmax.hpp"

namespace kvhead::engine {
namespace {

// Query rows stacked per task: R heads x query_tile positions <= 120 rows, so
// the chunk's scores (120 x 256 floats) and accumulators stay in L2; 120 is a
// multiple of every path's MR (12, 6, 6), so tiles have no short row edge.
constexpr std::size_t stacked_rows = 120;

std::size_t ceil_div(std::size_t value, std::size_t divisor) { return (value + divisor - 1) / divisor; }

// Adds the shared additive mask to rows of scores: row r (position i = r / R)
// gets mask[(i0 + i) * kv_len + key0 + j].
void add_mask(const attention_problem& problem, float* scores, std::size_t ld, std::size_t rows,
              std::size_t group, std::size_t position0, std::size_t key0, std::size_t width) {
  for (std::size_t row = 0; row < rows; ++row) {
    const float* mask_row = problem.additive_mask + (position0 + row / group) * problem.dims.kv_len + key0;
    float* score_row = scores + row * ld;
    for (std::size_t j = 0; j < width; ++j) score_row[j] += mask_row[j];
  }
}

// K and V of one (batch, kv head), packed once per chunk as GEMM B operands:
// keys[c] is K[chunk c]ᵀ (head_dim x width), values[c] is V[chunk c] (width x head_dim).
struct packed_kv_head {
  std::vector<packed_b> keys, values;
};

packed_kv_head pack_kv_head(const attention_problem& problem, std::size_t batch, std::size_t kv_head,
                            std::size_t keys_seen) {
  const std::size_t head_dim = problem.dims.head_dim;
  const float* k = problem.k.data + batch * problem.k.batch_stride + kv_head * problem.k.head_stride;
  const float* v = problem.v.data + batch * problem.v.batch_stride + kv_head * problem.v.head_stride;
  packed_kv_head packed;
  for (std::size_t key0 = 0; key0 < keys_seen; key0 += kv_chunk) {
    const std::size_t width = std::min(kv_chunk, keys_seen - key0);
    packed.keys.emplace_back(head_dim, width, gemm_operand{k + key0 * problem.k.seq_stride, problem.k.seq_stride,
                                                           transpose::yes}, problem.path);
    packed.values.emplace_back(width, head_dim, gemm_operand{v + key0 * problem.v.seq_stride, problem.v.seq_stride,
                                                             transpose::no}, problem.path);
  }
  return packed;
}

// True when rows[0:count] (row_stride apart, head_dim floats each) are finite.
bool all_finite(const float* rows, std::size_t count, std::size_t head_dim, std::size_t row_stride) {
  for (std::size_t row = 0; row < count; ++row)
    for (std::size_t e = 0; e < head_dim; ++e)
      if (!std::isfinite(rows[row * row_stride + e])) return false;
  return true;
}

// One task: kv head `kv_head` of batch element `batch`, query positions
// [position0, position0 + positions). Passes numbered as in the header.
void attend_tile(const attention_problem& problem, const packed_kv_head& kv, std::size_t batch,
                 std::size_t kv_head, std::size_t position0, std::size_t positions) {
  const gemm_serial_scope serial;  // one task per tile already keeps the threads busy
  const attention_dims& dims = problem.dims;
  const std::size_t group = dims.num_heads / dims.num_kv_heads;  // R
  const std::size_t head_dim = dims.head_dim;
  const std::size_t rows = positions * group;
  const simd_path path = problem.path;

  // Row = position * R + head in group. Running partial of each row in
  // (max, sum, acc); the current chunk's in (chunk_max, chunk_sum, chunk_acc).
  scratch_lease q_rows(rows * head_dim), scores(rows * kv_chunk), acc(rows * head_dim),
      chunk_acc(rows * head_dim), stats(4 * rows);
  float* const max = stats.data();
  float* const sum = max + rows;
  float* const chunk_max = sum + rows;
  float* const chunk_sum = chunk_max + rows;

  for (std::size_t i = 0; i < positions; ++i) {
    for (std::size_t r = 0; r < group; ++r) {
      const float* source = problem.q.data + batch * problem.q.batch_stride +
                            (kv_head * group + r) * problem.q.head_stride + (position0 + i) * problem.q.seq_stride;
      std::copy(source, source + head_dim, q_rows.data() + (i * group + r) * head_dim);
    }
  }
  std::fill(max, max + rows, -INFINITY);
  std::fill(sum, sum + rows, 0.0f);
  std::fill(acc.data(), acc.data() + rows * head_dim, 0.0f);

  const float* v_head = problem.v.data + batch * problem.v.batch_stride + kv_head * problem.v.head_stride;
  // The last position sees the most keys (visible_end grows with the position).
  const std::size_t tile_end = problem.visible_end(batch, position0 + positions - 1);

  for (std::size_t key0 = 0; key0 < tile_end; key0 += kv_chunk) {  // 1. fixed chunks
    const std::size_t width = std::min(kv_chunk, tile_end - key0);
    auto visible = [&](std::size_t position) {  // keys of this chunk that `position` sees
      const std::size_t end = problem.visible_end(batch, position0 + position);
      return end <= key0 ? 0 : std::min(width, end - key0);
    };
    const std::size_t chunk = key0 / kv_chunk;
    // 2a. scores = scale * q kᵀ (+ mask), against the chunk's packed kᵀ.
    gemm({rows, width, head_dim}, problem.scale, {q_rows.data(), head_dim, transpose::no}, kv.keys[chunk], 0.0f,
         scores.data(), kv_chunk);
    if (problem.additive_mask != nullptr)
      add_mask(problem, scores.data(), kv_chunk, rows, group, position0, key0, width);

    // 2b. Each row's chunk partial from an empty state over its visible keys.
    for (std::size_t row = 0; row < rows; ++row) {
      softmax_partial state;
      online_softmax_block(scores.data() + row * kv_chunk, visible(row / group), state, path);
      chunk_max[row] = state.max;
      chunk_sum[row] = state.sum;
    }
    // 2c. chunk_acc = p v. Off the causal diagonal every position sees the
    // whole chunk: one GEMM. On it, positions see different prefixes. When
    // V's rows there are all finite, hidden probabilities are set to 0 and one
    // GEMM still runs over the widest prefix: fma(0, v, acc) == acc exactly
    // for finite v (acc starts at +0 and is never -0), so each row's bits are
    // those of a GEMM over its own prefix. Otherwise (NaN or Inf in V) runs of
    // positions with equal prefixes get their own GEMMs, so a hidden
    // non-finite value never meets a zero probability.
    const std::size_t widest = visible(positions - 1);
    const float* v_chunk = v_head + key0 * problem.v.seq_stride;
    auto multiply_pv = [&](std::size_t first_position, std::size_t end_position, std::size_t depth) {
      const std::size_t row0 = first_position * group;
      gemm({(end_position - first_position) * group, head_dim, depth}, 1.0f,
           {scores.data() + row0 * kv_chunk, kv_chunk, transpose::no}, kv.values[chunk], 0.0f,
           chunk_acc.data() + row0 * head_dim, head_dim);
    };
    if (visible(0) == widest || all_finite(v_chunk, widest, head_dim, problem.v.seq_stride)) {
      for (std::size_t row = 0; row < rows; ++row)
        std::fill(scores.data() + row * kv_chunk + visible(row / group), scores.data() + row * kv_chunk + widest,
                  0.0f);
      if (widest > 0) multiply_pv(0, positions, widest);
    } else {
      for (std::size_t run_start = 0; run_start < positions;) {
        const std::size_t depth = visible(run_start);
        std::size_t run_end = run_start + 1;
        while (run_end < positions && visible(run_end) == depth) ++run_end;
        if (depth > 0) multiply_pv(run_start, run_end, depth);
        run_start = run_end;
      }
    }
    // 3. Merge into the running partial, left to right.
    for (std::size_t row = 0; row < rows; ++row) {
      if (visible(row / group) == 0) continue;
      softmax_partial running{max[row], sum[row]};
      merge_partials(running, acc.data() + row * head_dim, softmax_partial{chunk_max[row], chunk_sum[row]},
                     chunk_acc.data() + row * head_dim, head_dim, path);
      max[row] = running.max;
      sum[row] = running.sum;
    }
  }

  for (std::size_t i = 0; i < positions; ++i) {
    for (std::size_t r = 0; r < group; ++r) {
      const std::size_t row = i * group + r;
      float* target = problem.out.data + batch * problem.out.batch_stride +
                      (kv_head * group + r) * problem.out.head_stride + (position0 + i) * problem.out.seq_stride;
      normalize_row(acc.data() + row * head_dim, sum[row], target, head_dim, path);
    }
  }
}

}  // namespace

std::size_t attention_problem::visible_end(std::size_t batch, std::size_t row) const {
  std::size_t end = valid_len != nullptr ? valid_len[batch] : dims.kv_len;
  if (causal) end = std::min(end, q_offset + row + 1);
  return end;
}

void flash_attention(const attention_problem& problem) {
  const attention_dims& dims = problem.dims;
  const std::size_t group = dims.num_heads / dims.num_kv_heads;
  const std::size_t query_tile = std::max<std::size_t>(1, stacked_rows / group);
  const std::size_t tiles = ceil_div(dims.q_len, query_tile);
  // 1. Pack K and V of every (batch, kv head), as far as the last query sees.
  std::vector<packed_kv_head> packed(dims.batch * dims.num_kv_heads);
  tbb::parallel_for(std::size_t{0}, packed.size(), [&](std::size_t index) {
    const gemm_serial_scope serial;
    const std::size_t batch = index / dims.num_kv_heads;
    packed[index] = pack_kv_head(problem, batch, index % dims.num_kv_heads, problem.visible_end(batch, dims.q_len - 1));
  });
  // 2. Every (batch, kv head, query tile).
  tbb::parallel_for(std::size_t{0}, dims.batch * dims.num_kv_heads * tiles, [&](std::size_t task) {
    const std::size_t tile = task % tiles, head_index = task / tiles;
    const std::size_t position0 = tile * query_tile;
    attend_tile(problem, packed[head_index], head_index / dims.num_kv_heads, head_index % dims.num_kv_heads,
                position0, std::min(query_tile, dims.q_len - position0));
  });
}

void attention_probabilities(const attention_problem& problem, float* probabilities) {
  const attention_dims& dims = problem.dims;
  const std::size_t group = dims.num_heads / dims.num_kv_heads;
  tbb::parallel_for(std::size_t{0}, dims.batch * dims.num_heads, [&](std::size_t task) {
    const std::size_t batch = task / dims.num_heads, head = task % dims.num_heads;
    float* rows = probabilities + task * dims.q_len * dims.kv_len;
    const float* q = problem.q.data + batch * problem.q.batch_stride + head * problem.q.head_stride;
    const float* k = problem.k.data + batch * problem.k.batch_stride + head / group * problem.k.head_stride;
    gemm({dims.q_len, dims.kv_len, dims.head_dim}, problem.scale, {q, problem.q.seq_stride, transpose::no},
         {k, problem.k.seq_stride, transpose::yes}, 0.0f, rows, dims.kv_len, problem.path);
    if (problem.additive_mask != nullptr)
      add_mask(problem, rows, dims.kv_len, dims.q_len, 1, 0, 0, dims.kv_len);
    for (std::size_t i = 0; i < dims.q_len; ++i) {
      float* row = rows + i * dims.kv_len;
      std::fill(row + problem.visible_end(batch, i), row + dims.kv_len, -INFINITY);
      softmax_row(row, dims.kv_len, problem.path);
    }
  });
}

}  // namespace kvhead::engine
