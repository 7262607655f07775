// The attention shapes S1-S5 of the benchmarks: geometry, seeded inputs and
// the flop and byte formulas, shared by the kvhead benchmarks, their textbook
// baselines and the sweeps, so every ratio between them is direct.
//   S1_decode_gqa       32 q heads, 8 kv heads, d 128, past 4096, one call
//                       per sequence of 5 (168 MB of fp32 K/V) in turn;
//   S2_prefill_gqa_causal  32/8 heads, d 128, 1024 tokens, causal, attention
//                       only (8.59 GFLOP);
//   S3_mha_layer        whole layer: d_model 512, 8 heads, batch 4, seq 512, no
//                       mask (6.44 GFLOP);
//   S4_decode_mqa       32 q heads, 1 kv head, d 128, past 8192, 16 sequences;
//   S5_decode_ragged16  16 sequences, pasts 256..4096 evenly, 32/8 heads, d
//                       128, one batched call (285 MB);
//   S6_decode_swa       S1's geometry at past 16384 with a sliding window of
//                       4096 (5 sequences, 671 MB cached, 168 MB read per
//                       rotation), against S1 itself (past 4096, no window).
// Every decode benchmark rotates its calls over copies of its sequences
// (decode_shape::replicas, from_dram) until they read at least
// min_rotation_bytes, so that K/V come from DRAM whatever the dtype: S1's 5
// sequences are 42 MB over an int8 cache, near a last-level cache of 32 MiB
// or more, which can then serve part of each call (Zen 5, one call per
// sequence in turn: int8 347 us over 5 sequences and 549 over 20 in one
// run, 498 and 626 in another; the host's noise is as large).
// Decode counts (attention only, one new token per sequence): flops 4 H d
// (past + 1), bytes the K/V read; with a window W, min(past + 1, W) keys. Prefill: flops 4 H d L(L+1)/2 (q kᵀ and p v
// over the causal triangle), bytes q, k, v and out once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "bench/bench_util.hpp"
#include "kvhead/config.hpp"

namespace kvhead::bench {

struct decode_shape {
  std::size_t heads, kv_heads, head_dim;
  std::vector<std::size_t> pasts;  // one sequence each: past + 1 cached keys
  std::size_t per_call = 1;        // sequences per call; calls rotate over pasts.size() / per_call groups
  std::size_t block_size = 0;      // cache tokens per block, 0: the cache's default
  kv_dtype dtype = kv_dtype::f32;  // how the cache stores K/V
  std::size_t window = 0;          // sliding window, 0: none
  std::size_t replicas = 1;        // the calls rotate over this many copies of the sequences (from_dram)

  std::size_t sequences() const { return pasts.size() * replicas; }
  // Sequence j of the rotation is a copy of sequence j % pasts.size().
  std::size_t past(std::size_t j) const { return pasts[j % pasts.size()]; }
  std::size_t calls() const { return sequences() / per_call; }
  // Call `call`'s sequences alone, as a rotation of that one call (inputs are
  // seeded by a sequence's place in pasts: call 0 keeps its data exactly).
  decode_shape only_call(std::size_t call) const {
    decode_shape one = *this;
    one.pasts.clear();
    for (std::size_t j = call * per_call; j < (call + 1) * per_call; ++j) one.pasts.push_back(past(j));
    one.replicas = 1;
    return one;
  }
  // Per call, averaged over the rotation.
  double flops_per_call() const { return 4.0 * double(heads * head_dim) * keys_per_call(); }
  // K/V bytes read: the stored elements (and, for int8, one fp32 scale per key and kv head for each of K, V).
  double bytes_per_call() const {
    const double element = dtype == kv_dtype::f32 ? 4.0 : dtype == kv_dtype::int8 ? 1.0 : 2.0;
    const double scales = dtype == kv_dtype::int8 ? 2.0 * double(kv_heads) * sizeof(float) : 0.0;
    return (2.0 * double(kv_heads * head_dim) * element + scales) * keys_per_call();
  }

