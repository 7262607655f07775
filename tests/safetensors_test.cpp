// safetensors reader: exact values for every dtype, one failing file per
// validation rule, truncation at every length, and random damage (under
// ASan/UBSan this is the hostile-file check: load or file_error, nothing else).
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/safetensors.hpp"
#include "tests/io_test_files.hpp"

namespace {

using kvhead::io::file_error;
using kvhead::io::safetensors_file;
using namespace kvhead::test;

// One float32 tensor "a" of shape [2]: 8 bytes of data.
const std::string tensor_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
const std::string data_a(8, '\0');

/// Writes `bytes` to `name` in `dir` and opens it.
safetensors_file open_bytes(const temp_dir& dir, const std::string& bytes, const std::string& name = "t.safetensors") {
  write_file(dir.file(name), bytes);
  return safetensors_file(dir.file(name));
}

/// The file (header text + data) is refused with a one-line message
/// "<path>: ..." containing `expected`.
void check_rejected(const std::string& header, const std::string& data, const std::string& expected) {
  temp_dir dir;
  const std::string path = dir.file("bad.safetensors");
  write_file(path, safetensors_bytes(header, data));
  INFO("header: ", header);
  CHECK_THROWS_WITH_AS(safetensors_file{path}, doctest::Contains(expected.c_str()), file_error);
  try {
    safetensors_file file(path);
  } catch (const file_error& error) {
    check_error_message(error, path);
  }
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits;
  for (const float value : values) bits.push_back(std::bit_cast<std::uint32_t>(value));
  return bits;
}

/// binary16 -> value, written from the definition (shares nothing with the
/// engine's bit manipulation): NaN maps to NaN, checked separately.
float reference_f16(std::uint16_t half) {
  const int exponent = (half >> 10) & 0x1f, mantissa = half & 0x3ff;
  const double sign = (half & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? std::numeric_limits<float>::quiet_NaN() : float(sign * INFINITY);
  if (exponent == 0) return float(sign * std::ldexp(mantissa, -24));
  return float(sign * std::ldexp(1024 + mantissa, exponent - 25));
}

TEST_CASE("safetensors: F32 loads bitwise, at any alignment, scalars included") {
  const std::vector<std::uint32_t> bits = {0x3fc00000, 0x80000000, 0x00000001, 0x7f7fffff,
                                           0x7f800000, 0xff800000, 0x7fc12345, 0x7f800001};
  std::vector<float> values;
  for (const std::uint32_t b : bits) values.push_back(std::bit_cast<float>(b));
  temp_dir dir;
  // An F16 scalar first (2 bytes) and a header of odd length: "m" and "s"
  // start at odd offsets in the file.
  std::string header = R"({"h":{"dtype":"F16","shape":[],"data_offsets":[0,2]},)"
                       R"("m":{"dtype":"F32","shape":[2,4],"data_offsets":[2,34]},)"
                       R"("s":{"dtype":"F32","shape":[],"data_offsets":[34,38]}})";
  if (header.size() % 2 == 0) header += ' ';
  const safetensors_file file =
      open_bytes(dir, safetensors_bytes(header, u16_bytes({0x3c00}) + f32_bytes(values) + f32_bytes({-2.5f})));
  CHECK(bits_of(file.load_f32("m")) == bits);
  CHECK(file.load_f32("s") == std::vector<float>{-2.5f});
  CHECK(file.load_f32("h") == std::vector<float>{1.0f});
  CHECK(file.info("m").shape == std::vector<std::size_t>{2, 4});
  CHECK(file.info("s").shape.empty());
  CHECK(kvhead::io::element_count(file.info("s")) == 1);
}

TEST_CASE("safetensors: F16 widens exactly, all 65536 values") {
  std::vector<std::uint16_t> halves(65536);
  for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = std::uint16_t(i);
  temp_dir dir;
  const safetensors_file file = open_bytes(dir, safetensors_bytes({{"x", "F16", {256, 256}, u16_bytes(halves)}}));
  const std::vector<float> values = file.load_f32("x");
  REQUIRE(values.size() == 65536);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float expected = reference_f16(halves[i]);
    const std::uint32_t got = std::bit_cast<std::uint32_t>(values[i]);
    if (std::isnan(expected)) {
      // NaN keeps its sign and payload (quiet bit included) in the top bits.
      const std::uint32_t want =
          (std::uint32_t(halves[i] & 0x8000) << 16) | 0x7f800000u | (std::uint32_t(halves[i] & 0x3ff) << 13);
      if (got != want) ++wrong;
    } else if (!(values[i] == expected) || std::signbit(values[i]) != std::signbit(expected)) {
      ++wrong;
    }
  }
  CHECK(wrong == 0);
  // Landmarks, written out.
  CHECK(values[0x3c00] == 1.0f);
  CHECK(values[0xc000] == -2.0f);
  CHECK(values[0x7bff] == 65504.0f);
  CHECK(values[0x0001] == std::ldexp(1.0f, -24));     // smallest subnormal
  CHECK(values[0x03ff] == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(values[0x0400] == std::ldexp(1.0f, -14));     // smallest normal
  CHECK(values[0x8001] == -std::ldexp(1.0f, -24));
  CHECK(std::bit_cast<std::uint32_t>(values[0x8000]) == 0x80000000u);  // -0
  CHECK(values[0x7c00] == INFINITY);
  CHECK(values[0xfc00] == -INFINITY);
  CHECK(std::isnan(values[0x7e00]));
  CHECK(std::isnan(values[0x7c01]));  // signaling NaN stays NaN
}

TEST_CASE("safetensors: BF16 widens exactly, all 65536 values") {
  std::vector<std::uint16_t> halves(65536);
  for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = std::uint16_t(i);
  temp_dir dir;
  const safetensors_file file = open_bytes(dir, safetensors_bytes({{"x", "BF16", {65536}, u16_bytes(halves)}}));
  const std::vector<float> values = file.load_f32("x");
  REQUIRE(values.size() == 65536);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(values[i]) != std::uint32_t(i) << 16) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(values[0x3f80] == 1.0f);
  CHECK(values[0xc000] == -2.0f);
  CHECK(values[0x4049] == 3.140625f);
  CHECK(values[0x0001] == std::ldexp(1.0f, -133));  // smallest subnormal
  CHECK(values[0x7f80] == INFINITY);
  CHECK(values[0xff80] == -INFINITY);
  CHECK(std::isnan(values[0x7fc0]));
}

TEST_CASE("safetensors: metadata, sorted names, info, empty and zero-size tensors") {
  temp_dir dir;
  {
    const safetensors_file file = open_bytes(
        dir, safetensors_bytes({{"z.weight", "F32", {1}, f32_bytes({7.0f})},
                                {"a.bias", "BF16", {2}, u16_bytes({0x3f80, 0x4000})},
                                {"empty", "F16", {2, 0, 3}, ""},
                                {"m.huge_but_empty", "F32", {0, 18446744073709551615ull, 18446744073709551615ull}, ""},
                                {"n.empty_last", "F16", {4294967296, 4294967296, 0}, ""}},
                               {{"format", "pt"}, {"note", "weights"}}));
    CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"note", "weights"}});
    CHECK(file.tensor_names() ==
          std::vector<std::string>{"a.bias", "empty", "m.huge_but_empty", "n.empty_last", "z.weight"});
    CHECK(file.contains("a.bias"));
    CHECK_FALSE(file.contains("a"));
    CHECK_FALSE(file.contains("__metadata__"));
    const auto& bias = file.info("a.bias");
    CHECK(bias.name == "a.bias");
    CHECK(bias.dtype == kvhead::io::dtype::bf16);
    CHECK(bias.begin == 4);
    CHECK(bias.end == 8);
    CHECK(file.load_f32("a.bias") == std::vector<float>{1.0f, 2.0f});
    CHECK(file.load_f32("empty").empty());
    CHECK(file.load_f32("m.huge_but_empty").empty());
    CHECK(file.load_f32("n.empty_last").empty());
    CHECK(file.load_f32("z.weight") == std::vector<float>{7.0f});
    CHECK_THROWS_WITH_AS(file.info("nope"), doctest::Contains("no tensor 'nope'"), file_error);
    CHECK_THROWS_WITH_AS(file.load_f32("nope"), doctest::Contains("no tensor 'nope'"), file_error);
  }
  // The smallest header, "{}", and a header padded with spaces.
  CHECK(open_bytes(dir, safetensors_bytes("{}", "")).tensor_names().empty());
  CHECK(open_bytes(dir, safetensors_bytes("{}      ", "")).tensor_names().empty());
  // Zero-size tensors at a boundary: the start, between two tensors, the end.
  const safetensors_file file =
      open_bytes(dir, safetensors_bytes(R"({"e0":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                                        R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                                        R"("e2":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                        R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                        data_a));
  CHECK(file.tensor_names().size() == 5);
}

