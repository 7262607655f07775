// The one exception type of the file layer (engine/io).
//
// Contract for every reader and writer in engine/io: any problem with a file or
// its contents (missing, unreadable, not a regular file, truncated, malformed
// header, lying sizes, unsupported dtype, failed write ...) throws file_error,
// never anything else, and never crashes, hangs or allocates more than the file
// can justify. The message is ONE line, "<path>: <problem>", e.g.
//
//   w.safetensors: tensor 'q_proj.weight' data_offsets [0, 4096] end beyond
//   the data section (2048 bytes)
//
// Names taken from a file (tensor names, dtype strings) are quoted with
// quote_name(), which escapes control characters and shortens very long names, so
// a hostile name cannot break the message over several lines.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvhead::io {

/// `text` with every control character (bytes < 0x20 and 0x7f) written as an
/// escape (\n, \r, \t, \xNN): the result is safe to print on one line.
inline std::string escape_controls(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string result;
  result.reserve(text.size());
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte >= 0x20 && byte != 0x7f) {
      result += ch;
    } else if (ch == '\n') {
      result += "\\n";
    } else if (ch == '\r') {
      result += "\\r";
    } else if (ch == '\t') {
      result += "\\t";
    } else {
      result += "\\x";
      result += hex[byte >> 4];
      result += hex[byte & 0xf];
    }
  }
  return result;
}

/// 'text' in single quotes, control characters escaped, cut to 200 bytes
/// ("..." appended) so a megabyte-long hostile name keeps the message short.
inline std::string quote_name(std::string_view text) {
  constexpr std::size_t max_bytes = 200;
  std::string result = "'";
  result += escape_controls(text.substr(0, max_bytes));
  if (text.size() > max_bytes) result += "...";
  result += "'";
  return result;
}

/// A shape for a message: "[2, 3]".
inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

/// What a file_error is about: the contents, or getting at the file at all
/// (missing, unreadable, not a regular file: the C API's KVH_ERR_IO).
enum class file_problem { contents, access };

class file_error : public std::runtime_error {
 public:
  /// Message "<path>: <problem>", on one line (control characters escaped).
  file_error(std::string_view path, std::string_view problem, file_problem kind = file_problem::contents)
      : std::runtime_error(escape_controls(path) + ": " + escape_controls(problem)), kind_(kind) {}
  file_problem kind() const { return kind_; }

 private:
  file_problem kind_;
};

}  // namespace kvhead::io
