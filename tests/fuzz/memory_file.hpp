// A file that lives in memory (memfd), for fuzz targets whose code under test
// takes a path: each input is written to it, and the readers open it again
// through /proc/self/fd/<n> as a regular file, without touching the disk.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace kvhead::fuzz {

class memory_file {
 public:
  memory_file() : descriptor_(::memfd_create("kvhead-fuzz", MFD_CLOEXEC)) {
    if (descriptor_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(descriptor_);
  }
  ~memory_file() { ::close(descriptor_); }
  memory_file(const memory_file&) = delete;
  memory_file& operator=(const memory_file&) = delete;

  /// Replaces the contents with `size` bytes from `data`.
  void assign(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(descriptor_, 0) != 0) std::abort();
    for (std::size_t done = 0; done < size;) {
      const ssize_t wrote = ::pwrite(descriptor_, data + done, size - done, off_t(done));
      if (wrote <= 0) std::abort();
      done += std::size_t(wrote);
    }
  }

  const std::string& path() const { return path_; }

 private:
  int descriptor_;
  std::string path_;
};

}  // namespace kvhead::fuzz