TEST_CASE("safetensors: the tensors tile the data section exactly, in any header order") {
  const std::string data(12, '\0');
  // Unsorted but tiling: accepted.
  temp_dir dir;
  const safetensors_file file = open_bytes(
      dir, safetensors_bytes(R"({"c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
                             data));
  CHECK(file.info("c").begin == 8);
  // A gap at the start and between tensors.
  check_rejected(R"({"b":{"dtype":"F16","shape":[1],"data_offsets":[6,8]}})", data_a,
                 "data bytes [0, 6] before tensor 'b' [6, 8] belong to no tensor (the tensors must tile");
  check_rejected(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 data, "data bytes [4, 8] before tensor 'c' [8, 12] belong to no tensor");
  // Trailing bytes, with tensors and without.
  check_rejected("{" + tensor_a + "}", data_a + "xy", "data section is 10 bytes, but the tensors end at byte 8: trailing bytes");
  check_rejected("{}      ", "trailing", "data section is 8 bytes, but the tensors end at byte 0: trailing bytes");
  // A zero-size tensor inside another tensor's range.
  check_rejected("{" + tensor_a + R"(,"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", data_a,
                 "tensors 'a' [0, 8] and 'e' [4, 4] overlap");
}

TEST_CASE("safetensors: at most 100,000 tensors") {
  // Zero-size tensors at offset 0: the count alone decides.
  auto header = [](std::size_t tensors) {
    std::string text = "{";
    for (std::size_t i = 0; i < tensors; ++i)
      text += (i == 0 ? "\"t" : ",\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
    return text + "}";
  };
  temp_dir dir;
  CHECK(open_bytes(dir, safetensors_bytes(header(100'000), "")).tensor_names().size() == 100'000);
  check_rejected(header(100'001), "", "header has more than 100000 tensors");
}

TEST_CASE("safetensors: the handle is move-only and keeps its file") {
  static_assert(!std::is_copy_constructible_v<safetensors_file>);
  static_assert(std::is_nothrow_move_constructible_v<safetensors_file>);
  temp_dir dir;
  safetensors_file first = open_bytes(dir, safetensors_bytes({{"x", "F32", {1}, f32_bytes({3.0f})}}), "1.safetensors");
  safetensors_file second = std::move(first);
  CHECK(second.load_f32("x") == std::vector<float>{3.0f});
  safetensors_file third = open_bytes(dir, safetensors_bytes({{"y", "F32", {1}, f32_bytes({4.0f})}}), "2.safetensors");
  third = std::move(second);
  CHECK(third.load_f32("x") == std::vector<float>{3.0f});
  CHECK(third.path() == dir.file("1.safetensors"));
}

TEST_CASE("safetensors: paths that are not readable regular files") {
  temp_dir dir;
  CHECK_THROWS_WITH_AS(safetensors_file(dir.file("missing.safetensors")),
                       doctest::Contains("missing.safetensors: cannot open: No such file or directory"), file_error);
  CHECK_THROWS_WITH_AS(safetensors_file(dir.path().string()), doctest::Contains("is a directory"), file_error);
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(safetensors_file{fifo}, doctest::Contains("not a regular file"), file_error);  // no hang
  write_file(dir.file("short"), "1234567");
  CHECK_THROWS_WITH_AS(safetensors_file(dir.file("short")), doctest::Contains("7 bytes, too short"), file_error);
  write_file(dir.file("empty"), "");
  CHECK_THROWS_WITH_AS(safetensors_file(dir.file("empty")), doctest::Contains("0 bytes, too short"), file_error);
  if (::geteuid() != 0) {  // root reads anything
    write_file(dir.file("locked"), safetensors_bytes("{}", ""));
    REQUIRE(::chmod(dir.file("locked").c_str(), 0) == 0);
    CHECK_THROWS_WITH_AS(safetensors_file(dir.file("locked")), doctest::Contains("Permission denied"), file_error);
  }
}

TEST_CASE("safetensors: header length bounds") {
  temp_dir dir;
  const std::string path = dir.file("h.safetensors");
  auto check = [&](const std::string& bytes, const char* expected) {
    write_file(path, bytes);
    CHECK_THROWS_WITH_AS(safetensors_file{path}, doctest::Contains(expected), file_error);
  };
  check(little_endian(0, 8), "header length 0 is too small");
  check(little_endian(1, 8) + "{", "header length 1 is too small");
  check(little_endian(100'000'001, 8) + "{}", "header length 100000001 is over the limit");
  check(little_endian(~0ull, 8) + "{}", "is over the limit");
  check(little_endian(3, 8) + "{}", "header length 3 goes beyond the end of the file (10 bytes)");
  check(little_endian(1000, 8) + "{}", "goes beyond the end of the file");
}

TEST_CASE("safetensors: header JSON syntax and top-level type") {
  check_rejected("{\"a\":", "", "header is not valid JSON");
  check_rejected("{'a':1}", "", "header is not valid JSON");
  check_rejected("{}x", "", "header is not valid JSON");  // trailing garbage
  check_rejected("{}{}", "", "header is not valid JSON");
  check_rejected("{\"\xff\":{}}", "", "header is not valid JSON");  // not UTF-8
  check_rejected("{\"\xff\":{}}", "", "last read: '\"\\xff'");      // shown escaped
  check_rejected(std::string("{}\0", 3), "", "header is not valid JSON");
  check_rejected(std::string("{}\0{\"a\":", 8), "", "NUL byte at header offset 2");  // nlohmann stops at NUL
  check_rejected("{\"a\":1e999}", "", "header is not valid JSON");                   // number overflow
  check_rejected("[]", "", "header is not a JSON object");
  check_rejected("12", "", "header is not a JSON object");
  check_rejected("\"{}\"", "", "header is not a JSON object");
  check_rejected("null", "", "header is not a JSON object");
  // The parse error message is cut short even when the bad token is huge.
  check_rejected("{\"" + std::string(100000, 'x'), "", "header is not valid JSON");
}

TEST_CASE("safetensors: duplicate keys at every depth") {
  check_rejected("{" + tensor_a + "," + tensor_a + "}", data_a, "duplicate key 'a' in the header");
  check_rejected(R"({"__metadata__":{},"__metadata__":{}})", "", "duplicate key '__metadata__'");
  check_rejected(R"({"__metadata__":{"k":"1","k":"2"}})", "", "duplicate key 'k' in __metadata__");
  check_rejected(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data_a,
                 "duplicate key 'dtype' in tensor 'a'");
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}})", data_a,
                 "duplicate key 'shape' in tensor 'a'");
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"data_offsets":[0,8]}})", data_a,
                 "duplicate key 'data_offsets' in tensor 'a'");
  // Same name through a JSON escape is still a duplicate.
  check_rejected("{" + tensor_a + R"(,"\u0061":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", data_a,
                 "duplicate key 'a'");
}

