// Integer products over an int8 paged B (gemm_int8_paged, engine/gemm/gemm_int8.hpp):
// the driver and both panel widths' layouts (the avx512 path's 32 columns,
// avx2's 16) through the scalar emulation on any CPU, the AVX512-VNNI and
// the AVX2 kernels where they run (else visibly skipped), against a
// reference of the stated quantization and bit for bit against each other
// (the sums are exact: every kernel set and layout gives the same bits).
#include <doctest/doctest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/gemm/gemm_int8.hpp"
#include "kvhead/config.hpp"
#include "tests/random_values.hpp"

namespace {

using kvhead::kv_dtype;
using kvhead::simd_path;
using namespace kvhead::engine;

constexpr simd_path wide_layout = simd_path::avx512, narrow_layout = simd_path::avx2;  // NR 32 and 16
constexpr double unit_roundoff = std::numeric_limits<float>::epsilon() / 2;

// B (k x n int8, row-major) cut into pages of the packed layout (narrow:
// each column page one panel of row stride `page`, a KV cache's 16-key
// blocks), each page a buffer of its own whose unused bytes are 0x7f, so a
// read outside B changes the sums.
struct paged_matrix {
  std::vector<std::vector<std::int8_t>> storage;
  std::vector<const void*> pages;
  paged_b_view view;
};

paged_matrix page_b(simd_path layout, const std::vector<std::int8_t>& b, std::size_t k, std::size_t n, std::size_t page,
                    bool along_k, bool narrow = false) {
  const gemm_config config = gemm_config_for(layout);
  const std::size_t page_k = along_k ? page : k, page_n = along_k ? n : page;
  const std::size_t count = along_k ? (k + page - 1) / page : (n + page - 1) / page;
  paged_matrix paged;
  for (std::size_t p = 0; p < count; ++p) {
    std::vector<std::int8_t> bytes(narrow ? page_k * page_n : packed_b_floats(config, page_k, page_n), 0x7f);
    for (std::size_t row = 0; row < page_k; ++row)
      for (std::size_t col = 0; col < page_n; ++col) {
        const std::size_t global_row = along_k ? p * page + row : row, global_col = along_k ? col : p * page + col;
        if (global_row < k && global_col < n)
          bytes[narrow ? row * page_n + col : pack_b_offset(config, page_k, page_n, row, col)] =
              b[global_row * n + global_col];
      }
    paged.storage.push_back(std::move(bytes));
  }
  for (const auto& bytes : paged.storage) paged.pages.push_back(bytes.data());
  paged.view = {paged.pages.data(), page, along_k, k, n, layout, kv_dtype::int8, narrow ? page : 0};
  return paged;
}

/// `count` draws of a uniform int8 in [-127, 127] from `generator`.
std::vector<std::int8_t> random_int8(std::size_t count, std::mt19937& generator) {
  std::uniform_int_distribution<int> byte(-127, 127);
  std::vector<std::int8_t> values(count);
  for (std::int8_t& x : values) x = std::int8_t(byte(generator));
  return values;
}

// A kernel set and the layout of B it reads (its panel width).
struct kernel_case {
  const int8_paged_kernels* kernels;
  const char* name;
  simd_path layout;
  bool int8_a() const { return kernels->int8_a_by_rows != nullptr; }
};
std::vector<kernel_case> kernels_to_test() {
  std::vector<kernel_case> cases{{&emulated_int8_paged_kernels(32), "emulated, 32 columns", wide_layout},
                                 {&emulated_int8_paged_kernels(16), "emulated, 16 columns", narrow_layout}};
  if (gemm_int8_paged_runs(wide_layout, kv_dtype::int8))
    cases.push_back({&avx512vnni_int8_paged_kernels(), "avx512vnni", wide_layout});
  else
    MESSAGE(
        "gemm_int8_paged on AVX512-VNNI skipped: the kernels do not run here, `kvhead kernels` says why (emulation "
        "tested)");
  if (gemm_int8_paged_runs(narrow_layout, kv_dtype::int8))
    cases.push_back({&avx2_int8_paged_kernels(), "avx2", narrow_layout});
  else
    MESSAGE("gemm_int8_paged on AVX2 skipped: this CPU has no AVX2 (emulation tested)");
  return cases;
}

// The stated quantization of one row, computed here on its own: scale =
// max|a| / quantum (32767 for int16 A, 127 for int8) in fp32, q = a / scale
// in fp32 rounded to nearest even (the default rounding mode), and the exact
// dot products with B in int64.
struct reference_row {
  float scale;
  std::vector<std::int64_t> sums;  // per column
};
float quantum(a_quantization quantization) { return quantization == a_quantization::int8 ? 127.0f : 32767.0f; }
const char* name(a_quantization quantization) { return quantization == a_quantization::int8 ? "int8 A" : "int16 A"; }
constexpr a_quantization both_quantizations[] = {a_quantization::int16, a_quantization::int8};

reference_row quantized_reference(const float* a, std::size_t k, const std::vector<std::int8_t>& b, std::size_t n,
                                  a_quantization quantization) {
  float largest = 0.0f;
  bool finite = true;
  for (std::size_t i = 0; i < k; ++i) {
    finite = finite && std::isfinite(a[i]);
    if (std::fabs(a[i]) > largest) largest = std::fabs(a[i]);
  }
  reference_row row{finite ? largest / quantum(quantization) : std::numeric_limits<float>::quiet_NaN(),
                    std::vector<std::int64_t>(n, 0)};
  REQUIRE(std::fegetround() == FE_TONEAREST);
  for (std::size_t i = 0; i < k && row.scale > 0.0f; ++i) {
    const auto q = std::int64_t(std::nearbyint(a[i] / row.scale));
    for (std::size_t j = 0; j < n; ++j) row.sums[j] += q * b[i * n + j];
  }
  return row;
}

struct paged_case {
  std::size_t m, n, k, page;
  bool along_k;
  float alpha;
  bool narrow = false;  // column pages of 16 as narrow panels (page_b)
};

std::vector<float> run(const int8_paged_kernels& kernels, a_quantization quantization, const paged_case& test,
                       const std::vector<float>& a, std::size_t lda, const paged_matrix& paged, std::size_t ldc,
                       std::size_t rows, std::size_t pv_rows_per_call = int8_pv_rows_configured) {
  std::vector<float> c(rows * ldc, std::numeric_limits<float>::quiet_NaN());
  gemm_int8_paged_with(kernels, quantization, {rows, test.n, test.k}, test.alpha, {a.data(), lda, transpose::no},
                       paged.view, c.data(), ldc, pv_rows_per_call);
  return c;
}

// One case through every kernel set: C = (alpha s) float(sum) within 2 u of
// the exact value (the sum's rounding to fp32, two products), within the
// quantization's own bound of alpha A B (|a - s q| <= s / 2 per element),
// padding never written, the kernel sets bit-identical, a row alone its
// row's bits. Row 0 is zero, row 1 (when m > 2) holds a NaN.
void check_case(const paged_case& test, a_quantization quantization, std::mt19937& generator) {
  CAPTURE(name(quantization));
  CAPTURE(test.m);
  CAPTURE(test.n);
  CAPTURE(test.k);
  CAPTURE(test.page);
  CAPTURE(test.along_k);
  const std::size_t lda = test.k + 3, ldc = test.n + 2;
  std::vector<float> a = kvhead::testing::random_values(test.m * lda, generator, 1.0f);
  for (std::size_t i = 0; i < test.k; ++i) a[i] = 0.0f;
  const bool poisoned = test.m > 2;
  if (poisoned) a[lda + test.k / 2] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::int8_t> b = random_int8(test.k * test.n, generator);
  std::vector<float> first;
  for (const kernel_case& kernels : kernels_to_test()) {
    // Narrow pages are narrower than a panel: on the 32-column layout only.
    if ((quantization == a_quantization::int8 && !kernels.int8_a()) || (test.narrow && kernels.layout != wide_layout))
      continue;
    CAPTURE(kernels.name);
    const paged_matrix paged = page_b(kernels.layout, b, test.k, test.n, test.page, test.along_k, test.narrow);
    const std::vector<float> c = run(*kernels.kernels, quantization, test, a, lda, paged, ldc, test.m);
    std::size_t failures = 0, padding_written = 0, nan_wrong = 0;
    for (std::size_t i = 0; i < test.m; ++i) {
      const reference_row reference = quantized_reference(&a[i * lda], test.k, b, test.n, quantization);
      for (std::size_t j = 0; j < ldc; ++j) {
        const float value = c[i * ldc + j];
        if (j >= test.n) {
          padding_written += !std::isnan(value);
          continue;
        }
        if (poisoned && i == 1) {
          nan_wrong += !std::isnan(value);
          continue;
        }
        const double exact = double(test.alpha) * double(reference.scale) * double(reference.sums[j]);
        double product = 0.0, magnitude = 0.0;  // alpha A B, and sum |b| for the quantization bound
        for (std::size_t l = 0; l < test.k; ++l) {
          product += double(a[i * lda + l]) * double(b[l * test.n + j]);
          magnitude += std::fabs(double(b[l * test.n + j]));
        }
        product *= double(test.alpha);
        const double quantization = std::fabs(double(test.alpha)) * double(reference.scale) / 2.0 * magnitude;
        failures += !(std::fabs(double(value) - exact) <= 2.0 * unit_roundoff * std::fabs(exact));
        failures += !(std::fabs(double(value) - product) <= 1.01 * quantization + 1e-30);
      }
    }
    CHECK(failures == 0);
    CHECK(padding_written == 0);
    CHECK(nan_wrong == 0);
    if (first.empty())
      first = c;
    else
      CHECK(std::memcmp(first.data(), c.data(), c.size() * sizeof(float)) == 0);  // every kernel set and layout
    const std::size_t row = test.m - 1;
    std::vector<float> alone_a(a.begin() + std::ptrdiff_t(row * lda), a.begin() + std::ptrdiff_t((row + 1) * lda));
    const std::vector<float> alone = run(*kernels.kernels, quantization, test, alone_a, lda, paged, ldc, 1);
    CHECK(std::memcmp(alone.data(), c.data() + row * ldc, ldc * sizeof(float)) == 0);
  }
}

TEST_CASE(
    "gemm_int8_paged: against the stated quantization over awkward shapes and pages, emulated and on avx512vnni and "
    "avx2") {
  std::mt19937 generator(2027);
  for (const paged_case& test :
       {paged_case{1, 1, 1, 16, false, 1.0f}, paged_case{4, 256, 128, 16, false, 0.125f},
        paged_case{5, 37, 129, 64, false, 0.5f}, paged_case{13, 70, 7, 256, false, 1.0f},
        paged_case{4, 128, 256, 16, true, 1.0f}, paged_case{25, 41, 131, 32, true, 1.0f},
        paged_case{3, 128, 255, 256, true, 1.0f}, paged_case{32, 96, 256, 64, true, 1.0f},
        paged_case{12, 33, 6, 16, false, 1.0f}, paged_case{2, 32, 250, 16, true, 1.0f},
        paged_case{1, 1, 1, 16, false, 1.0f, true}, paged_case{4, 256, 128, 16, false, 0.125f, true},
        paged_case{13, 41, 7, 16, false, 1.0f, true}, paged_case{5, 30, 250, 16, false, 0.5f, true}})
    for (const a_quantization quantization : both_quantizations) check_case(test, quantization, generator);
}

TEST_CASE(
    "gemm_int8_paged: the same bits however B is cut into pages and however many pages a call takes, narrow pages "
    "included") {
  std::mt19937 generator(91);
  const std::size_t n = 96, k = 256;
  const std::vector<std::int8_t> b = random_int8(k * n, generator);
  // 5 rows: one row block of every kernel set, its pages outermost; 7: more than avx2's 6.
  for (const std::size_t m : {std::size_t{5}, std::size_t{7}})
    for (const kernel_case& kernels : kernels_to_test())
      for (const a_quantization quantization : both_quantizations)
        for (const bool along_k : {false, true}) {
          if (quantization == a_quantization::int8 && !kernels.int8_a()) continue;
          const std::vector<float> a = kvhead::testing::random_values(m * k, generator, 1.0f);
          CAPTURE(m);
          CAPTURE(kernels.name);
          CAPTURE(name(quantization));
          CAPTURE(along_k);
          std::vector<float> first;
          for (const std::size_t page : {std::size_t{256}, std::size_t{64}, std::size_t{16}}) {
            const paged_matrix matrix = page_b(kernels.layout, b, k, n, page, along_k);
            for (const std::size_t pv_rows_per_call :
                 {std::size_t{0}, std::size_t{32}, std::size_t{64}}) {  // 1, 2, 4 of 16
              CAPTURE(page);
              CAPTURE(pv_rows_per_call);
              const std::vector<float> c = run(*kernels.kernels, quantization, {m, n, k, page, along_k, 1.0f}, a, k,
                                               matrix, n, m, pv_rows_per_call);
              if (first.empty())
                first = c;
              else
                CHECK(std::memcmp(first.data(), c.data(), c.size() * sizeof(float)) == 0);
            }
          }
          if (!along_k && kernels.layout == wide_layout) {  // narrow pages: a KV cache's 16-key blocks
            const paged_matrix narrow = page_b(kernels.layout, b, k, n, 16, false, true);
            const std::vector<float> c =
                run(*kernels.kernels, quantization, {m, n, k, 16, false, 1.0f, true}, a, k, narrow, n, m);
            CHECK(std::memcmp(first.data(), c.data(), c.size() * sizeof(float)) == 0);
          }
        }
}

TEST_CASE("gemm_int8_paged: rows quantized beforehand are read instead of A, with the bits of quantizing it there") {
  std::mt19937 generator(5);
  const std::size_t m = 6, n = 70, k = 132;
  const std::vector<float> a = kvhead::testing::random_values(m * k, generator, 1.0f);
  const std::vector<float> other = kvhead::testing::random_values(m * k, generator, 1.0f);
  const std::vector<std::int8_t> b = random_int8(k * n, generator);
  for (const kernel_case& kernels : kernels_to_test())
    for (const a_quantization quantization : both_quantizations)
      for (const bool along_k : {false, true}) {
        if (quantization == a_quantization::int8 && !kernels.int8_a()) continue;
        CAPTURE(kernels.name);
        CAPTURE(name(quantization));
        CAPTURE(along_k);
        const std::size_t page = along_k ? 4 : 32;
        const paged_matrix matrix = page_b(kernels.layout, b, k, n, page, along_k);
        const paged_case test{m, n, k, page, along_k, 0.5f};
        const std::vector<float> expected = run(*kernels.kernels, quantization, test, other, k, matrix, n, m);
        // other's rows, quantized once, given with A = a: the product is other's.
        std::vector<float> storage(quantized_rows_floats(quantization, m, k));
        const quantized_rows given =
            quantize_rows_with(*kernels.kernels, quantization, {other.data(), k, transpose::no}, m, k, storage.data());
        std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
        for (int call = 0; call < 2; ++call) {  // read, never changed: the same for every product
          gemm_int8_paged_with(*kernels.kernels, quantization, {m, n, k}, 0.5f, {a.data(), k, transpose::no},
                               matrix.view, c.data(), n, int8_pv_rows_configured, &given);
          CHECK(std::memcmp(expected.data(), c.data(), c.size() * sizeof(float)) == 0);
        }
        const quantized_rows again = quantized_rows_at(quantization, m, k, storage.data());
        CHECK(again.scales == given.scales);
        CHECK(again.rows == given.rows);
        CHECK(again.ld == given.ld);
      }
}

TEST_CASE("gemm_int8_paged: int16 rows quantized as stated, ties to even, zero, NaN, Inf and subnormal rows") {
  constexpr float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::mt19937 generator(77);
  for (const std::size_t cols : {1, 3, 8, 9, 17, 130}) {
    const std::size_t ld = cols + 1 + cols % 2;  // past the pair: zeros expected up to it
    std::vector<std::vector<float>> rows;
    rows.push_back(kvhead::testing::random_values(cols, generator, 3.0f));
    std::vector<float> ties(cols, 0.0f);  // max 32767: scale 1, so x.5 are ties
    const float halves[] = {32767.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, -32767.0f};
    for (std::size_t col = 0; col < cols; ++col) ties[col] = halves[col % 8];
    rows.push_back(ties);
    rows.push_back(std::vector<float>(cols, 0.0f));
    rows.push_back(std::vector<float>(cols, std::numeric_limits<float>::denorm_min() * 3.0f));
    rows.push_back(std::vector<float>(cols, 1e-39f));
    std::vector<float> with_inf = rows[0], with_nan = rows[0];
    with_inf[cols - 1] = -inf;
    with_nan[cols / 2] = nan;
    rows.push_back(with_inf);
    rows.push_back(with_nan);
    std::vector<float> a;
    for (const auto& row : rows) a.insert(a.end(), row.begin(), row.end());
    for (const kernel_case& kernels : kernels_to_test()) {
      CAPTURE(cols);
      CAPTURE(kernels.name);
      std::vector<std::int16_t> q(rows.size() * ld, 12345);
      std::vector<float> scales(rows.size());
      kernels.kernels->quantize_rows_int16(a.data(), cols, rows.size(), cols, q.data(), ld, scales.data());
      for (std::size_t r = 0; r < rows.size(); ++r) {
        CAPTURE(r);
        const reference_row reference = quantized_reference(rows[r].data(), cols, {}, 0, a_quantization::int16);
        if (std::isnan(reference.scale))
          CHECK(std::isnan(scales[r]));
        else
          CHECK(scales[r] == reference.scale);
        std::size_t wrong = 0;
        for (std::size_t col = 0; col < ld; ++col) {
          const long expected = col < cols && reference.scale > 0.0f ? std::lrint(rows[r][col] / reference.scale) : 0;
          wrong += q[r * ld + col] != expected;
        }
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("gemm_int8_paged: bad arguments named, never a wrong answer") {
  std::vector<std::int8_t> b(16 * 4, 1);
  const paged_matrix fine = page_b(wide_layout, b, 16, 4, 16, true);
  std::vector<float> a(2 * 16, 1.0f), c(2 * 4);
  const int8_paged_kernels& kernels = emulated_int8_paged_kernels();
  paged_b_view f32_b = fine.view;
  f32_b.element = kv_dtype::f32;
  CHECK_THROWS_WITH_AS(gemm_int8_paged_with(kernels, a_quantization::int16, {2, 4, 16}, 1.0f,
                                            {a.data(), 16, transpose::no}, f32_b, c.data(), 4),
                       doctest::Contains("int8 (narrow pages of row stride 16) B"), std::invalid_argument);
  // Narrow pages (column pages of one panel) of another row stride than 16: refused for either A.
  std::vector<std::int8_t> narrow_b(16 * 24, 1);
  std::vector<float> wide_c(2 * 24);
  const paged_matrix narrow24 = page_b(wide_layout, narrow_b, 16, 24, 24, false, true);
  for (const a_quantization quantization : both_quantizations)
    CHECK_THROWS_WITH_AS(gemm_int8_paged_with(kernels, quantization, {2, 24, 16}, 1.0f, {a.data(), 16, transpose::no},
                                              narrow24.view, wide_c.data(), 24),
                         doctest::Contains("row stride 16"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm_int8_paged_with(kernels, a_quantization::int16, {2, 5, 16}, 1.0f,
                                            {a.data(), 16, transpose::no}, fine.view, c.data(), 5),
                       doctest::Contains("within B"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm_int8_paged_with(kernels, a_quantization::int16, {2, 4, 16}, 1.0f,
                                            {a.data(), 16, transpose::yes}, fine.view, c.data(), 4),
                       doctest::Contains("not transposed"), std::invalid_argument);
  paged_b_view odd_pages = fine.view;
  odd_pages.page = 7;
  CHECK_THROWS_WITH_AS(gemm_int8_paged_with(kernels, a_quantization::int16, {2, 4, 16}, 1.0f,
                                            {a.data(), 16, transpose::no}, odd_pages, c.data(), 4),
                       doctest::Contains("even number of rows"), std::invalid_argument);
  std::vector<float> deep_a(2 * 24, 1.0f);
  std::vector<std::int8_t> deep_b(24 * 4, 1);
  const paged_matrix six_rows = page_b(wide_layout, deep_b, 24, 4, 6, true);
  CHECK_THROWS_WITH_AS(gemm_int8_paged_with(kernels, a_quantization::int8, {2, 4, 24}, 1.0f,
                                            {deep_a.data(), 24, transpose::no}, six_rows.view, c.data(), 4),
                       doctest::Contains("multiple of 4 rows"), std::invalid_argument);
  CHECK_NOTHROW(gemm_int8_paged_with(kernels, a_quantization::int16, {2, 4, 24}, 1.0f,
                                     {deep_a.data(), 24, transpose::no}, six_rows.view, c.data(), 4));
  std::vector<float> storage(quantized_rows_floats(a_quantization::int8, 2, 16));
  const quantized_rows int8_rows =
      quantize_rows_with(kernels, a_quantization::int8, {a.data(), 16, transpose::no}, 2, 16, storage.data());
  CHECK_THROWS_WITH_AS(
      gemm_int8_paged_with(kernels, a_quantization::int16, {2, 4, 16}, 1.0f, {a.data(), 16, transpose::no}, fine.view,
                           c.data(), 4, int8_pv_rows_configured, &int8_rows),
      doctest::Contains("are not A's"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      gemm_int8_paged_with(kernels, a_quantization::int8, {1, 4, 16}, 1.0f, {a.data(), 16, transpose::no}, fine.view,
                           c.data(), 4, int8_pv_rows_configured, &int8_rows),
      doctest::Contains("2 x 16, int8) are not A's (1 x 16, int8)"), std::invalid_argument);
  if (!gemm_int8_paged_runs(wide_layout, kv_dtype::int8))
    CHECK_THROWS_WITH_AS(
        gemm_int8_paged(a_quantization::int8, {2, 4, 16}, 1.0f, {a.data(), 16, transpose::no}, fine.view, c.data(), 4),
        doctest::Contains("AVX512-VNNI"), std::invalid_argument);
  // Kernels of one panel width over B laid out for the other: refused, naming both.
  const paged_matrix narrow_layout_b = page_b(narrow_layout, b, 16, 4, 16, true);
  CHECK_THROWS_WITH_AS(gemm_int8_paged_with(kernels, a_quantization::int16, {2, 4, 16}, 1.0f,
                                            {a.data(), 16, transpose::no}, narrow_layout_b.view, c.data(), 4),
                       doctest::Contains("a path with NR 32 (this one's: 16)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(emulated_int8_paged_kernels(8), doctest::Contains("16 or 32 columns, not 8"),
                       std::invalid_argument);
  // The avx2 kernels take A in int16 only: int8 A refused by name, for products and quantization.
  if (gemm_int8_paged_runs(narrow_layout, kv_dtype::int8)) {
    const int8_paged_kernels& avx2 = avx2_int8_paged_kernels();
    CHECK_THROWS_WITH_AS(gemm_int8_paged_with(avx2, a_quantization::int8, {2, 4, 16}, 1.0f,
                                              {a.data(), 16, transpose::no}, narrow_layout_b.view, c.data(), 4),
                         doctest::Contains("int16 only"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        quantize_rows_with(avx2, a_quantization::int8, {a.data(), 16, transpose::no}, 2, 16, storage.data()),
        doctest::Contains("int16 only"), std::invalid_argument);
    CHECK(int8_scores_quantization(narrow_layout) == a_quantization::int16);
  }
  CHECK_THROWS_WITH_AS(
      quantize_rows(simd_path::sse2, a_quantization::int16, {a.data(), 16, transpose::no}, 2, 16, storage.data()),
      doctest::Contains("no int8 paged kernels run here for the path sse2"), std::invalid_argument);
}

}  // namespace
