#include "engine/io/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "engine/io/file_error.hpp"

namespace kvhead::io {

std::string system_message(int error) { return std::system_category().message(error); }

regular_file::regular_file(const std::string& path, const char* kind)
    : path_(path), descriptor_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) {
  constexpr file_problem access = file_problem::access;
  if (descriptor_ < 0) throw file_error(path, "cannot open: " + system_message(errno), access);
  struct stat status {};
  const bool stated = ::fstat(descriptor_, &status) == 0;
  const int stat_error = errno;
  if (!stated || !S_ISREG(status.st_mode)) {
    ::close(descriptor_);
    if (!stated) throw file_error(path, "cannot stat: " + system_message(stat_error), access);
    if (S_ISDIR(status.st_mode)) throw file_error(path, std::string("is a directory, not ") + kind, access);
    throw file_error(path, "not a regular file", access);
  }
  size_ = std::size_t(status.st_size);
}

regular_file::~regular_file() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

regular_file::regular_file(regular_file&& other) noexcept
    : path_(std::move(other.path_)),
      descriptor_(std::exchange(other.descriptor_, -1)),
      size_(std::exchange(other.size_, 0)) {}

regular_file& regular_file::operator=(regular_file&& other) noexcept {
  if (this != &other) {
    if (descriptor_ >= 0) ::close(descriptor_);
    path_ = std::move(other.path_);
    descriptor_ = std::exchange(other.descriptor_, -1);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void regular_file::read_exact(void* buffer, std::size_t bytes, std::size_t offset) const {
  auto* at = static_cast<unsigned char*>(buffer);
  while (bytes > 0) {
    const ssize_t got = ::pread(descriptor_, at, bytes, off_t(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw file_error(path_, "cannot read: " + system_message(errno), file_problem::access);
    }
    if (got == 0) throw file_error(path_, "file ended early (was it changed while being read?)");
    at += got;
    bytes -= std::size_t(got);
    offset += std::size_t(got);
  }
}

}  // namespace kvhead::io
