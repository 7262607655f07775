// bf16 products over a paged B (gemm_bf16_paged, engine/gemm/gemm_bf16.hpp):
// the driver and layouts through the scalar emulation on any CPU, the
// avx512bf16 kernels where they run (else visibly skipped), against the
// double reference on bf16-rounded inputs and bit for bit against each other.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/gemm/bf16_emulation.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "kvhead/config.hpp"
#include "tests/reference/gemm_reference.hpp"
#include "tests/reference/kv_dtype_reference.hpp"

namespace {

using kvhead::kv_dtype;
using kvhead::simd_path;
using namespace kvhead::engine;

// The layout the paged kernels read: the avx512 path's (NR 32).
constexpr simd_path layout_path = simd_path::avx512;

// B's values: N(0, 1) rounded to bf16 (attention's k, v and p are), stored
// as `dtype`; `exact` holds what the stored element decodes to.
struct stored_matrix {
  std::vector<float> exact;  // k x n, row-major
  std::vector<std::uint16_t> bits;
};

stored_matrix draw_b(std::size_t k, std::size_t n, kv_dtype dtype, std::mt19937& generator) {
  namespace ref = kvhead::reference;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  stored_matrix b{std::vector<float>(k * n), std::vector<std::uint16_t>(k * n)};
  for (std::size_t i = 0; i < k * n; ++i) {
    const float value = float(ref::bf16_value(ref::round_to_bf16(normal(generator))));
    b.bits[i] = dtype == kv_dtype::f16 ? ref::round_to_f16(value) : ref::round_to_bf16(value);
    b.exact[i] = dtype == kv_dtype::f16 ? float(ref::f16_value(b.bits[i])) : value;
  }
  return b;
}

// B cut into pages, each packed in the layout of paged_b_view (gemm.hpp):
// `page` rows x n (along k) or k x `page` columns (narrow: one panel of row
// stride `page`, for pages of fewer than 32 columns), every page a buffer of
// its own with NaN between the elements the layout uses and in the rows and
// columns past B's edge, so a read outside B shows.
struct paged_matrix {
  std::vector<std::vector<std::uint32_t>> storage;  // whole 32-bit words
  std::vector<const void*> pages;
  paged_b_view view;
};

paged_matrix page_b(const stored_matrix& b, std::size_t k, std::size_t n, std::size_t page, bool along_k,
                    kv_dtype dtype, bool narrow = false) {
  const gemm_config config = gemm_config_for(layout_path);
  const std::size_t page_k = along_k ? page : k, page_n = along_k ? n : page;
  const std::size_t count = along_k ? (k + page - 1) / page : (n + page - 1) / page;
  const std::size_t bytes = dtype == kv_dtype::f32 ? 4 : 2;
  const std::size_t elements = narrow ? page_k * page_n : packed_b_floats(config, page_k, page_n);
  paged_matrix paged;
  for (std::size_t p = 0; p < count; ++p) {
    std::vector<std::uint32_t> words((elements * bytes + 3) / 4, 0x7fc07fc0u);  // NaN as f32, bf16 and f16
    for (std::size_t row = 0; row < page_k; ++row)
      for (std::size_t col = 0; col < page_n; ++col) {
        const std::size_t global_row = along_k ? p * page + row : row, global_col = along_k ? col : p * page + col;
        const std::size_t at = narrow ? row * page_n + col : pack_b_offset(config, page_k, page_n, row, col);
        auto* target = reinterpret_cast<unsigned char*>(words.data()) + at * bytes;
        if (global_row >= k || global_col >= n) continue;  // past B's edge: stays NaN, never read
        const std::size_t index = global_row * n + global_col;
        if (dtype == kv_dtype::f32)
          std::memcpy(target, &b.exact[index], 4);
        else
          std::memcpy(target, &b.bits[index], 2);
      }
    paged.storage.push_back(std::move(words));
  }
  for (const auto& words : paged.storage) paged.pages.push_back(words.data());
  paged.view = {paged.pages.data(), page, along_k, k, n, layout_path, dtype, narrow ? page : 0};
  return paged;
}

// The kernels to run: each unit's emulation everywhere, its hardware where
// it runs (the bits of one unit alike; the two units sum in other orders).
struct kernel_case {
  const bf16_paged_kernels* kernels;
  const char* name;
  bf16_unit unit;
};
std::vector<kernel_case> kernels_to_test() {
  std::vector<kernel_case> cases{
      {&emulated_bf16_paged_kernels(bf16_unit::avx512bf16), "emulated avx512bf16", bf16_unit::avx512bf16},
      {&emulated_bf16_paged_kernels(bf16_unit::amx), "emulated amx", bf16_unit::amx}};
  if (bf16_unit_runs_here(bf16_unit::avx512bf16))
    cases.push_back({&avx512bf16_paged_kernels(), "avx512bf16", bf16_unit::avx512bf16});
  if (bf16_unit_runs_here(bf16_unit::amx)) cases.push_back({&amx_paged_kernels(), "amx", bf16_unit::amx});
  return cases;
}

// The first result of each unit, which later kernel sets of the unit match.
struct unit_results {
  std::vector<float> of[2];
  std::vector<float>& operator[](bf16_unit unit) { return of[unit == bf16_unit::amx]; }
};

// |C - ref| <= (2k + 6) u |alpha| sum|a||b|: the products of bf16 values are
// exact in fp32, each of the k sums rounds once (2 per pair bound for
// safety, as for gemm_bf16), alpha's product once more. Subnormals flushed
// add at most 2^-126 per step, far below it for N(0, 1) inputs.
bool within_bound(float value, double reference, double magnitude, std::size_t k) {
  constexpr double unit_roundoff = std::numeric_limits<float>::epsilon() / 2;
  return std::fabs(double(value) - reference) <= (2.0 * double(k) + 6.0) * unit_roundoff * magnitude + 1e-30;
}

struct paged_case {
  std::size_t m, n, k, page;
  bool along_k;
  kv_dtype dtype;
  float alpha;
};

// Runs one case through every kernel set: within the bound of the reference
// on the rounded inputs, bit-identical between kernel sets, and a single
// row alone gives that row's bits.
void check_case(const paged_case& test, std::mt19937& generator) {
  namespace ref = kvhead::reference;
  CAPTURE(test.m);
  CAPTURE(test.n);
  CAPTURE(test.k);
  CAPTURE(test.page);
  CAPTURE(test.along_k);
  CAPTURE(std::string(kvhead::to_string(test.dtype)));
  const std::size_t lda = test.k + 3;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(test.m * lda), a_rounded(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = normal(generator);
    a_rounded[i] = float(ref::bf16_value(ref::round_to_bf16(a[i])));
  }
  const stored_matrix b = draw_b(test.k, test.n, test.dtype, generator);
  const paged_matrix paged = page_b(b, test.k, test.n, test.page, test.along_k, test.dtype);
  const auto reference = ref::gemm(test.m, test.n, test.k, test.alpha, a_rounded.data(), lda, false, b.exact.data(),
                                   test.n, false, 0.0, nullptr, 0);
  const std::size_t ldc = test.n + 2;
  unit_results first;
  for (const kernel_case& kernels : kernels_to_test()) {
    CAPTURE(kernels.name);
    std::vector<float> c(test.m * ldc, std::numeric_limits<float>::quiet_NaN());
    gemm_bf16_paged_with(*kernels.kernels, {test.m, test.n, test.k}, test.alpha, {a.data(), lda, transpose::no},
                         paged.view, c.data(), ldc);
    std::size_t failures = 0, padding_written = 0;
    for (std::size_t i = 0; i < test.m; ++i)
      for (std::size_t j = 0; j < ldc; ++j) {
        const float value = c[i * ldc + j];
        if (j >= test.n)
          padding_written += !std::isnan(value);
        else
          failures +=
              !within_bound(value, reference.value[i * test.n + j], reference.magnitude[i * test.n + j], test.k);
      }
    CHECK(failures == 0);
    CHECK(padding_written == 0);
    if (first[kernels.unit].empty())
      first[kernels.unit] = c;
    else
      CHECK(std::memcmp(first[kernels.unit].data(), c.data(), c.size() * sizeof(float)) == 0);  // hardware = emulation
    const std::size_t row = test.m / 2;
    std::vector<float> alone(test.n);
    gemm_bf16_paged_with(*kernels.kernels, {1, test.n, test.k}, test.alpha, {a.data() + row * lda, lda, transpose::no},
                         paged.view, alone.data(), test.n);
    CHECK(std::memcmp(alone.data(), c.data() + row * ldc, test.n * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("gemm_bf16_paged: against the double reference over awkward shapes and pages, emulated and on hardware") {
  for (const bf16_unit unit : {bf16_unit::avx512bf16, bf16_unit::amx})
    if (!bf16_unit_runs_here(unit))
      MESSAGE(to_string(unit) << " paged kernels not run (only their emulation): " << bf16_unit_refusal(unit));
  std::mt19937 generator(20261202);
  const std::size_t rows[] = {1, 2, 3, 4, 11, 12, 13, 25, 120};
  const std::size_t cols[] = {1, 7, 16, 31, 32, 33, 97, 128};
  const std::size_t depths[] = {1, 2, 3, 17, 64, 127, 128, 255, 256};
  const std::size_t pages[] = {16, 32, 64, 256};
  const kv_dtype dtypes[] = {kv_dtype::f32, kv_dtype::bf16, kv_dtype::f16};
  auto pick = [&](const auto& list) { return list[generator() % std::size(list)]; };
  for (int sample = 0; sample < 60; ++sample) {
    const bool along_k = sample % 2 == 0;
    paged_case test{
        pick(rows), pick(cols), pick(depths), pick(pages), along_k, pick(dtypes), sample % 3 == 0 ? 0.3f : 1.0f};
    if (test.m * test.n * test.k > 400'000) test.m = 1 + test.m % 13;  // the emulation and the reference stay fast
    check_case(test, generator);
  }
  // A single page along k holding an odd depth (a chunk's last keys), and
  // the attention shapes themselves.
  check_case({12, 128, 255, 255, true, kv_dtype::f32, 1.0f}, generator);
  check_case({30, 256, 128, 16, false, kv_dtype::bf16, 0.088f}, generator);
  check_case({30, 128, 256, 16, true, kv_dtype::f16, 1.0f}, generator);
}

TEST_CASE("gemm_bf16_paged: the same bits however B is cut into pages, narrow pages included") {
  std::mt19937 generator(7);
  const std::size_t m = 29, n = 100, k = 256;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(m * k);
  for (float& x : a) x = normal(generator);
  for (const kv_dtype dtype : {kv_dtype::f32, kv_dtype::bf16, kv_dtype::f16})
    for (const bool along_k : {true, false}) {
      CAPTURE(along_k);
      const stored_matrix b = draw_b(k, n, dtype, generator);
      for (const kernel_case& kernels : kernels_to_test()) {
        CAPTURE(kernels.name);
        std::vector<float> whole;
        for (const std::size_t page : {std::size_t{256}, std::size_t{64}, std::size_t{16}}) {
          const std::size_t page_size = along_k ? page : std::min(page, n);
          const paged_matrix paged = page_b(b, k, n, page_size, along_k, dtype);
          std::vector<float> c(m * n);
          gemm_bf16_paged_with(*kernels.kernels, {m, n, k}, 1.0f, {a.data(), k, transpose::no}, paged.view, c.data(),
                               n);
          if (whole.empty())
            whole = c;
          else
            CHECK(std::memcmp(whole.data(), c.data(), c.size() * sizeof(float)) == 0);
        }
        if (!along_k) {  // narrow pages: a KV cache's 16-key blocks
          const paged_matrix narrow = page_b(b, k, n, 16, false, dtype, true);
          std::vector<float> c(m * n);
          gemm_bf16_paged_with(*kernels.kernels, {m, n, k}, 1.0f, {a.data(), k, transpose::no}, narrow.view, c.data(),
                               n);
          CHECK(std::memcmp(whole.data(), c.data(), c.size() * sizeof(float)) == 0);
        }
      }
    }
}

TEST_CASE(
    "gemm_bf16_paged: B packed once in the amx tiles' layout (pack_tile_pairs) holds the tiles' pairs and gives the "
    "bits of B staged by each product") {
  namespace ref = kvhead::reference;
  std::vector<kernel_case> amx_kernels;
  for (const kernel_case& kernels : kernels_to_test())
    if (kernels.unit == bf16_unit::amx) amx_kernels.push_back(kernels);
  if (!bf16_unit_runs_here(bf16_unit::amx))
    MESSAGE("amx tile pairs run on the emulation only: " << bf16_unit_refusal(bf16_unit::amx));
  std::mt19937 generator(43);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct shape {
    std::size_t m, n, k, product_k;
    bool along_k;
  };
  for (const shape& test : {shape{1, 33, 80, 80, false}, shape{40, 70, 17, 17, false}, shape{5, 1, 255, 255, true},
                            shape{33, 128, 100, 61, true}, shape{3, 31, 128, 1, true}, shape{64, 64, 64, 64, true}}) {
    CAPTURE(test.m);
    CAPTURE(test.n);
    CAPTURE(test.k);
    CAPTURE(test.product_k);
    std::vector<float> b_values(test.k * test.n), a(test.m * test.product_k);
    for (float& x : b_values) x = normal(generator);  // not bf16 values: packing rounds them
    for (float& x : a) x = normal(generator);
    const packed_b fp32(test.k, test.n, {b_values.data(), test.n, transpose::no}, layout_path);
    const std::size_t depth = (test.k + 31) / 32 * 32, panel_elements = depth * 32;
    for (const kernel_case& kernels : amx_kernels) {
      CAPTURE(kernels.name);
      std::vector<bf16_bits> pairs(tile_pairs_elements(test.k, test.n), bf16_bits{0x7fc0});
      REQUIRE(pairs.size() == (test.n + 31) / 32 * panel_elements);
      pack_tile_pairs_with(*kernels.kernels, fp32.view(), pairs.data());
      std::size_t wrong = 0;
      for (std::size_t panel = 0; panel < (test.n + 31) / 32; ++panel)
        for (std::size_t row = 0; row < depth; ++row)
          for (std::size_t lane = 0; lane < 32; ++lane) {
            const std::size_t col = panel * 32 + lane;
            const std::uint16_t expected =
                row < test.k && col < test.n ? ref::round_to_bf16(b_values[row * test.n + col]) : 0;
            wrong += pairs[panel * panel_elements + (row / 2 * 32 + lane) * 2 + row % 2].bits != expected;
          }
      CHECK(wrong == 0);
      const void* staged_page[] = {fp32.view().panels};
      const void* packed_page[] = {pairs.data()};
      const std::size_t page = test.along_k ? test.k : test.n;
      const paged_b_view staged{staged_page, page, test.along_k, test.k, test.n, layout_path};
      const paged_b_view packed{
          packed_page, page, test.along_k, test.k, test.n, layout_path, kv_dtype::bf16, 0, panel_layout::tile_pairs};
      std::vector<float> expected(test.m * test.n), got(test.m * test.n, std::numeric_limits<float>::quiet_NaN());
      const gemm_operand a_rows{a.data(), test.product_k, transpose::no};
      gemm_bf16_paged_with(*kernels.kernels, {test.m, test.n, test.product_k}, 0.5f, a_rows, staged, expected.data(),
                           test.n);
      gemm_bf16_paged_with(*kernels.kernels, {test.m, test.n, test.product_k}, 0.5f, a_rows, packed, got.data(),
                           test.n);
      CHECK(std::memcmp(expected.data(), got.data(), got.size() * sizeof(float)) == 0);
    }
  }
  // Refused where the layout cannot be read, by name.
  std::vector<float> a(64, 1.0f), c(64);
  std::vector<bf16_bits> pairs(tile_pairs_elements(16, 4));
  const void* pages[] = {pairs.data()};
  const paged_b_view tile_pairs_b{pages, 16, true, 16, 4, layout_path, kv_dtype::bf16, 0, panel_layout::tile_pairs};
  const gemm_operand a_rows{a.data(), 16, transpose::no};
  CHECK_THROWS_WITH_AS(gemm_bf16_paged_with(emulated_bf16_paged_kernels(bf16_unit::avx512bf16), {2, 4, 16}, 1.0f,
                                            a_rows, tile_pairs_b, c.data(), 4),
                       doctest::Contains("pair layout needs the amx unit"), std::invalid_argument);
  paged_b_view two_pages = tile_pairs_b;
  two_pages.page = 8;
  CHECK_THROWS_WITH_AS(gemm_bf16_paged_with(emulated_bf16_paged_kernels(bf16_unit::amx), {2, 4, 16}, 1.0f, a_rows,
                                            two_pages, c.data(), 4),
                       doctest::Contains("in one page"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm({2, 4, 16}, 1.0f, a_rows, tile_pairs_b, 0.0f, c.data(), 4),
                       doctest::Contains("pair layout"), std::invalid_argument);
  const packed_b fp32(16, 4, {a.data(), 4, transpose::no}, simd_path::avx2);
  CHECK_THROWS_WITH_AS(
      pack_tile_pairs_with(emulated_bf16_paged_kernels(bf16_unit::avx512bf16), fp32.view(), pairs.data()),
      doctest::Contains("needs the amx unit"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pack_tile_pairs_with(emulated_bf16_paged_kernels(bf16_unit::amx), fp32.view(), pairs.data()),
                       doctest::Contains("f32 panels of 32 columns (NR 1"), std::invalid_argument);
  if (!gemm_bf16_paged_reads_tile_pairs())
    CHECK_THROWS_WITH_AS(
        pack_tile_pairs(packed_b(16, 4, {a.data(), 4, transpose::no}, layout_path).view(), pairs.data()),
        doctest::Contains("not amx"), std::invalid_argument);
}

TEST_CASE("gemm_bf16_paged: rows converted beforehand are read instead of A, with the bits of converting it there") {
  std::mt19937 generator(11);
  const std::size_t n = 70, k = 100;
  for (const std::size_t m : {std::size_t{3}, std::size_t{40}}) {  // amx: the FMA form and the tiles
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> a(m * k), other(m * k);
    for (float& x : a) x = normal(generator);
    for (float& x : other) x = normal(generator);
    const stored_matrix b = draw_b(k, n, kv_dtype::bf16, generator);
    for (const bool along_k : {false, true}) {
      const paged_matrix paged = page_b(b, k, n, along_k ? 32 : n, along_k, kv_dtype::bf16);
      for (const kernel_case& kernels : kernels_to_test()) {
        CAPTURE(m);
        CAPTURE(along_k);
        CAPTURE(kernels.name);
        std::vector<float> expected(m * n), c(m * n, std::numeric_limits<float>::quiet_NaN());
        gemm_bf16_paged_with(*kernels.kernels, {m, n, k}, 0.5f, {other.data(), k, transpose::no}, paged.view,
                             expected.data(), n);
        // other's rows, converted once, given with A = a: the product is other's.
        std::vector<float> storage(bf16_rows_floats_with(*kernels.kernels, m, k),
                                   std::numeric_limits<float>::quiet_NaN());
        const bf16_rows given =
            convert_rows_bf16_with(*kernels.kernels, {other.data(), k, transpose::no}, m, k, storage.data());
        for (int call = 0; call < 2; ++call) {  // read, never changed: the same for every product
          gemm_bf16_paged_with(*kernels.kernels, {m, n, k}, 0.5f, {a.data(), k, transpose::no}, paged.view, c.data(), n,
                               &given);
          CHECK(std::memcmp(expected.data(), c.data(), c.size() * sizeof(float)) == 0);
        }
        const bf16_rows wrong_depth{given.rows, m, k - 1, given.ld, given.held};
        CHECK_THROWS_WITH_AS(gemm_bf16_paged_with(*kernels.kernels, {m, n, k}, 0.5f, {a.data(), k, transpose::no},
                                                  paged.view, c.data(), n, &wrong_depth),
                             doctest::Contains("are not A's"), std::invalid_argument);
      }
    }
  }
  if (gemm_bf16_paged_runs(layout_path, kv_dtype::bf16)) {  // the active unit's layout, read back
    std::vector<float> a(5 * 33, 1.0f), storage(bf16_rows_floats(5, 33));
    const bf16_rows made = convert_rows_bf16({a.data(), 33, transpose::no}, 5, 33, storage.data());
    const bf16_rows again = bf16_rows_at(5, 33, storage.data());
    CHECK(again.rows == made.rows);
    CHECK(again.ld == made.ld);
    CHECK(again.held == made.held);
  }
}

TEST_CASE("gemm_bf16_paged: bad arguments named, never a wrong answer") {
  std::vector<float> a(64, 1.0f), c(64);
  std::vector<std::uint32_t> page(4096, 0);
  const void* pages[] = {page.data(), page.data()};
  const bf16_paged_kernels& kernels = emulated_bf16_paged_kernels();
  const paged_b_view int8_b{pages, 16, true, 16, 4, layout_path, kv_dtype::int8};
  CHECK_THROWS_WITH_AS(
      gemm_bf16_paged_with(kernels, {2, 4, 16}, 1.0f, {a.data(), 16, transpose::no}, int8_b, c.data(), 4),
      doctest::Contains("f32, bf16 or f16 B"), std::invalid_argument);
  const paged_b_view odd_pages{pages, 3, true, 6, 4, layout_path, kv_dtype::f32};
  CHECK_THROWS_WITH_AS(
      gemm_bf16_paged_with(kernels, {2, 4, 6}, 1.0f, {a.data(), 6, transpose::no}, odd_pages, c.data(), 4),
      doctest::Contains("even number of rows"), std::invalid_argument);
  const paged_b_view narrow_path{pages, 16, true, 16, 4, simd_path::avx2, kv_dtype::f32};
  CHECK_THROWS_WITH_AS(
      gemm_bf16_paged_with(kernels, {2, 4, 16}, 1.0f, {a.data(), 16, transpose::no}, narrow_path, c.data(), 4),
      doctest::Contains("NR 32"), std::invalid_argument);
  const paged_b_view narrow_along_k{pages, 16, true, 16, 4, layout_path, kv_dtype::f32, 16};
  CHECK_THROWS_WITH_AS(
      gemm_bf16_paged_with(kernels, {2, 4, 16}, 1.0f, {a.data(), 16, transpose::no}, narrow_along_k, c.data(), 4),
      doctest::Contains("narrow pages only along n"), std::invalid_argument);
  const paged_b_view fine{pages, 16, true, 16, 4, layout_path, kv_dtype::f32};
  CHECK_THROWS_WITH_AS(gemm_bf16_paged_with(kernels, {2, 4, 16}, 1.0f, {a.data(), 8, transpose::no}, fine, c.data(), 4),
                       doctest::Contains("leading dimension of A"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      gemm_bf16_paged_with(kernels, {2, 4, 16}, 1.0f, {a.data(), 16, transpose::yes}, fine, c.data(), 4),
      doctest::Contains("not transposed"), std::invalid_argument);
  if (!gemm_bf16_paged_runs(layout_path, kv_dtype::f32))
    CHECK_THROWS_WITH_AS(gemm_bf16_paged({2, 4, 16}, 1.0f, {a.data(), 16, transpose::no}, fine, c.data(), 4),
                         doctest::Contains("need avx512bf16"), std::invalid_argument);
}
