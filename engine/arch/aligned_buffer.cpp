#include "engine/arch/aligned_buffer.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <new>

namespace kvhead::engine {

float_storage allocate_floats(std::size_t count) {
  constexpr std::size_t huge_page = std::size_t{2} << 20;
  // A count whose bytes wrap past 2^64 would otherwise ask for a few bytes
  // and hand out a block far smaller than the caller's count.
  if (count > SIZE_MAX / sizeof(float)) throw std::bad_alloc();
  const std::size_t bytes = (count == 0 ? 1 : count) * sizeof(float);
  const std::size_t alignment = bytes >= huge_page ? huge_page : aligned_buffer::alignment;
  float_storage storage(static_cast<float*>(::operator new (bytes, std::align_val_t{alignment})),
                        float_storage_delete{alignment});
  if (alignment == huge_page) madvise(storage.get(), bytes, MADV_HUGEPAGE);
  return storage;
}

}  // namespace kvhead::engine
