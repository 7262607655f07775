// softmax_row and the online-softmax building blocks against the double
// reference, on every SIMD path this CPU runs.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/softmax/softmax.hpp"
#include "kvhead/config.hpp"
#include "tests/reference/kv_dtype_reference.hpp"
#include "tests/reference/softmax_reference.hpp"

namespace {

using kvhead::simd_path;
using namespace kvhead::engine;

constexpr float infinity = std::numeric_limits<float>::infinity();
constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();
constexpr double unit_roundoff = 0x1p-24;  // u: half of float's epsilon

std::size_t vector_width(simd_path path) {
  switch (path) {
    case simd_path::avx512: return 16;
    case simd_path::avx2: return 8;
    case simd_path::sse2: break;
  }
  return 4;
}

// Lengths 0..3W+1 for the widest W (16), so every tail of every path, and
// two long rows (one a multiple of no W).
std::vector<std::size_t> test_lengths() {
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 3 * 16 + 1; ++n) lengths.push_back(n);
  lengths.push_back(1000);
  lengths.push_back(4099);
  return lengths;
}

// Scores uniform in [-spread, spread], a fraction `masked` of them -inf.
std::vector<float> random_row(std::size_t n, float spread, double masked, std::mt19937& generator) {
  std::uniform_real_distribution<float> uniform(-spread, spread);
  std::bernoulli_distribution is_masked(masked);
  std::vector<float> row(n);
  for (float& x : row) x = is_masked(generator) ? -infinity : uniform(generator);
  return row;
}

// The bound on |p - ref| for one probability p_j = exp(d_j) / S, d_j = x_j - max:
//   d_j = fl(x_j - max): relative error u in the argument, |d_j| u in exp(d_j);
//   exp itself: 2 ULP (softmax.hpp), at most 4u relative;
//   S: n - 1 roundings of a sum of positive terms ((n - 1) u; adding the
//      zero padding is exact), plus the terms' own errors, a weighted mean
//      of (4 + |d_j|) u that is below (4 + n / e) u since |d| e^d <= 1/e
//      and S >= 1;
//   1 / S and the multiply: 2u.
// Together (10 + 2n + |d_j|) u relative. Each online block or merge adds a
// correction factor (exp: 4u, its argument's error telescopes into |d_j|),
// the multiply by it, and two roundings in the running sum: `extra` = 14u
// per block or merge. Plus an absolute FLT_MIN: exp flushes results below
// ~8.4e-39 to 0 and rounds subnormal results absolutely. Masked entries must
// be exactly +0; a NaN reference needs a NaN. Written so that NaN fails.
std::size_t count_mismatches(const float* got, const std::vector<float>& input,
                             const kvhead::reference::softmax_result& reference, double extra) {
  const std::size_t n = input.size();
  std::size_t failures = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const double expected = reference.value[j];
    if (std::isnan(expected)) {
      if (!std::isnan(got[j])) ++failures;
      continue;
    }
    if (input[j] == -infinity) {
      if (std::bit_cast<std::uint32_t>(got[j]) != 0u) ++failures;
      continue;
    }
    const double relative = (10.0 + 2.0 * double(n) + extra + std::fabs(reference.shifted[j])) * unit_roundoff;
    const double bound = relative * expected + double(std::numeric_limits<float>::min());
    if (!(std::fabs(double(got[j]) - expected) <= bound)) ++failures;
  }
  return failures;
}

// sum_j exp(x_j - max) in double (the running sum the online state holds);
// 0 when every x_j is masked.
double reference_sum(const std::vector<float>& row) {
  float max = -infinity;
  for (float x : row) max = std::max(max, x);
  if (max == -infinity) return 0.0;
  double sum = 0.0;
  for (float x : row) sum += std::exp(double(x) - double(max));
  return sum;
}

// A running sum within `relative` of the reference; exactly 0 when nothing is visible.
bool sum_close(float sum, double expected, double relative) {
  if (expected == 0.0) return sum == 0.0f;
  return std::fabs(double(sum) / expected - 1.0) <= relative;
}

