// Under ThreadSanitizer, oneTBB runs no worker thread: every thread that calls
// into kvhead is alone in its task arena and runs all of its tasks itself.
// Debian's oneTBB is not built with TSan, so TSan cannot see the
// synchronization inside libtbb.so.12 and reports races between a task and
// the thread that split or spawned it in correct parallel_for code. With one
// thread per arena, what TSan checks is kvhead's own synchronization between
// the caller threads (the cache's lock, copy-on-write ordering, the
// per-thread scratch, the shared RoPE tables). Other builds are unaffected.
#include <memory>

#include <tbb/global_control.h>

#include "tests/thread_sanitizer.hpp"

namespace {

const auto tsan_limit =
    kvhead::testing::under_thread_sanitizer
        ? std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, 1)
        : nullptr;

}  // namespace
