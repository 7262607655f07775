// Per-thread reusable memory that is safe under oneTBB work stealing.
//
// A thread waiting inside parallel_for may steal and run another task that
// asks for scratch too, so a single thread_local buffer could be handed out
// twice. Each thread keeps a stack of objects instead: a lease takes the next
// free level and gives it back on destruction. Objects are kept (buffers only
// grow, vectors keep their capacity), so steady-state calls allocate nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/arch/aligned_buffer.hpp"

namespace kvhead::engine {

/// A per-thread reusable T (a set of vectors, say): each live lease on a
/// thread has its own object, kept for the next lease at that level.
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

/// At least `floats` floats of 64-byte aligned per-thread scratch.
class scratch_lease {
 public:
  explicit scratch_lease(std::size_t floats) : data_(buffer_->reserve(floats)) {}

  float* data() const { return data_; }

 private:
  reusable<aligned_buffer> buffer_;
  float* data_;
};

}  // namespace kvhead::engine