// Folds keys [begin, end) of `row` into `state` in blocks of `block`, the
// way tiled attention does with V = identity: the accumulator has one column
// per key, so acc[j] ends as exp(x_j - max), and normalizing it gives the
// softmax row. Returns the number of blocks.
std::size_t fold_keys(const std::vector<float>& row, std::size_t begin, std::size_t end, std::size_t block,
                      std::vector<float>& acc, softmax_partial& state, simd_path path) {
  std::size_t blocks = 0;
  for (std::size_t start = begin; start < end; start += block, ++blocks) {
    const std::size_t length = std::min(block, end - start);
    std::vector<float> scores(row.begin() + std::ptrdiff_t(start), row.begin() + std::ptrdiff_t(start + length));
    const float correction = online_softmax_block(scores.data(), length, state, path);
    scale_floats(acc.data() + begin, start - begin, correction, path);
    std::copy(scores.begin(), scores.end(), acc.begin() + std::ptrdiff_t(start));
  }
  return blocks;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

bool same_bits(float a, float b) { return same_bits(&a, &b, 1); }

}  // namespace

TEST_CASE("softmax_row matches the double reference for lengths 0..49, 1000 and 4099, every path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(20240611);
    for (std::size_t n : test_lengths()) {
      for (double masked : {0.0, 0.3}) {
        for (float spread : {1.0f, 30.0f}) {
          INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n << " masked=" << masked << " spread=" << spread);
          // A buffer of exactly n floats: the sanitizer build catches any
          // access past it.
          const std::vector<float> input = random_row(n, spread, masked, generator);
          std::vector<float> row = input;
          softmax_row(row.data(), n, path);
          CHECK(count_mismatches(row.data(), input, kvhead::reference::softmax(input.data(), n), 0.0) == 0);
        }
      }
    }
  }
}

TEST_CASE("softmax_row_with_sink matches the double reference, and sink -inf gives softmax_row's bits, every path") {
  // The sink adds one term to the sum: its exp (4u) and argument (|sink -
  // max| u), weighted by its share of the sum (<= 1), and one more rounding
  // of the sum: `extra` 6u, plus the argument term below.
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(424242);
    for (std::size_t n : test_lengths())
      for (double masked : {0.0, 0.3, 1.0})
        for (float sink : {-3.0f, 0.0f, 2.5f, 40.0f}) {
          INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n << " masked=" << masked
                       << " sink=" << sink);
          const std::vector<float> input = random_row(n, 10.0f, masked, generator);
          std::vector<float> row = input;
          softmax_row_with_sink(row.data(), n, sink, path);
          const auto reference = kvhead::reference::softmax(input.data(), n, sink);
          double max = sink;
          for (float x : input) max = std::max(max, double(x));
          CHECK(count_mismatches(row.data(), input, reference, 6.0 + std::fabs(double(sink) - max)) == 0);
          if (masked == 1.0)  // the sink takes all the mass
            CHECK(std::all_of(row.begin(), row.end(), [](float x) { return std::bit_cast<std::uint32_t>(x) == 0u; }));
          std::vector<float> plain = input, no_sink = input;
          softmax_row(plain.data(), n, path);
          softmax_row_with_sink(no_sink.data(), n, -infinity, path);
          CHECK(same_bits(plain.data(), no_sink.data(), n));
        }
  }
}

TEST_CASE("softmax_row writes nothing outside its n floats, every path") {
  const float sentinel = std::bit_cast<float>(0x7fa5'a5a5u);
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(5);
    for (std::size_t n = 0; n <= 49; ++n) {
      for (std::size_t offset = 0; offset < 17; ++offset) {
        std::vector<float> buffer(offset + n + 17, sentinel);
        const std::vector<float> input = random_row(n, 5.0f, 0.2, generator);
        std::copy(input.begin(), input.end(), buffer.begin() + std::ptrdiff_t(offset));
        softmax_row(buffer.data() + offset, n, path);
        std::size_t touched = 0;
        for (std::size_t i = 0; i < buffer.size(); ++i)
          if ((i < offset || i >= offset + n) && !same_bits(buffer[i], sentinel)) ++touched;
        INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n << " offset=" << offset);
        CHECK(touched == 0);
      }
    }
  }
}

