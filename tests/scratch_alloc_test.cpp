// Per-thread scratch (engine/arch/scratch.hpp) when allocations fail, and
// kvhead::release_scratch(), with the allocator of tests/counting_new.cpp:
// it fails on demand on one thread and counts the bytes held.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <latch>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include <tbb/task_arena.h>

#include "engine/arch/aligned_buffer.hpp"
#include "engine/arch/scratch.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "tests/counting_new.hpp"
#include "tests/random_values.hpp"

namespace {

using kvhead::engine::reusable;
using kvhead::engine::scratch_lease;
namespace testing = kvhead::testing;

// Stops failing allocations when a check fails mid-test, too.
struct failing_allocations {
  explicit failing_allocations(std::size_t successes) { testing::fail_allocations_after(successes); }
  ~failing_allocations() { testing::stop_failing(); }
};

// Types no other code leases: their stacks start empty on every thread.
struct workspace_a {
  std::vector<float> values;
};
struct workspace_b {
  std::vector<float> values;
};

}  // namespace

TEST_CASE("scratch: a lease whose object cannot be created takes no level") {
  // First use on this thread: the stack registers itself (allocates).
  { const reusable<workspace_a> warm; }
  const workspace_a* level0 = nullptr;
  const workspace_a* level1 = nullptr;
  {
    const reusable<workspace_a> outer;
    level0 = &*outer;
    {
      const failing_allocations fail(0);
      CHECK_THROWS_AS(reusable<workspace_a>(), std::bad_alloc);  // level 1 would be a new object
    }
    const reusable<workspace_a> inner;  // level 1 again, created now
    level1 = &*inner;
    CHECK(level1 != level0);
  }
  const reusable<workspace_a> again;
  CHECK(&*again == level0);  // the depth went back to 0
}

TEST_CASE("scratch: a scratch_lease whose buffer cannot grow gives its level back") {
  const std::size_t floats = 1 << 16;
  float* first = nullptr;
  {
    const scratch_lease lease(floats);
    first = lease.data();
  }
  {
    const failing_allocations fail(0);
    CHECK_THROWS_AS(scratch_lease(4 * floats), std::bad_alloc);
  }
  // Level 0 is free: the next lease there reuses or regrows the same buffer.
  const scratch_lease lease(floats);
  std::memset(lease.data(), 0, floats * sizeof(float));
  const scratch_lease nested(floats);  // level 1
  CHECK(nested.data() != lease.data());
  (void)first;
}

TEST_CASE("scratch: a lease whose bytes overflow std::size_t throws bad_alloc and leaves a working buffer") {
  // 2^62 floats fit a size_t, their bytes do not: no small block may be
  // handed out for them (nor recorded as that many floats for the next lease).
  const std::size_t floats = std::size_t(1) << 62;
  CHECK_THROWS_AS(scratch_lease{floats}, std::bad_alloc);
  CHECK_THROWS_AS(kvhead::engine::allocate_floats(SIZE_MAX), std::bad_alloc);
  const scratch_lease lease(1 << 16);
  std::memset(lease.data(), 0, (1 << 16) * sizeof(float));  // ASan: the whole block is there
}

TEST_CASE("scratch: attention_layer::forward under failing allocations throws bad_alloc, then works") {
  // Every allocation of the call fails in turn (the k-th for k = 0, 1, ...)
  // until one call succeeds: each failure is std::bad_alloc (no crash, no
  // leak, no level lost), and the final result is the bits of an undisturbed
  // run.
  std::mt19937 generator(5);
  const std::size_t d_model = 48, heads = 4, kv_heads = 2, head_dim = 8, batch = 2, seq = 37;
  const auto wq = testing::random_values(heads * head_dim * d_model, generator, 0.2f);
  const auto wk = testing::random_values(kv_heads * head_dim * d_model, generator, 0.2f);
  const auto wv = testing::random_values(kv_heads * head_dim * d_model, generator, 0.2f);
  const auto wo = testing::random_values(d_model * heads * head_dim, generator, 0.2f);
  const auto x = testing::random_values(batch * seq * d_model, generator, 1.0f);
  const kvhead::attention_layer layer({heads, kv_heads, head_dim, d_model, std::nullopt, true, 10000.0},
                                      {{wq.data()}, {wk.data()}, {wv.data()}, {wo.data()}});
  tbb::task_arena arena(1);  // the work runs on this thread, where allocations fail
  std::vector<float> expected(x.size());
  kvhead::release_scratch();  // so the call has to allocate its scratch
  arena.execute([&] { layer.forward(x.data(), batch, seq, expected.data()); });
  std::size_t failures = 0;
  for (std::size_t successes = 0;; ++successes) {
    kvhead::release_scratch();
    std::vector<float> y(x.size(), 0.0f);
    bool done = false;
    arena.execute([&] {
      const failing_allocations fail(successes);
      try {
        layer.forward(x.data(), batch, seq, y.data());
        done = true;
      } catch (const std::bad_alloc&) {
        ++failures;
      }
    });
    if (done) {
      CHECK(std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)) == 0);
      break;
    }
    REQUIRE(successes < 1000);
  }
  CHECK(failures >= 2);  // the Q/K/V and attention scratch at least
}

TEST_CASE("scratch: release_scratch frees every thread's unleased scratch, never a leased one") {
  const std::size_t floats = std::size_t(1) << 22;  // 16 MiB
  kvhead::release_scratch();
  const std::size_t baseline = testing::live_bytes();
  std::latch leased(1), released(1), done(1);
  float* held = nullptr;
  std::thread other([&] {
    {
      const scratch_lease unused(floats);  // level 0, then given back
    }
    const reusable<workspace_b> keep;  // a level that stays leased
    keep->values.assign(floats, 1.0f);
    held = keep->values.data();
    leased.count_down();
    released.wait();
    for (std::size_t i = 0; i < floats; i += 4096) held[i] += 1.0f;  // still valid (ASan would see a free)
    CHECK(keep->values[4096] == 2.0f);
    done.count_down();
  });
  leased.wait();
  CHECK(testing::live_bytes() >= baseline + 2 * floats * sizeof(float));
  kvhead::release_scratch();
  // The other thread's unleased 16 MiB buffer is gone; its leased workspace stays.
  CHECK(testing::live_bytes() < baseline + 2 * floats * sizeof(float));
  CHECK(testing::live_bytes() >= baseline + floats * sizeof(float));
  released.count_down();
  done.wait();
  other.join();
}

TEST_CASE("scratch: a long prefill's scratch is returned by release_scratch") {
  std::mt19937 generator(8);
  const std::size_t d_model = 128, heads = 4, head_dim = 32, seq = 2048;
  const auto w = testing::random_values(heads * head_dim * d_model, generator, 0.1f);
  const auto x = testing::random_values(seq * d_model, generator, 1.0f);
  const kvhead::attention_layer layer({heads, heads, head_dim, d_model, std::nullopt, true, 0.0},
                                      {{w.data()}, {w.data()}, {w.data()}, {w.data()}});
  std::vector<float> y(x.size());
  tbb::task_arena arena(2);
  arena.execute([&] { layer.forward(x.data(), 1, seq, y.data()); });
  const std::size_t before = testing::live_bytes();
  kvhead::release_scratch();
  // At least the Q/K/V rows (seq x 3 H d floats) and the attended rows
  // (seq x H d) of the calling thread.
  CHECK(before - testing::live_bytes() >= seq * 4 * heads * head_dim * sizeof(float));
}
