#include "engine/attention/flash_attention.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <tbb/parallel_for.h>

#include "engine/arch/scratch.hpp"
#include "engine/softmax/softmax.hpp"

namespace kvhead::engine {
namespace {

// Query rows stacked per tile: R heads x positions <= 120 rows, so the
// chunk's scores (120 x 256 floats) and accumulators stay in L2; 120 is a
// multiple of every path's MR (12, 6, 6), so tiles have no short row edge.
constexpr std::size_t stacked_rows = 120;

std::size_t ceil_div(std::size_t value, std::size_t divisor) { return (value + divisor - 1) / divisor; }

// True when the first `rows` rows of every panel of a packed V (k x n) are
// finite (padding lanes included: they are written as zeros).
bool all_finite(const packed_b_view& values, std::size_t rows) {
  const std::size_t nr = gemm_config_for(values.path).nr;
  for (std::size_t panel = 0; panel < ceil_div(values.n, nr); ++panel) {
    const float* start = values.panels + panel * values.k * nr;
    for (std::size_t i = 0; i < rows * nr; ++i)
      if (!std::isfinite(start[i])) return false;
  }
  return true;
}

// User K and V of one (batch, kv head), packed once per chunk.
class packed_kv_source final : public kv_chunk_source {
 public:
  packed_kv_source(const attention_problem& problem, std::size_t batch, std::size_t kv_head, std::size_t keys) {
    const std::size_t head_dim = problem.dims.head_dim;
    const float* k = problem.k.data + batch * problem.k.batch_stride + kv_head * problem.k.head_stride;
    const float* v = problem.v.data + batch * problem.v.batch_stride + kv_head * problem.v.head_stride;
    for (std::size_t key0 = 0; key0 < keys; key0 += kv_chunk) {
      const std::size_t width = std::min(kv_chunk, keys - key0);
      keys_.emplace_back(head_dim, width,
                         gemm_operand{k + key0 * problem.k.seq_stride, problem.k.seq_stride, transpose::yes},
                         problem.path);
      values_.emplace_back(width, head_dim,
                           gemm_operand{v + key0 * problem.v.seq_stride, problem.v.seq_stride, transpose::no},
                           problem.path);
    }
  }
  kv_chunk_view chunk(std::size_t index, float*) const override {
    return {keys_[index].view(), values_[index].view()};
  }

