// The bf16 GEMM (engine/gemm/gemm_bf16.hpp) against the double reference on
// bf16-rounded inputs, on every unit and SIMD path this CPU runs.
#include <doctest/doctest.h>

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

#include "engine/gemm/bf16_emulation.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "kvhead/config.hpp"
#include "tests/reference/gemm_reference.hpp"
#include "tests/reference/kv_dtype_reference.hpp"

namespace {

using kvhead::simd_path;
using namespace kvhead::engine;

// The units to test: each bf16 unit this CPU runs, and the emulation of
// each bf16 unit (its driver, packing and layouts through the scalar
// kernels, on any CPU), then the fallback on every fp32 path this CPU runs.
struct unit_case {
  bf16_unit unit;
  simd_path path;
  bool emulated = false;
};
std::vector<unit_case> units_to_test() {
  std::vector<unit_case> cases;
  for (bf16_unit unit : {bf16_unit::amx, bf16_unit::avx512bf16}) {
    if (bf16_unit_runs_here(unit)) cases.push_back({unit, kvhead::active_simd_path()});
    cases.push_back({unit, kvhead::active_simd_path(), true});
  }
  for (simd_path path : kvhead::supported_simd_paths()) cases.push_back({bf16_unit::fp32_fallback, path});
  return cases;
}

std::string describe(const unit_case& u) {
  if (u.unit == bf16_unit::fp32_fallback) return std::string("fp32_fallback on ") + kvhead::to_string(u.path);
  return std::string(to_string(u.unit)) + (u.emulated ? " (emulated)" : "");
}

void multiply(const unit_case& u, gemm_shape shape, gemm_operand a, const packed_bf16_b& b, float beta, float* c,
              std::size_t ldc) {
  if (u.emulated)
    gemm_bf16_with(emulated_bf16_kernels(u.unit), shape, a, b, beta, c, ldc);
  else
    gemm_bf16(shape, a, b, beta, c, ldc);
}

// The reference's rounding (tests/reference: no engine code), as a value.
float reference_round(float x) { return float(kvhead::reference::bf16_value(kvhead::reference::round_to_bf16(x))); }

struct bf16_case {
  std::size_t m, n, k;
  bool trans_a, trans_b, b_from_fp32;
  std::size_t pad;  // extra columns beyond each row length
  float beta;
};

// |C - ref| <= (2k + 4) u (sum|a||b| + |beta c|): as for the fp32 GEMM (the
// products of bf16 values are exact in fp32, so only the sums round: k of
// them, 2 per step without FMA, one for beta * c, one to add it, one per
// extra sum block). Subnormal flushing by the bf16 instructions adds at most
// 2^-126 per step: the inputs here are N(0, 1), far from it. Written so NaN fails.
bool within_bound(float value, double reference, double magnitude, std::size_t k) {
  constexpr double unit_roundoff = std::numeric_limits<float>::epsilon() / 2;
  return std::fabs(double(value) - reference) <= (2.0 * double(k) + 4.0) * unit_roundoff * magnitude + 1e-30;
}

std::vector<float> normal_values(std::size_t count, std::mt19937& generator) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& x : values) x = normal(generator);
  return values;
}

std::vector<bf16_bits> reference_bits(const std::vector<float>& values) {
  std::vector<bf16_bits> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = {kvhead::reference::round_to_bf16(values[i])};
  return bits;
}

packed_bf16_b pack(const unit_case& u, const bf16_case& test, const std::vector<float>& b, std::size_t ldb) {
  const transpose trans = test.trans_b ? transpose::yes : transpose::no;
  if (test.b_from_fp32) return packed_bf16_b(test.k, test.n, gemm_operand{b.data(), ldb, trans}, u.unit, u.path);
  const std::vector<bf16_bits> bits = reference_bits(b);
  return packed_bf16_b(test.k, test.n, bits.data(), ldb, trans, u.unit, u.path);
}