TEST_CASE("safetensors: __metadata__ maps strings to strings") {
  check_rejected(R"({"__metadata__":[]})", "", "__metadata__ is not an object");
  check_rejected(R"({"__metadata__":"x"})", "", "__metadata__ is not an object");
  check_rejected(R"({"__metadata__":{"k":1}})", "", "__metadata__ value for 'k' is not a string");
  check_rejected(R"({"__metadata__":{"k":{}}})", "", "__metadata__ value for 'k' is not a string");
  check_rejected(R"({"__metadata__":{"k":["v"]}})", "", "__metadata__ value for 'k' is not a string");
  check_rejected(R"({"__metadata__":{"k":null}})", "", "__metadata__ value for 'k' is not a string");
}

TEST_CASE("safetensors: tensor entry structure") {
  check_rejected(R"({"a":[]})", "", "tensor 'a' is not an object");
  check_rejected(R"({"a":"F32"})", "", "tensor 'a' is not an object");
  check_rejected(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", data_a, "tensor 'a' is missing 'dtype'");
  check_rejected(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", data_a, "tensor 'a' is missing 'shape'");
  check_rejected(R"({"a":{"dtype":"F32","shape":[2]}})", data_a, "tensor 'a' is missing 'data_offsets'");
  check_rejected(R"({"a":{}})", "", "tensor 'a' is missing 'dtype'");
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", data_a,
                 "tensor 'a' has unknown key 'extra'");
  check_rejected(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", data_a, "tensor 'a' dtype is not a string");
  check_rejected(R"({"a":{"dtype":["F32"],"shape":[2],"data_offsets":[0,8]}})", data_a,
                 "tensor 'a' dtype is not a string");
  const char* shape_problem = "tensor 'a' shape is not an array of non-negative integers";
  check_rejected(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", data_a, shape_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data_a, shape_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data_a, shape_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", data_a, shape_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", data_a, shape_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[{}],"data_offsets":[0,8]}})", data_a, shape_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[true],"data_offsets":[0,8]}})", data_a, shape_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}})", data_a,
                 shape_problem);  // beyond u64: parsed as a double
  std::string rank_65 = "[0";
  for (int i = 1; i < 65; ++i) rank_65 += ",0";
  check_rejected(R"({"a":{"dtype":"F32","shape":)" + rank_65 + R"(],"data_offsets":[0,0]}})", "",
                 "tensor 'a' shape has more than 64 dimensions");
  temp_dir dir;
  std::string rank_64 = "[1";
  for (int i = 1; i < 64; ++i) rank_64 += ",1";
  CHECK(open_bytes(dir, safetensors_bytes(R"({"a":{"dtype":"F32","shape":)" + rank_64 + R"(],"data_offsets":[0,4]}})",
                                          f32_bytes({5.0f})))
            .info("a")
            .shape.size() == 64);
  const char* offsets_problem = "tensor 'a' data_offsets is not an array of 2 non-negative integers";
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", data_a, offsets_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[]}})", data_a, offsets_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", data_a, offsets_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}})", data_a, offsets_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":{"0":8}}})", data_a, offsets_problem);
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})", data_a, offsets_problem);
}

