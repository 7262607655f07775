// A growable, 64-byte aligned float buffer for packed panels and scratch.
// Grows only (never shrinks), and by at least half its size when it grows, so
// a buffer reused across calls stops allocating once it has seen the largest
// request, and a request that creeps up (a growing sequence) reallocates only
// O(log) times. Contents are not kept across a grow.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace kvhead::engine {

class aligned_buffer {
 public:
  static constexpr std::size_t alignment = 64;  // one cache line, one zmm

  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t count) { reserve(count); }

  /// Makes room for at least `count` floats and returns the start.
  float* reserve(std::size_t count) {
    if (count > capacity_) {
      const std::size_t grown = count > capacity_ + capacity_ / 2 ? count : capacity_ + capacity_ / 2;
      storage_.reset(new (std::align_val_t{alignment}) float[grown]);
      capacity_ = grown;
    }
    return storage_.get();
  }

  float* data() { return storage_.get(); }
  const float* data() const { return storage_.get(); }
  std::size_t capacity() const { return capacity_; }

 private:
  struct aligned_delete {
    void operator()(float* pointer) const {
      ::operator delete[](pointer, std::align_val_t{alignment});
    }
  };
  std::unique_ptr<float[], aligned_delete> storage_;
  std::size_t capacity_ = 0;
};

}  // namespace kvhead::engine
