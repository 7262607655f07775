// The peer of tools/peer_ggml: ggml's CPU flash attention (ggml_flash_attn_ext,
// what llama.cpp runs over its KV cache) on kvhead_bench's decode shapes, with
// K/V stored as f16 and as q8_0 (llama.cpp's cache types), one query token per
// sequence, fp32 q. Geometry as bench/shapes.hpp:
//   S1_decode_gqa       32 q / 8 kv heads, head_dim 128, past 4096, calls rotating over 5 sequences
//   S4_decode_mqa       32 q / 1 kv head, past 8192, rotating over 16 sequences
//   S5_decode_ragged16  16 sequences of pasts 256 .. 4096 evenly, all in one call (one graph)
// Each call is one ggml graph (one flash_attn_ext node per sequence) computed
// by ggml_graph_compute with `threads` threads; prints the median time per call. Built by
// tools/peer_ggml against the ggml it fetches; not part of kvhead's build.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"

namespace {

struct decode_shape {
  const char* name;
  int heads, kv_heads, head_dim;
  std::vector<int> pasts;  // one sequence each: past + 1 cached keys
  int per_call;            // sequences per call
};

// Median ms per call of `shape` over a cache of element type `type`.
double median_call_ms(const decode_shape& shape, ggml_type type, int threads, int calls_timed) {
  std::size_t bytes = std::size_t(64) << 20;  // tensors' overhead and the graphs
  for (int past : shape.pasts) bytes += 2 * std::size_t(past + 1) * shape.kv_heads * shape.head_dim * sizeof(float);
  ggml_context* context = ggml_init({bytes, nullptr, false});
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<ggml_tensor*> outputs;
  for (int past : shape.pasts) {
    const int keys = past + 1;
    ggml_tensor* q = ggml_new_tensor_3d(context, GGML_TYPE_F32, shape.head_dim, 1, shape.heads);
    for (int i = 0; i < shape.head_dim * shape.heads; ++i) static_cast<float*>(q->data)[i] = uniform(random);
    ggml_tensor* kv[2];
    for (ggml_tensor*& tensor : kv) {
      tensor = ggml_new_tensor_3d(context, type, shape.head_dim, keys, shape.kv_heads);
      std::vector<float> values(std::size_t(keys) * shape.kv_heads * shape.head_dim);
      for (float& value : values) value = uniform(random);
      ggml_quantize_chunk(type, values.data(), tensor->data, 0, std::size_t(keys) * shape.kv_heads, shape.head_dim,
                          nullptr);
    }
    const float scale = 1.0f / std::sqrt(float(shape.head_dim));
    outputs.push_back(ggml_flash_attn_ext(context, q, kv[0], kv[1], nullptr, scale, 0.0f, 0.0f));
  }
  // One graph and compute plan per call, each plan with its own work buffer.
  const int calls = int(shape.pasts.size()) / shape.per_call;
  std::vector<ggml_cgraph*> graphs;
  std::vector<ggml_cplan> plans;
  std::vector<std::vector<std::uint8_t>> work(static_cast<std::size_t>(calls));
  for (int call = 0; call < calls; ++call) {
    ggml_cgraph* graph = ggml_new_graph(context);
    for (int i = 0; i < shape.per_call; ++i)
      ggml_build_forward_expand(graph, outputs[std::size_t(call * shape.per_call + i)]);
    graphs.push_back(graph);
    plans.push_back(ggml_graph_plan(graph, threads, nullptr));
    work[std::size_t(call)].resize(plans.back().work_size);
    plans.back().work_data = work[std::size_t(call)].data();
  }
  for (int call = 0; call < calls; ++call)
    ggml_graph_compute(graphs[std::size_t(call)], &plans[std::size_t(call)]);  // untimed
  for (ggml_tensor* output : outputs)
    for (int i = 0; i < shape.head_dim * shape.heads; ++i)
      if (!std::isfinite(static_cast<const float*>(output->data)[i])) {
        std::fprintf(stderr, "peer_ggml: %s produced a non-finite output\n", shape.name);
        std::exit(1);
      }
  std::vector<double> seconds;
  for (int rep = 0; rep < calls_timed; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    ggml_graph_compute(graphs[std::size_t(rep % calls)], &plans[std::size_t(rep % calls)]);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  ggml_free(context);
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2] * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  if (threads < 1) {
    std::fprintf(stderr, "peer_ggml: threads must be a positive integer\n");
    return 2;
  }
  ggml_cpu_init();
  std::vector<int> ragged;
  for (int i = 0; i < 16; ++i) ragged.push_back(256 + i * (4096 - 256) / 15);
  const decode_shape shapes[] = {{"S1_decode_gqa", 32, 8, 128, std::vector<int>(5, 4096), 1},
                                 {"S4_decode_mqa", 32, 1, 128, std::vector<int>(16, 8192), 1},
                                 {"S5_decode_ragged16", 32, 8, 128, ragged, 16}};
  std::printf("ggml flash_attn_ext, %d thread(s), median ms per call\n", threads);
  for (const decode_shape& shape : shapes)
    for (ggml_type type : {GGML_TYPE_F16, GGML_TYPE_Q8_0}) {
      const double ms = median_call_ms(shape, type, threads, shape.per_call > 1 ? 60 : 400);
      char name[64];
      std::snprintf(name, sizeof name, "ggml_%s_%s", shape.name, ggml_type_name(type));
      std::printf("%-28s %8.3f\n", name, ms);
    }
}
