// safetensors reader: read the header (pread), validate it in one SAX pass,
// then check that the tensors tile the data section.
//
// The header is parsed with nlohmann's SAX interface, not into a DOM: the
// handler below is a small state machine that accepts exactly the documented
// shape (root object -> "__metadata__" object of strings | tensor objects ->
// dtype string, shape / data_offsets arrays of integers) and stops at the first
// thing that does not fit. So the nesting depth is at most 3, duplicate keys
// are seen (a DOM keeps the last one silently), and memory stays proportional
// to the number of tensors, whatever the header contains.
#include "engine/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

namespace kvhead::io {

static_assert(sizeof(std::size_t) == 8, "offsets and sizes are checked as 64-bit std::size_t");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

std::size_t dtype_size(dtype type) { return type == dtype::f32 ? 4 : 2; }

const char* dtype_name(dtype type) {
  switch (type) {
    case dtype::f32:
      return "F32";
    case dtype::f16:
      return "F16";
    case dtype::bf16:
      return "BF16";
  }
  return "?";
}

std::size_t element_count(const tensor_info& info) {
  std::size_t count = 1;
  for (const std::size_t extent : info.shape) count *= extent;
  return count;
}

float f16_to_f32(std::uint16_t bits) {
  const std::uint32_t sign = std::uint32_t(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  std::uint32_t result;
  if (exponent == 0x1f) {  // inf (mantissa 0) or NaN: payload and quiet bit kept
    result = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    result = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // +-0
    result = sign;
  } else {
    // Subnormal: mantissa * 2^-24. With the top set bit at position p (0..9),
    // that is 1.f * 2^(p - 24): f32 exponent field p - 24 + 127, and the bits
    // below the top one become the f32 fraction.
    const int top = std::bit_width(mantissa) - 1;
    mantissa = (mantissa << (23 - top)) & 0x7fffffu;
    result = sign | (std::uint32_t(top + 127 - 24) << 23) | mantissa;
  }
  return std::bit_cast<float>(result);
}

float bf16_to_f32(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

namespace {

constexpr std::uint64_t max_header_bytes = 100'000'000;
// Far beyond any real tensor (NumPy's limit is 64); bounds the shape vector
// so a header of "[0,0,0,..." cannot cost 4 bytes of memory per byte.
constexpr std::size_t max_rank = 64;
// Published checkpoints hold a few thousand tensors per file at most; the cap
// bounds the table (about 200 bytes per tensor) whatever the header holds.
constexpr std::size_t max_tensors = 100'000;

/// "[2, 3]", at most 8 extents shown (a hostile rank must not bloat messages).
std::string format_list(const std::vector<std::size_t>& values) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i == 8) {
      text += ", ...";
      break;
    }
    if (i != 0) text += ", ";
    text += std::to_string(values[i]);
  }
  return text + "]";
}

std::string format_range(std::size_t begin, std::size_t end) {
  // Appends, not "[" + ...: GCC 12 gives a false -Wrestrict on the latter.
  std::string text = "[";
  text += std::to_string(begin);
  text += ", ";
  text += std::to_string(end);
  text += "]";
  return text;
}

/// SAX handler for the header (see the comment at the top of this file). On
/// a problem it stores a message in `error` and returns false, which stops
/// nlohmann's parser.
class header_handler {
 public:
  using json = nlohmann::json;

  explicit header_handler(std::size_t data_size) : data_size_(data_size) {}

  std::string error;
  std::map<std::string, std::string> metadata;
  std::map<std::string, tensor_info> tensors;

  bool null() { return fail_value(); }
  bool boolean(bool) { return fail_value(); }
  bool number_integer(json::number_integer_t value) {
    // Only negative numbers (and "-0") arrive here.
    if (value < 0) return fail_value();
    return number_unsigned(json::number_unsigned_t(value));
  }
  bool number_unsigned(json::number_unsigned_t value) {
    if (state_ == state::shape) {
      if (current_.shape.size() == max_rank) {
        return fail(tensor_name() + " shape has more than " + std::to_string(max_rank) + " dimensions");
      }
      current_.shape.push_back(std::size_t(value));
      return true;
    }
    if (state_ == state::offsets) {
      if (offsets_.size() == 2) return fail_value();
      offsets_.push_back(std::size_t(value));
      return true;
    }
    return fail_value();
  }
  bool number_float(json::number_float_t, const std::string&) { return fail_value(); }
  bool binary(json::binary_t&) { return fail_value(); }