TEST_CASE("safetensors: dtype must be F32, F16 or BF16") {
  for (const char* name : {"F64", "I8", "U8", "BOOL", "F8_E4M3", "f32", "", "F32 "}) {
    check_rejected(std::string(R"({"a":{"dtype":")") + name + R"(","shape":[2],"data_offsets":[0,8]}})", data_a,
                   "tensor 'a' has unsupported dtype '" + std::string(name) + "'");
  }
}

TEST_CASE("safetensors: element count and byte size overflow") {
  check_rejected(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", "",
                 "tensor 'a' shape [4294967296, 4294967296] has too many elements");
  check_rejected(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", "",
                 "has too many bytes");
  check_rejected(R"({"a":{"dtype":"BF16","shape":[18446744073709551615],"data_offsets":[0,0]}})", "",
                 "has too many bytes");
  // A rank-64 shape of 2s overflows too; the message lists 8 extents only.
  std::string shape = "[2";
  for (int i = 1; i < 64; ++i) shape += ",2";
  check_rejected(R"({"a":{"dtype":"F32","shape":)" + shape + R"(],"data_offsets":[0,0]}})", "",
                 "shape [2, 2, 2, 2, 2, 2, 2, 2, ...] has too many elements");
}

TEST_CASE("safetensors: data_offsets against the shape and the data section") {
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data_a,
                 "tensor 'a' data_offsets [8, 0] begin after end");
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", data_a,
                 "tensor 'a' data_offsets [0, 4] span 4 bytes, but shape [2] of F32 needs 8");
  check_rejected(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", data_a, "of F16 needs 4");
  check_rejected(R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,0]}})", data_a, "needs 4");  // scalar
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", data_a,
                 "span 18446744073709551615 bytes");
  check_rejected(R"({"q_proj.weight":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]}})", std::string(2048, '\0'),
                 "tensor 'q_proj.weight' data_offsets [0, 4096] end beyond the data section (2048 bytes)");
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})", data_a, "end beyond the data section");
  check_rejected(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[9,9]}})", data_a,
                 "end beyond the data section (8 bytes)");
  check_rejected(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[18446744073709551608,0]}})", data_a,
                 "begin after end");
}

