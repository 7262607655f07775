// Opening an input file for the readers: regular files only, read-only, with
// O_NONBLOCK so a FIFO cannot hang the open; every failure is a file_error.
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
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;

  int descriptor() const { return descriptor_; }
  std::size_t size() const { return size_; }

 private:
  int descriptor_;
  std::size_t size_ = 0;
};

}  // namespace kvhead::io
