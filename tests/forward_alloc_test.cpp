// The cache-free paths allocate nothing per call in steady state, and what
// does grow grows rarely (counted by the operator new of
// tests/counting_new.cpp): after a warm-up, repeated
// scaled_dot_product_attention and attention_layer::forward calls of one
// shape make zero allocations on one thread; the shared RoPE table regrows
// only O(log n) times for a growing sequence.
//
// In a two-thread arena a thread's scratch (engine/arch/scratch.hpp) still
// grows the first time it happens to run one of a call's largest tiles: work
// stealing decides which tiles it gets, and it gets the small ones most of the
// time. So there the bound is a few growths over 100 calls (per-call buffers
// would make at least one allocation per call).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include <tbb/task_arena.h>

#include "engine/attention/rope.hpp"
#include "kvhead/attention.hpp"
#include "tests/counting_new.hpp"
#include "tests/random_values.hpp"

namespace {

std::vector<float> random_values(std::size_t count, std::mt19937& generator) {
  return kvhead::testing::random_values(count, generator, 0.125f);
}

// Allocations made by `calls` calls of `work` in `arena`, after `warm_up` calls.
template <class Work>
std::size_t steady_allocations(tbb::task_arena& arena, int warm_up, int calls, const Work& work) {
  for (int i = 0; i < warm_up; ++i) arena.execute(work);
  const std::size_t before = kvhead::testing::allocation_count();
  for (int i = 0; i < calls; ++i) arena.execute(work);
  return kvhead::testing::allocation_count() - before;
}

}  // namespace

TEST_CASE("forward alloc: a sequence growing to 200000 positions regrows the RoPE table O(log n) times") {
  const kvhead::engine::rope rope(8, 12345.0);  // a (head_dim, theta) no other test uses
  std::vector<float> row(8, 1.0f);
  const std::size_t first = 0;
  rope.apply(row.data(), 1, 8, 1, &first);  // the first table (4096 positions), and oneTBB's own start-up
  const std::size_t before = kvhead::testing::allocation_count();
  for (std::size_t position = 1; position < 200000; ++position) rope.apply(row.data(), 1, 8, 1, &position);
  // Then tables of the power of two at or above twice the position asked,
  // up to the cap: 16384, 65536 and 131072 positions, each a table and its
  // shared state; positions past the cap are computed without allocating.
  CHECK(kvhead::testing::allocation_count() - before <= 6);
}

TEST_CASE("forward alloc: scaled_dot_product_attention allocates nothing after warm-up, f32 and bf16") {
  std::mt19937 generator(11);
  using view = kvhead::head_tensor<const float>;
  // A decode-shaped query over 700 keys (its key range split across tasks;
  // V read in place), and a 300-token causal prefill (V packed); in bf16
  // precision the rounded copies of q, k and v are scratch too.
  for (const kvhead::precision compute : {kvhead::precision::f32, kvhead::precision::bf16})
    for (std::size_t q_len : {1, 300}) {
      const std::size_t kv_len = q_len == 1 ? 700 : q_len;
      const kvhead::attention_dims dims{1, 8, 2, q_len, kv_len, 32};
      const auto q = random_values(8 * q_len * 32, generator), k = random_values(2 * kv_len * 32, generator);
      const auto v = random_values(k.size(), generator);
      std::vector<float> out(q.size());
      kvhead::attention_options options;
      options.causal = true;
      options.precision = compute;
      for (int threads : {1, 2}) {
        tbb::task_arena arena(threads);
        const std::size_t allocations = steady_allocations(arena, 30, 100, [&] {
          kvhead::scaled_dot_product_attention(dims, view::bhsd(q.data(), 8, q_len, 32),
                                               view::bhsd(k.data(), 2, kv_len, 32), view::bhsd(v.data(), 2, kv_len, 32),
                                               kvhead::head_tensor<float>::bhsd(out.data(), 8, q_len, 32), options);
        });
        INFO("precision " << kvhead::to_string(compute) << " q_len " << q_len << " threads " << threads);
        CHECK(allocations <= (threads == 1 ? 0 : 20));
        CHECK(std::isfinite(out[0]));
      }
    }
}

TEST_CASE("forward alloc: the cache-free forward allocates nothing after warm-up") {
  std::mt19937 generator(7);
  // GQA with RoPE and some biases; 130 tokens: several query tiles per kv head.
  const kvhead::attention_config config{8, 2, 16, 64, {}, true, 10000.0};
  const auto wq = random_values(128 * 64, generator), wk = random_values(32 * 64, generator);
  const auto wv = random_values(32 * 64, generator), wo = random_values(64 * 128, generator);
  const auto bq = random_values(128, generator), bv = random_values(32, generator);
  const kvhead::attention_layer layer(
      config, {{wq.data(), bq.data()}, {wk.data(), nullptr}, {wv.data(), bv.data()}, {wo.data(), nullptr}});
  constexpr std::size_t batch = 2, seq = 130;
  const std::vector<float> x = random_values(batch * seq * 64, generator);
  std::vector<float> y(x.size());
  for (int threads : {1, 2}) {
    tbb::task_arena arena(threads);
    const std::size_t allocations =
        steady_allocations(arena, 30, 100, [&] { layer.forward(x.data(), batch, seq, y.data()); });
    INFO("threads " << threads);
    CHECK(allocations <= (threads == 1 ? 0 : 20));
    CHECK(std::isfinite(y[0]));
  }
}