TEST_CASE("softmax_row extreme values: +-88, huge logits, masks, a single visible entry, NaN and +inf") {
  const std::vector<std::size_t> lengths = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 49, 1000};
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(99);
    for (std::size_t n : lengths) {
      INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n);
      auto check_against_reference = [&](const std::vector<float>& input) {
        std::vector<float> row = input;
        softmax_row(row.data(), n, path);
        return count_mismatches(row.data(), input, kvhead::reference::softmax(input.data(), n), 0.0);
      };
      auto softmax_of = [&](std::vector<float> row) {
        softmax_row(row.data(), n, path);
        return row;
      };

      // Fully masked: zeros (+0), never NaN.
      const std::vector<float> masked_out = softmax_of(std::vector<float>(n, -infinity));
      CHECK(std::all_of(masked_out.begin(), masked_out.end(),
                        [](float p) { return std::bit_cast<std::uint32_t>(p) == 0u; }));

      // Alternating +-88, and the float extremes (their difference overflows to -inf).
      std::vector<float> edges(n);
      for (std::size_t j = 0; j < n; ++j) edges[j] = j % 2 == 0 ? 88.0f : -88.0f;
      CHECK(check_against_reference(edges) == 0);
      for (std::size_t j = 0; j < n; ++j)
        edges[j] = j % 3 == 0 ? std::numeric_limits<float>::max() : std::numeric_limits<float>::lowest();
      CHECK(check_against_reference(edges) == 0);

      // Equal logits: 1/n each.
      CHECK(check_against_reference(std::vector<float>(n, 7.5f)) == 0);

      const std::vector<std::size_t> positions = {0, n / 2, n - 1};
      for (std::size_t position : positions) {
        INFO("position " << position);
        // One huge logit among ordinary ones takes all the mass.
        std::vector<float> huge = random_row(n, 10.0f, 0.2, generator);
        huge[position] = 1e30f;
        const std::vector<float> huge_out = softmax_of(huge);
        CHECK(huge_out[position] == 1.0f);
        CHECK(check_against_reference(huge) == 0);
        // A single visible entry, whatever its value, is exactly 1.
        for (float value : {-1e30f, -88.0f, 0.0f, 88.0f, 1e30f}) {
          std::vector<float> single(n, -infinity);
          single[position] = value;
          const std::vector<float> single_out = softmax_of(single);
          std::size_t wrong = 0;
          for (std::size_t j = 0; j < n; ++j)
            if (!same_bits(single_out[j], j == position ? 1.0f : 0.0f)) ++wrong;
          CHECK(wrong == 0);
        }
        // NaN or +inf anywhere: the whole row is NaN, even when the rest is masked.
        for (float poison : {nan_value, infinity}) {
          for (double masked : {0.0, 1.0}) {
            std::vector<float> poisoned = random_row(n, 10.0f, masked, generator);
            poisoned[position] = poison;
            const std::vector<float> poisoned_out = softmax_of(poisoned);
            CHECK(std::all_of(poisoned_out.begin(), poisoned_out.end(), [](float p) { return std::isnan(p); }));
          }
        }
      }
    }
    // n = 0 is a no-op (a null row is fine).
    softmax_row(nullptr, 0, path);
  }
}

TEST_CASE("online_softmax_block over blocks of any size equals the one-shot softmax, every path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    const std::size_t width = vector_width(path);
    const std::vector<std::size_t> blocks = {1, 2, 3, width - 1, width, width + 1, 2 * width + 3, 64, 100, 5000};
    std::mt19937 generator(31);
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{49}, std::size_t{1000}, std::size_t{4099}}) {
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<float> row = random_row(n, 20.0f, pattern == 1 ? 0.3 : 0.0, generator);
        if (pattern == 2) {
          // Rising scores (the max changes in every block, so every block
          // rescales), the first third masked (blocks with nothing visible).
          for (std::size_t j = 0; j < n; ++j) row[j] = j < n / 3 ? -infinity : 0.05f * float(j) + 0.1f * row[j];
        }
        const auto reference = kvhead::reference::softmax(row.data(), n);
        for (std::size_t block : blocks) {
          INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n << " block=" << block << " pattern=" << pattern);
          std::vector<float> acc(n, 0.0f), out(n);
          softmax_partial state;
          const std::size_t count = fold_keys(row, 0, n, block, acc, state, path);
          normalize_row(acc.data(), state.sum, out.data(), n, path);
          CHECK(count_mismatches(out.data(), row, reference, 14.0 * double(count)) == 0);
          CHECK(state.max == *std::max_element(row.begin(), row.end()));
          const double sum_bound = (10.0 + 2.0 * double(n) + 14.0 * double(count)) * unit_roundoff;
          CHECK(sum_close(state.sum, reference_sum(row), sum_bound));
        }
      }
    }
  }
}

