// Read-only safetensors file (weights for `kvhead run`).
//
// Layout:  [u64 little-endian N][N bytes of JSON header][data section]
//
//   header = { "__metadata__": {"key": "value", ...},          (optional)
//              "<tensor name>": { "dtype": "F32" | "F16" | "BF16",
//                                 "shape": [d0, d1, ...],      (rank 0: scalar)
//                                 "data_offsets": [begin, end] }, ... }
//
// begin/end are byte offsets into the data section (not the file); the tensor
// is stored row-major, little-endian, with no alignment guarantee.
//
// The constructor reads the header and validates everything before any tensor
// is read, so every later call works on a consistent table. Any failure
// throws file_error ("<path>: <problem>", one line; file_error.hpp):
//   - the path cannot be opened or read, or is not a regular file;
//   - the file is shorter than 8 bytes; N < 2, N > 100,000,000 or 8 + N beyond
//     the end of the file;
//   - the header is not valid JSON (UTF-8, RFC 8259), is not an object, or has
//     a duplicate key in any object; it lists more than 100,000 tensors;
//   - "__metadata__" is not an object of string -> string;
//   - a tensor entry is not an object of exactly the keys "dtype" (string),
//     "shape" (array of at most 64 non-negative integers: the rank limit
//     bounds memory) and "data_offsets" (array of
//     exactly 2 non-negative integers); unknown keys are rejected too;
//   - the dtype is not F32, F16 or BF16 ("unsupported dtype");
//   - the element count or byte size overflows std::size_t;
//   - begin > end, end - begin != element count * dtype size, end beyond the
//     data section;
//   - the tensors do not tile the data section exactly, as the reference
//     reader (huggingface/safetensors) requires: taken in order of
//     (begin, end), whatever the header's order, each begins where the
//     previous one ended, the first at 0, the last ending at the end of the
//     file. Overlapping tensors, a gap, trailing bytes, and a zero-size tensor
//     inside another's range are errors.
//
// The file stays open (read-only) while the object lives; tensors are read
// with pread, not through a mapping, so a file truncated by someone else
// while it is open makes load_f32 throw file_error ("file ended early"),
// never SIGBUS. load_f32 and load_bf16_bits may be called from several
// threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/io/file_error.hpp"
#include "engine/io/regular_file.hpp"

namespace kvhead::io {

enum class dtype { f32, f16, bf16 };

/// Bytes per element: 4 for f32, 2 for f16 and bf16.
std::size_t dtype_size(dtype type);
/// The safetensors spelling: "F32", "F16", "BF16".
const char* dtype_name(dtype type);

struct tensor_info {
  std::string name;
  io::dtype dtype;
  std::vector<std::size_t> shape;  // empty: a scalar (one element)
  std::size_t begin, end;          // byte range in the data section
};

/// Product of the shape (1 for a scalar). Cannot overflow for an info that
/// came from safetensors_file: the constructor checked it.
std::size_t element_count(const tensor_info& info);

class safetensors_file {
 public:
  /// Reads and validates the whole header; throws file_error.
  explicit safetensors_file(const std::string& path);

  safetensors_file(safetensors_file&&) noexcept = default;
  safetensors_file& operator=(safetensors_file&&) noexcept = default;
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;

  const std::string& path() const { return file_.path(); }
  /// The "__metadata__" object (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// All tensor names, sorted.
  std::vector<std::string> tensor_names() const;
  bool contains(const std::string& name) const;
  /// file_error "no tensor '<name>'" if missing.
  const tensor_info& info(const std::string& name) const;

  /// The tensor as row-major f32: F32 copied bitwise (memcpy, any alignment),
  /// F16 and BF16 widened exactly (subnormals, infinities, NaN payloads kept).
  /// file_error if the file was shortened since it was opened.
  std::vector<float> load_f32(const std::string& name) const;

  /// A BF16 tensor's bit patterns as stored (no conversion), row-major.
  /// file_error when the tensor is not BF16 or the file was shortened.
  std::vector<std::uint16_t> load_bf16_bits(const std::string& name) const;

 private:
  /// A 16-bit tensor's elements, each through convert, into out, read in
  /// chunks of 64 KiB (little-endian in the file).
  template <class T, class Convert>
  void read_16_bit(const tensor_info& tensor, T* out, Convert convert) const;

  regular_file file_;
  std::size_t data_offset_ = 0;  // of the data section in the file: 8 + header length
  std::size_t data_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, tensor_info> tensors_;
};

/// IEEE binary16 bits -> float, exactly (integer bit manipulation; no F16C).
float f16_to_f32(std::uint16_t bits);
/// bfloat16 bits -> float, exactly (the top half of the f32 bits).
float bf16_to_f32(std::uint16_t bits);

}  // namespace kvhead::io
