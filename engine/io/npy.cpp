// .npy reader and atomic writer (float32 only), POSIX file calls.
//
// Reading: 1. open and stat (regular files only), 2. preamble (magic,
// version, header length), 3. header dict, 4. sizes (the data must fill the
// rest of the file exactly), 5. one read straight into the result. Nothing is
// allocated before the file size has justified it.
#include "engine/io/npy.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <utility>

#include "engine/io/output_file.hpp"
#include "engine/io/regular_file.hpp"

namespace kvhead::io {

namespace {

static_assert(sizeof(float) == 4);

constexpr char magic[] = "\x93NUMPY";
constexpr std::size_t magic_size = 6;
// NumPy itself refuses headers over 10,000 bytes unless told otherwise; 1 MB
// leaves room for absurd ranks and still bounds the allocation.
constexpr std::size_t max_header_bytes = 1'000'000;
// NumPy 2's NPY_MAXDIMS. Also bounds the shape vector whatever the header
// says, and keeps any header we write far below 1.0's 65535-byte limit.
constexpr std::size_t max_rank = 64;

/// "(2, 3)", "(3,)", "()" as Python prints a tuple; at most 8 extents shown.
std::string format_shape(const std::vector<std::size_t>& shape, bool complete = false) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i == 8 && !complete) {
      text += ", ...";
      break;
    }
    if (i != 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  if (shape.size() == 1) text += ",";
  return text + ")";
}

/// The header dict, parsed by recursive descent over the Python literal
/// subset described in npy.hpp. Throws file_error at the first problem.
class header_parser {
 public:
  header_parser(const std::string& path, std::string_view text) : path_(path), text_(text) {}

  struct header {
    std::string descr;
    bool fortran_order;
    std::vector<std::size_t> shape;
  };

  header parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<std::size_t>> shape;
    skip_space();
    expect('{');
    skip_space();
    while (peek() != '}') {
      const std::size_t key_at = at_;
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (descr) fail("duplicate key 'descr'");
        if (peek() != '\'' && peek() != '"') fail("descr is not a string (structured dtypes are not supported)");
        descr = parse_string();
      } else if (key == "fortran_order") {
        if (fortran_order) fail("duplicate key 'fortran_order'");
        fortran_order = parse_bool();
      } else if (key == "shape") {
        if (shape) fail("duplicate key 'shape'");
        shape = parse_shape();
      } else {
        at_ = key_at;
        fail("unknown key " + quote_name(key) + " (expected 'descr', 'fortran_order', 'shape')");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        skip_space();
      } else if (peek() != '}') {
        syntax_error("',' or '}'");
      }
    }
    ++at_;  // '}'
    skip_space();
    if (at_ != text_.size()) syntax_error("the end of the header after '}'");
    if (!descr) fail("no 'descr' key");
    if (!fortran_order) fail("no 'fortran_order' key");
    if (!shape) fail("no 'shape' key");
    return {*descr, *fortran_order, *shape};
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw file_error(path_, "bad header at byte " + std::to_string(at_) + ": " + problem);
  }

  [[noreturn]] void syntax_error(const std::string& expected) const {
    if (at_ >= text_.size()) fail("expected " + expected + ", found the end");
    fail("expected " + expected + ", found " + quote_name(text_.substr(at_, 1)));
  }

  /// The next character, or '\0' at the end (never a valid token here).
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r')) {
      ++at_;
    }
  }

  void expect(char ch) {
    if (peek() != ch) syntax_error(quote_name(std::string_view(&ch, 1)));
    ++at_;
  }

  /// 'text' or "text", no escapes, on one line.
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') syntax_error("a string");
    const std::size_t begin = ++at_;
    while (at_ < text_.size() && text_[at_] != quote) {
      if (text_[at_] == '\\') fail("escape sequences in strings are not supported");
      if (text_[at_] == '\n') fail("string not terminated on its line");
      ++at_;
    }
    if (at_ == text_.size()) fail("string not terminated");
    return std::string(text_.substr(begin, at_++ - begin));
  }

  bool parse_bool() {
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(at_, word.size()) == word) {
        const std::size_t after = at_ + word.size();
        // A whole word: "Trueish" is not True.
        if (after < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[after])) || text_[after] == '_'))
          break;
        at_ = after;
        return value;
      }
    }
    fail("fortran_order is not True or False");
  }

  /// (), (3,), (2, 3) or (2, 3,): non-negative decimal integers.
  std::vector<std::size_t> parse_shape() {
    if (peek() != '(') fail("shape is not a tuple of non-negative integers");
    ++at_;
    std::vector<std::size_t> shape;
    bool trailing_comma = false;
    skip_space();
    while (peek() != ')') {
      if (peek() < '0' || peek() > '9') fail("shape is not a tuple of non-negative integers");
      std::size_t extent = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(extent, std::size_t(10), &extent) ||
            __builtin_add_overflow(extent, std::size_t(peek() - '0'), &extent)) {
          fail("shape extent does not fit 64 bits");
        }
        ++at_;
      }
      if (shape.size() == max_rank) fail("shape has more than " + std::to_string(max_rank) + " dimensions");
      shape.push_back(extent);
      skip_space();
      trailing_comma = false;
      if (peek() == ',') {
        ++at_;
        trailing_comma = true;
        skip_space();
      } else if (peek() != ')') {
        syntax_error("',' or ')' in the shape");
      }
    }
    ++at_;  // ')'
    // In Python "(3)" is the integer 3, not a tuple.
    if (shape.size() == 1 && !trailing_comma)
      fail("shape (" + std::to_string(shape[0]) + ") is not a tuple (write (" + std::to_string(shape[0]) + ",))");
    return shape;
  }

  const std::string& path_;
  std::string_view text_;
  std::size_t at_ = 0;
};