TEST_CASE("online_softmax_block: masked blocks, the returned correction, n = 0, NaN") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    INFO("path " << std::string(kvhead::to_string(path)));
    softmax_partial state;
    // n = 0: nothing changes, correction 1.
    CHECK(online_softmax_block(nullptr, 0, state, path) == 1.0f);
    CHECK(state.max == -infinity);
    CHECK(state.sum == 0.0f);

    // Nothing visible yet: scores become +0, state unchanged, correction 1.
    for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{17}}) {
      std::vector<float> masked(n, -infinity);
      CHECK(online_softmax_block(masked.data(), n, state, path) == 1.0f);
      CHECK(std::all_of(masked.begin(), masked.end(), [](float p) { return std::bit_cast<std::uint32_t>(p) == 0u; }));
      CHECK(state.max == -infinity);
      CHECK(same_bits(state.sum, 0.0f));
    }

    // The first visible block: correction exp(-inf) = 0 (the accumulator is
    // still all zeros), max and sum of the block.
    std::vector<float> first = {1.0f, -infinity, 3.0f, 2.0f, -1.0f};
    const std::vector<float> first_input = first;
    CHECK(online_softmax_block(first.data(), first.size(), state, path) == 0.0f);
    CHECK(state.max == 3.0f);
    CHECK(first[2] == 1.0f);
    CHECK(first[1] == 0.0f);
    CHECK(sum_close(state.sum, reference_sum(first_input), 20 * unit_roundoff));

    // A block with a larger max: correction exp(3 - 5), sum rescaled.
    const softmax_partial before = state;
    std::vector<float> second = {5.0f, 4.0f, -infinity};
    const float correction = online_softmax_block(second.data(), second.size(), state, path);
    CHECK(std::fabs(double(correction) / std::exp(-2.0) - 1.0) <= 6 * unit_roundoff);
    CHECK(state.max == 5.0f);
    const double expected_sum = double(before.sum) * std::exp(-2.0) + 1.0 + std::exp(-1.0);
    CHECK(std::fabs(double(state.sum) / expected_sum - 1.0) <= 20 * unit_roundoff);

    // A fully masked block after visible ones: zeros, correction 1, state bit-identical.
    const softmax_partial visible = state;
    std::vector<float> masked_after(9, -infinity);
    CHECK(online_softmax_block(masked_after.data(), masked_after.size(), state, path) == 1.0f);
    CHECK(same_bits(state.max, visible.max));
    CHECK(same_bits(state.sum, visible.sum));
    CHECK(std::all_of(masked_after.begin(), masked_after.end(), [](float p) { return p == 0.0f; }));

    // A block with a smaller max: correction exactly 1.
    std::vector<float> lower = {0.0f, 1.0f};
    CHECK(online_softmax_block(lower.data(), lower.size(), state, path) == 1.0f);

    // NaN in a block: the running sum becomes NaN, so the row normalizes to NaN.
    for (bool visible_before : {false, true}) {
      softmax_partial poisoned;
      if (visible_before) poisoned = visible;
      std::vector<float> with_nan = {-infinity, nan_value, -infinity};
      online_softmax_block(with_nan.data(), with_nan.size(), poisoned, path);
      CHECK(std::isnan(poisoned.sum));
      std::vector<float> acc(4, 0.0f), out(4);
      normalize_row(acc.data(), poisoned.sum, out.data(), out.size(), path);
      CHECK(std::all_of(out.begin(), out.end(), [](float p) { return std::isnan(p); }));
    }
  }
}

