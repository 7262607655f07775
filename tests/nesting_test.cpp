// How kvhead's work meets oneTBB (engine/scheduler/arena.hpp, run_in_arena):
// called from a task of the caller's own oneTBB loop, each call does all its
// work, whatever the loop's other iterations do; a worker thread oneTBB could
// not start is reported as a shortage, not as a bug.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "engine/capi/status.hpp"
#include "engine/scheduler/arena.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/random_values.hpp"
#include "tests/seeded_layer.hpp"

namespace {

// Large enough that a prefill of `prompt` tokens runs as many tasks for tens
// of milliseconds, so that the loop's other iteration throws in its middle.
const kvhead::attention_config layer_config{8, 2, 64, 512, {}, true, 10000.0};
constexpr std::size_t prompt = 600;

bool same_bits(const float* a, const float* b, std::size_t count) {
  return std::memcmp(a, b, count * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("nesting: a call in a user's parallel_for whose other iteration throws still does all its work") {
  const kvhead::testing::seeded_layer weights(layer_config, 7, 1.0f / std::sqrt(float(layer_config.d_model)));
  const kvhead::attention_layer layer(layer_config, weights.weights());
  const std::size_t width = layer_config.d_model;
  std::mt19937 generator(11);
  const std::vector<float> x = kvhead::testing::random_values((prompt + 1) * width, generator, 1.0f);
  std::vector<float> expected(x.size());
  layer.forward(x.data(), 1, prompt + 1, expected.data());

  for (const bool cached : {false, true}) {
    CAPTURE(cached);
    kvhead::kv_cache_config cache_config;
    cache_config.num_kv_heads = layer_config.num_kv_heads;
    cache_config.head_dim = layer_config.head_dim;
    cache_config.capacity_bytes = std::size_t(64) << 20;
    kvhead::kv_cache cache(cache_config);
    const kvhead::sequence_id id = cache.create();
    std::vector<float> y(x.size(), 0.0f);
    std::atomic<bool> started{false}, returned{false};
    bool thrown = false;
    // Iteration 0 throws a few milliseconds into iteration 1's call, which
    // cancels the user's loop. kvhead's work must not be cancelled with it:
    // its context was bound to the loop's, and the call returned normally
    // with part of its output (and of the cache's K/V) never computed.
    tbb::task_arena user_arena(2);
    try {
      user_arena.execute([&] {
        tbb::parallel_for(
            tbb::blocked_range<int>(0, 2, 1),
            [&](const tbb::blocked_range<int>& range) {
              if (range.begin() == 0) {
                // Bounded: with one thread free the call may run first, or not at all.
                for (int wait = 0; wait < 2000 && !started.load(); ++wait)
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
                std::this_thread::sleep_for(std::chrono::milliseconds(3));
                throw std::runtime_error("the user's own error");
              }
              started.store(true);
              if (cached) {
                cache.append(id, prompt);
                layer.forward(cache, 0, {{id, prompt}}, x.data(), y.data());
              } else {
                layer.forward(x.data(), 1, prompt, y.data());
              }
              returned.store(true);
            },
            tbb::simple_partitioner());
      });
    } catch (const std::runtime_error& error) {
      thrown = std::string(error.what()) == "the user's own error";
    }
    CHECK(thrown);
    if (!returned.load()) {
      MESSAGE("the call was cancelled before it started (one thread free): nothing to check");
      continue;
    }
    CHECK(same_bits(y.data(), expected.data(), prompt * width));
    if (!cached) continue;
    // The next step reads the K/V the prefill wrote.
    cache.append(id, 1);
    layer.forward(cache, 0, {{id, 1}}, x.data() + prompt * width, y.data() + prompt * width);
    CHECK(same_bits(y.data() + prompt * width, expected.data() + prompt * width, width));
  }
}

TEST_CASE("nesting: a worker thread oneTBB could not start is a shortage, in C++ and in the C API") {
  // oneTBB's own words when pthread_create fails (a limit on threads, no memory).
  const auto failing_start = [] {
    throw std::runtime_error("pthread_create has failed: Resource temporarily unavailable");
  };
  try {
    kvhead::engine::run_in_arena(failing_start);
    FAIL("no exception");
  } catch (const std::system_error& error) {
    CHECK(error.code() == std::errc::resource_unavailable_try_again);
    CHECK(std::string(error.what()) ==
          "could not start a worker thread (oneTBB's pthread_create failed): Resource temporarily unavailable");
  }
  const kvh_status status = kvhead::capi::guarded("kvh_decode", [&] { kvhead::engine::run_in_arena(failing_start); });
  CHECK(status == KVH_ERR_CAPACITY);
  CHECK(std::string(kvh_last_error()).find("kvh_decode: could not start a worker thread") == 0);
  // Any other runtime_error is the work's own, passed on as it is.
  CHECK_THROWS_WITH_AS(kvhead::engine::run_in_arena([] { throw std::runtime_error("the work's own"); }),
                       "the work's own", std::runtime_error);
}
