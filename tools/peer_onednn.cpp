// The peer of tools/peer_onednn: oneDNN's primitives (Debian's libdnnl, the
// library under PyTorch's mkldnn paths and Intel's CPU inference stacks) on
// kvhead_bench's S shapes, in the form a oneDNN user writes attention: a
// matmul for the scores (scale as the primitive's output scale, the causal
// mask as a binary-add post-op), a softmax primitive, a matmul by V, with a
// GQA group's query heads as the rows of one product per kv head (batch
// broadcast), so K/V are never copied. Decode's cache holds K in the layout
// its products read fastest (decode_step); prefill's K comes from a
// projection as rows, read in place through a transposed descriptor.
// Geometry, flop and byte formulas as bench/shapes.hpp:
//   S1_decode_gqa       32 q / 8 kv heads, head_dim 128, past 4096, one call per sequence
//   S2_prefill_gqa_causal  32 / 8 heads, head_dim 128, 1024 tokens, causal
//   S3_mha_layer        d_model 512, 8 heads, batch 4 x seq 512: x W_qkv, attention, W_out
//   S4_decode_mqa       32 q / 1 kv head, past 8192, 16 sequences
//   S5_decode_ragged16  16 sequences of pasts 256 .. 4096 evenly, all in one call
// Decode calls rotate over copies of their sequences until a rotation reads
// at least 256 MiB of K/V (kvhead_bench's from_dram), so K/V come from DRAM.
// Element types: f32; bf16 (K/V, or S2's q, k, v and S3's weights and x, in
// bf16, converted before timing; the scores are summed in fp32, the softmax
// writes bf16 probabilities, a decode step converts its query by a reorder
// inside the call); f16 likewise where this oneDNN runs f16 matmuls on this
// CPU (a row says when it does not). oneDNN has no int8 attention form that
// keeps one scale per token (its matmul scales are per output column or
// per tensor), so there is no int8 row.
//   peer_onednn THREADS [--only TEXT] [--out FILE.json]
// (OMP_NUM_THREADS set to THREADS by tools/peer_onednn) prints, per row, the
// median over 5 repetitions of the mean time per call over at least 0.2 s,
// GFLOP/s, GB/s and the check's error; --only runs the rows whose
// <shape>_<type> holds TEXT; --out writes them as tools/peer_torch.py's JSON
// (names onednn_<shape>[_<type>]/threads:<N>) for tools/plot_bench.py --peer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <omp.h>

#include "oneapi/dnnl/dnnl.hpp"

namespace {

using dnnl::memory;
using element = memory::data_type;
using dims = memory::dims;

dnnl::engine cpu_engine(dnnl::engine::kind::cpu, 0);

const char* element_name(element type) { return type == element::f32 ? "f32" : type == element::bf16 ? "bf16" : "f16"; }

std::size_t element_bytes(element type) { return type == element::f32 ? 4 : 2; }

// U(-1, 1) values, seeded.
std::vector<float> uniform_floats(std::size_t count, unsigned seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(random);
  return values;
}

// Each of `matrices` rows x cols matrices of `values` transposed (cols x rows).
std::vector<float> transposed_rows(const std::vector<float>& values, std::size_t matrices, std::size_t rows,
                                   std::size_t cols) {
  std::vector<float> transposed(values.size());
  for (std::size_t m = 0; m < matrices; ++m)
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) transposed[(m * cols + c) * rows + r] = values[(m * rows + r) * cols + c];
  return transposed;
}

// Storage for `count` elements of `type`.
struct buffer {
  std::vector<float> storage;  // fp32 words enough for the elements
  buffer(std::size_t count, element type) : storage((count * element_bytes(type) + 3) / 4) {}
  void* data() { return storage.data(); }
};

dnnl::stream& cpu_stream() {
  static dnnl::stream stream(cpu_engine);
  return stream;
}

// `values` converted to `type` (rounded to nearest even) by a reorder.
buffer converted(const std::vector<float>& values, element type) {
  buffer target(values.size(), type);
  const dims shape{static_cast<memory::dim>(values.size())};
  memory from({shape, element::f32, memory::format_tag::a}, cpu_engine, const_cast<float*>(values.data()));
  memory to({shape, type, memory::format_tag::a}, cpu_engine, target.data());
  dnnl::reorder(from, to).execute(cpu_stream(), from, to);
  cpu_stream().wait();
  return target;
}

