// RoPE from the shared per-position table gives the bits of the direct
// computation (cos and sin in double per position, rounded to float; the
// rotation in float), across table growth, over many rows in parallel, and
// while several threads grow the same table.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/attention/rope.hpp"
#include "tests/random_values.hpp"
#include "tests/reference/rope_float_reference.hpp"

namespace {

std::vector<float> random_values(std::size_t count, std::mt19937& generator) {
  return kvhead::testing::random_values(count, generator, 1.0f);
}

// Rows at `positions`, `heads` heads each, rows row_stride apart (the floats
// past the heads must stay untouched): the table's bits against the direct ones.
bool matches_direct(const kvhead::engine::rope& rope, std::size_t heads, std::size_t head_dim, double theta,
                    std::size_t row_stride, const std::vector<std::size_t>& positions, std::mt19937& generator) {
  std::vector<float> got = random_values(positions.size() * row_stride, generator), expected = got;
  rope.apply(got.data(), positions.size(), row_stride, heads, positions.data());
  for (std::size_t row = 0; row < positions.size(); ++row)
    kvhead::reference::rope_float(expected.data() + row * row_stride, heads, head_dim, theta, positions[row]);
  return std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("rope: the shared table gives the bits of the direct computation, across its growth") {
  struct setting {
    std::size_t head_dim;
    double theta;
    std::size_t last_position;  // the table reaches up to 4x the last position: large head dims stop early
  };
  const std::vector<std::size_t> positions = {0, 1, 2, 255, 4095, 4096, 4097, 8191, 8192, 20000, 40000};
  for (const setting s : {setting{2, 10000.0, 40000}, setting{16, 10000.0, 40000}, setting{64, 500000.0, 8192},
                          setting{128, 1e6, 4097}, setting{18, 1.5, 8192}}) {
    std::mt19937 generator(static_cast<unsigned>(s.head_dim));
    const kvhead::engine::rope rope(s.head_dim, s.theta), same_key(s.head_dim, s.theta);
    // Increasing positions, each call asking the table to cover more.
    for (std::size_t position : positions) {
      if (position > s.last_position) break;
      INFO("head_dim " << s.head_dim << " theta " << s.theta << " position " << position);
      CHECK(matches_direct(rope, 3, s.head_dim, s.theta, 3 * s.head_dim, {position}, generator));
      CHECK(matches_direct(same_key, 1, s.head_dim, s.theta, s.head_dim + 5, {position, 0, position / 2}, generator));
    }
  }
}

TEST_CASE("rope: many rows at once (split over tasks) equal row by row, theta 0 leaves rows as they are") {
  std::mt19937 generator(3);
  const kvhead::engine::rope rope(64, 10000.0);
  std::vector<std::size_t> positions(700);
  for (std::size_t& position : positions) position = generator() % 6000;
  // 12 heads (q and k of a fused projection) in rows of 16 heads.
  CHECK(matches_direct(rope, 12, 64, 10000.0, 16 * 64, positions, generator));

  const kvhead::engine::rope none(64, 0.0);
  std::vector<float> x = random_values(4 * 64, generator);
  const std::vector<float> before = x;
  none.apply(x.data(), 4, 64, 1, positions.data());
  CHECK(x == before);
}

TEST_CASE("rope: threads growing one table at the same time all get the direct bits") {
  constexpr double theta = 777.0;  // a key no other test uses: its table starts empty
  constexpr std::size_t head_dim = 8;
  std::vector<int> results(4, 0);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] {
      std::mt19937 generator(static_cast<unsigned>(t));
      const kvhead::engine::rope rope(head_dim, theta);
      bool all = true;
      for (std::size_t position = t; position < 70000; position = position * 3 / 2 + 1 + t)
        all = all && matches_direct(rope, 2, head_dim, theta, 2 * head_dim, {position, position / 3}, generator);
      results[t] = all ? 1 : 0;
    });
  for (std::thread& thread : threads) thread.join();
  for (int result : results) CHECK(result == 1);
}

TEST_CASE("rope: positions past the table's 2^17 positions, up to SIZE_MAX, give the direct bits") {
  constexpr double theta = 313.0;  // a key of its own
  constexpr std::size_t head_dim = 6;
  std::mt19937 generator(17);
  const kvhead::engine::rope rope(head_dim, theta);
  const std::size_t limit = std::size_t{1} << 17;
  for (std::size_t position : {limit - 1, limit, limit + 1, std::size_t{1} << 40, SIZE_MAX - 1, SIZE_MAX}) {
    INFO("position " << position);
    CHECK(matches_direct(rope, 2, head_dim, theta, 2 * head_dim, {position, 3, position / 2}, generator));
  }
}
