// Replaces every global operator new/delete with counting versions, for the
// allocation tests (their own executable: the replacement is global).
#include "tests/counting_new.hpp"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

std::atomic<std::size_t> allocations{0};

void* counted_allocate(std::size_t size, std::size_t alignment) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (size == 0) size = 1;
  if (alignment <= alignof(std::max_align_t)) return std::malloc(size);
  void* pointer = nullptr;
  return posix_memalign(&pointer, alignment, size) == 0 ? pointer : nullptr;
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
void operator delete(void* pointer) noexcept { std::free(pointer); }
void operator delete[](void* pointer) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::size_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::size_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, const std::nothrow_t&) noexcept { std::free(pointer); }
void operator delete[](void* pointer, const std::nothrow_t&) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::align_val_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::align_val_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::size_t, std::align_val_t) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::size_t, std::align_val_t) noexcept { std::free(pointer); }
void operator delete(void* pointer, std::align_val_t, const std::nothrow_t&) noexcept { std::free(pointer); }
void operator delete[](void* pointer, std::align_val_t, const std::nothrow_t&) noexcept { std::free(pointer); }

std::size_t kvhead::testing::allocation_count() { return allocations.load(); }