TEST_CASE("merge_partials of two halves equals the one-shot softmax, either order, every path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    const std::size_t width = vector_width(path);
    std::mt19937 generator(77);
    for (std::size_t n : {std::size_t{2}, std::size_t{17}, std::size_t{49}, std::size_t{1000}, std::size_t{4099}}) {
      const std::vector<float> row = random_row(n, 20.0f, 0.2, generator);
      const auto reference = kvhead::reference::softmax(row.data(), n);
      for (std::size_t split : {std::size_t{1}, std::min(width, n - 1), n / 2, n - 1}) {
        for (std::size_t block : {width + 1, std::size_t{64}}) {
          for (bool a_first : {true, false}) {
            INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n << " split=" << split << " block=" << block
                         << " a_first=" << a_first);
            // a holds keys [0, split) and b the rest, or the other way round.
            const std::size_t a_begin = a_first ? 0 : split, a_end = a_first ? split : n;
            const std::size_t b_begin = a_first ? split : 0, b_end = a_first ? n : split;
            std::vector<float> acc_a(n, 0.0f), acc_b(n, 0.0f), out(n);
            softmax_partial a, b;
            const std::size_t count = fold_keys(row, a_begin, a_end, block, acc_a, a, path) +
                                      fold_keys(row, b_begin, b_end, block, acc_b, b, path);
            merge_partials(a, acc_a.data(), b, acc_b.data(), n, path);
            normalize_row(acc_a.data(), a.sum, out.data(), n, path);
            CHECK(count_mismatches(out.data(), row, reference, 14.0 * double(count + 1)) == 0);
            CHECK(a.max == *std::max_element(row.begin(), row.end()));
            const double sum_bound = (10.0 + 2.0 * double(n) + 14.0 * double(count + 1)) * unit_roundoff;
            CHECK(sum_close(a.sum, reference_sum(row), sum_bound));
          }
        }
      }
    }
  }
}

TEST_CASE("merge_partials with a fully masked side, every path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(3);
    for (std::size_t d : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{33}, std::size_t{128}}) {
      INFO("path " << std::string(kvhead::to_string(path)) << " d=" << d);
      const softmax_partial visible{2.5f, 3.25f};
      const softmax_partial masked;
      std::vector<float> values = random_row(d, 4.0f, 0.0, generator);
      values[d / 2] = -0.0f;  // kept as -0 (0 * 0 + -0 would give +0)

      // a masked, b visible: a becomes b, bit for bit.
      softmax_partial a = masked;
      std::vector<float> acc_a(d, 0.0f);
      merge_partials(a, acc_a.data(), visible, values.data(), d, path);
      CHECK(same_bits(a.max, visible.max));
      CHECK(same_bits(a.sum, visible.sum));
      CHECK(same_bits(acc_a.data(), values.data(), d));
      // ...but a NaN in a's accumulator (0 * NaN from a value behind a mask) stays.
      a = masked;
      std::fill(acc_a.begin(), acc_a.end(), 0.0f);
      acc_a[d - 1] = nan_value;
      merge_partials(a, acc_a.data(), visible, values.data(), d, path);
      CHECK(std::isnan(acc_a[d - 1]));
      CHECK(same_bits(acc_a.data(), values.data(), d - 1));

      // b masked: a unchanged.
      a = visible;
      acc_a = values;
      const std::vector<float> zeros(d, 0.0f);
      merge_partials(a, acc_a.data(), masked, zeros.data(), d, path);
      CHECK(same_bits(a.max, visible.max));
      CHECK(same_bits(a.sum, visible.sum));
      CHECK(same_bits(acc_a.data(), values.data(), d));
      // ...but its NaN (0 * NaN behind the mask) joins.
      std::vector<float> masked_nan(d, 0.0f);
      masked_nan[0] = nan_value;
      merge_partials(a, acc_a.data(), masked, masked_nan.data(), d, path);
      CHECK(std::isnan(acc_a[0]));
      CHECK(same_bits(acc_a.data() + 1, values.data() + 1, d - 1));
      acc_a = values;

      // Both masked: a's NaN stays, and b's NaN joins it (the chunk with the
      // masked NaN value may come first or later: the same result).
      a = masked;
      std::vector<float> untouched(d, nan_value);
      merge_partials(a, untouched.data(), masked, zeros.data(), d, path);
      CHECK(a.max == -infinity);
      CHECK(same_bits(a.sum, 0.0f));
      CHECK(std::all_of(untouched.begin(), untouched.end(), [](float x) { return std::isnan(x); }));
      std::vector<float> clean(d, 0.0f);
      merge_partials(a, clean.data(), masked, untouched.data(), d, path);
      CHECK(std::all_of(clean.begin(), clean.end(), [](float x) { return std::isnan(x); }));
      // ...and normalizing it (sum 0) gives zeros.
      std::vector<float> out(d, 1.0f);
      normalize_row(zeros.data(), a.sum, out.data(), d, path);
      CHECK(out == zeros);

      // A side whose scores were all NaN (max -inf, sum NaN) keeps its NaN.
      a = masked;
      merge_partials(a, acc_a.data(), softmax_partial{-infinity, nan_value}, zeros.data(), d, path);
      CHECK(std::isnan(a.sum));
      normalize_row(zeros.data(), a.sum, out.data(), d, path);
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isnan(x); }));
    }
  }
}