std::uint32_t read_le(const unsigned char* bytes, std::size_t count) {
  std::uint32_t value = 0;
  for (std::size_t i = count; i-- > 0;) value = (value << 8) | bytes[i];
  return value;
}

}  // namespace

npy_array read_npy(const std::string& path) {
  // 1. Open: regular files only.
  const regular_file file(path, "a .npy file");
  const std::size_t file_size = file.size();

  // 2. Preamble: magic, version, header length.
  unsigned char preamble[12] = {};
  file.read_exact(preamble, std::min<std::size_t>(file_size, sizeof preamble), 0);
  if (std::memcmp(preamble, magic, std::min(file_size, magic_size)) != 0) {
    throw file_error(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  if (file_size < 10) {
    throw file_error(path, "file is " + std::to_string(file_size) + " bytes, too short for a .npy header");
  }
  const unsigned major = preamble[6], minor = preamble[7];
  if (minor != 0 || major < 1 || major > 3) {
    throw file_error(path, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                               " (supported: 1.0, 2.0, 3.0)");
  }
  const std::size_t preamble_size = major == 1 ? 10 : 12;
  if (file_size < preamble_size) {
    throw file_error(path, "file is " + std::to_string(file_size) + " bytes, too short for a .npy header");
  }
  const std::size_t header_size = read_le(preamble + 8, preamble_size - 8);
  if (header_size > file_size - preamble_size) {
    throw file_error(path, "header length " + std::to_string(header_size) + " goes beyond the end of the file (" +
                               std::to_string(file_size) + " bytes)");
  }
  if (header_size > max_header_bytes) {
    throw file_error(path, "header length " + std::to_string(header_size) + " is over the limit of " +
                               std::to_string(max_header_bytes) + " bytes");
  }

  // 3. The header dict.
  std::string text(header_size, '\0');
  file.read_exact(text.data(), header_size, preamble_size);
  const auto header = header_parser(path, text).parse();
  if (header.descr != "<f4") throw file_error(path, "dtype " + quote_name(header.descr) + " is not float32 ('<f4')");
  if (header.fortran_order) throw file_error(path, "Fortran order is not supported");

  // 4. Sizes: the data must be exactly the rest of the file.
  // A zero extent anywhere makes an empty array, whatever the others are.
  std::size_t count = std::find(header.shape.begin(), header.shape.end(), 0) != header.shape.end() ? 0 : 1;
  std::size_t bytes = 0;
  for (const std::size_t extent : header.shape) {
    if (__builtin_mul_overflow(count, extent, &count)) {
      throw file_error(path, "shape " + format_shape(header.shape) + " has too many elements");
    }
  }
  if (__builtin_mul_overflow(count, sizeof(float), &bytes)) {
    throw file_error(path, "shape " + format_shape(header.shape) + " has too many bytes");
  }
  const std::size_t data_size = file_size - preamble_size - header_size;
  if (data_size != bytes) {
    throw file_error(path, "data is " + std::to_string(data_size) + " bytes, but shape " + format_shape(header.shape) +
                               " of float32 needs " + std::to_string(bytes) +
                               (data_size < bytes ? " (file truncated)" : " (trailing bytes)"));
  }

  // 5. The values.
  npy_array array{header.shape, std::vector<float>(count)};
  if (count != 0) file.read_exact(array.values.data(), bytes, preamble_size + header_size);
  if constexpr (std::endian::native == std::endian::big) {
    for (float& value : array.values) {
      value = std::bit_cast<float>(__builtin_bswap32(std::bit_cast<std::uint32_t>(value)));
    }
  }
  return array;
}

void write_npy(const std::string& path, const std::vector<std::size_t>& shape, const float* values) {
  if (shape.size() > max_rank) {
    throw file_error(
        path, "shape has " + std::to_string(shape.size()) + " dimensions, more than " + std::to_string(max_rank));
  }
  std::size_t count = std::find(shape.begin(), shape.end(), 0) != shape.end() ? 0 : 1;
  std::size_t bytes = 0;
  for (const std::size_t extent : shape) {
    if (__builtin_mul_overflow(count, extent, &count)) {
      throw file_error(path, "shape " + format_shape(shape) + " has too many elements");
    }
  }
  if (__builtin_mul_overflow(count, sizeof(float), &bytes)) {
    throw file_error(path, "shape " + format_shape(shape) + " has too many bytes");
  }
  if (count != 0 && values == nullptr) throw std::invalid_argument("write_npy: values is null for a non-empty shape");

  // Version 1.0 preamble (10 bytes), then the dict, spaces and '\n' so that
  // preamble + header is a multiple of 64 bytes (NumPy's ARRAY_ALIGN). With
  // rank <= 64 the header stays under 2 KB: 1.0's u16 length always fits.
  constexpr std::size_t preamble_size = 10;
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + format_shape(shape, true) + ", }";
  header.append((64 - (preamble_size + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  unsigned char preamble[preamble_size];
  std::memcpy(preamble, magic, magic_size);
  preamble[6] = 1;
  preamble[7] = 0;
  preamble[8] = header.size() & 0xff;
  preamble[9] = (header.size() >> 8) & 0xff;

  output_file file(path);
  file.write(preamble, preamble_size);
  file.write(header.data(), header.size());
  if constexpr (std::endian::native == std::endian::little) {
    file.write(values, bytes);
  } else {
    std::vector<std::uint32_t> chunk(std::min<std::size_t>(count, 1 << 16));
    for (std::size_t done = 0; done < count; done += chunk.size()) {
      const std::size_t n = std::min(chunk.size(), count - done);
      for (std::size_t i = 0; i < n; ++i) chunk[i] = __builtin_bswap32(std::bit_cast<std::uint32_t>(values[done + i]));
      file.write(chunk.data(), n * sizeof(std::uint32_t));
    }
  }
  file.commit();
}

}  // namespace kvhead::io
