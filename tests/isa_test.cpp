#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "kvhead/config.hpp"

TEST_CASE("supported SIMD paths: best first, sse2 always, the active one among them") {
  const auto paths = kvhead::supported_simd_paths();
  REQUIRE(!paths.empty());
  CHECK(paths.back() == kvhead::simd_path::sse2);
  CHECK(std::is_sorted(paths.begin(), paths.end()));
  CHECK(std::find(paths.begin(), paths.end(), kvhead::active_simd_path()) != paths.end());
  MESSAGE("active SIMD path: " << std::string(kvhead::to_string(kvhead::active_simd_path())));
}
