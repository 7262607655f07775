#include "engine/io/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <memory>
#include <utility>

#include "engine/io/file_error.hpp"
#include "engine/io/regular_file.hpp"

namespace kvhead::io {
namespace {

// The file a symbolic link names, when it exists; otherwise `path` itself
// (a dangling link is replaced, as a missing file is created).
std::string file_written(const std::string& path) {
  struct stat link {};
  if (::lstat(path.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) return path;
  const std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(path.c_str(), nullptr), &std::free);
  return resolved != nullptr ? std::string(resolved.get()) : path;
}

// "<folder>/<name>.tmp.<pid>.<n>", the name cut so that the whole stays
// within the folder's limit on a name's length (a valid long name must not
// fail because of the suffix).
std::string temporary_name(const std::string& target) {
  static std::atomic<unsigned long> counter{0};
  const std::string suffix = ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const std::size_t slash = target.rfind('/');
  const std::string folder = slash == std::string::npos ? std::string() : target.substr(0, slash + 1);
  std::string name = slash == std::string::npos ? target : target.substr(slash + 1);
  const long limit = ::pathconf(folder.empty() ? "." : folder.c_str(), _PC_NAME_MAX);
  const std::size_t name_max = limit > 0 ? std::size_t(limit) : NAME_MAX;
  if (name.size() + suffix.size() > name_max) name.resize(name_max > suffix.size() ? name_max - suffix.size() : 0);
  return folder + name + suffix;
}

}  // namespace

output_file::output_file(const std::string& path) : path_(path), target_(file_written(path)) {
  struct stat existing {};
  if (::stat(target_.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    if (S_ISDIR(existing.st_mode)) throw file_error(path_, "is a directory, not a file name");
    // Opened without blocking, so that a FIFO nobody reads is an error, not a
    // hang; then the writes block as a pipe's do, while its reader reads.
    descriptor_ = ::open(target_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (descriptor_ < 0 && errno == ENXIO && S_ISFIFO(existing.st_mode))
      throw file_error(path_, "is a FIFO that no process is reading");
    if (descriptor_ < 0) fail("cannot open", target_);
    const int flags = ::fcntl(descriptor_, F_GETFL);
    if (flags < 0 || ::fcntl(descriptor_, F_SETFL, flags & ~O_NONBLOCK) != 0) fail("cannot set up", target_);
    return;
  }
  temporary_ = temporary_name(target_);
  descriptor_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0666);
  if (descriptor_ < 0) fail("cannot create temporary file", temporary_);
}

output_file::~output_file() {
  if (descriptor_ >= 0) ::close(descriptor_);
  if (!committed_ && !temporary_.empty()) ::unlink(temporary_.c_str());
}

void output_file::write(const void* buffer, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(buffer);
  while (size > 0) {
    const ssize_t done = ::write(descriptor_, bytes, size);
    if (done < 0) {
      if (errno == EINTR) continue;
      if (temporary_.empty()) fail("cannot write", target_);
      fail("cannot write temporary file", temporary_);
    }
    bytes += done;
    size -= std::size_t(done);
  }
}

void output_file::commit() {
  const int descriptor = std::exchange(descriptor_, -1);
  if (::close(descriptor) != 0) {
    if (temporary_.empty()) fail("cannot close", target_);
    fail("cannot close temporary file", temporary_);
  }
  if (!temporary_.empty() && ::rename(temporary_.c_str(), target_.c_str()) != 0) {
    const int error = errno;
    throw file_error(path_, "cannot rename " + quote_name(temporary_) + " over " +
                                (target_ == path_ ? std::string("it") : quote_name(target_)) + ": " +
                                system_message(error));
  }
  committed_ = true;
}

void output_file::fail(const char* what, const std::string& name) const {
  const int error = errno;
  throw file_error(path_, std::string(what) + " " + quote_name(name) + ": " + system_message(error));
}

}  // namespace kvhead::io
