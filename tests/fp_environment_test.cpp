// kvhead computes in the default floating-point environment whatever the
// caller's (attention.hpp, "Floating-point environment"): a caller thread with
// flush-to-zero and denormals-are-zero, another rounding mode or unmasked
// exceptions, and task arenas initialized in that environment (oneTBB gives
// their workers the settings captured then), get the bits of the default
// environment, for every thread count, and find their own environment intact
// after each call. The inputs hold denormals (tiny V, tiny v_proj weights) so
// that FTZ/DAZ would change the outputs, and the rounding modes change nearly
// every bit.
#include <doctest/doctest.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <tbb/task_arena.h>
#include <xmmintrin.h>

#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"
#include "kvhead/kv_cache.hpp"
#include "tests/random_values.hpp"

namespace {

using kvhead::testing::random_values;

constexpr unsigned flush_to_zero = 0x8000, denormals_are_zero = 0x0040;  // MXCSR bits

struct environment {
  const char* name;
  int rounding;       // FE_TONEAREST, FE_UPWARD, ...
  unsigned mxcsr_or;  // FTZ / DAZ bits set on top
  int traps;          // exceptions unmasked (feenableexcept)
};

const environment altered[] = {
    {"FTZ + DAZ", FE_TONEAREST, flush_to_zero | denormals_are_zero, 0},
    {"FTZ only", FE_TONEAREST, flush_to_zero, 0},
    {"round upward", FE_UPWARD, 0, 0},
    {"round toward zero + FTZ + DAZ", FE_TOWARDZERO, flush_to_zero | denormals_are_zero, 0},
    {"invalid and divide-by-zero unmasked", FE_TONEAREST, 0, FE_INVALID | FE_DIVBYZERO},
};

// The inputs of every public computation, made in the default environment.
struct inputs {
  static constexpr std::size_t batch = 2, heads = 4, kv_heads = 2, q_len = 5, kv_len = 37, head_dim = 24;
  std::vector<float> q, k, v;
  kvhead::attention_config config{8, 2, 16, 48, {}, true, 10000.0};
  std::vector<float> wq, wk, wv, wo, x;
  static constexpr std::size_t seq = 11;

  inputs() {
    std::mt19937 generator(31);
    q = random_values(batch * heads * q_len * head_dim, generator, 1.0f);
    k = random_values(batch * kv_heads * kv_len * head_dim, generator, 1.0f);
    v = random_values(batch * kv_heads * kv_len * head_dim, generator, 1e-39f);  // denormal values
    k[3] = std::numeric_limits<float>::infinity();  // an invalid operation (inf - inf) in the softmax
    const std::size_t d_model = config.d_model, q_out = 8 * 16, kv_out = 2 * 16;
    wq = random_values(q_out * d_model, generator, 0.2f);
    wk = random_values(kv_out * d_model, generator, 0.2f);
    wv = random_values(kv_out * d_model, generator, 1e-39f);  // denormal weights: denormal v rows
    wo = random_values(d_model * q_out, generator, 0.2f);
    x = random_values(seq * d_model, generator, 1.0f);
  }
};

// Everything kvhead computes from `in`, concatenated: attention, a layer
// built here, its cache-free forward and its forward over a cache (a prefill
// then single tokens).
std::vector<float> compute(const inputs& in) {
  using kvhead::head_tensor;
  const std::size_t b = inputs::batch, h = inputs::heads, g = inputs::kv_heads, d = inputs::head_dim;
  std::vector<float> out(b * h * inputs::q_len * d);
  kvhead::scaled_dot_product_attention({b, h, g, inputs::q_len, inputs::kv_len, d},
                                       head_tensor<const float>::bhsd(in.q.data(), h, inputs::q_len, d),
                                       head_tensor<const float>::bhsd(in.k.data(), g, inputs::kv_len, d),
                                       head_tensor<const float>::bhsd(in.v.data(), g, inputs::kv_len, d),
                                       head_tensor<float>::bhsd(out.data(), h, inputs::q_len, d));

  const kvhead::attention_layer layer(
      in.config, {{in.wq.data(), nullptr}, {in.wk.data(), nullptr}, {in.wv.data(), nullptr}, {in.wo.data(), nullptr}});
  const std::size_t d_model = in.config.d_model, rows = inputs::seq * d_model;
  out.resize(out.size() + 2 * rows);
  float* y = out.data() + out.size() - 2 * rows;
  layer.forward(in.x.data(), 1, inputs::seq, y);
  kvhead::kv_cache cache({1, 2, 16, 32, 1u << 20});
  const kvhead::sequence_id id = cache.create();
  cache.append(id, 7);
  layer.forward(cache, 0, {{id, 7}}, in.x.data(), y + rows);
  for (std::size_t t = 7; t < inputs::seq; ++t) {
    cache.append(id, 1);
    layer.forward(cache, 0, {{id, 1}}, in.x.data() + t * d_model, y + rows + t * d_model);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Sets `env` on this thread; returns what the thread's MXCSR then is.
unsigned enter(const environment& env) {
  std::fesetround(env.rounding);
  _mm_setcsr(_mm_getcsr() | env.mxcsr_or);
  if (env.traps != 0) feenableexcept(env.traps);
  return _mm_getcsr();
}

void leave() {
  fedisableexcept(FE_ALL_EXCEPT);
  std::fesetenv(FE_DFL_ENV);
}

}  // namespace

TEST_CASE("fp environment: the caller's FTZ/DAZ and rounding mode and traps change no bit at any thread count") {
  const inputs in;
  std::vector<float> expected;
  {
    tbb::task_arena one(1);
    one.execute([&] { expected = compute(in); });
  }
  // The inputs exercise denormals: some outputs are denormal, and NaN (from
  // the infinite key) propagates to others.
  std::size_t denormal = 0, nan = 0;
  for (const float value : expected) {
    denormal += std::fpclassify(value) == FP_SUBNORMAL;
    nan += std::isnan(value);
  }
  CHECK(denormal > 100);
  CHECK(nan > 0);

  for (const environment& env : altered) {
    for (const int threads : {1, 2, 3}) {
      const std::string name = env.name;
      CAPTURE(name);
      CAPTURE(threads);
      std::vector<float> got;
      unsigned set = 0, after = 0;
      {
        // The arena is initialized in the altered environment, so oneTBB
        // would hand it to the arena's workers.
        set = enter(env);
        tbb::task_arena arena(threads);
        arena.initialize();
        arena.execute([&] { got = compute(in); });
        after = _mm_getcsr();
        leave();
      }
      CHECK(same_bits(got, expected));
      CHECK((after & ~0x3fu) == (set & ~0x3fu));  // the caller's controls, not the flags, are back
      // With the thread count set through kvhead: its own arena, initialized
      // at its first use, in the altered environment.
      kvhead::set_num_threads(static_cast<std::size_t>(threads));
      set = enter(env);
      got = compute(in);
      after = _mm_getcsr();
      leave();
      kvhead::set_num_threads(0);
      CHECK(same_bits(got, expected));
      CHECK((after & ~0x3fu) == (set & ~0x3fu));
    }
  }
  // The default environment is also what the caller's plain arena gives.
  CHECK(same_bits(compute(in), expected));
}
