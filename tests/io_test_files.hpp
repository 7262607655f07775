// Test helpers for the file layer (engine/io): a self-cleaning temporary
// directory, and builders for valid and deliberately broken safetensors and
// .npy files. The builders write bytes by hand (no engine code), so a test can
// produce anything, including duplicate keys and lying lengths.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/io/file_error.hpp"

namespace kvhead::test {

/// A fresh directory under the system temporary directory, removed with all
/// its contents on destruction.
class temp_dir {
 public:
  temp_dir() {
    static std::atomic<unsigned> counter{0};
    std::random_device entropy;
    const std::string name = "kvhead-io-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
                             std::to_string(entropy());
    path_ = std::filesystem::temp_directory_path() / name;
    if (!std::filesystem::create_directory(path_)) throw std::runtime_error("temp_dir: exists: " + path_.string());
  }
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

  /// Names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("write_file failed: " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("read_file failed: " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// `value` as `bytes` little-endian bytes.
inline std::string little_endian(std::uint64_t value, std::size_t bytes) {
  std::string text;
  for (std::size_t i = 0; i < bytes; ++i) text += char((value >> (8 * i)) & 0xff);
  return text;
}

inline std::string f32_bytes(const std::vector<float>& values) {
  std::string text;
  for (const float value : values) text += little_endian(std::bit_cast<std::uint32_t>(value), 4);
  return text;
}

inline std::string u16_bytes(const std::vector<std::uint16_t>& values) {
  std::string text;
  for (const std::uint16_t value : values) text += little_endian(value, 2);
  return text;
}

// --- safetensors -----------------------------------------------------------

/// u64 header length, the header text as given, the data.
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  return little_endian(header.size(), 8) + header + data;
}

struct st_tensor {
  std::string name;  // written into JSON as is: no characters needing escapes
  std::string dtype;
  std::vector<std::size_t> shape;
  std::string data;  // raw bytes
};

inline std::string json_list(const std::vector<std::size_t>& values) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i != 0) text += ",";
    text += std::to_string(values[i]);  // no "," + ...: GCC 12 false -Wrestrict
  }
  return text + "]";
}

/// A valid file: tensors packed in order, header padded with spaces to a
/// multiple of 8 bytes (as the Python writer does) unless `pad` is false.
inline std::string safetensors_bytes(const std::vector<st_tensor>& tensors,
                                     const std::map<std::string, std::string>& metadata = {}, bool pad = true) {
  std::string header = "{", data;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      header += std::string(first ? "" : ",") + "\"" + key + "\":\"" + value + "\"";
      first = false;
    }
    header += "}";
  }
  for (const st_tensor& tensor : tensors) {
    if (header.size() > 1) header += ",";
    header += "\"" + tensor.name + "\":{\"dtype\":\"" + tensor.dtype + "\",\"shape\":" + json_list(tensor.shape) +
              ",\"data_offsets\":" + json_list({data.size(), data.size() + tensor.data.size()}) + "}";
    data += tensor.data;
  }
  header += "}";
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return safetensors_bytes(header, data);
}

// --- npy ------------------------------------------------------------------

/// Magic, version, header length field (2 bytes for 1.x, else 4), header
/// text as given, data.
inline std::string npy_bytes(unsigned major, unsigned minor, const std::string& header, const std::string& data) {
  std::string text = "\x93NUMPY";
  text += char(major);
  text += char(minor);
  text += little_endian(header.size(), major == 1 ? 2 : 4);
  return text + header + data;
}

/// A dict text padded as NumPy pads it (to 64 bytes including the preamble).
inline std::string npy_header(const std::string& dict, std::size_t preamble = 10) {
  std::string header = dict;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  return header + "\n";
}

// --- checks -----------------------------------------------------------------

/// The error contract: "<path>: <problem>" on one line.
inline void check_error_message(const io::file_error& error, const std::string& path) {
  const std::string message = error.what();
  CHECK(message.rfind(path + ": ", 0) == 0);
  CHECK(message.find('\n') == std::string::npos);
  CHECK(message.size() < 2000);
}

/// Random damage for the hostile-file loops: 1-4 edits among bit flips,
/// random or JSON-significant bytes, deletions, insertions and truncation.
inline std::string mutate(std::string bytes, std::mt19937& generator) {
  static constexpr char interesting[] = {'{',    '}',    '[', ']', '"',  ',', ':', '0',  '9',  '-', ' ', '\0',
                                         '\xff', '\x80', '.', 'e', '\'', '(', ')', '\n', '\\', 'T', 'F'};
  auto random = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(generator); };
  const std::size_t edits = 1 + random(4);
  for (std::size_t edit = 0; edit < edits && !bytes.empty(); ++edit) {
    const std::size_t at = random(bytes.size());
    switch (random(7)) {
      case 0: bytes[at] = char(bytes[at] ^ (1 << random(8))); break;
      case 1: bytes[at] = char(random(256)); break;
      case 2:
      case 3: bytes[at] = interesting[random(sizeof interesting)]; break;
      case 4: bytes.erase(at, 1); break;
      case 5: bytes.insert(bytes.begin() + std::ptrdiff_t(at), interesting[random(sizeof interesting)]); break;
      default: bytes.resize(at); break;
    }
  }
  return bytes;
}

}  // namespace kvhead::test