TEST_CASE("normalize_row: acc / sum within two roundings, in place, sum 0 gives zeros, every path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(11);
    for (std::size_t d = 0; d <= 49; ++d) {
      INFO("path " << std::string(kvhead::to_string(path)) << " d=" << d);
      const std::vector<float> acc = random_row(d, 100.0f, 0.0, generator);
      for (float sum : {1.0f, 3.0f, 1234.5f, 1e-3f}) {
        std::vector<float> out(d);
        normalize_row(acc.data(), sum, out.data(), d, path);
        std::size_t failures = 0;
        const float inverse = 1.0f / sum;
        for (std::size_t i = 0; i < d; ++i) {
          const double expected = double(acc[i]) / double(sum);  // one reciprocal, one multiply: 2u
          if (!(std::fabs(double(out[i]) - expected) <= 2.0 * unit_roundoff * std::fabs(expected))) ++failures;
          if (!same_bits(out[i], acc[i] * inverse)) ++failures;  // exactly that, on every path
        }
        CHECK(failures == 0);
        std::vector<float> in_place = acc;
        normalize_row(in_place.data(), sum, in_place.data(), d, path);
        CHECK(same_bits(in_place.data(), out.data(), d));
      }
      // No visible key: zeros, whatever the accumulator holds.
      for (float fill : {0.0f, -0.0f, nan_value, infinity}) {
        const std::vector<float> zero_acc(d, fill);
        std::vector<float> out(d, nan_value);
        normalize_row(zero_acc.data(), 0.0f, out.data(), d, path);
        CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::bit_cast<std::uint32_t>(x) == 0u; }));
      }
    }
  }
}

TEST_CASE("normalize_row_with_sink: acc f / (sum f + g) within its bound, nothing visible gives zeros, every path") {
  // f = exp(max - m), g = exp(sink - m): 4u each plus their arguments'
  // rounding (|max - m| u, |sink - m| u); then the product, the add, the
  // division and the multiply: 4u more.
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(12);
    for (std::size_t d = 0; d <= 49; ++d) {
      INFO("path " << std::string(kvhead::to_string(path)) << " d=" << d);
      const std::vector<float> acc = random_row(d, 100.0f, 0.0, generator);
      for (const softmax_partial state : {softmax_partial{0.5f, 3.0f}, softmax_partial{-20.0f, 1.0f},
                                          softmax_partial{60.0f, 1234.5f}})
        for (float sink : {-100.0f, -1.0f, 0.5f, 7.0f, 80.0f}) {
          std::vector<float> out(d);
          normalize_row_with_sink(acc.data(), state, sink, out.data(), d, path);
          const double m = std::max(double(state.max), double(sink));
          const double f = std::exp(double(state.max) - m), g = std::exp(double(sink) - m);
          const double relative =
              (12.0 + std::fabs(double(state.max) - m) + std::fabs(double(sink) - m)) * unit_roundoff;
          std::size_t failures = 0;
          for (std::size_t i = 0; i < d; ++i) {
            const double expected = double(acc[i]) * f / (double(state.sum) * f + g);
            if (!(std::fabs(double(out[i]) - expected) <=
                  relative * std::fabs(expected) + double(std::numeric_limits<float>::min())))
              ++failures;
          }
          CHECK(failures == 0);
          std::vector<float> in_place = acc;
          normalize_row_with_sink(in_place.data(), state, sink, in_place.data(), d, path);
          CHECK(same_bits(in_place.data(), out.data(), d));
        }
      // No visible key (the empty partial, accumulator 0): zeros; a NaN sum: NaN.
      const std::vector<float> zero_acc(d, 0.0f);
      std::vector<float> out(d, nan_value);
      normalize_row_with_sink(zero_acc.data(), softmax_partial{}, 1.5f, out.data(), d, path);
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
      normalize_row_with_sink(zero_acc.data(), softmax_partial{-infinity, nan_value}, 1.5f, out.data(), d, path);
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isnan(x); }));
    }
  }
}

