// libFuzzer target: io::safetensors_file on arbitrary bytes.
//
// Either the reader throws io::file_error with a one-line message, or every
// property below holds; anything else (another exception, a sanitizer report,
// a violated property) is a finding.
//   - each tensor's byte range lies inside the data section, and the non-empty
//     ranges tile it exactly (no gap, no overlap, no trailing byte);
//   - load_f32 returns element_count values, and an F32 tensor's values are
//     the file's bytes.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/io/safetensors.hpp"
#include "tests/fuzz/memory_file.hpp"

namespace {

void check(bool property) {
  if (!property) std::abort();
}

std::uint64_t header_length(const std::uint8_t* data) {
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | data[i];
  return length;
}

void check_file(const kvhead::io::safetensors_file& file, const std::uint8_t* data, std::size_t size) {
  using namespace kvhead::io;
  const std::uint8_t* const section = data + 8 + header_length(data);
  const std::size_t section_size = size - 8 - header_length(data);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (const std::string& name : file.tensor_names()) {
    const tensor_info& info = file.info(name);
    check(info.begin <= info.end && info.end <= section_size);
    check(info.end - info.begin == element_count(info) * dtype_size(info.dtype));
    if (info.end > info.begin) ranges.emplace_back(info.begin, info.end);
    const std::vector<float> values = file.load_f32(name);
    check(values.size() == element_count(info));
    if (info.dtype == dtype::f32 && !values.empty())
      check(std::memcmp(values.data(), section + info.begin, values.size() * sizeof(float)) == 0);
  }
  std::sort(ranges.begin(), ranges.end());
  std::size_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    check(begin == covered);
    covered = end;
  }
  check(covered == section_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static kvhead::fuzz::memory_file input;
  input.assign(data, size);
  try {
    const kvhead::io::safetensors_file file(input.path());
    check_file(file, data, size);
  } catch (const kvhead::io::file_error& error) {
    const std::string_view message = error.what();
    check(message.starts_with(input.path() + ": ") && message.find('\n') == std::string_view::npos);
  }
  return 0;
}
