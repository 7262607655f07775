// Aligned float storage for packed panels, scratch and pools.
//
// allocate_floats: 64-byte aligned (a cache line, a zmm register); requests
// of 2 MiB and more are 2 MiB aligned and marked MADV_HUGEPAGE, so where the
// kernel offers transparent huge pages (transparent_hugepage=madvise) they
// are backed by them: the streams of packed weights and KV blocks then cross
// no 4 KiB page boundary, where the hardware prefetchers stop. The advice is a
// hint; where it is refused nothing changes.
//
// aligned_buffer: growable, grows only (never shrinks), and by at least half
// its size when it grows, so a buffer reused across calls stops allocating
// once it has seen the largest request, and a request that creeps up (a
// growing sequence) reallocates only O(log) times. Contents are not kept
// across a grow.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace kvhead::engine {

struct float_storage_delete {
  std::size_t alignment = 64;
  void operator()(float* pointer) const { ::operator delete (pointer, std::align_val_t{alignment}); }
};
using float_storage = std::unique_ptr<float, float_storage_delete>;

/// Uninitialized storage for `count` floats (see above for the alignment);
/// std::bad_alloc when it cannot be had, a count whose bytes overflow
/// std::size_t included.
float_storage allocate_floats(std::size_t count);

class aligned_buffer {
 public:
  static constexpr std::size_t alignment = 64;  // at least

  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t count) { reserve(count); }

  /// Makes room for at least `count` floats and returns the start.
  float* reserve(std::size_t count) {
    if (count > capacity_) {
      const std::size_t grown = count > capacity_ + capacity_ / 2 ? count : capacity_ + capacity_ / 2;
      storage_ = allocate_floats(grown);
      capacity_ = grown;
    }
    return storage_.get();
  }

  float* data() { return storage_.get(); }
  const float* data() const { return storage_.get(); }
  std::size_t capacity() const { return capacity_; }

 private:
  float_storage storage_;
  std::size_t capacity_ = 0;
};

}  // namespace kvhead::engine
