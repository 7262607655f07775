// Replaces every global operator new/delete with counting versions, for the
// allocation tests (their own executable: the replacement is global).
#include "tests/counting_new.hpp"

#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <new>

namespace {

std::atomic<std::size_t> allocations{0};
std::atomic<std::size_t> held_bytes{0};
constexpr std::size_t never = std::numeric_limits<std::size_t>::max();
thread_local std::size_t successes_left = never;  // never: no failure planned

void* counted_allocate(std::size_t size, std::size_t alignment) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (successes_left != never) {
    if (successes_left == 0) return nullptr;
    --successes_left;
  }
  if (size == 0) size = 1;
  void* pointer = nullptr;
  if (alignment <= alignof(std::max_align_t)) {
    pointer = std::malloc(size);
  } else if (posix_memalign(&pointer, alignment, size) != 0) {
    pointer = nullptr;
  }
  if (pointer != nullptr) held_bytes.fetch_add(malloc_usable_size(pointer), std::memory_order_relaxed);
  return pointer;
}

void counted_free(void* pointer) noexcept {
  if (pointer != nullptr) held_bytes.fetch_sub(malloc_usable_size(pointer), std::memory_order_relaxed);
  std::free(pointer);
}

void* counted_allocate_or_throw(std::size_t size, std::size_t alignment) {
  if (void* pointer = counted_allocate(size, alignment)) return pointer;
  throw std::bad_alloc();
}

std::size_t align_of(std::align_val_t alignment) { return static_cast<std::size_t>(alignment); }

}  // namespace

void* operator new(std::size_t size) { return counted_allocate_or_throw(size, 0); }
void* operator new[](std::size_t size) { return counted_allocate_or_throw(size, 0); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted_allocate(size, 0); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return counted_allocate(size, 0); }
void* operator new(std::size_t size, std::align_val_t alignment) {
  return counted_allocate_or_throw(size, align_of(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return counted_allocate_or_throw(size, align_of(alignment));
}
void* operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_allocate(size, align_of(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted_allocate(size, align_of(alignment));
}
void operator delete(void* pointer) noexcept { counted_free(pointer); }
void operator delete[](void* pointer) noexcept { counted_free(pointer); }
void operator delete(void* pointer, std::size_t) noexcept { counted_free(pointer); }
void operator delete[](void* pointer, std::size_t) noexcept { counted_free(pointer); }
void operator delete(void* pointer, const std::nothrow_t&) noexcept { counted_free(pointer); }
void operator delete[](void* pointer, const std::nothrow_t&) noexcept { counted_free(pointer); }
void operator delete(void* pointer, std::align_val_t) noexcept { counted_free(pointer); }
void operator delete[](void* pointer, std::align_val_t) noexcept { counted_free(pointer); }
void operator delete(void* pointer, std::size_t, std::align_val_t) noexcept { counted_free(pointer); }
void operator delete[](void* pointer, std::size_t, std::align_val_t) noexcept { counted_free(pointer); }
void operator delete(void* pointer, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(pointer); }
void operator delete[](void* pointer, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(pointer); }

std::size_t kvhead::testing::allocation_count() { return allocations.load(); }
std::size_t kvhead::testing::live_bytes() { return held_bytes.load(); }
void kvhead::testing::fail_allocations_after(std::size_t successes) { successes_left = successes; }
void kvhead::testing::stop_failing() { successes_left = never; }