memory::desc strided(const dims& shape, element type, const dims& strides) { return {shape, type, strides}; }

// scores = scale * src weights (+ mask): a matmul with the scale as its
// output scale and, when mask_desc is not empty, a binary-add post-op.
dnnl::matmul scores_product(const memory::desc& src, const memory::desc& weights, const memory::desc& dst, float scale,
                            const memory::desc& mask_desc = {}) {
  dnnl::primitive_attr attr;
  attr.set_output_scales(0, {scale});
  if (!mask_desc.is_zero()) {
    dnnl::post_ops ops;
    ops.append_binary(dnnl::algorithm::binary_add, mask_desc);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul({{src, weights, dst}, attr, cpu_engine});
}

dnnl::matmul plain_product(const memory::desc& src, const memory::desc& weights, const memory::desc& dst) {
  return dnnl::matmul({{src, weights, dst}, cpu_engine});
}

// softmax over the last axis of scores (fp32) into probabilities of `type`.
dnnl::softmax_v2_forward softmax_rows(const memory::desc& scores, const memory::desc& probabilities) {
  return dnnl::softmax_v2_forward({{dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, scores,
                                    probabilities, static_cast<int>(scores.dims().size()) - 1},
                                   cpu_engine});
}

void run(dnnl::primitive& primitive, const std::unordered_map<int, memory>& args) {
  primitive.execute(cpu_stream(), args);
}

// A row of the table: name, what one call does, flops and bytes per call.
// check: after a call, the largest |difference| of some of its outputs from
// attend's, over the largest |reference output|.
struct row {
  std::string name;
  std::function<void(std::size_t call)> call;
  double flops, bytes;
  std::function<double()> check;
};

// softmax(scale q kᵀ) v of one query row over keys [0, keys), in double
// (this tool's own reference, from the rows' fp32 values): k and v rows
// `stride` elements apart.
template <class Value>
std::vector<double> attend(const Value* q, const Value* k, const Value* v, std::size_t keys, std::size_t head_dim,
                           std::size_t stride) {
  std::vector<double> scores(keys), out(head_dim, 0.0);
  double largest = -INFINITY, total = 0;
  for (std::size_t j = 0; j < keys; ++j) {
    double dot = 0;
    for (std::size_t i = 0; i < head_dim; ++i) dot += double(q[i]) * double(k[j * stride + i]);
    scores[j] = dot / std::sqrt(double(head_dim));
    largest = std::max(largest, scores[j]);
  }
  for (double& score : scores) total += score = std::exp(score - largest);
  for (std::size_t j = 0; j < keys; ++j)
    for (std::size_t i = 0; i < head_dim; ++i) out[i] += scores[j] / total * double(v[j * stride + i]);
  return out;
}

// Folds rows of an output and their references into a relative error.
struct error_gauge {
  double difference = 0, largest = 0;
  void add(const float* out, const std::vector<double>& reference) {
    for (std::size_t i = 0; i < reference.size(); ++i) {
      difference = std::max(difference, std::abs(double(out[i]) - reference[i]));
      largest = std::max(largest, std::abs(reference[i]));
    }
  }
  double relative() const { return difference / largest; }
};

// One decode step of one sequence: q [heads, head_dim] fp32 against its
// cache of `type`, V [kv_heads, keys, head_dim] and K as the products read it
// fastest: fp32 Kᵀ [kv_heads, head_dim, keys] (the cache a oneDNN user lays
// out for it), bf16 K [kv_heads, keys, head_dim] read through a transposed
// descriptor, whose pairs along head_dim are the bf16 kernels' own (Zen 5,
// the two layouts alternated 3 times: S1 over f32 1.80-2.12 ms with Kᵀ
// stored against 2.13-2.95 reading K, over bf16 2.02-2.57 against 1.55-2.20).
struct decode_step {
  std::size_t heads, kv_heads, head_dim, group, keys;
  unsigned seed;
  bool keys_transposed;
  buffer k, v;
  std::vector<float> q, out;
  buffer q_converted, scores, probabilities;
  memory q_f32, q_typed, k_memory, v_memory, scores_memory, probabilities_memory, out_memory;
  dnnl::primitive convert, qk, softmax, pv;

  decode_step(std::size_t heads, std::size_t kv_heads, std::size_t head_dim, std::size_t past, element type,
              unsigned seed)
      : heads(heads),
        kv_heads(kv_heads),
        head_dim(head_dim),
        group(heads / kv_heads),
        keys(past + 1),
        seed(seed),
        keys_transposed(type == element::f32),
        k(converted(keys_transposed
                        ? transposed_rows(uniform_floats(kv_heads * keys * head_dim, seed), kv_heads, keys, head_dim)
                        : uniform_floats(kv_heads * keys * head_dim, seed),
                    type)),
        v(converted(uniform_floats(kv_heads * keys * head_dim, seed + 1), type)),
        q(uniform_floats(heads * head_dim, seed + 2)),
        out(heads * head_dim),
        q_converted(heads * head_dim, type),
        scores(heads * keys, element::f32),
        probabilities(heads * keys, type) {
    const auto g = static_cast<memory::dim>(kv_heads), r = static_cast<memory::dim>(group),
               n = static_cast<memory::dim>(keys), d = static_cast<memory::dim>(head_dim);
    const memory::desc q_desc = strided({g, r, d}, type, {r * d, d, 1});
    const memory::desc k_transposed =
        keys_transposed ? strided({g, d, n}, type, {n * d, n, 1}) : strided({g, d, n}, type, {n * d, 1, d});
    const memory::desc v_desc = strided({g, n, d}, type, {n * d, d, 1});
    const memory::desc scores_desc = strided({g, r, n}, element::f32, {r * n, n, 1});
    const memory::desc probabilities_desc = strided({g, r, n}, type, {r * n, n, 1});
    const memory::desc out_desc = strided({g, r, d}, element::f32, {r * d, d, 1});
    q_f32 = memory(strided({g, r, d}, element::f32, {r * d, d, 1}), cpu_engine, q.data());
    q_typed = type == element::f32 ? q_f32 : memory(q_desc, cpu_engine, q_converted.data());
    k_memory = memory(k_transposed, cpu_engine, k.data());
    v_memory = memory(v_desc, cpu_engine, v.data());
    scores_memory = memory(scores_desc, cpu_engine, scores.data());
    probabilities_memory =
        type == element::f32 ? scores_memory : memory(probabilities_desc, cpu_engine, probabilities.data());
    out_memory = memory(out_desc, cpu_engine, out.data());
    if (type != element::f32) convert = dnnl::reorder(q_f32, q_typed);
    qk = scores_product(q_desc, k_transposed, scores_desc, 1.0f / std::sqrt(float(head_dim)));
    softmax = softmax_rows(scores_desc, probabilities_desc);
    pv = plain_product(probabilities_desc, v_desc, out_desc);
  }

  void operator()() {
    if (convert) run(convert, {{DNNL_ARG_FROM, q_f32}, {DNNL_ARG_TO, q_typed}});
    run(qk, {{DNNL_ARG_SRC, q_typed}, {DNNL_ARG_WEIGHTS, k_memory}, {DNNL_ARG_DST, scores_memory}});
    run(softmax, {{DNNL_ARG_SRC, scores_memory}, {DNNL_ARG_DST, probabilities_memory}});
    run(pv, {{DNNL_ARG_SRC, probabilities_memory}, {DNNL_ARG_WEIGHTS, v_memory}, {DNNL_ARG_DST, out_memory}});
  }

  // The last call's output of every head against attend over the fp32 values.
  double error() const {
    const std::vector<float> k_values = uniform_floats(kv_heads * keys * head_dim, seed),
                             v_values = uniform_floats(kv_heads * keys * head_dim, seed + 1);
    error_gauge gauge;
    for (std::size_t head = 0; head < heads; ++head) {
      const std::size_t kv_offset = head / group * keys * head_dim;
      gauge.add(out.data() + head * head_dim, attend(q.data() + head * head_dim, k_values.data() + kv_offset,
                                                     v_values.data() + kv_offset, keys, head_dim, head_dim));
    }
    return gauge.relative();
  }
};

row decode_row(const char* shape, std::size_t heads, std::size_t kv_heads, std::size_t head_dim,
               const std::vector<std::size_t>& pasts, std::size_t per_call, element type) {
  constexpr double min_rotation_bytes = 256.0 * 1024 * 1024;
  double keys = 0;
  for (std::size_t past : pasts) keys += double(past + 1);
  const double rotation_bytes = 2.0 * double(kv_heads * head_dim * element_bytes(type)) * keys;
  const std::size_t replicas = std::max<std::size_t>(1, std::size_t(std::ceil(min_rotation_bytes / rotation_bytes)));
  auto steps = std::make_shared<std::vector<std::unique_ptr<decode_step>>>();
  for (std::size_t copy = 0; copy < replicas; ++copy)
    for (std::size_t i = 0; i < pasts.size(); ++i)
      steps->push_back(std::make_unique<decode_step>(heads, kv_heads, head_dim, pasts[i], type, unsigned(3 * i)));
  const std::size_t calls = steps->size() / per_call;
  const double keys_per_call = keys * double(replicas) / double(calls);
  return {std::string("onednn_") + shape + (type == element::f32 ? "" : std::string("_") + element_name(type)),
          [steps, per_call, calls](std::size_t call) {
            for (std::size_t i = 0; i < per_call; ++i) (*(*steps)[call % calls * per_call + i])();
          },
          4.0 * double(heads * head_dim) * keys_per_call,
          2.0 * double(kv_heads * head_dim * element_bytes(type)) * keys_per_call,
          [steps, per_call] {  // the first call's sequences (call 0 runs first, as the warm-up)
            double worst = 0;
            for (std::size_t i = 0; i < per_call; ++i) worst = std::max(worst, (*steps)[i]->error());
            return worst;
          }};
}

// S2: per query head, scores [tokens, tokens] = scale * q_h K_gᵀ + mask (0 on
// and below the diagonal, -inf above), a 2-D matmul with the mask as its
// binary-add post-op (oneDNN 2.6 runs a batched matmul with a broadcast
// [tokens, tokens] mask on its reference kernel: 61 s a call on Zen 5; the
// 2-D form runs on brgemm); then one softmax over all heads' scores, and p v
// as one batched matmul, [kv_heads, group, tokens, tokens] by V [kv_heads, 1,
// tokens, d] broadcast over the group.
row prefill_row(element type) {
  constexpr std::size_t heads = 32, kv_heads = 8, head_dim = 128, tokens = 1024, group = heads / kv_heads;
  struct state {
    buffer q, k, v, scores, probabilities;
    std::vector<float> mask, out;
    std::vector<memory> q_heads, k_heads, scores_heads;
    memory v_memory, scores_memory, probabilities_memory, mask_memory, out_memory;
    dnnl::primitive qk, softmax, pv;
  };
  const auto g = static_cast<memory::dim>(kv_heads), r = static_cast<memory::dim>(group),
             n = static_cast<memory::dim>(tokens), d = static_cast<memory::dim>(head_dim);
  auto s = std::shared_ptr<state>(new state{converted(uniform_floats(heads * tokens * head_dim, 1), type),
                                            converted(uniform_floats(kv_heads * tokens * head_dim, 2), type),
                                            converted(uniform_floats(kv_heads * tokens * head_dim, 3), type),
                                            buffer(heads * tokens * tokens, element::f32),
                                            buffer(heads * tokens * tokens, type),
                                            std::vector<float>(tokens * tokens),
                                            std::vector<float>(heads * tokens * head_dim),
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {}});
  for (std::size_t i = 0; i < tokens; ++i)
    for (std::size_t j = i + 1; j < tokens; ++j) s->mask[i * tokens + j] = -INFINITY;
  const memory::desc q_head = strided({n, d}, type, {d, 1});
  const memory::desc k_transposed = strided({d, n}, type, {1, d});  // K read in place as Kᵀ
  const memory::desc scores_head = strided({n, n}, element::f32, {n, 1});
  const memory::desc mask_desc = strided({n, n}, element::f32, {n, 1});
  const memory::desc v_desc = strided({g, 1, n, d}, type, {n * d, n * d, d, 1});
  const memory::desc scores_desc = strided({g, r, n, n}, element::f32, {r * n * n, n * n, n, 1});
  const memory::desc probabilities_desc = strided({g, r, n, n}, type, {r * n * n, n * n, n, 1});
  const memory::desc out_desc = strided({g, r, n, d}, element::f32, {r * n * d, n * d, d, 1});
  const std::size_t bytes = element_bytes(type);
  for (std::size_t head = 0; head < heads; ++head) {
    s->q_heads.emplace_back(q_head, cpu_engine, static_cast<char*>(s->q.data()) + head * tokens * head_dim * bytes);
    s->k_heads.emplace_back(k_transposed, cpu_engine,
                            static_cast<char*>(s->k.data()) + head / group * tokens * head_dim * bytes);
    s->scores_heads.emplace_back(scores_head, cpu_engine, s->scores.storage.data() + head * tokens * tokens);
  }
  s->v_memory = memory(v_desc, cpu_engine, s->v.data());
  s->scores_memory = memory(scores_desc, cpu_engine, s->scores.data());
  s->probabilities_memory =
      type == element::f32 ? s->scores_memory : memory(probabilities_desc, cpu_engine, s->probabilities.data());
  s->mask_memory = memory(mask_desc, cpu_engine, s->mask.data());
  s->out_memory = memory(out_desc, cpu_engine, s->out.data());
  s->qk = scores_product(q_head, k_transposed, scores_head, 1.0f / std::sqrt(float(head_dim)), mask_desc);
  s->softmax = softmax_rows(scores_desc, probabilities_desc);
  s->pv = plain_product(probabilities_desc, v_desc, out_desc);
  return {
      std::string("onednn_S2_prefill_gqa_causal") + (type == element::f32 ? "" : std::string("_") + element_name(type)),
      [s](std::size_t) {
        for (std::size_t head = 0; head < heads; ++head)
          run(s->qk, {{DNNL_ARG_SRC, s->q_heads[head]},
                      {DNNL_ARG_WEIGHTS, s->k_heads[head]},
                      {DNNL_ARG_DST, s->scores_heads[head]},
                      {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, s->mask_memory}});
        run(s->softmax, {{DNNL_ARG_SRC, s->scores_memory}, {DNNL_ARG_DST, s->probabilities_memory}});
        run(s->pv,
            {{DNNL_ARG_SRC, s->probabilities_memory}, {DNNL_ARG_WEIGHTS, s->v_memory}, {DNNL_ARG_DST, s->out_memory}});
      },
      4.0 * double(heads * head_dim) * (double(tokens) * double(tokens + 1) / 2),
      4.0 * double(tokens * head_dim) * double(2 * heads + 2 * kv_heads),
      [s] {  // positions 0, 1, 512 and 1023 of the first and the last head
        const std::vector<float> q = uniform_floats(heads * tokens * head_dim, 1),
                                 k = uniform_floats(kv_heads * tokens * head_dim, 2),
                                 v = uniform_floats(kv_heads * tokens * head_dim, 3);
        error_gauge gauge;
        for (std::size_t head : {std::size_t(0), heads - 1})
          for (std::size_t position : {0, 1, 512, 1023}) {
            const std::size_t row = head * tokens + position, kv = head / group * tokens * head_dim;
            gauge.add(s->out.data() + row * head_dim, attend(q.data() + row * head_dim, k.data() + kv, v.data() + kv,
                                                             position + 1, head_dim, head_dim));
          }
        return gauge.relative();
      }};
}

// S3: qkv = x W_qkv ([batch * seq, d_model] x [d_model, 3 d_model]); per batch
// and head, q, k, v read in place from qkv by strides; the heads' outputs
// written in place as [batch * seq, d_model]; out = that W_out. Biases zero
// (left out), as tools/peer_torch.py's zeroed ones.
row layer_row(element type) {
  constexpr std::size_t d_model = 512, heads = 8, batch = 4, seq = 512, head_dim = d_model / heads;
  struct state {
    buffer x, w_qkv, w_out, qkv, scores, probabilities, attended;
    std::vector<float> out;
    memory x_memory, w_qkv_memory, w_out_memory, qkv_memory, q_memory, k_memory, v_memory, scores_memory,
        probabilities_memory, attended_memory, out_memory;
    dnnl::primitive project, qk, softmax, pv, output;
  };
  const auto b = static_cast<memory::dim>(batch), h = static_cast<memory::dim>(heads),
             s_ = static_cast<memory::dim>(seq), dm = static_cast<memory::dim>(d_model),
             d = static_cast<memory::dim>(head_dim), rows = b * s_;
  auto s = std::shared_ptr<state>(new state{converted(uniform_floats(batch * seq * d_model, 1), type),
                                            converted(uniform_floats(d_model * 3 * d_model, 2), type),
                                            converted(uniform_floats(d_model * d_model, 3), type),
                                            buffer(batch * seq * 3 * d_model, type),
                                            buffer(batch * heads * seq * seq, element::f32),
                                            buffer(batch * heads * seq * seq, type),
                                            buffer(batch * seq * d_model, type),
                                            std::vector<float>(batch * seq * d_model),
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {},
                                            {}});
  const memory::desc x_desc = strided({rows, dm}, type, {dm, 1});
  const memory::desc w_qkv_desc = strided({dm, 3 * dm}, type, {3 * dm, 1});
  const memory::desc qkv_desc = strided({rows, 3 * dm}, type, {3 * dm, 1});
  const memory::desc head_desc = strided({b, h, s_, d}, type, {s_ * 3 * dm, d, 3 * dm, 1});  // q or v in qkv
  const memory::desc k_transposed = strided({b, h, d, s_}, type, {s_ * 3 * dm, d, 1, 3 * dm});
  const memory::desc scores_desc = strided({b, h, s_, s_}, element::f32, {h * s_ * s_, s_ * s_, s_, 1});
  const memory::desc probabilities_desc = strided({b, h, s_, s_}, type, {h * s_ * s_, s_ * s_, s_, 1});
  const memory::desc attended_heads = strided({b, h, s_, d}, type, {s_ * dm, d, dm, 1});
  const memory::desc attended_rows = strided({rows, dm}, type, {dm, 1});
  const memory::desc w_out_desc = strided({dm, dm}, type, {dm, 1});
  const memory::desc out_desc = strided({rows, dm}, element::f32, {dm, 1});
  auto* const qkv = static_cast<char*>(s->qkv.data());
  const std::size_t bytes = element_bytes(type);
  s->x_memory = memory(x_desc, cpu_engine, s->x.data());
  s->w_qkv_memory = memory(w_qkv_desc, cpu_engine, s->w_qkv.data());
  s->w_out_memory = memory(w_out_desc, cpu_engine, s->w_out.data());
  s->qkv_memory = memory(qkv_desc, cpu_engine, qkv);
  s->q_memory = memory(head_desc, cpu_engine, qkv);
  s->k_memory = memory(k_transposed, cpu_engine, qkv + d_model * bytes);
  s->v_memory = memory(head_desc, cpu_engine, qkv + 2 * d_model * bytes);
  s->scores_memory = memory(scores_desc, cpu_engine, s->scores.data());
  s->probabilities_memory =
      type == element::f32 ? s->scores_memory : memory(probabilities_desc, cpu_engine, s->probabilities.data());
  s->attended_memory = memory(attended_heads, cpu_engine, s->attended.data());
  s->out_memory = memory(out_desc, cpu_engine, s->out.data());
  s->project = plain_product(x_desc, w_qkv_desc, qkv_desc);
  s->qk = scores_product(head_desc, k_transposed, scores_desc, 1.0f / std::sqrt(float(head_dim)));
  s->softmax = softmax_rows(scores_desc, probabilities_desc);
  s->pv = plain_product(probabilities_desc, head_desc, attended_heads);
  s->output = plain_product(attended_rows, w_out_desc, out_desc);
  const memory attended_as_rows(attended_rows, cpu_engine, s->attended.data());
  return {
      std::string("onednn_S3_mha_layer") + (type == element::f32 ? "" : std::string("_") + element_name(type)),
      [s, attended_as_rows](std::size_t) {
        run(s->project,
            {{DNNL_ARG_SRC, s->x_memory}, {DNNL_ARG_WEIGHTS, s->w_qkv_memory}, {DNNL_ARG_DST, s->qkv_memory}});
        run(s->qk, {{DNNL_ARG_SRC, s->q_memory}, {DNNL_ARG_WEIGHTS, s->k_memory}, {DNNL_ARG_DST, s->scores_memory}});
        run(s->softmax, {{DNNL_ARG_SRC, s->scores_memory}, {DNNL_ARG_DST, s->probabilities_memory}});
        run(s->pv, {{DNNL_ARG_SRC, s->probabilities_memory},
                    {DNNL_ARG_WEIGHTS, s->v_memory},
                    {DNNL_ARG_DST, s->attended_memory}});
        run(s->output,
            {{DNNL_ARG_SRC, attended_as_rows}, {DNNL_ARG_WEIGHTS, s->w_out_memory}, {DNNL_ARG_DST, s->out_memory}});
      },
      4.0 * 2.0 * double(batch * seq * d_model * d_model) + 4.0 * double(batch * heads * seq * seq * head_dim),
      4.0 * double(2 * batch * seq * d_model + 4 * d_model * d_model),
      [s] {  // rows 0 and 511 of the last batch entry
        const std::vector<float> x = uniform_floats(batch * seq * d_model, 1),
                                 w_qkv = uniform_floats(d_model * 3 * d_model, 2),
                                 w_out = uniform_floats(d_model * d_model, 3);
        const std::size_t entry = batch - 1, width = 3 * d_model;
        std::vector<double> qkv(seq * width, 0.0);
        for (std::size_t t = 0; t < seq; ++t)
          for (std::size_t i = 0; i < d_model; ++i) {
            const double xi = x[(entry * seq + t) * d_model + i];
            for (std::size_t j = 0; j < width; ++j) qkv[t * width + j] += xi * double(w_qkv[i * width + j]);
          }
        error_gauge gauge;
        for (std::size_t t : {std::size_t(0), seq - 1}) {
          std::vector<double> attended;
          for (std::size_t head = 0; head < heads; ++head) {
            const double* base = qkv.data() + head * head_dim;
            const std::vector<double> one =
                attend(base + t * width, base + d_model, base + 2 * d_model, seq, head_dim, width);
            attended.insert(attended.end(), one.begin(), one.end());
          }
          std::vector<double> out(d_model, 0.0);
          for (std::size_t i = 0; i < d_model; ++i)
            for (std::size_t j = 0; j < d_model; ++j) out[j] += attended[i] * double(w_out[i * d_model + j]);
          gauge.add(s->out.data() + (entry * seq + t) * d_model, out);
        }
        return gauge.relative();
      }};
}

// Median over 5 repetitions of the mean seconds per call over at least 0.2 s
// (after one warm-up call), and the calls timed.
struct timing {
  double seconds;
  std::size_t calls;
};

timing time_per_call(const row& r) {
  r.call(0);
  cpu_stream().wait();
  std::vector<double> means;
  std::size_t call = 0;
  for (int repetition = 0; repetition < 5; ++repetition) {
    const auto start = std::chrono::steady_clock::now();
    std::size_t calls = 0;
    double elapsed = 0;
    do {
      r.call(++call);
      cpu_stream().wait();
      ++calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (elapsed < 0.2);
    means.push_back(elapsed / double(calls));
  }
  std::sort(means.begin(), means.end());
  return {means[means.size() / 2], call};
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// A JSON string's contents (the names and messages here hold no control characters).
std::string json_escaped(const std::string& text) {
  std::string escaped;
  for (char c : text) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return escaped;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  std::string only, out_path;
  bool arguments_ok = threads >= 1;
  for (int i = 2; i < argc && arguments_ok; i += 2) {
    const std::string flag = argv[i];
    arguments_ok = i + 1 < argc && (flag == "--only" || flag == "--out");
    if (arguments_ok) (flag == "--only" ? only : out_path) = argv[i + 1];
  }
  if (!arguments_ok) {
    std::fprintf(stderr, "usage: peer_onednn THREADS [--only TEXT] [--out FILE.json] (THREADS a positive integer)\n");
    return 2;
  }
  omp_set_num_threads(threads);
  const dnnl_version_t* version = dnnl_version();
  const std::string peer = "oneDNN " + std::to_string(version->major) + "." + std::to_string(version->minor) + "." +
                           std::to_string(version->patch);
  std::printf("%s (%s), %d thread(s), median ms per call\n", peer.c_str(),
              version->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime", threads);
  std::printf("%-40s %10s %9s %9s %12s\n", "name", "ms", "gflops", "gbps", "rel. error");
  std::vector<std::size_t> ragged;
  for (std::size_t i = 0; i < 16; ++i) ragged.push_back(256 + i * (4096 - 256) / 15);
  const std::vector<std::pair<const char*, std::function<row(element)>>> makers = {
      {"S1_decode_gqa",
       [](element type) {
         return decode_row("S1_decode_gqa", 32, 8, 128, std::vector<std::size_t>(5, 4096), 1, type);
       }},
      {"S2_prefill_gqa_causal", prefill_row},
      {"S3_mha_layer", layer_row},
      {"S4_decode_mqa",
       [](element type) {
         return decode_row("S4_decode_mqa", 32, 1, 128, std::vector<std::size_t>(16, 8192), 1, type);
       }},
      {"S5_decode_ragged16",
       [&ragged](element type) { return decode_row("S5_decode_ragged16", 32, 8, 128, ragged, 16, type); }}};
  std::string json_rows;  // tools/peer_torch.py's JSON shape, for tools/plot_bench.py --peer
  for (element type : {element::f32, element::bf16, element::f16})
    for (const auto& [shape, make] : makers) {
      if (!only.empty() && (std::string(shape) + "_" + element_name(type)).find(only) == std::string::npos) continue;
      try {
        const row r = make(type);
        const timing timed = time_per_call(r);
        // A check of the form (a wrong stride or operand is off by the order of
        // the outputs), not of precision: the 16-bit rows round q, K, V and p
        // (S3: x, the weights and qkv) to 8 or 11 bits, and S3's random layer
        // has logits of tens (q kᵀ over 64 dims of sums over 512), where
        // bf16 moves its outputs by about a tenth of the largest.
        const double error = r.check(), bound = type == element::f32 ? 1e-4 : 0.25;
        if (!(error <= bound)) {
          std::printf("%s: its output is off the reference by %.3g of its largest (more than %.0e)\n", r.name.c_str(),
                      error, bound);
          return 1;
        }
        const std::string name = r.name + "/threads:" + std::to_string(threads);
        const double gflops = r.flops / timed.seconds * 1e-9, gbps = r.bytes / timed.seconds * 1e-9;
        std::printf("%-40s %10.3f %9.2f %9.2f %12.2e\n", name.c_str(), timed.seconds * 1e3, gflops, gbps, error);
        char fields[320];
        std::snprintf(fields, sizeof fields,
                      "\"run_type\": \"iteration\", \"repetitions\": 5, \"iterations\": %zu, \"real_time\": %.1f, "
                      "\"cpu_time\": %.1f, \"time_unit\": \"ns\", \"gflops\": %.4f, \"gbps\": %.4f",
                      timed.calls, timed.seconds * 1e9, timed.seconds * 1e9, gflops, gbps);
        json_rows += std::string(json_rows.empty() ? "" : ",\n") + "    {\"name\": \"" + name + "\", \"run_name\": \"" +
                     name + "\", " + fields + "}";
      } catch (const dnnl::error& error) {
        std::printf("onednn_%s_%s: not run, oneDNN has no %s implementation of it on this CPU (%s)\n", shape,
                    element_name(type), element_name(type), error.what());
      }
      std::fflush(stdout);
    }
  if (out_path.empty()) return 0;
  std::ofstream out(out_path);
  out << "{\n  \"context\": {\"cpu_model\": \"" << json_escaped(cpu_model()) << "\", \"peer\": \"" << peer
      << "\", \"onednn_threads\": \"" << threads << "\"},\n  \"benchmarks\": [\n"
      << json_rows << "\n  ]\n}\n";
  if (!out) {
    std::fprintf(stderr, "peer_onednn: could not write %s\n", out_path.c_str());
    return 1;
  }
  return 0;
}
