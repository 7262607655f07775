// GEMM against the double reference on every SIMD path this CPU runs.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "engine/gemm/gemm.hpp"
#include "kvhead/config.hpp"
#include "tests/reference/gemm_reference.hpp"

namespace {

using kvhead::simd_path;
using namespace kvhead::engine;

struct gemm_case {
  std::size_t m, n, k;
  bool trans_a, trans_b;
  std::size_t pad_a, pad_b, pad_c;  // extra columns beyond the row length
  float alpha, beta;
};

struct operands {
  std::vector<float> a, b, c;
  std::size_t lda, ldb, ldc;
};

operands make_operands(const gemm_case& test, std::mt19937& generator) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  operands result;
  const std::size_t a_rows = test.trans_a ? test.k : test.m, a_cols = test.trans_a ? test.m : test.k;
  const std::size_t b_rows = test.trans_b ? test.n : test.k, b_cols = test.trans_b ? test.k : test.n;
  result.lda = a_cols + test.pad_a;
  result.ldb = b_cols + test.pad_b;
  result.ldc = test.n + test.pad_c;
  result.a.resize(a_rows * result.lda);
  result.b.resize(b_rows * result.ldb);
  result.c.resize(test.m * result.ldc);
  for (float& x : result.a) x = uniform(generator);
  for (float& x : result.b) x = uniform(generator);
  // beta == 0 must overwrite: poison the old C so a leak shows as NaN.
  for (float& x : result.c) x = test.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : uniform(generator);
  return result;
}

// |C - ref| <= (2k + 4) u (|alpha| sum|a||b| + |beta c|): k roundings in the
// sum (2 per step without FMA), one for alpha, one for beta*c, one for the
// add, one per extra KC block (< k). Written so NaN fails.
bool within_bound(float value, double reference, double magnitude, std::size_t k) {
  constexpr double unit_roundoff = std::numeric_limits<float>::epsilon() / 2;
  const double bound = (2.0 * double(k) + 4.0) * unit_roundoff * magnitude + 1e-30;
  return std::fabs(double(value) - reference) <= bound;
}

void check_case(const gemm_case& test, simd_path path, std::mt19937& generator) {
  operands data = make_operands(test, generator);
  const std::vector<float> old_c = data.c;
  const auto reference =
      kvhead::reference::gemm(test.m, test.n, test.k, test.alpha, data.a.data(), data.lda, test.trans_a, data.b.data(),
                              data.ldb, test.trans_b, test.beta, old_c.data(), data.ldc);
  gemm({test.m, test.n, test.k}, test.alpha, {data.a.data(), data.lda, test.trans_a ? transpose::yes : transpose::no},
       {data.b.data(), data.ldb, test.trans_b ? transpose::yes : transpose::no}, test.beta, data.c.data(), data.ldc,
       path);
  std::size_t failures = 0;
  for (std::size_t i = 0; i < test.m; ++i) {
    for (std::size_t j = 0; j < data.ldc; ++j) {
      const float value = data.c[i * data.ldc + j];
      if (j >= test.n) {  // padding columns of C stay untouched (bitwise)
        if (std::memcmp(&value, &old_c[i * data.ldc + j], sizeof value) != 0) ++failures;
        continue;
      }
      if (!within_bound(value, reference.value[i * test.n + j], reference.magnitude[i * test.n + j], test.k))
        ++failures;
    }
  }
  INFO("path " << std::string(kvhead::to_string(path)) << " m=" << test.m << " n=" << test.n << " k=" << test.k
               << " transA=" << test.trans_a << " transB=" << test.trans_b << " pads=" << test.pad_a << ","
               << test.pad_b << "," << test.pad_c << " alpha=" << test.alpha << " beta=" << test.beta);
  CHECK(failures == 0);
}