  bool string(std::string& value) {
    if (state_ == state::metadata) {
      metadata.emplace(metadata_key_, std::move(value));
      return true;
    }
    if (state_ == state::tensor && field_ == field::dtype) {
      if (value == "F32") {
        current_.dtype = dtype::f32;
      } else if (value == "F16") {
        current_.dtype = dtype::f16;
      } else if (value == "BF16") {
        current_.dtype = dtype::bf16;
      } else {
        return fail(tensor_name() + " has unsupported dtype " + quote_name(value) + " (supported: F32, F16, BF16)");
      }
      return true;
    }
    return fail_value();
  }

  bool start_object(std::size_t) {
    if (state_ == state::start) {
      state_ = state::root;
      return true;
    }
    if (state_ == state::root) {
      if (root_key_ == "__metadata__") {
        state_ = state::metadata;
      } else {
        state_ = state::tensor;
        current_ = tensor_info{root_key_, dtype::f32, {}, 0, 0};
        seen_ = 0;
      }
      return true;
    }
    return fail_value();
  }

  bool key(std::string& key) {
    switch (state_) {
      case state::root:
        if (tensors.contains(key) || (key == "__metadata__" && metadata_seen_)) {
          return fail("duplicate key " + quote_name(key) + " in the header");
        }
        if (key != "__metadata__" && tensors.size() == max_tensors) {
          return fail("header has more than " + std::to_string(max_tensors) + " tensors");
        }
        if (key == "__metadata__") metadata_seen_ = true;
        root_key_ = std::move(key);
        return true;
      case state::metadata:
        if (metadata.contains(key)) return fail("duplicate key " + quote_name(key) + " in __metadata__");
        metadata_key_ = std::move(key);
        return true;
      case state::tensor: {
        if (key == "dtype") {
          field_ = field::dtype;
        } else if (key == "shape") {
          field_ = field::shape;
        } else if (key == "data_offsets") {
          field_ = field::offsets;
        } else {
          return fail(tensor_name() + " has unknown key " + quote_name(key) + " (expected dtype, shape, data_offsets)");
        }
        const unsigned bit = 1u << unsigned(field_);
        if (seen_ & bit) return fail("duplicate key " + quote_name(key) + " in " + tensor_name());
        seen_ |= bit;
        return true;
      }
      default:
        return fail_value();  // unreachable: objects elsewhere are refused
    }
  }

  bool end_object() {
    if (state_ == state::metadata) {
      state_ = state::root;
      return true;
    }
    if (state_ == state::tensor) {
      if (!finish_tensor()) return false;
      state_ = state::root;
      return true;
    }
    state_ = state::done;  // the root; strict parsing refuses anything after it
    return true;
  }

  bool start_array(std::size_t) {
    if (state_ == state::tensor && field_ == field::shape) {
      state_ = state::shape;
      return true;
    }
    if (state_ == state::tensor && field_ == field::offsets) {
      state_ = state::offsets;
      offsets_.clear();
      return true;
    }
    return fail_value();
  }

  bool end_array() {
    // Only the arrays of a tensor entry get here (others are refused early).
    if (state_ == state::offsets && offsets_.size() != 2) return fail_value();
    state_ = state::tensor;
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& problem) {
    // "[json.exception.parse_error.101] parse error at line 1, column 7: ..."
    std::string_view text = problem.what();
    if (const auto close = text.find("] "); close != std::string_view::npos) text.remove_prefix(close + 2);
    if (text.size() > 300) text = text.substr(0, 300);  // the last token read may be huge
    // That token may hold invalid UTF-8 (the likely error): bytes >= 0x80 as
    // \xNN. (Control characters are escaped by file_error.)
    std::string message = "header is not valid JSON: ";
    for (const char ch : text) {
      const auto byte = static_cast<unsigned char>(ch);
      if (byte < 0x80) {
        message += ch;
      } else {
        static constexpr char hex[] = "0123456789abcdef";
        message += "\\x";
        message += hex[byte >> 4];
        message += hex[byte & 0xf];
      }
    }
    return fail(std::move(message));
  }

 private:
  enum class state { start, root, metadata, tensor, shape, offsets, done };
  enum class field { dtype, shape, offsets };

  bool fail(std::string message) {
    error = std::move(message);
    return false;
  }

  std::string tensor_name() const { return "tensor " + quote_name(current_.name); }

