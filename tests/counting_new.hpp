// The allocation tests' view of the counting global operator new
// (tests/counting_new.cpp, linked only into the alloc_tests executable).
#pragma once

#include <cstddef>

namespace kvhead::testing {

/// Calls of any global operator new so far, in this process.
std::size_t allocation_count();

/// Bytes held by global operator new allocations now (as malloc_usable_size
/// counts them), in this process.
std::size_t live_bytes();

/// On the calling thread only: the next `successes` allocations succeed and
/// every one after them fails (std::bad_alloc, or null from the nothrow
/// forms) until stop_failing().
void fail_allocations_after(std::size_t successes);
void stop_failing();

}  // namespace kvhead::testing
