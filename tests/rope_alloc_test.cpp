// The lifetime of RoPE's shared cos/sin tables (engine/attention/rope.hpp),
// with the bytes held counted by tests/counting_new.cpp: a table lives as long
// as a rope using its frequencies, and a call whose rows all lie past the
// table's 2^17 positions grows none.
#include <doctest/doctest.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "engine/attention/rope.hpp"
#include "tests/counting_new.hpp"

namespace {

namespace testing = kvhead::testing;

constexpr std::size_t head_dim = 128;
constexpr std::size_t full_table_bytes = (std::size_t{1} << 17) * head_dim * sizeof(float);  // 64 MiB

// Rotates one row at `position` (the table grows to cover it, if it can).
void rotate_at(const kvhead::engine::rope& rope, std::size_t position) {
  std::vector<float> row(head_dim, 1.0f);
  rope.apply(row.data(), 1, head_dim, 1, &position);
}

}  // namespace

TEST_CASE("rope alloc: a table lives as long as a rope with its frequencies, and is shared while it does") {
  // Thetas no other test uses: their tables do not exist before.
  const std::size_t before = testing::live_bytes();
  std::optional<kvhead::engine::rope> first(std::in_place, head_dim, 10007.0);
  rotate_at(*first, 100000);  // grows the table to its 2^17 positions
  const std::size_t with_table = testing::live_bytes();
  CHECK(with_table >= before + full_table_bytes);
  {
    const kvhead::engine::rope same(head_dim, 10007.0);  // the same frequencies: the same table
    rotate_at(same, 120000);
    CHECK(testing::live_bytes() < with_table + (1u << 20));
  }
  CHECK(testing::live_bytes() < with_table + (1u << 20));  // the first rope still holds it
  first.reset();
  CHECK(testing::live_bytes() < before + (1u << 20));  // freed with the last rope using it
  for (int layer = 0; layer < 8; ++layer) {  // layers of 8 thetas, one after another: one table at a time
    const kvhead::engine::rope rope(head_dim, 20011.0 + layer);
    rotate_at(rope, 100000);
    CHECK(testing::live_bytes() < before + full_table_bytes + (4u << 20));
  }
  CHECK(testing::live_bytes() < before + (1u << 20));
}

TEST_CASE("rope alloc: rows past the table's positions alone grow no table") {
  const std::size_t before = testing::live_bytes();
  const kvhead::engine::rope rope(head_dim, 30011.0);
  rotate_at(rope, std::size_t{1} << 31);
  CHECK(testing::live_bytes() < before + (1u << 20));
  rotate_at(rope, 5000);  // within it: a table of 8192 positions (the power of two at or above twice 5000)
  CHECK(testing::live_bytes() >= before + 8192 * head_dim * sizeof(float));
  CHECK(testing::live_bytes() < before + full_table_bytes);
}