void check_case(const unit_case& u, const bf16_case& test, std::mt19937& generator) {
  const std::size_t a_rows = test.trans_a ? test.k : test.m, a_cols = test.trans_a ? test.m : test.k;
  const std::size_t b_rows = test.trans_b ? test.n : test.k, b_cols = test.trans_b ? test.k : test.n;
  const std::size_t lda = a_cols + test.pad, ldb = b_cols + test.pad, ldc = test.n + test.pad;
  const std::vector<float> a = normal_values(a_rows * lda, generator), b = normal_values(b_rows * ldb, generator);
  std::vector<float> c = normal_values(test.m * ldc, generator);
  if (test.beta == 0.0f) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> old_c = c;

  std::vector<float> a_rounded(a.size()), b_rounded(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) a_rounded[i] = reference_round(a[i]);
  for (std::size_t i = 0; i < b.size(); ++i) b_rounded[i] = reference_round(b[i]);
  const auto reference = kvhead::reference::gemm(test.m, test.n, test.k, 1.0, a_rounded.data(), lda, test.trans_a,
                                                 b_rounded.data(), ldb, test.trans_b, test.beta, old_c.data(), ldc);

  const packed_bf16_b packed = pack(u, test, b, ldb);
  const gemm_operand a_op{a.data(), lda, test.trans_a ? transpose::yes : transpose::no};
  multiply(u, {test.m, test.n, test.k}, a_op, packed, test.beta, c.data(), ldc);

  std::size_t failures = 0;
  for (std::size_t i = 0; i < test.m; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      const float value = c[i * ldc + j];
      if (j >= test.n)  // padding columns of C stay untouched (bitwise)
        failures += std::memcmp(&value, &old_c[i * ldc + j], sizeof value) != 0;
      else
        failures += !within_bound(value, reference.value[i * test.n + j], reference.magnitude[i * test.n + j], test.k);
    }

  // The fallback has the bits of the fp32 GEMM on the rounded inputs.
  std::size_t fallback_differences = 0;
  if (u.unit == bf16_unit::fp32_fallback) {
    std::vector<float> fp32 = old_c;
    gemm({test.m, test.n, test.k}, 1.0f, {a_rounded.data(), lda, a_op.trans},
         {b_rounded.data(), ldb, test.trans_b ? transpose::yes : transpose::no}, test.beta, fp32.data(), ldc, u.path);
    fallback_differences = std::memcmp(fp32.data(), c.data(), c.size() * sizeof(float)) != 0;
  }
  INFO(describe(u) << " m=" << test.m << " n=" << test.n << " k=" << test.k << " transA=" << test.trans_a
                   << " transB=" << test.trans_b << " B from fp32=" << test.b_from_fp32 << " pad=" << test.pad
                   << " beta=" << test.beta);
  CHECK(failures == 0);
  CHECK(fallback_differences == 0);
}

// 1..5, primes, and the blocking numbers +-1 of the unit (the fallback's fp32
// tile and KC, the bf16 units' NR and KC).
std::vector<std::size_t> awkward_sizes(const unit_case& u) {
  std::set<std::size_t> sizes = {1, 2, 3, 4, 5, 7, 13, 31, 37, 61, 97, 131};
  std::vector<std::size_t> blocks = {bf16_nr, bf16_kc, 16};
  if (u.unit == bf16_unit::fp32_fallback) {
    const gemm_config config = gemm_config_for(u.path);
    blocks = {config.mr, config.nr, config.kc};
  }
  for (std::size_t block : blocks)
    for (std::size_t size : {block - 1, block, block + 1}) sizes.insert(size);
  return {sizes.begin(), sizes.end()};
}

}  // namespace