  /// A value that does not belong where it is; the message names the place.
  bool fail_value() {
    switch (state_) {
      case state::start:
      case state::done:
        return fail("header is not a JSON object");
      case state::root:
        if (root_key_ == "__metadata__") return fail("__metadata__ is not an object");
        return fail("tensor " + quote_name(root_key_) + " is not an object");
      case state::metadata:
        return fail("__metadata__ value for " + quote_name(metadata_key_) + " is not a string");
      case state::tensor:
      case state::shape:
      case state::offsets:
        switch (field_) {
          case field::dtype:
            return fail(tensor_name() + " dtype is not a string");
          case field::shape:
            return fail(tensor_name() + " shape is not an array of non-negative integers");
          case field::offsets:
            return fail(tensor_name() + " data_offsets is not an array of 2 non-negative integers");
        }
    }
    return fail("header has an unexpected value");
  }

  /// End of a tensor entry: all fields present, sizes consistent.
  bool finish_tensor() {
    static constexpr const char* names[] = {"dtype", "shape", "data_offsets"};
    for (unsigned i = 0; i < 3; ++i) {
      if (!(seen_ & (1u << i))) return fail(tensor_name() + " is missing " + quote_name(names[i]));
    }
    // A zero extent anywhere makes an empty tensor, whatever the others are.
    const auto& shape = current_.shape;
    std::size_t count = std::find(shape.begin(), shape.end(), 0) != shape.end() ? 0 : 1, bytes = 0;
    for (const std::size_t extent : shape) {
      if (__builtin_mul_overflow(count, extent, &count)) {
        return fail(tensor_name() + " shape " + format_list(current_.shape) + " has too many elements");
      }
    }
    if (__builtin_mul_overflow(count, dtype_size(current_.dtype), &bytes)) {
      return fail(tensor_name() + " shape " + format_list(current_.shape) + " has too many bytes");
    }
    current_.begin = offsets_[0];
    current_.end = offsets_[1];
    const std::string where = tensor_name() + " data_offsets " + format_range(current_.begin, current_.end);
    if (current_.begin > current_.end) return fail(where + " begin after end");
    if (current_.end - current_.begin != bytes) {
      return fail(where + " span " + std::to_string(current_.end - current_.begin) + " bytes, but shape " +
                  format_list(current_.shape) + " of " + dtype_name(current_.dtype) + " needs " +
                  std::to_string(bytes));
    }
    if (current_.end > data_size_) {
      return fail(where + " end beyond the data section (" + std::to_string(data_size_) + " bytes)");
    }
    std::string name = current_.name;
    tensors.emplace(std::move(name), std::move(current_));
    return true;
  }

  std::size_t data_size_;
  state state_ = state::start;
  field field_ = field::dtype;
  unsigned seen_ = 0;  // bit per field of the current tensor entry
  bool metadata_seen_ = false;
  std::string root_key_, metadata_key_;
  tensor_info current_{};
  std::vector<std::size_t> offsets_;
};

}  // namespace