TEST_CASE("scale_floats: one exact multiply per element, lengths 0..49, neighbours untouched, every path") {
  const float sentinel = std::bit_cast<float>(0x7fa5'a5a5u);
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(13);
    for (std::size_t n = 0; n <= 49; ++n) {
      for (float factor : {0.0f, 0.5f, 0.3f, 1.0f, 7.0f}) {
        const std::vector<float> values = random_row(n, 50.0f, 0.0, generator);
        std::vector<float> buffer(n + 32, sentinel);
        std::copy(values.begin(), values.end(), buffer.begin() + 16);
        scale_floats(buffer.data() + 16, n, factor, path);
        std::size_t failures = 0;
        for (std::size_t i = 0; i < buffer.size(); ++i) {
          const bool inside = i >= 16 && i < 16 + n;
          if (!same_bits(buffer[i], inside ? values[i - 16] * factor : sentinel)) ++failures;
        }
        INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n << " factor=" << factor);
        CHECK(failures == 0);
      }
    }
  }
}

TEST_CASE("multiply_floats: one exact multiply per element, lengths 0..49, neighbours untouched, every path") {
  const float sentinel = std::bit_cast<float>(0x7fa5'a5a5u);
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(17);
    for (std::size_t n = 0; n <= 49; ++n) {
      const std::vector<float> values = random_row(n, 50.0f, 0.0, generator);
      std::vector<float> factors = random_row(n, 3.0f, 0.0, generator);
      if (n > 2) {  // 0 * x and x * inf as the scalar loop gives them
        factors[1] = 0.0f;
        factors[2] = INFINITY;
      }
      std::vector<float> buffer(n + 32, sentinel);
      std::copy(values.begin(), values.end(), buffer.begin() + 16);
      multiply_floats(buffer.data() + 16, factors.data(), n, path);
      std::size_t failures = 0;
      for (std::size_t i = 0; i < buffer.size(); ++i) {
        const bool inside = i >= 16 && i < 16 + n;
        if (!same_bits(buffer[i], inside ? values[i - 16] * factors[i - 16] : sentinel)) ++failures;
      }
      INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n);
      CHECK(failures == 0);
    }
  }
}

TEST_CASE("round_floats_to_bf16: nearest even bf16 per element, special values, lengths 0..49, every path") {
  namespace ref = kvhead::reference;
  const float sentinel = std::bit_cast<float>(0x7fa5'a5a5u);
  // Ties both ways, the largest finite bf16 and just past it, subnormals,
  // zeros, infinities and NaNs with payloads, then random values of all sizes.
  std::vector<float> special;
  for (const std::uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0xbf808001u, 0x7f7f7fffu, 0x7f7f8000u,
                                   0x7f7fffffu, 0x00008000u, 0x00018000u, 0x807fffffu, 0x00000001u, 0x00000000u,
                                   0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u, 0x7f800001u})
    special.push_back(std::bit_cast<float>(bits));
  std::mt19937 generator(23);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 4000; ++i) special.push_back(std::bit_cast<float>(any_bits(generator)));
  auto rounded_right = [&](float in, float out) {
    if (std::isnan(in)) return std::isnan(out);
    return std::bit_cast<std::uint32_t>(out) == std::uint32_t{ref::round_to_bf16(in)} << 16;
  };
  for (simd_path path : kvhead::supported_simd_paths()) {
    INFO("path " << std::string(kvhead::to_string(path)));
    std::vector<float> out(special.size());
    round_floats_to_bf16(special.data(), out.data(), special.size(), path);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < special.size(); ++i) wrong += !rounded_right(special[i], out[i]);
    CHECK(wrong == 0);
    for (std::size_t n = 0; n <= 49; ++n) {  // tails, in place, neighbours untouched
      std::vector<float> buffer(n + 32, sentinel);
      std::copy(special.begin() + 20, special.begin() + 20 + std::ptrdiff_t(n), buffer.begin() + 16);
      round_floats_to_bf16(buffer.data() + 16, buffer.data() + 16, n, path);
      std::size_t failures = 0;
      for (std::size_t i = 0; i < buffer.size(); ++i) {
        const bool inside = i >= 16 && i < 16 + n;
        failures += inside ? !rounded_right(special[20 + i - 16], buffer[i]) : !same_bits(buffer[i], sentinel);
      }
      INFO("n=" << n);
      CHECK(failures == 0);
    }
  }
}