TEST_CASE("round_to_bf16: nearest even, as the reference rounds, NaN stays quiet NaN, Inf stays Inf") {
  std::mt19937 generator(12);
  std::size_t wrong = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(std::uint32_t(generator()));
    const float rounded = round_to_bf16(x);
    wrong += std::isnan(x) ? !std::isnan(rounded)
                           : std::bit_cast<std::uint32_t>(rounded) != std::bit_cast<std::uint32_t>(reference_round(x));
  }
  CHECK(wrong == 0);
  // Ties go to the even pattern: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  CHECK(round_to_bf16(1.0f + 0x1p-8f) == 1.0f);
  CHECK(round_to_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 1.0f + 0x1p-6f);
  CHECK(round_to_bf16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(round_to_bf16(-std::numeric_limits<float>::infinity()) == -std::numeric_limits<float>::infinity());
  CHECK(round_to_bf16(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  const float nan = round_to_bf16(std::bit_cast<float>(std::uint32_t{0x7f800001}));  // signalling NaN
  CHECK(std::isnan(nan));
  CHECK((std::bit_cast<std::uint32_t>(nan) & 0x00400000u) != 0);  // made quiet
}

TEST_CASE("gemm_bf16 matches the double reference on rounded inputs over awkward shapes, every unit and path") {
  for (const unit_case& u : units_to_test()) {
    const std::vector<std::size_t> sizes = awkward_sizes(u);
    const std::size_t largest = u.emulated ? 1'000'000 : 3'000'000;  // multiply-adds: keep the reference fast
    std::mt19937 generator(20261201);
    auto pick = [&](const auto& list) { return list[generator() % list.size()]; };
    const std::vector<float> betas = {0.0f, 1.0f, 0.75f};
    for (int sample = 0; sample < (u.emulated ? 40 : 60); ++sample) {
      bf16_case test{pick(sizes),          pick(sizes),          pick(sizes),     bool(generator() & 1),
                     bool(generator() & 1), bool(generator() & 1), generator() % 3, pick(betas)};
      if (test.m * test.n * test.k > largest) test.k = 1 + test.k % 61;
      check_case(u, test, generator);
    }
    // Several sum blocks and every transpose at least once.
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        check_case(u, {19, 45, 2 * bf16_kc + 3, trans_a, trans_b, trans_a, 1, 0.5f}, generator);
  }
}

TEST_CASE("gemm_bf16 determinism: a row of C is bit-identical for any m and thread count, every unit and path") {
  for (const unit_case& u : units_to_test()) {
    CAPTURE(describe(u));
    const std::size_t m = 77, n = 3 * bf16_nr + 5, k = bf16_kc + 37;
    std::mt19937 generator(5);
    const std::vector<float> a = normal_values(m * k, generator), b = normal_values(k * n, generator);
    const packed_bf16_b packed(k, n, gemm_operand{b.data(), n, transpose::no}, u.unit, u.path);
    auto run = [&](std::size_t rows, const float* a_rows, int threads) {
      std::vector<float> c(rows * n);
      tbb::task_arena arena(threads);
      arena.execute([&] { multiply(u, {rows, n, k}, {a_rows, k, transpose::no}, packed, 0.0f, c.data(), n); });
      return c;
    };
    const std::vector<float> full = run(m, a.data(), 1);
    CHECK(run(m, a.data(), 2) == full);
    CHECK(run(m, a.data(), 3) == full);
    for (std::size_t rows : {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::size_t{17}})
      for (std::size_t row : {std::size_t{0}, std::size_t{9}, m - rows}) {
        const std::vector<float> some = run(rows, a.data() + row * k, 2);
        CHECK(std::memcmp(some.data(), full.data() + row * n, some.size() * sizeof(float)) == 0);
      }
    // The leading columns of B give the leading columns of C.
    std::vector<float> narrow(m * 7);
    multiply(u, {m, 7, k}, {a.data(), k, transpose::no}, packed, 0.0f, narrow.data(), 7);
    std::size_t differences = 0;
    for (std::size_t i = 0; i < m; ++i) differences += std::memcmp(&narrow[i * 7], &full[i * n], 7 * sizeof(float)) != 0;
    CHECK(differences == 0);
  }
}

TEST_CASE("packed_bf16_b layouts: the fallback's packed_b layout, the bf16 units' [k/2][NR][2] pairs") {
  for (const std::size_t k : {std::size_t{1}, std::size_t{6}, bf16_kc + 3})
    for (const std::size_t n : {std::size_t{1}, bf16_nr + 3}) {
      CAPTURE(k);
      CAPTURE(n);
      std::vector<bf16_bits> b(k * n);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = {std::uint16_t(i + 1)};  // nonzero, distinct
      for (bf16_unit unit : {bf16_unit::amx, bf16_unit::avx512bf16}) {
        const packed_bf16_b packed(k, n, b.data(), n, transpose::no, unit);
        const std::size_t padded_n = (n + bf16_nr - 1) / bf16_nr * bf16_nr;
        // Padded depth: whole pairs; for AMX whole tile steps of 32 k.
        const std::size_t multiple = unit == bf16_unit::amx ? 32 : 2;
        const std::size_t last_k0 = (k - 1) / bf16_kc * bf16_kc;
        const std::size_t padded_k = last_k0 + (k - last_k0 + multiple - 1) / multiple * multiple;
        CHECK(packed.bytes() == padded_k * padded_n * 2);
        std::size_t wrong = 0, nonzero_padding = 0;
        for (std::size_t row = 0; row < padded_k; ++row)
          for (std::size_t col = 0; col < padded_n; ++col) {
            const std::size_t k0 = row / bf16_kc * bf16_kc, depth = std::min(bf16_kc, padded_k - k0);
            const std::size_t offset = k0 * padded_n + col / bf16_nr * depth * bf16_nr +
                                       (((row - k0) / 2) * bf16_nr + col % bf16_nr) * 2 + row % 2;
            const std::uint16_t stored = packed.panels()[offset].bits;
            if (row < k && col < n)
              wrong += stored != b[row * n + col].bits;
            else
              nonzero_padding += stored != 0;
          }
        CHECK(wrong == 0);
        CHECK(nonzero_padding == 0);
        // The same operand given transposed packs to the same bytes.
        std::vector<bf16_bits> transposed(n * k);
        for (std::size_t row = 0; row < k; ++row)
          for (std::size_t col = 0; col < n; ++col) transposed[col * k + row] = b[row * n + col];
        const packed_bf16_b from_transposed(k, n, transposed.data(), k, transpose::yes, unit);
        CHECK(std::memcmp(from_transposed.panels(), packed.panels(), packed.bytes()) == 0);
      }
      for (simd_path path : kvhead::supported_simd_paths()) {
        const gemm_config config = gemm_config_for(path);
        const packed_bf16_b packed(k, n, b.data(), n, transpose::no, bf16_unit::fp32_fallback, path);
        std::size_t wrong = 0;
        for (std::size_t row = 0; row < k; ++row)
          for (std::size_t col = 0; col < n; ++col)
            wrong += packed.panels()[pack_b_offset(config, k, n, row, col)].bits != b[row * n + col].bits;
        CHECK(wrong == 0);
      }
    }
}

TEST_CASE("gemm_bf16 rejects bad arguments with a message naming them") {
  std::vector<float> a(12, 1.0f), b(12, 1.0f), c(16);
  const packed_bf16_b packed(3, 4, gemm_operand{b.data(), 4, transpose::no});
  CHECK_THROWS_WITH_AS(gemm_bf16({4, 4, 2}, {a.data(), 3, transpose::no}, packed, 0.0f, c.data(), 4),
                       doctest::Contains("does not fit B"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm_bf16({4, 5, 3}, {a.data(), 3, transpose::no}, packed, 0.0f, c.data(), 5),
                       doctest::Contains("does not fit B"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm_bf16({4, 4, 3}, {a.data(), 2, transpose::no}, packed, 0.0f, c.data(), 4),
                       doctest::Contains("leading dimension of A"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gemm_bf16({4, 4, 3}, {a.data(), 3, transpose::no}, packed, 0.0f, c.data(), 3),
                       doctest::Contains("ldc"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(packed_bf16_b(3, 4, gemm_operand{b.data(), 3, transpose::no}),
                       doctest::Contains("leading dimension of B"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(packed_bf16_b(3, 4, static_cast<const bf16_bits*>(nullptr), 4, transpose::no),
                       doctest::Contains("B is null"), std::invalid_argument);
  for (bf16_unit unit : {bf16_unit::amx, bf16_unit::avx512bf16}) {
    if (bf16_unit_runs_here(unit)) continue;
    const packed_bf16_b foreign(3, 4, gemm_operand{b.data(), 4, transpose::no}, unit);
    CHECK_THROWS_WITH_AS(gemm_bf16({4, 4, 3}, {a.data(), 3, transpose::no}, foreign, 0.0f, c.data(), 4),
                         doctest::Contains("cannot run"), std::invalid_argument);
  }
}

TEST_CASE("bf16 instruction emulation: the SDM's order, fused steps, subnormals flushed") {
  auto bits = [](float x) { return bf16_bits{std::uint16_t(std::bit_cast<std::uint32_t>(x) >> 16)}; };
  const bf16_bits one = bits(1.0f), minus_one = bits(-1.0f), zero = bits(0.0f);
  // vdpbf16ps adds the odd product, then the even one. From 2^24 + 2 (the
  // spacing is 2 there): + 1 ties to 2^24 + 4, - 1 ties back to 2^24 + 4;
  // the other order would go to 2^24, then stay there.
  CHECK(emulate_vdpbf16ps(0x1p24f + 2.0f, minus_one, one, one, one) == 0x1p24f + 4.0f);
  CHECK(emulate_vdpbf16ps(0x1p24f + 2.0f, one, minus_one, one, one) == 0x1p24f);
  // Products of bf16 values are exact in fp32; each step rounds once.
  CHECK(emulate_vdpbf16ps(-1.0f, zero, bits(1.0f + 0x1p-7f), zero, bits(1.0f - 0x1p-7f)) == -0x1p-14f);
  // Subnormal inputs read as zero, subnormal results flushed to zero.
  CHECK(emulate_vdpbf16ps(0.0f, bits(0x1p-130f), zero, one, zero) == 0.0f);
  CHECK(emulate_vdpbf16ps(0.0f, bits(0x1p-70f), zero, bits(0x1p-70f), zero) == 0.0f);  // 2^-140
  CHECK(emulate_vdpbf16ps(0x1p-130f, zero, zero, zero, zero) == 0.0f);
  // tdpbf16ps: an even and an odd chain apart, then acc + (even + odd).
  // k = 0..3 products 2^24, 1, 1, 1: even 2^24 + 1 ties to 2^24, odd 1 + 1 = 2,
  // so 2^24 + 2; one chain in k order would stay at 2^24.
  const bf16_bits a[4] = {one, one, one, one};
  const bf16_bits b[4] = {bits(0x1p24f), one, one, one};
  CHECK(emulate_tdpbf16ps(0.0f, a, b, 2) == 0x1p24f + 2.0f);
  CHECK(emulate_tdpbf16ps(0x1p-130f, a, b, 0) == 0.0f);
}

namespace {

// The unit's kernels on this CPU against their emulation over the same
// packed buffers: bit for bit (the emulation follows the SDM's order, so
// this checks that the hardware does too), on every edge of the driver.
void check_hardware_against_emulation(bf16_unit unit) {
  if (!bf16_unit_runs_here(unit)) {
    MESSAGE("SKIPPED: " << std::string(to_string(unit)) << " does not run on this CPU: " << bf16_unit_refusal(unit));
    return;
  }
  std::mt19937 generator(3);
  for (const gemm_shape shape : {gemm_shape{1, 1, 1}, gemm_shape{2, 131, 37}, gemm_shape{5, 64, 300},
                                 gemm_shape{13, 33, 2 * bf16_kc + 1}, gemm_shape{70, 97, 61}}) {
    CAPTURE(shape.m);
    CAPTURE(shape.n);
    CAPTURE(shape.k);
    const std::vector<float> a = normal_values(shape.m * shape.k, generator);
    const std::vector<float> b = normal_values(shape.k * shape.n, generator);
    const std::vector<float> old_c = normal_values(shape.m * shape.n, generator);
    const packed_bf16_b packed(shape.k, shape.n, gemm_operand{b.data(), shape.n, transpose::no}, unit);
    for (float beta : {0.0f, 0.5f}) {
      std::vector<float> hardware = old_c, emulated = old_c;
      gemm_bf16(shape, {a.data(), shape.k, transpose::no}, packed, beta, hardware.data(), shape.n);
      gemm_bf16_with(emulated_bf16_kernels(unit), shape, {a.data(), shape.k, transpose::no}, packed, beta,
                     emulated.data(), shape.n);
      CHECK(std::memcmp(hardware.data(), emulated.data(), hardware.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("amx kernels on this CPU: the bits of their emulation") { check_hardware_against_emulation(bf16_unit::amx); }

TEST_CASE("avx512bf16 kernels on this CPU: the bits of their emulation") {
  check_hardware_against_emulation(bf16_unit::avx512bf16);
}

TEST_CASE("the active bf16 unit: the best that runs, with the reason for any better one") {
  const bf16_unit unit = active_bf16_unit();
  CHECK(bf16_unit_runs_here(unit));
  CHECK(bf16_unit_runs_here(bf16_unit::fp32_fallback));
  if (unit != bf16_unit::amx) CHECK(!bf16_unit_reason().empty());
  MESSAGE("active bf16 unit: " << std::string(to_string(unit))
                               << std::string(bf16_unit_reason().empty() ? "" : " because ") << bf16_unit_reason());
}

namespace {

// Kernels standing in for broken hardware: a wrong result, an illegal instruction.
void zero_kernel(const bf16_microkernel_params& params) {
  for (std::size_t col = 0; col < bf16_nr; ++col) params.c[col] = 0.0f;
}
void illegal_kernel(const bf16_microkernel_params&) { __builtin_trap(); }

bf16_kernels replaced(bf16_kernels kernels, const bf16_microkernel_function* table) {
  kernels.kernels = table;
  kernels.skinny = kernels.skinny != nullptr ? table : nullptr;
  return kernels;
}

}  // namespace

TEST_CASE("bf16 self-test: the emulation passes, a wrong or faulting kernel is refused, never a crash") {
  for (bf16_unit unit : {bf16_unit::amx, bf16_unit::avx512bf16}) {
    CAPTURE(std::string(to_string(unit)));
    const bf16_kernels& emulated = emulated_bf16_kernels(unit);
    CHECK(bf16_self_test(emulated).empty());
    std::vector<bf16_microkernel_function> zeros(emulated.mr, &zero_kernel), traps(emulated.mr, &illegal_kernel);
    CHECK(bf16_self_test(replaced(emulated, zeros.data())) == "its self-test gave other results than the emulation");
    CHECK(bf16_self_test(replaced(emulated, traps.data())) == "its self-test faulted (SIGILL or SIGSEGV)");
  }
}