// Awkward sizes for one path: 1..5, primes to ~300, and MR, NR, KC, MC +-1.
std::vector<std::size_t> awkward_sizes(const gemm_config& config) {
  std::set<std::size_t> sizes = {1, 2, 3, 4, 5, 7, 13, 31, 37, 61, 97, 127, 131, 257, 293};
  for (std::size_t block : {config.mr, config.nr, config.kc, config.mc})
    for (std::size_t size : {block - 1, block, block + 1}) sizes.insert(size);
  return {sizes.begin(), sizes.end()};
}

}  // namespace

TEST_CASE("gemm matches the double reference over awkward shapes, on every SIMD path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    const gemm_config config = gemm_config_for(path);
    const std::vector<std::size_t> sizes = awkward_sizes(config);
    std::mt19937 generator(20261129);
    auto pick = [&](const auto& list) { return list[generator() % list.size()]; };
    const std::vector<float> alphas = {1.0f, -0.5f, 2.5f};
    const std::vector<float> betas = {0.0f, 1.0f, 0.75f};
    for (int sample = 0; sample < 160; ++sample) {
      gemm_case test{pick(sizes),     pick(sizes),     pick(sizes),     bool(generator() & 1), bool(generator() & 1),
                     generator() % 3, generator() % 3, generator() % 3, pick(alphas),          pick(betas)};
      if (test.m * test.n * test.k > 6'000'000) test.k = 1 + test.k % 61;  // keep the reference fast
      check_case(test, path, generator);
    }
    // Every transpose combination and a deep k (several KC blocks) at least once.
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        check_case({config.mr + 1, config.nr + 3, 2 * config.kc + 5, trans_a, trans_b, 1, 2, 3, 1.5f, 0.5f}, path,
                   generator);
  }
}

TEST_CASE("gemm edge semantics: empty shapes, k = 0, beta = 0 overwrites NaN") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::vector<float> a(12, 1.0f), b(12, 1.0f);
    std::vector<float> c(12, 3.0f);
    // m = 0 and n = 0: nothing touched.
    gemm({0, 4, 3}, 1.0f, {a.data(), 3, transpose::no}, {b.data(), 4, transpose::no}, 0.0f, c.data(), 4, path);
    gemm({3, 0, 4}, 1.0f, {a.data(), 4, transpose::no}, {b.data(), 1, transpose::no}, 0.0f, c.data(), 1, path);
    for (float x : c) CHECK(x == 3.0f);
    // k = 0: C = beta * C, and beta = 0 gives exact zeros even over NaN.
    gemm({3, 4, 0}, 1.0f, {a.data(), 1, transpose::no}, {b.data(), 4, transpose::no}, 0.5f, c.data(), 4, path);
    for (float x : c) CHECK(x == 1.5f);
    c.assign(12, std::numeric_limits<float>::quiet_NaN());
    gemm({3, 4, 0}, 1.0f, {a.data(), 1, transpose::no}, {b.data(), 4, transpose::no}, 0.0f, c.data(), 4, path);
    for (float x : c) CHECK(x == 0.0f);
    c.assign(12, std::numeric_limits<float>::infinity());
    gemm({3, 4, 3}, 1.0f, {a.data(), 3, transpose::no}, {b.data(), 4, transpose::no}, 0.0f, c.data(), 4, path);
    for (float x : c) CHECK(x == 3.0f);
  }
}