TEST_CASE("safetensors: overlapping tensors") {
  const std::string data(16, '\0');
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 data, "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
  check_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})",
                 data, "overlap");
  check_rejected(R"({"big":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                 R"("x":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 data, "tensors 'big' [0, 16] and 'x' [8, 12] overlap");
  // Touching ranges do not overlap.
  temp_dir dir;
  CHECK(open_bytes(dir, safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                          data))
            .tensor_names()
            .size() == 2);
}

TEST_CASE("safetensors: hostile names and paths stay on one line") {
  check_rejected(R"({"bad\nname":{"dtype":"I8","shape":[2],"data_offsets":[0,8]}})", data_a,
                 "tensor 'bad\\nname' has unsupported dtype 'I8'");
  check_rejected(R"({"a\u0000\u001b":{"dtype":"I8","shape":[2],"data_offsets":[0,8]}})", data_a,
                 "tensor 'a\\x00\\x1b'");
  check_rejected("{\"" + std::string(10000, 'n') + R"(":{"dtype":"I8","shape":[2],"data_offsets":[0,8]}})", data_a,
                 std::string(200, 'n') + "...'");
  temp_dir dir;
  const std::string path = dir.file("line\nbreak.safetensors");
  write_file(path, "garbage!!");
  CHECK_THROWS_WITH_AS(safetensors_file{path}, doctest::Contains("line\\nbreak.safetensors: header length"),
                       file_error);
}

