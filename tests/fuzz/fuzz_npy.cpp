// libFuzzer target: io::read_npy on arbitrary bytes, and write_npy of what it
// read.
//
// Either the reader throws io::file_error with a one-line message, or it
// returns product(shape) values, which are the file's last bytes, and writing
// them with write_npy and reading that back gives the same shape and bits.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/io/npy.hpp"
#include "tests/fuzz/memory_file.hpp"

namespace {

void check(bool property) {
  if (!property) std::abort();
}

std::size_t product(const std::vector<std::size_t>& shape) {
  std::size_t count = 1;
  for (const std::size_t extent : shape) count *= extent;
  return count;
}

/// A file name for the round trip, in the temporary folder, one per process.
const std::string& round_trip_path() {
  static const std::string path = [] {
    const char* folder = std::getenv("TMPDIR");
    return std::string(folder != nullptr && *folder != '\0' ? folder : "/tmp") + "/kvhead-fuzz-npy-" +
           std::to_string(::getpid()) + ".npy";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvhead::io;
  static kvhead::fuzz::memory_file input;
  input.assign(data, size);
  npy_array array;
  try {
    array = read_npy(input.path());
  } catch (const file_error& error) {
    const std::string_view message = error.what();
    check(message.starts_with(input.path() + ": ") && message.find('\n') == std::string_view::npos);
    return 0;
  }
  const std::size_t bytes = array.values.size() * sizeof(float);
  check(array.values.size() == product(array.shape) && bytes <= size);
  check(bytes == 0 || std::memcmp(array.values.data(), data + size - bytes, bytes) == 0);

  write_npy(round_trip_path(), array.shape, array.values.data());
  const npy_array again = read_npy(round_trip_path());
  ::unlink(round_trip_path().c_str());
  check(again.shape == array.shape);
  check(bytes == 0 || std::memcmp(again.values.data(), array.values.data(), bytes) == 0);
  return 0;
}