TEST_CASE("gemm rejects bad arguments with a message naming them") {
  std::vector<float> a(12), b(12), c(12);
  CHECK_THROWS_WITH_AS(
      gemm({3, 4, 4}, 1.0f, {a.data(), 3, transpose::no}, {b.data(), 4, transpose::no}, 0.0f, c.data(), 4),
      doctest::Contains("leading dimension of A"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      gemm({3, 4, 3}, 1.0f, {a.data(), 3, transpose::no}, {b.data(), 2, transpose::yes}, 0.0f, c.data(), 4),
      doctest::Contains("leading dimension of B"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      gemm({3, 4, 3}, 1.0f, {a.data(), 3, transpose::no}, {b.data(), 4, transpose::no}, 0.0f, c.data(), 3),
      doctest::Contains("ldc"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      gemm({3, 4, 3}, 1.0f, {nullptr, 3, transpose::no}, {b.data(), 4, transpose::no}, 0.0f, c.data(), 4),
      doctest::Contains("A is null"), std::invalid_argument);
}

TEST_CASE("gemm determinism: a row of C is bit-identical for any m, thread count, or pre-packed B") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    const gemm_config config = gemm_config_for(path);
    const std::size_t m = 2 * config.mc + 7, n = config.nc + 2 * config.nr + 5, k = 2 * config.kc + 3;
    std::mt19937 generator(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> a(m * k), b(k * n);
    for (float& x : a) x = uniform(generator);
    for (float& x : b) x = uniform(generator);
    const gemm_operand b_op{b.data(), n, transpose::no};

    auto run = [&](std::size_t rows, const float* a_rows, int threads) {
      std::vector<float> c(rows * n);
      tbb::task_arena arena(threads);
      arena.execute([&] { gemm({rows, n, k}, 1.0f, {a_rows, k, transpose::no}, b_op, 0.0f, c.data(), n, path); });
      return c;
    };
    const std::vector<float> full = run(m, a.data(), 1);
    CHECK(run(m, a.data(), 2) == full);
    CHECK(run(m, a.data(), 3) == full);
    for (std::size_t row : {std::size_t{0}, config.mr + 1, m - 1}) {
      const std::vector<float> single = run(1, a.data() + row * k, 2);
      CHECK(std::memcmp(single.data(), full.data() + row * n, n * sizeof(float)) == 0);
    }
    const packed_b packed(k, n, b_op, path);
    std::vector<float> c(m * n);
    gemm({m, n, k}, 1.0f, {a.data(), k, transpose::no}, packed.view(), 0.0f, c.data(), n);
    CHECK(c == full);
    // One or two rows over the packed B run wide tiles (several B panels per
    // kernel call): the same bits as the rows of the full product.
    for (std::size_t rows : {std::size_t{1}, std::size_t{2}})
      for (std::size_t row : {std::size_t{0}, config.mr + 1, m - rows}) {
        std::vector<float> some(rows * n);
        gemm({rows, n, k}, 1.0f, {a.data() + row * k, k, transpose::no}, packed.view(), 0.0f, some.data(), n);
        CHECK(std::memcmp(some.data(), full.data() + row * n, some.size() * sizeof(float)) == 0);
      }
    // A leading block of the packed B equals the GEMM over that block unpacked.
    for (gemm_shape block :
         {gemm_shape{m, n - 7, k - 5}, gemm_shape{9, config.nr + 1, config.kc + 1}, gemm_shape{3, 1, 1}}) {
      std::vector<float> from_packed(block.m * block.n), unpacked(block.m * block.n);
      gemm(block, 1.0f, {a.data(), k, transpose::no}, packed.view(), 0.0f, from_packed.data(), block.n);
      gemm(block, 1.0f, {a.data(), k, transpose::no}, b_op, 0.0f, unpacked.data(), block.n, path);
      CHECK(std::memcmp(from_packed.data(), unpacked.data(), unpacked.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("gemm determinism: more A blocks than the tasks wanted (their count a multiple of the threads), same bits") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    const gemm_config config = gemm_config_for(path);
    // 8 MC blocks of rows and a few: 9 blocks at 1 thread; at 2 threads (8
    // tasks wanted) the driver rounds the 9 up to 10, at 3 (12 wanted) cuts
    // 12: each a different split of rows, never of a sum.
    const std::size_t m = 8 * config.mc + 7, n = 2 * config.nr + 3, k = config.kc + 3;
    std::mt19937 generator(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> a(m * k), b(k * n);
    for (float& x : a) x = uniform(generator);
    for (float& x : b) x = uniform(generator);
    auto run = [&](int threads) {
      std::vector<float> c(m * n);
      tbb::task_arena arena(threads);
      arena.execute([&] {
        gemm({m, n, k}, 1.0f, {a.data(), k, transpose::no}, {b.data(), n, transpose::no}, 0.0f, c.data(), n, path);
      });
      return c;
    };
    const std::vector<float> one_thread = run(1);
    CHECK(run(2) == one_thread);
    CHECK(run(3) == one_thread);
    // And right, against the double reference, on 2 threads.
    tbb::task_arena two_threads(2);
    two_threads.execute([&] { check_case({m, n, k, false, false, 0, 0, 0, 1.0f, 0.0f}, path, generator); });
  }
}

TEST_CASE("gemm: few rows over a B that is packed (transposed, or rows 256 bytes apart) split by columns per thread: "
          "the bits of the rows of a tall product") {
  // Up to 48 rows, a B that cannot be read in place is packed by column
  // chunks, one per task, on several threads (untransposed, as the first A
  // panel's calls read it, the later A panels reading the copy); a tall A
  // (more than 48 rows) takes the shared block packed beforehand. Both must
  // give every element the same bits, over two KC blocks (the packed copy of
  // the first block overwritten by the second's), whatever the number of A
  // panels.
  for (simd_path path : kvhead::supported_simd_paths()) {
    const gemm_config config = gemm_config_for(path);
    const std::size_t tall = 53, k = 2 * config.kc + 3;
    std::mt19937 generator(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (const std::size_t n : {std::size_t{2}, config.nr + 1, 9 * config.nr + 7})
      for (const transpose trans : {transpose::no, transpose::yes}) {
        CAPTURE(n);
        // Untransposed rows 64 floats (256 bytes) apart at least: packed.
        const std::size_t ld = trans == transpose::no ? (n + 63) / 64 * 64 : k + 1;
        std::vector<float> a(tall * k), b(trans == transpose::no ? k * ld : n * ld);
        for (float& x : a) x = uniform(generator);
        for (float& x : b) x = uniform(generator);
        auto run = [&](std::size_t row0, std::size_t rows, int threads) {
          std::vector<float> c(rows * n);
          tbb::task_arena arena(threads);
          arena.execute([&] {
            gemm({rows, n, k}, 1.0f, {a.data() + row0 * k, k, transpose::no}, {b.data(), ld, trans}, 0.0f, c.data(),
                 n, path);
          });
          return c;
        };
        const std::vector<float> full = run(0, tall, 1);
        for (const std::size_t rows : {std::size_t{5}, config.mr + 1, 2 * config.mr + 5, std::size_t{48}})
          for (const int threads : {1, 2, 3}) {
            CAPTURE(rows);
            CAPTURE(threads);
            const std::vector<float> some = run(3, rows, threads);
            CHECK(std::memcmp(some.data(), full.data() + 3 * n, some.size() * sizeof(float)) == 0);
          }
      }
  }
}

TEST_CASE("gemm: A read in place or packed gives the same bits (kernel_config_row::a_in_place_panels)") {
  // Every path, whatever this CPU's row says: A packed unless one panel,
  // against A read in place for every shape; M over several panels with the
  // split remainder (engine/gemm/gemm.cpp), A rows padded, k over two KC
  // blocks, 1 and 2 threads.
  for (simd_path path : kvhead::supported_simd_paths()) {
    CAPTURE(to_string(path));
    gemm_config packed = gemm_config_for(path), in_place = packed;
    packed.a_in_place_panels = 0;
    in_place.a_in_place_panels = std::size_t(-1);
    std::mt19937 generator(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const std::size_t mr = packed.mr, nr = packed.nr, kc = packed.kc;
    for (const gemm_shape shape : {gemm_shape{2 * mr + 1, 3 * nr + 5, 2 * kc + 3}, gemm_shape{10 * mr, 8 * nr, 128},
                                   gemm_shape{5 * mr + mr / 2 + 1, nr - 1, 7}, gemm_shape{mr + 1, 1, kc}}) {
      CAPTURE(shape.m);
      CAPTURE(shape.n);
      CAPTURE(shape.k);
      const std::size_t lda = shape.k + 5;
      std::vector<float> a(shape.m * lda), b(shape.k * shape.n);
      for (float& x : a) x = uniform(generator);
      for (float& x : b) x = uniform(generator);
      auto run = [&](const gemm_config& config, int threads) {
        std::vector<float> c(shape.m * shape.n);
        tbb::task_arena arena(threads);
        arena.execute([&] {
          gemm(shape, 0.75f, {a.data(), lda, transpose::no}, {b.data(), shape.n, transpose::no}, 0.0f, c.data(),
               shape.n, config);
        });
        return c;
      };
      const std::vector<float> reference = run(packed, 1);
      CHECK(run(in_place, 1) == reference);
      CHECK(run(in_place, 2) == reference);
      CHECK(run(packed, 2) == reference);
    }
  }
}

TEST_CASE("pack_b_offset addresses the packed layout of packed_b, every path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    const gemm_config config = gemm_config_for(path);
    for (gemm_shape shape : {gemm_shape{0, 37, 5}, gemm_shape{0, config.nr, config.kc + 3}, gemm_shape{0, 1, 1}}) {
      std::vector<float> b(shape.k * shape.n);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(i + 1);
      const packed_b packed(shape.k, shape.n, {b.data(), shape.n, transpose::no}, path);
      for (std::size_t row = 0; row < shape.k; ++row)
        for (std::size_t col = 0; col < shape.n; ++col)
          CHECK(static_cast<const float*>(packed.view().panels)[pack_b_offset(config, shape.k, shape.n, row, col)] ==
                b[row * shape.n + col]);
    }
  }
}

namespace {

std::vector<float> seeded_floats(std::size_t count, unsigned seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `product` (writing `got`) run at 1 thread (a task of every A panel) and at
// 2 (a few per task), each time from NaN, gives `expected`'s bits.
template <class Product>
void same_at_1_and_2_threads(const std::vector<float>& expected, std::vector<float>& got, const Product& product) {
  for (const int threads : {1, 2}) {
    CAPTURE(threads);
    std::fill(got.begin(), got.end(), std::numeric_limits<float>::quiet_NaN());
    tbb::task_arena(threads).execute(product);
    CHECK(same_floats(got, expected));
  }
}

}  // namespace

TEST_CASE("gemm over a paged B: the bits of one packed B, pages along n or along k, every path") {
  for (simd_path path : kvhead::supported_simd_paths())
    for (const std::size_t page : {std::size_t{16}, std::size_t{32}, std::size_t{64}})
      for (const std::size_t pages : {std::size_t{1}, std::size_t{3}, std::size_t{4}})
        // m 61: at 1 thread more A panels than the driver's loops for a few
        // of them take (gemm.cpp, lean_a_panels) at MR 6; at 2, a few per task.
        for (const std::size_t m : {std::size_t{1}, std::size_t{4}, std::size_t{7}, std::size_t{13}, std::size_t{61}})
          for (const std::size_t other : {std::size_t{1}, std::size_t{17}, std::size_t{40}, std::size_t{300}}) {
            CAPTURE(std::string(kvhead::to_string(path)));
            CAPTURE(page);
            CAPTURE(pages);
            CAPTURE(m);
            CAPTURE(other);
            const std::size_t paged = page * pages;
            // Along n: B is k x (pages * page), k = other (several KC blocks at 300).
            {
              const std::size_t k = other, n = paged, used_n = n - page / 2;
              const std::vector<float> a = seeded_floats(m * k, 1), b = seeded_floats(k * n, 2);
              const packed_b whole(k, n, {b.data(), n, transpose::no}, path);
              std::vector<packed_b> parts;
              std::vector<const void*> addresses;
              for (std::size_t p = 0; p < pages; ++p) {
                parts.emplace_back(k, page, gemm_operand{b.data() + p * page, n, transpose::no}, path);
                addresses.push_back(parts.back().view().panels);
              }
              std::vector<float> expected(m * used_n), got(m * used_n);
              gemm({m, used_n, k}, 0.5f, {a.data(), k, transpose::no}, whole.view(), 0.0f, expected.data(), used_n);
              same_at_1_and_2_threads(expected, got, [&] {
                gemm({m, used_n, k}, 0.5f, {a.data(), k, transpose::no},
                     paged_b_view{addresses.data(), page, false, k, n, path}, 0.0f, got.data(), used_n);
              });
            }
            // Along k: B is (pages * page) x n, n = other, depth up to KC.
            if (paged <= 256) {
              const std::size_t k = paged, n = other, used_k = k - page / 2;
              const std::vector<float> a = seeded_floats(m * k, 3), b = seeded_floats(k * n, 4);
              const packed_b whole(k, n, {b.data(), n, transpose::no}, path);
              std::vector<packed_b> parts;
              std::vector<const void*> addresses;
              for (std::size_t p = 0; p < pages; ++p) {
                parts.emplace_back(page, n, gemm_operand{b.data() + p * page * n, n, transpose::no}, path);
                addresses.push_back(parts.back().view().panels);
              }
              std::vector<float> expected(m * n), got(m * n);
              gemm({m, n, used_k}, 1.0f, {a.data(), k, transpose::no}, whole.view(), 0.0f, expected.data(), n);
              same_at_1_and_2_threads(expected, got, [&] {
                gemm({m, n, used_k}, 1.0f, {a.data(), k, transpose::no},
                     paged_b_view{addresses.data(), page, true, k, n, path}, 0.0f, got.data(), n);
              });
            }
          }
  const float a = 1.0f, b = 1.0f;
  const void* page = &b;
  float c = 0.0f;
  CHECK_THROWS_WITH_AS(gemm({1, 1, 1}, 2.0f, {&a, 1, transpose::no},
                            paged_b_view{&page, 1, true, 1, 1, kvhead::active_simd_path()}, 0.0f, &c, 1),
                       doctest::Contains("alpha 1 and beta 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      gemm({1, 1, 1}, 1.0f, {&a, 1, transpose::no},
           paged_b_view{&page, 1, true, 1, 1, kvhead::active_simd_path(), kvhead::kv_dtype::f32, 1}, 0.0f, &c, 1),
      doctest::Contains("narrow pages need to be column pages"), std::invalid_argument);
}

TEST_CASE("gemm over bf16 pages along k: the bits of the same values in f32 pages, every path") {
  // bf16 rows widen into the kernels' own lane order (even and odd columns
  // on avx2 and avx512), which C keeps from page to page (microkernel.hpp,
  // c_to_lanes); f32 rows are in memory order. The values are bf16's (an
  // f32 with its low 16 bits cleared), so both read the same numbers.
  for (simd_path path : kvhead::supported_simd_paths()) {
    const std::size_t nr = gemm_config_for(path).nr;
    for (const std::size_t page : {std::size_t{16}, std::size_t{32}})
      for (const std::size_t pages : {std::size_t{3}, std::size_t{4}})
        // m 61: more A panels than the driver's loops for a few of them take (lean_a_panels).
        for (const std::size_t m : {std::size_t{4}, std::size_t{13}, std::size_t{61}})
          for (const std::size_t n : {std::size_t{17}, std::size_t{40}, std::size_t{300}}) {
            CAPTURE(std::string(kvhead::to_string(path)));
            CAPTURE(page);
            CAPTURE(pages);
            CAPTURE(m);
            CAPTURE(n);
            const std::size_t k = page * pages, used_k = k - page / 2, panels = (n + nr - 1) / nr;
            std::vector<float> b = seeded_floats(k * n, 5);
            for (float& value : b) value = std::bit_cast<float>(std::bit_cast<std::uint32_t>(value) & 0xffff0000u);
            const std::vector<float> a = seeded_floats(m * k, 6);
            std::vector<packed_b> f32_parts;
            std::vector<std::vector<bf16_bits>> bf16_parts;
            std::vector<const void*> f32_pages, bf16_pages;
            for (std::size_t p = 0; p < pages; ++p) {
              f32_parts.emplace_back(page, n, gemm_operand{b.data() + p * page * n, n, transpose::no}, path);
              f32_pages.push_back(f32_parts.back().view().panels);
              // The packed layout of one KC block: panel, then row, then lane; columns past n zero.
              std::vector<bf16_bits> part(panels * page * nr, bf16_bits{0});
              for (std::size_t row = 0; row < page; ++row)
                for (std::size_t col = 0; col < n; ++col)
                  part[col / nr * page * nr + row * nr + col % nr].bits =
                      std::uint16_t(std::bit_cast<std::uint32_t>(b[(p * page + row) * n + col]) >> 16);
              bf16_parts.push_back(std::move(part));
              bf16_pages.push_back(bf16_parts.back().data());
            }
            std::vector<float> expected(m * n), got(m * n);
            const gemm_operand a_rows{a.data(), k, transpose::no};
            gemm({m, n, used_k}, 1.0f, a_rows, paged_b_view{f32_pages.data(), page, true, k, n, path}, 0.0f,
                 expected.data(), n);
            same_at_1_and_2_threads(expected, got, [&] {
              gemm({m, n, used_k}, 1.0f, a_rows,
                   paged_b_view{bf16_pages.data(), page, true, k, n, path, kvhead::kv_dtype::bf16}, 0.0f, got.data(),
                   n);
            });
          }
  }
}

// A KV cache's 16-key blocks on a path whose panels are wider: each page one
// narrow panel of row stride 16, its last row followed by NaN the kernel
// reads into columns it never uses.
TEST_CASE("gemm over narrow column pages (one 16-wide panel each): the bits of one packed B") {
  constexpr std::size_t page = 16;
  for (simd_path path : kvhead::supported_simd_paths()) {
    const std::size_t nr = kvhead::engine::gemm_config_for(path).nr;
    if (nr <= page) continue;  // 16 columns are whole panels there
    for (const std::size_t pages : {std::size_t{1}, std::size_t{5}})
      for (const std::size_t m : {std::size_t{1}, std::size_t{4}, std::size_t{13}})
        for (const std::size_t k : {std::size_t{1}, std::size_t{17}, std::size_t{300}}) {
          CAPTURE(std::string(kvhead::to_string(path)));
          CAPTURE(pages);
          CAPTURE(m);
          CAPTURE(k);
          const std::size_t n = page * pages, used_n = n - 3;
          const std::vector<float> a = seeded_floats(m * k, 5), b = seeded_floats(k * n, 6);
          const packed_b whole(k, n, {b.data(), n, transpose::no}, path);
          std::vector<std::vector<float>> parts;
          parts.reserve(pages);  // the addresses stay valid
          std::vector<const void*> addresses;
          for (std::size_t p = 0; p < pages; ++p) {
            std::vector<float> part((k + 1) * page + nr, std::numeric_limits<float>::quiet_NaN());
            for (std::size_t row = 0; row < k; ++row)
              std::copy(b.begin() + std::ptrdiff_t(row * n + p * page),
                        b.begin() + std::ptrdiff_t(row * n + p * page + page),
                        part.begin() + std::ptrdiff_t(row * page));
            parts.push_back(std::move(part));
            addresses.push_back(parts.back().data());
          }
          std::vector<float> expected(m * used_n), got(m * used_n);
          gemm({m, used_n, k}, 0.5f, {a.data(), k, transpose::no}, whole.view(), 0.0f, expected.data(), used_n);
          gemm({m, used_n, k}, 0.5f, {a.data(), k, transpose::no},
               paged_b_view{addresses.data(), page, false, k, n, path, kvhead::kv_dtype::f32, page}, 0.0f, got.data(),
               used_n);
          CHECK(same_floats(got, expected));
        }
  }
}
