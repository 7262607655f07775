#include "bench/textbook.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvhead::bench {
namespace {

// Where the rows of each head of a [.., heads, .., head_dim] array are.
struct head_layout {
  std::size_t heads, head_stride, row_stride;
};

// dst head h := src head h / (dst heads / src heads), `rows` rows of
// head_dim floats each: repeat_kv when dst has more heads, split or merge
// heads when the strides differ.
void copy_heads(const float* src, head_layout from, float* dst, head_layout to, std::size_t rows,
                std::size_t head_dim) {
  const std::size_t group = to.heads / from.heads;
  for (std::size_t h = 0; h < to.heads; ++h) {
    for (std::size_t r = 0; r < rows; ++r) {
      std::memcpy(dst + h * to.head_stride + r * to.row_stride,
                  src + h / group * from.head_stride + r * from.row_stride, head_dim * sizeof(float));
    }
  }
}

// x [rows, cols] := x Wᵀ for w [cols, cols] (nn.Linear without bias).
void linear(const float* x, const float* w, std::size_t rows, std::size_t cols, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(cols), int(cols), 1.0f, x, int(cols), w,
              int(cols), 0.0f, y, int(cols));
}

// Steps 1-3 of the header for one head; query i sits at position
// kv_len - q_len + i (it sees keys up to there when causal).
void head_attention(const float* q, const float* k, const float* v, std::size_t q_len, std::size_t kv_len,
                    std::size_t head_dim, bool causal, float* scores, float* out) {
  const float scale = 1.0f / std::sqrt(float(head_dim));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(q_len), int(kv_len), int(head_dim), scale, q, int(head_dim),
              k, int(head_dim), 0.0f, scores, int(kv_len));
  for (std::size_t i = 0; i < q_len; ++i) {
    float* row = scores + i * kv_len;
    if (causal) std::fill(row + (kv_len - q_len + i + 1), row + kv_len, -INFINITY);
    float max = -INFINITY;
    for (std::size_t j = 0; j < kv_len; ++j) max = std::max(max, row[j]);
    float sum = 0.0f;
    for (std::size_t j = 0; j < kv_len; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    for (std::size_t j = 0; j < kv_len; ++j) row[j] /= sum;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(q_len), int(head_dim), int(kv_len), 1.0f, scores,
              int(kv_len), v, int(head_dim), 0.0f, out, int(head_dim));
}

}  // namespace

textbook_decode::textbook_decode(const decode_shape& shape) : shape_(shape) {
  cache_.reserve(shape.sequences());
  for (std::size_t i = 0; i < shape.pasts.size(); ++i)
    cache_.push_back(*decode_kv(shape, i));  // a copy of its own, as the replicas below
  for (std::size_t j = shape.pasts.size(); j < shape.sequences(); ++j) cache_.push_back(cache_[j % shape.pasts.size()]);
  const std::size_t keys = *std::max_element(shape.pasts.begin(), shape.pasts.end()) + 1;
  k_heads_.resize(shape.heads * keys * shape.head_dim);
  v_heads_.resize(k_heads_.size());
  scores_.resize(keys);
}

void textbook_decode::run(std::size_t call, const float* q, float* out) {
  const std::size_t d = shape_.head_dim, heads = shape_.heads;
  for (std::size_t row = 0; row < shape_.per_call; ++row) {
    const std::size_t sequence = call * shape_.per_call + row;
    const std::size_t keys = shape_.past(sequence) + 1;
    const head_layout cached{shape_.kv_heads, d, shape_.kv_heads * d}, repeated{heads, keys * d, d};
    copy_heads(cache_[sequence].k.data(), cached, k_heads_.data(), repeated, keys, d);
    copy_heads(cache_[sequence].v.data(), cached, v_heads_.data(), repeated, keys, d);
    for (std::size_t h = 0; h < heads; ++h) {
      head_attention(q + (row * heads + h) * d, &k_heads_[h * keys * d], &v_heads_[h * keys * d], 1, keys, d, false,
                     scores_.data(), out + (row * heads + h) * d);
    }
  }
}

textbook_prefill::textbook_prefill(const prefill_shape& shape)
    : shape_(shape),
      k_heads_(shape.heads * shape.tokens * shape.head_dim),
      v_heads_(k_heads_.size()),
      scores_(shape.tokens * shape.tokens) {}

void textbook_prefill::run(const prefill_inputs& in, float* out) {
  const std::size_t d = shape_.head_dim, tokens = shape_.tokens, per_head = tokens * d;
  copy_heads(in.k.data(), {shape_.kv_heads, per_head, d}, k_heads_.data(), {shape_.heads, per_head, d}, tokens, d);
  copy_heads(in.v.data(), {shape_.kv_heads, per_head, d}, v_heads_.data(), {shape_.heads, per_head, d}, tokens, d);
  for (std::size_t h = 0; h < shape_.heads; ++h) {
    head_attention(&in.q[h * per_head], &k_heads_[h * per_head], &v_heads_[h * per_head], tokens, tokens, d, true,
                   scores_.data(), out + h * per_head);
  }
}

textbook_layer::textbook_layer(const layer_shape& shape, const layer_inputs& in)
    : shape_(shape),
      weights_(in),
      q_(shape.batch * shape.seq * shape.d_model),
      k_(q_.size()),
      v_(q_.size()),
      q_heads_(shape.batch * shape.heads * shape.seq * shape.head_dim),
      k_heads_(q_heads_.size()),
      v_heads_(q_heads_.size()),
      out_heads_(q_heads_.size()),
      merged_(q_.size()),
      scores_(shape.seq * shape.seq) {}

void textbook_layer::run(const float* x, float* y) {
  const std::size_t rows = shape_.batch * shape_.seq, d_model = shape_.d_model, d = shape_.head_dim;
  const std::size_t seq = shape_.seq, per_head = seq * d;
  linear(x, weights_.wq.data(), rows, d_model, q_.data());
  linear(x, weights_.wk.data(), rows, d_model, k_.data());
  linear(x, weights_.wv.data(), rows, d_model, v_.data());
  const head_layout tokens_major{shape_.heads, d, d_model}, heads_major{shape_.heads, per_head, d};
  for (std::size_t b = 0; b < shape_.batch; ++b) {
    const std::size_t in = b * seq * d_model, out = b * shape_.heads * per_head;
    copy_heads(&q_[in], tokens_major, &q_heads_[out], heads_major, seq, d);
    copy_heads(&k_[in], tokens_major, &k_heads_[out], heads_major, seq, d);
    copy_heads(&v_[in], tokens_major, &v_heads_[out], heads_major, seq, d);
    for (std::size_t h = 0; h < shape_.heads; ++h) {
      const std::size_t head = out + h * per_head;
      head_attention(&q_heads_[head], &k_heads_[head], &v_heads_[head], seq, seq, d, false, scores_.data(),
                     &out_heads_[head]);
    }
    copy_heads(&out_heads_[out], heads_major, &merged_[in], tokens_major, seq, d);
  }
  linear(merged_.data(), weights_.wo.data(), rows, d_model, y);
}

}  // namespace kvhead::bench
