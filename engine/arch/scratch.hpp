// Per-thread reusable memory that is safe under oneTBB work stealing.
//
// A thread waiting inside parallel_for may steal and run another task that
// asks for scratch too, so a single thread_local buffer could be handed out
// twice. Each thread keeps a stack of objects per type instead: a lease takes
// the next free level and gives it back on destruction. Objects are kept
// (buffers only grow, vectors keep their capacity), so steady-state calls
// allocate nothing.
//
// Release. Every thread's stacks are listed in one process-wide registry, so
// kvhead::release_scratch() (kvhead/config.hpp) can free, on all threads, the
// objects no lease holds at that moment. A thread's own mutex guards its
// stacks: the owner takes it for a moment to lease or give back a level,
// release_scratch() to free the levels above the leased ones. A level in use
// is never freed, so release may run at any time.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "engine/arch/aligned_buffer.hpp"

namespace kvhead::engine {

/// One thread's stack of objects of one type, as the registry sees it.
class scratch_stack {
 public:
  /// Frees the objects above the leased levels. Called with the thread's
  /// mutex held.
  virtual void release_unused() = 0;

 protected:
  ~scratch_stack() = default;
};

/// One thread's stacks, registered with the process-wide registry for the
/// thread's lifetime.
class thread_scratch {
 public:
  /// The calling thread's (created and registered at first use).
  static thread_scratch& current();

  std::mutex& mutex() { return mutex_; }
  /// Called with mutex() held, once per stack, when the stack is created
  /// and when it is destroyed (thread exit).
  void add(scratch_stack* stack) { stacks_.push_back(stack); }
  void remove(scratch_stack* stack);
  /// release_unused() on every stack, under mutex().
  void release_unused();

  thread_scratch();
  ~thread_scratch();
  thread_scratch(const thread_scratch&) = delete;
  thread_scratch& operator=(const thread_scratch&) = delete;

 private:
  std::mutex mutex_;
  std::vector<scratch_stack*> stacks_;
};

/// A per-thread reusable T (a set of vectors, say): each live lease on a
/// thread has its own object, kept for the next lease at that level until
/// release_scratch(). If creating the object throws (std::bad_alloc), nothing
/// changes: the lease does not exist and the level stays free.
template <class T>
class reusable {
 public:
  reusable() : stack_(stack()) {
    const std::lock_guard lock(stack_.owner.mutex());
    if (stack_.objects.size() <= stack_.depth) stack_.objects.push_back(std::make_unique<T>());
    object_ = stack_.objects[stack_.depth].get();
    ++stack_.depth;  // only once the object exists
  }
  ~reusable() {
    const std::lock_guard lock(stack_.owner.mutex());
    --stack_.depth;
  }
  reusable(const reusable&) = delete;
  reusable& operator=(const reusable&) = delete;

  T& operator*() const { return *object_; }
  T* operator->() const { return object_; }

 private:
  struct typed_stack final : scratch_stack {
    thread_scratch& owner = thread_scratch::current();  // constructed first, destroyed after
    std::vector<std::unique_ptr<T>> objects;
    std::size_t depth = 0;  // levels leased

    typed_stack() {
      const std::lock_guard lock(owner.mutex());
      owner.add(this);
    }
    ~typed_stack() {
      const std::lock_guard lock(owner.mutex());
      owner.remove(this);
    }
    void release_unused() override { objects.resize(depth); }
  };

  static typed_stack& stack() {
    thread_local typed_stack objects;
    return objects;
  }

  typed_stack& stack_;
  T* object_;
};

/// At least `floats` floats of 64-byte aligned per-thread scratch. If the
/// allocation throws, the level is given back (the buffer member's
/// destructor runs). No floats take no level (data() is null): a decode
/// step's fp32 products lease nothing for the A they read in place. A lease
/// locks the thread's mutex twice and touches lines of thread-local state
/// that the K/V streaming past since the last one has evicted (S1 over a
/// bf16 cache, Xeon: the mutex alone 0.8% of a step's samples in perf, two
/// leases per chunk and kv head; none with this).
class scratch_lease {
 public:
  explicit scratch_lease(std::size_t floats) {
    if (floats != 0) data_ = buffer_.emplace()->reserve(floats);
  }

  float* data() const { return data_; }

 private:
  std::optional<reusable<aligned_buffer>> buffer_;
  float* data_ = nullptr;
};

}  // namespace kvhead::engine
