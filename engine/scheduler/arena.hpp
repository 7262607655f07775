// The thread count set with kvhead::set_num_threads (kvhead/config.hpp) and
// the floating-point environment of kvhead's arithmetic: every public call
// runs its work through run_in_arena.
//
// Floating-point environment. Bit-identical results across threads need the
// same rounding mode and FTZ/DAZ in every thread that computes, and oneTBB
// does not use the caller's: a task runs with the settings its arena captured
// when it was initialized (or that its task_group_context captured), so a
// caller that enabled FTZ after its arena started, or in only some threads,
// would get a mix. kvhead ignores the caller's environment instead: its
// arithmetic runs in the default one (round to nearest, FTZ and DAZ off, every
// exception masked), set on the calling thread by default_fp_environment and
// carried to every worker by the context of the task run_in_arena starts
// (nested parallel_for contexts bind to it and copy its settings).
#pragma once

#include <fpu_control.h>
#include <xmmintrin.h>

#include <memory>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include <tbb/task_arena.h>
#include <tbb/task_group.h>

namespace kvhead::engine {

/// While alive, the calling thread runs in the default floating-point
/// environment: MXCSR 0x1F80 (round to nearest, FTZ/DAZ off, exceptions
/// masked) and the x87 control word _FPU_DEFAULT; the caller's MXCSR (flags
/// included) and control word are restored after. (fegetenv/fesetenv would
/// do the same at about 2 us per call: fnstenv/fldenv are slow.)
class default_fp_environment {
 public:
  static constexpr unsigned default_mxcsr = 0x1F80;

  default_fp_environment() : mxcsr_(_mm_getcsr()) {
    _FPU_GETCW(x87_);
    fpu_control_t x87 = _FPU_DEFAULT;
    _FPU_SETCW(x87);
    _mm_setcsr(default_mxcsr);
  }
  ~default_fp_environment() {
    _mm_setcsr(mxcsr_);
    _FPU_SETCW(x87_);
  }
  default_fp_environment(const default_fp_environment&) = delete;
  default_fp_environment& operator=(const default_fp_environment&) = delete;

 private:
  unsigned mxcsr_;
  fpu_control_t x87_;
};

/// The arena public calls run in, or null: the caller's own.
std::shared_ptr<tbb::task_arena> configured_arena();

/// Runs `work` in the configured arena (or the caller's), as one task whose
/// context holds the default floating-point environment, so that every task
/// it spawns, on any thread, computes in it. Exceptions propagate.
/// Called from a task of the caller's own (a kvhead call in each iteration
/// of a user's parallel_for), the work is cut off from the caller's tasks
/// both ways: its context is isolated, not bound to the caller's, so that an
/// exception in another iteration, which cancels the caller's group, cannot
/// cancel kvhead's loops half done (the call then returned normally with
/// part of its output, and of a cache's K/V, never computed); and the
/// calling thread, while it waits for its tasks, runs none of the caller's
/// (this_task_arena::isolate), so no other kvhead call starts on its stack
/// in the middle of this one (the C API's per-thread batch scratch was
/// overwritten so).
/// A worker thread oneTBB could not start (pthread_create failing: a limit
/// on threads, no memory) comes out of it as std::runtime_error
/// "pthread_create has failed: ..."; kvhead throws std::system_error
/// (errc::resource_unavailable_try_again) instead: a shortage, as bad_alloc
/// is (the C API's KVH_ERR_CAPACITY), not a bug.
template <class Work>
void run_in_arena(const Work& work) {
  const auto run = [&] {
    const default_fp_environment environment;
    tbb::task_group_context context(tbb::task_group_context::isolated);
    context.capture_fp_settings();  // the default environment just set
    tbb::task_group group(context);
    tbb::this_task_arena::isolate([&] { group.run_and_wait(work); });
  };
  try {
    const std::shared_ptr<tbb::task_arena> arena = configured_arena();
    if (arena == nullptr)
      run();
    else
      arena->execute(run);
  } catch (const std::runtime_error& error) {
    if (!std::string_view(error.what()).starts_with("pthread_create")) throw;
    // (what(): "could not start a worker thread (oneTBB's pthread_create failed): <the errc's text>".)
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                            "could not start a worker thread (oneTBB's pthread_create failed)");
  }
}

}  // namespace kvhead::engine