 private:
  std::vector<packed_b> keys_, values_;
};

}  // namespace

std::size_t attention_tile::visible_end(std::size_t row) const {
  return causal ? std::min(key_limit, q_offset + row + 1) : key_limit;
}

std::size_t tile_positions(std::size_t group) { return std::max<std::size_t>(1, stacked_rows / group); }

// Passes numbered as in the header. Row = position * R + head in group.
void attend_tile(const attention_tile& tile, const kv_chunk_source& source) {
  const gemm_serial_scope serial;  // one task per tile already keeps the threads busy
  const std::size_t group = tile.group, head_dim = tile.head_dim, positions = tile.positions;
  const std::size_t rows = positions * group;
  const simd_path path = tile.path;

  // Running partial of each row in (max, sum, acc); the chunk's in
  // (chunk_max, chunk_sum, chunk_acc).
  scratch_lease q_rows(rows * head_dim), scores(rows * kv_chunk), acc(rows * head_dim),
      chunk_acc(rows * head_dim), stats(4 * rows), assembly(source.assembly_floats());
  float* const max = stats.data();
  float* const sum = max + rows;
  float* const chunk_max = sum + rows;
  float* const chunk_sum = chunk_max + rows;

  auto q_row = [&](std::size_t i, std::size_t r) {
    return tile.q + (tile.kv_head * group + r) * tile.q_head_stride + (tile.position0 + i) * tile.q_seq_stride;
  };
  for (std::size_t i = 0; i < positions; ++i)
    for (std::size_t r = 0; r < group; ++r)
      std::copy(q_row(i, r), q_row(i, r) + head_dim, q_rows.data() + (i * group + r) * head_dim);
  std::fill(max, max + rows, -INFINITY);
  std::fill(sum, sum + rows, 0.0f);
  std::fill(acc.data(), acc.data() + rows * head_dim, 0.0f);

  // The last position sees the most keys (visible_end grows with the position).
  const std::size_t tile_end = tile.visible_end(tile.position0 + positions - 1);
  for (std::size_t key0 = 0; key0 < tile_end; key0 += kv_chunk) {  // 1. fixed chunks
    const std::size_t width = std::min(kv_chunk, tile_end - key0);
    auto visible = [&](std::size_t position) {  // keys of this chunk that `position` sees
      const std::size_t end = tile.visible_end(tile.position0 + position);
      return end <= key0 ? 0 : std::min(width, end - key0);
    };
    const kv_chunk_view chunk = source.chunk(key0 / kv_chunk, assembly.data());

    // 2a. scores = scale * q kᵀ (+ mask).
    gemm({rows, width, head_dim}, tile.scale, {q_rows.data(), head_dim, transpose::no}, chunk.keys, 0.0f,
         scores.data(), kv_chunk);
    if (tile.additive_mask != nullptr)
      for (std::size_t row = 0; row < rows; ++row) {
        const float* mask_row = tile.additive_mask + (tile.position0 + row / group) * tile.mask_ld + key0;
        float* score_row = scores.data() + row * kv_chunk;
        for (std::size_t j = 0; j < width; ++j) score_row[j] += mask_row[j];
      }

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
    auto multiply_pv = [&](std::size_t first_position, std::size_t end_position, std::size_t depth) {
      const std::size_t row0 = first_position * group;
      gemm({(end_position - first_position) * group, head_dim, depth}, 1.0f,
           {scores.data() + row0 * kv_chunk, kv_chunk, transpose::no}, chunk.values, 0.0f,
           chunk_acc.data() + row0 * head_dim, head_dim);
    };
    if (visible(0) == widest || all_finite(chunk.values, widest)) {
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

  for (std::size_t i = 0; i < positions; ++i)
    for (std::size_t r = 0; r < group; ++r) {
      float* target = tile.out + (tile.kv_head * group + r) * tile.out_head_stride +
                      (tile.position0 + i) * tile.out_seq_stride;
      normalize_row(acc.data() + (i * group + r) * head_dim, sum[i * group + r], target, head_dim, path);
    }
}

void flash_attention(const attention_problem& problem) {
  const attention_dims& dims = problem.dims;
  const std::size_t group = dims.num_heads / dims.num_kv_heads;
  const std::size_t positions = tile_positions(group);
  const std::size_t tiles = ceil_div(dims.q_len, positions);
  auto key_limit = [&](std::size_t batch) {
    return problem.valid_len != nullptr ? problem.valid_len[batch] : dims.kv_len;
  };
  auto make_tile = [&](std::size_t batch, std::size_t kv_head, std::size_t position0, std::size_t count) {
    return attention_tile{problem.q.data + batch * problem.q.batch_stride,
                          problem.q.head_stride,
                          problem.q.seq_stride,
                          problem.out.data + batch * problem.out.batch_stride,
                          problem.out.head_stride,
                          problem.out.seq_stride,
                          kv_head,
                          group,
                          dims.head_dim,
                          position0,
                          count,
                          problem.q_offset,
                          key_limit(batch),
                          problem.causal,
                          problem.additive_mask,
                          dims.kv_len,
                          problem.scale,
                          problem.path};
  };
  // 1. Pack K and V of every (batch, kv head), as far as the last query sees.
  std::vector<std::unique_ptr<packed_kv_source>> sources(dims.batch * dims.num_kv_heads);
  tbb::parallel_for(std::size_t{0}, sources.size(), [&](std::size_t index) {
    const std::size_t batch = index / dims.num_kv_heads, kv_head = index % dims.num_kv_heads;
    const std::size_t keys = make_tile(batch, kv_head, 0, 1).visible_end(dims.q_len - 1);
    sources[index] = std::make_unique<packed_kv_source>(problem, batch, kv_head, keys);
  });
  // 2. Every (batch, kv head, query tile).
  tbb::parallel_for(std::size_t{0}, sources.size() * tiles, [&](std::size_t task) {
    const std::size_t index = task / tiles, position0 = task % tiles * positions;
    attend_tile(make_tile(index / dims.num_kv_heads, index % dims.num_kv_heads, position0,
                          std::min(positions, dims.q_len - position0)),
                *sources[index]);
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
    const std::size_t key_limit = problem.valid_len != nullptr ? problem.valid_len[batch] : dims.kv_len;
    for (std::size_t i = 0; i < dims.q_len; ++i) {
      float* row = rows + i * dims.kv_len;
      if (problem.additive_mask != nullptr)
        for (std::size_t j = 0; j < dims.kv_len; ++j) row[j] += problem.additive_mask[i * dims.kv_len + j];
      const std::size_t end = problem.causal ? std::min(key_limit, problem.q_offset + i + 1) : key_limit;
      std::fill(row + end, row + dims.kv_len, -INFINITY);
      softmax_row(row, dims.kv_len, problem.path);
    }
  });
}

}  // namespace kvhead::engine
