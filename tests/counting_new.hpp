// The allocation tests' view of the counting global operator new
// (tests/counting_new.cpp, linked only into the alloc_tests executable).
#pragma once

#include <cstddef>

namespace kvhead::testing {

/// Calls of any global operator new so far, in this process.
std::size_t allocation_count();

}  // namespace kvhead::testing