safetensors_file::safetensors_file(const std::string& path) : file_(path, "a safetensors file") {
  // 1. Open: regular files only (done by file_).
  const std::size_t file_size = file_.size();
  if (file_size < 8) {
    throw file_error(path, "file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
  }

  // 2. Header length, u64 little-endian, and its bounds.
  unsigned char length_bytes[8];
  file_.read_exact(length_bytes, sizeof length_bytes, 0);
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
  if (header_size < 2) {
    throw file_error(path, "header length " + std::to_string(header_size) + " is too small (minimum 2, \"{}\")");
  }
  if (header_size > max_header_bytes) {
    throw file_error(path, "header length " + std::to_string(header_size) + " is over the limit of " +
                               std::to_string(max_header_bytes) + " bytes");
  }
  if (header_size > file_size - 8) {
    throw file_error(path, "header length " + std::to_string(header_size) + " goes beyond the end of the file (" +
                               std::to_string(file_size) + " bytes)");
  }
  data_offset_ = 8 + header_size;
  data_size_ = file_size - data_offset_;

  // 3. Parse and validate the header (each tensor against the data size).
  std::string header(header_size, '\0');
  file_.read_exact(header.data(), header_size, 8);
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore
  // whatever follows it; valid JSON never contains one (strings escape it).
  if (const std::size_t nul = header.find('\0'); nul != std::string::npos) {
    throw file_error(path, "header is not valid JSON: NUL byte at header offset " + std::to_string(nul));
  }
  header_handler handler(data_size_);
  if (!nlohmann::json::sax_parse(header.begin(), header.end(), &handler)) {
    throw file_error(path, handler.error.empty() ? "header is not valid JSON" : handler.error);
  }
  metadata_ = std::move(handler.metadata);
  tensors_ = std::move(handler.tensors);

  // 4. The tensors tile the data section exactly, as the reference reader
  // (huggingface/safetensors) requires: in order of (begin, end), each tensor
  // begins where the previous one ended (the first at 0), and the last ends
  // at the end of the file. So no byte is shared, none is unaccounted for, and
  // a zero-size tensor sits at a boundary. The header's order is free.
  std::vector<const tensor_info*> order;
  order.reserve(tensors_.size());
  for (const auto& entry : tensors_) order.push_back(&entry.second);
  std::stable_sort(order.begin(), order.end(), [](const tensor_info* a, const tensor_info* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::size_t covered = 0;
  const tensor_info* previous = nullptr;
  for (const tensor_info* tensor : order) {
    const std::string where = "tensor " + quote_name(tensor->name) + " " + format_range(tensor->begin, tensor->end);
    if (tensor->begin > covered) {
      throw file_error(path, "data bytes " + format_range(covered, tensor->begin) + " before " + where +
                                 " belong to no tensor (the tensors must tile the data section)");
    }
    if (tensor->begin < covered) {
      throw file_error(path, "tensors " + quote_name(previous->name) + " " +
                                 format_range(previous->begin, previous->end) + " and " + quote_name(tensor->name) +
                                 " " + format_range(tensor->begin, tensor->end) + " overlap");
    }
    covered = tensor->end;
    previous = tensor;
  }
  if (covered != data_size_) {
    throw file_error(path, "data section is " + std::to_string(data_size_) + " bytes, but the tensors end at byte " +
                               std::to_string(covered) + ": trailing bytes (the tensors must tile the data section)");
  }
}

std::vector<std::string> safetensors_file::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& entry : tensors_) names.push_back(entry.first);
  return names;  // std::map order: sorted
}

bool safetensors_file::contains(const std::string& name) const { return tensors_.contains(name); }

const tensor_info& safetensors_file::info(const std::string& name) const {
  const auto found = tensors_.find(name);
  if (found == tensors_.end()) throw file_error(path(), "no tensor " + quote_name(name));
  return found->second;
}

template <class T, class Convert>
void safetensors_file::read_16_bit(const tensor_info& tensor, T* out, Convert convert) const {
  const std::size_t count = element_count(tensor), offset = data_offset_ + tensor.begin;
  constexpr std::size_t chunk_elements = std::size_t(1) << 15;
  std::vector<unsigned char> bytes(2 * std::min(count, chunk_elements));
  for (std::size_t done = 0; done < count; done += chunk_elements) {
    const std::size_t n = std::min(chunk_elements, count - done);
    file_.read_exact(bytes.data(), 2 * n, offset + 2 * done);
    for (std::size_t i = 0; i < n; ++i) out[done + i] = convert(std::uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
  }
}

std::vector<float> safetensors_file::load_f32(const std::string& name) const {
  const tensor_info& tensor = info(name);
  const std::size_t count = element_count(tensor);  // checked by the constructor
  std::vector<float> values(count);
  if (count == 0) return values;
  const std::size_t offset = data_offset_ + tensor.begin;  // in the file: checked by the constructor
  if (tensor.dtype == dtype::f32) {
    file_.read_exact(values.data(), count * sizeof(float), offset);
    if constexpr (std::endian::native == std::endian::big) {
      for (float& value : values) value = std::bit_cast<float>(__builtin_bswap32(std::bit_cast<std::uint32_t>(value)));
    }
    return values;
  }
  // F16 and BF16: widened.
  read_16_bit(tensor, values.data(), tensor.dtype == dtype::f16 ? f16_to_f32 : bf16_to_f32);
  return values;
}

std::vector<std::uint16_t> safetensors_file::load_bf16_bits(const std::string& name) const {
  const tensor_info& tensor = info(name);
  if (tensor.dtype != dtype::bf16)
    throw file_error(path(), quote_name(name) + " is " + dtype_name(tensor.dtype) + ", not BF16");
  std::vector<std::uint16_t> bits(element_count(tensor));
  read_16_bit(tensor, bits.data(), [](std::uint16_t x) { return x; });
  return bits;
}

}  // namespace kvhead::io
