#include "engine/io/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "engine/io/file_error.hpp"

namespace kvhead::io {

std::string system_message(int error) { return std::system_category().message(error); }

regular_file::regular_file(const std::string& path, const char* kind)
    : descriptor_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) {
  if (descriptor_ < 0) throw file_error(path, "cannot open: " + system_message(errno));
  struct stat status {};
  const bool stated = ::fstat(descriptor_, &status) == 0;
  const int stat_error = errno;
  if (!stated || !S_ISREG(status.st_mode)) {
    ::close(descriptor_);
    if (!stated) throw file_error(path, "cannot stat: " + system_message(stat_error));
    if (S_ISDIR(status.st_mode)) throw file_error(path, std::string("is a directory, not ") + kind);
    throw file_error(path, "not a regular file");
  }
  size_ = std::size_t(status.st_size);
}

regular_file::~regular_file() { ::close(descriptor_); }

}  // namespace kvhead::io