 private:
  // Keys read per call, averaged over the rotation (every replica reads its sequences' keys).
  double keys_per_call() const {
    double total = 0.0;
    for (std::size_t past : pasts) total += double(window == 0 ? past + 1 : std::min(past + 1, window));
    return total * double(replicas) / double(calls());
  }
};

inline decode_shape s1_decode_gqa() { return {32, 8, 128, std::vector<std::size_t>(5, 4096)}; }
inline decode_shape s6_decode_swa() {
  return {32, 8, 128, std::vector<std::size_t>(5, 16384), 1, 0, kv_dtype::f32, 4096};
}
inline decode_shape s4_decode_mqa() { return {32, 1, 128, std::vector<std::size_t>(16, 8192)}; }
inline decode_shape s5_decode_ragged16() {
  std::vector<std::size_t> pasts;
  for (std::size_t i = 0; i < 16; ++i) pasts.push_back(256 + i * (4096 - 256) / 15);
  return {32, 8, 128, pasts, 16};
}

// Sequence i's cached keys and values, [past + 1, kv_heads, head_dim] each.
struct sequence_kv {
  std::vector<float> k, v;
};
// Seeded by i and sized by its past: the same values for every call, replica
// and dtype of a shape. Made once and shared while the most recently used
// sequences hold at most 512 MiB (bench/shapes.cpp): every decode benchmark
// builds a cache per call (decode_bench.cpp), and generating the values for
// each took most of `tools/run bench --quick`. Not thread-safe: benchmarks
// are set up on one thread.
std::shared_ptr<const sequence_kv> decode_kv(const decode_shape& shape, std::size_t i);
// At least this many K/V bytes read per rotation of a decode benchmark's
// calls: several times the last-level cache of the CPUs seen (Zen 5 32 MiB
// per CCD; the Xeons' shared L3 is larger).
inline constexpr double min_rotation_bytes = 256.0 * 1024 * 1024;

// The shape with enough replicas of its sequences to read min_rotation_bytes per rotation.
inline decode_shape from_dram(decode_shape shape) {
  shape.replicas = 1;
  const double rotation = shape.bytes_per_call() * double(shape.calls());
  shape.replicas = std::max<std::size_t>(1, std::size_t(std::ceil(min_rotation_bytes / rotation)));
  return shape;
}

// The new tokens' queries of one call, [per_call, heads, head_dim].
inline std::vector<float> decode_queries(const decode_shape& shape) {
  return random_floats(shape.per_call * shape.heads * shape.head_dim, 7);
}

struct prefill_shape {
  std::size_t heads, kv_heads, head_dim, tokens;

  double flops() const { return 4.0 * double(heads * head_dim) * (double(tokens) * double(tokens + 1) / 2); }
  double bytes() const { return 4.0 * double(tokens * head_dim) * double(2 * heads + 2 * kv_heads); }
};

inline prefill_shape s2_prefill_gqa_causal() { return {32, 8, 128, 1024}; }

// Projected q [heads, tokens, head_dim], k and v [kv_heads, tokens, head_dim].
struct prefill_inputs {
  std::vector<float> q, k, v;
  explicit prefill_inputs(const prefill_shape& s)
      : q(random_floats(s.heads * s.tokens * s.head_dim, 1)),
        k(random_floats(s.kv_heads * s.tokens * s.head_dim, 2)),
        v(random_floats(s.kv_heads * s.tokens * s.head_dim, 3)) {}
};

struct layer_shape {
  std::size_t d_model, heads, head_dim, batch, seq;

  double flops() const {
    const double projections = 4.0 * 2.0 * double(batch * seq) * double(d_model * d_model);
    const double attention = 4.0 * double(batch * heads) * double(seq * seq) * double(head_dim);
    return projections + attention;
  }
  double bytes() const { return 4.0 * double(2 * batch * seq * d_model + 4 * d_model * d_model); }
};

inline layer_shape s3_mha_layer() { return {512, 8, 64, 4, 512}; }

// nn.Linear weights [d_model, d_model] (no bias) and the input x [batch, seq, d_model].
struct layer_inputs {
  std::vector<float> wq, wk, wv, wo, x;
  explicit layer_inputs(const layer_shape& s)
      : wq(weights(s, 1)),
        wk(weights(s, 2)),
        wv(weights(s, 3)),
        wo(weights(s, 4)),
        x(random_floats(s.batch * s.seq * s.d_model, 5)) {}

 private:
  static std::vector<float> weights(const layer_shape& s, unsigned seed) {
    const float scale = 1.0f / std::sqrt(float(s.d_model));
    return random_floats(s.d_model * s.d_model, seed, -scale, scale);
  }
};

}  // namespace kvhead::bench
