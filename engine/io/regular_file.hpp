// Opening and reading an input file for the readers: regular files only,
// read-only, with O_NONBLOCK so a FIFO cannot hang the open; every failure is
// a file_error. Reads are positioned (pread), never through a mapping: a file
// truncated by someone else while it is open is a file_error ("file ended
// early"), not a SIGBUS.
#pragma once

#include <cstddef>
#include <string>

namespace kvhead::io {

/// strerror-like text for an errno value.
std::string system_message(int error);

class regular_file {
 public:
  /// `kind` names what the file should be, for messages ("a .npy file").
  regular_file(const std::string& path, const char* kind);
  ~regular_file();
  regular_file(regular_file&& other) noexcept;
  regular_file& operator=(regular_file&& other) noexcept;
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;

  const std::string& path() const { return path_; }
  /// The size when opened.
  std::size_t size() const { return size_; }

  /// Reads exactly `bytes` bytes at `offset` into `buffer` (EINTR retried);
  /// file_error if the file ends first or the read fails. Safe to call from
  /// several threads at once (pread keeps no file position).
  void read_exact(void* buffer, std::size_t bytes, std::size_t offset) const;

 private:
  std::string path_;
  int descriptor_;
  std::size_t size_ = 0;
};

}  // namespace kvhead::io