std::size_t open_descriptors() {
  return std::size_t(std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                   std::filesystem::directory_iterator()));
}

/// Whether `path` is mapped into this process (a line of /proc/self/maps).
bool is_mapped(const std::string& path) {
  return read_file("/proc/self/maps").find(std::filesystem::canonical(path).string()) != std::string::npos;
}

TEST_CASE("safetensors: failures and destruction release the descriptor, the file is never mapped") {
  temp_dir dir;
  const std::string path = dir.file("leak.safetensors");
  const std::size_t descriptors = open_descriptors();
  // Rejected after reading the header (bad dtype) and before (too short).
  write_file(path, safetensors_bytes(R"({"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})", "xx"));
  for (int i = 0; i < 20; ++i) CHECK_THROWS_AS(safetensors_file{path}, file_error);
  write_file(path, "short");
  CHECK_THROWS_AS(safetensors_file{path}, file_error);
  CHECK(open_descriptors() == descriptors);
  write_file(path, safetensors_bytes({{"x", "F32", {1}, f32_bytes({1.0f})}}));
  {
    const safetensors_file file(path);
    CHECK_FALSE(is_mapped(path));
    CHECK(open_descriptors() == descriptors + 1);  // open while the handle lives
  }
  CHECK(open_descriptors() == descriptors);
}