TEST_CASE("softmax determinism: bit-identical results at any offset, inside longer buffers, every path") {
  for (simd_path path : kvhead::supported_simd_paths()) {
    std::mt19937 generator(17);
    for (std::size_t n : {std::size_t{5}, std::size_t{17}, std::size_t{49}, std::size_t{1000}}) {
      const std::vector<float> row = random_row(n, 20.0f, 0.2, generator);
      const std::vector<float> other = random_row(n, 3.0f, 0.0, generator);
      const softmax_partial start{1.5f, 2.75f};

      // Results in buffers of exactly n floats.
      std::vector<float> softmax_expected = row, exp_expected(n), block_expected = row;
      softmax_row(softmax_expected.data(), n, path);
      exp_floats(row.data(), exp_expected.data(), n, path);
      softmax_partial block_state = start;
      const float block_correction = online_softmax_block(block_expected.data(), n, block_state, path);
      std::vector<float> merge_expected = other;
      softmax_partial merged = start;
      merge_partials(merged, merge_expected.data(), softmax_partial{2.0f, 1.0f}, row.data(), n, path);

      // The same inputs at every offset of a longer buffer whose neighbours
      // hold other values (including NaN and infinities).
      const std::vector<float> garbage = {nan_value, infinity, -infinity, 1e30f, -1e30f, 0.0f, 88.0f};
      for (std::size_t offset = 0; offset <= 17; ++offset) {
        INFO("path " << std::string(kvhead::to_string(path)) << " n=" << n << " offset=" << offset);
        std::vector<float> buffer(offset + n + 23);
        for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = garbage[(i + offset) % garbage.size()];
        float* const at = buffer.data() + offset;

        std::copy(row.begin(), row.end(), at);
        softmax_row(at, n, path);
        CHECK(same_bits(at, softmax_expected.data(), n));

        std::copy(row.begin(), row.end(), at);
        exp_floats(at, at, n, path);
        CHECK(same_bits(at, exp_expected.data(), n));

        std::copy(row.begin(), row.end(), at);
        softmax_partial state = start;
        CHECK(same_bits(online_softmax_block(at, n, state, path), block_correction));
        CHECK(same_bits(at, block_expected.data(), n));
        CHECK(same_bits(state.sum, block_state.sum));
        CHECK(same_bits(state.max, block_state.max));

        std::vector<float> b_buffer(n + 2 * offset + 1, nan_value);
        std::copy(row.begin(), row.end(), b_buffer.begin() + std::ptrdiff_t(2 * offset));
        std::copy(other.begin(), other.end(), at);
        softmax_partial a = start;
        merge_partials(a, at, softmax_partial{2.0f, 1.0f}, b_buffer.data() + 2 * offset, n, path);
        CHECK(same_bits(at, merge_expected.data(), n));
        CHECK(same_bits(a.sum, merged.sum));

        std::vector<float> out(n + offset);
        normalize_row(at, 3.0f, out.data() + offset, n, path);
        std::vector<float> out_expected(n);
        normalize_row(merge_expected.data(), 3.0f, out_expected.data(), n, path);
        CHECK(same_bits(out.data() + offset, out_expected.data(), n));
      }
    }
  }
}
