// Per-thread scratch memory that is safe under oneTBB work stealing.
//
// A thread waiting inside parallel_for may steal and run another task that
// asks for scratch too, so a single thread_local buffer could be handed out
// twice. Each thread keeps a stack of buffers instead: a scratch_lease takes
// the next free level and gives it back on destruction. Buffers only grow, so
// steady-state calls allocate nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/arch/aligned_buffer.hpp"

namespace kvhead::engine {

class scratch_lease {
 public:
  explicit scratch_lease(std::size_t floats) : level_(depth()++) {
    auto& levels = stack();
    if (levels.size() <= level_) levels.resize(level_ + 1);
    data_ = levels[level_].reserve(floats);
  }
  ~scratch_lease() { --depth(); }
  scratch_lease(const scratch_lease&) = delete;
  scratch_lease& operator=(const scratch_lease&) = delete;

  float* data() const { return data_; }

 private:
  static std::vector<aligned_buffer>& stack() {
    thread_local std::vector<aligned_buffer> levels;
    return levels;
  }
  static std::size_t& depth() {
    thread_local std::size_t used = 0;
    return used;
  }
  std::size_t level_;
  float* data_;
};

/// A per-thread reusable T (a set of vectors, say) with the same nesting
/// rule as scratch_lease: each live lease on a thread has its own object, kept
/// for the next lease at that level, so its vectors keep their capacity and a
/// steady state of repeated calls allocates nothing.
template <class T>
class reusable {
 public:
  reusable() : level_(depth()++) {
    auto& objects = stack();
    if (objects.size() <= level_) objects.push_back(std::make_unique<T>());
    object_ = objects[level_].get();
  }
  ~reusable() { --depth(); }
  reusable(const reusable&) = delete;
  reusable& operator=(const reusable&) = delete;

  T& operator*() const { return *object_; }
  T* operator->() const { return object_; }

 private:
  static std::vector<std::unique_ptr<T>>& stack() {
    thread_local std::vector<std::unique_ptr<T>> objects;
    return objects;
  }
  static std::size_t& depth() {
    thread_local std::size_t used = 0;
    return used;
  }
  std::size_t level_;
  T* object_;
};

}  // namespace kvhead::engine