TEST_CASE("safetensors: a file truncated while open is a file_error, not SIGBUS") {
  // With a mapping, touching a page beyond the new end of the file raises
  // SIGBUS; pread reports the short read instead.
  temp_dir dir;
  const std::string path = dir.file("shrinking.safetensors");
  const std::size_t count = 4096;  // 16 KiB: several pages
  write_file(path, safetensors_bytes({{"w", "F32", {count}, f32_bytes(std::vector<float>(count, 1.5f))},
                                      {"h", "BF16", {count}, u16_bytes(std::vector<std::uint16_t>(count, 0x3f80))}}));
  const safetensors_file file(path);
  CHECK(file.load_f32("w") == std::vector<float>(count, 1.5f));
  std::filesystem::resize_file(path, 100);  // the header survives, the data does not
  CHECK_THROWS_WITH_AS(file.load_f32("w"), doctest::Contains("file ended early"), file_error);
  CHECK_THROWS_WITH_AS(file.load_f32("h"), doctest::Contains("file ended early"), file_error);
  try {
    (void)file.load_f32("w");
  } catch (const file_error& error) {
    check_error_message(error, path);
  }
}

// A small valid file with every dtype, metadata and a scalar: the seed for
// the truncation and mutation loops. The last tensor ends at the end of the
// file, so every truncation breaks it.
std::string valid_file() {
  return safetensors_bytes({{"w", "F32", {2, 3}, f32_bytes({1, 2, 3, 4, 5, 6})},
                            {"h", "F16", {3}, u16_bytes({0x3c00, 0x0001, 0x7c00})},
                            {"s", "BF16", {}, u16_bytes({0x3f80})},
                            {"z", "F32", {0, 4}, ""},
                            {"b", "BF16", {2}, u16_bytes({0x4000, 0xc000})}},
                           {{"format", "pt"}});
}

TEST_CASE("safetensors: truncation at every length throws file_error") {
  const std::string bytes = valid_file();
  temp_dir dir;
  const std::string path = dir.file("cut.safetensors");
  write_file(path, bytes);
  CHECK(safetensors_file(path).tensor_names().size() == 5);
  std::size_t not_rejected = 0;
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    write_file(path, bytes.substr(0, size));
    try {
      safetensors_file file(path);
      ++not_rejected;
    } catch (const file_error& error) {
      check_error_message(error, path);
    }
  }
  CHECK(not_rejected == 0);
}

TEST_CASE("safetensors: random mutations load or throw file_error") {
  const std::string original = valid_file();
  temp_dir dir;
  const std::string path = dir.file("mutant.safetensors");
  std::mt19937 generator(20240611);
  std::size_t loaded = 0, rejected = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    write_file(path, mutate(original, generator));
    try {
      const safetensors_file file(path);
      for (const std::string& name : file.tensor_names()) {
        CHECK(file.load_f32(name).size() == kvhead::io::element_count(file.info(name)));
      }
      ++loaded;
    } catch (const file_error& error) {
      check_error_message(error, path);
      ++rejected;
    }
  }
  CHECK(loaded > 0);
  CHECK(rejected > 0);
}

}  // namespace
