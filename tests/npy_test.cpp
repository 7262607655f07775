// .npy reader and atomic writer: round trips, NumPy's exact header layout,
// one failing file per rule, truncation at every length, random damage, and
// the writer's failure paths (nothing left behind, old file untouched).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/io/npy.hpp"
#include "tests/io_test_files.hpp"

namespace {

using kvhead::io::file_error;
using kvhead::io::npy_array;
using kvhead::io::read_npy;
using kvhead::io::write_npy;
using namespace kvhead::test;

const std::string dict_3 = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
const std::string data_3 = f32_bytes({1.0f, -2.0f, 0.5f});

std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits;
  for (const float value : values) bits.push_back(std::bit_cast<std::uint32_t>(value));
  return bits;
}

/// The bytes are refused with a one-line message "<path>: ..." containing
/// `expected`.
void check_rejected(const std::string& bytes, const std::string& expected) {
  temp_dir dir;
  const std::string path = dir.file("bad.npy");
  write_file(path, bytes);
  CHECK_THROWS_WITH_AS(read_npy(path), doctest::Contains(expected.c_str()), file_error);
  try {
    read_npy(path);
  } catch (const file_error& error) {
    check_error_message(error, path);
  }
}

/// A version 1.0 file with the dict padded as NumPy pads it.
std::string npy_v1(const std::string& dict, const std::string& data) { return npy_bytes(1, 0, npy_header(dict), data); }

TEST_CASE("npy: write then read, ranks 0 to 3, bitwise") {
  temp_dir dir;
  std::mt19937 generator(7);
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  const std::vector<std::vector<std::size_t>> shapes = {{}, {1}, {5}, {3, 4}, {2, 3, 7}, {2, 0}, {0}, {4, 1, 1}};
  for (const auto& shape : shapes) {
    std::size_t count = 1;
    for (const std::size_t extent : shape) count *= extent;
    std::vector<float> values(count);
    for (float& value : values) value = uniform(generator);
    if (count >= 3) {  // special values survive bitwise
      values[0] = std::bit_cast<float>(0x7fc01234u);
      values[1] = -0.0f;
      values[2] = std::numeric_limits<float>::denorm_min();
    }
    const std::string path = dir.file("a.npy");
    write_npy(path, shape, values.data());
    const npy_array array = read_npy(path);
    CHECK(array.shape == shape);
    CHECK(bits_of(array.values) == bits_of(values));
  }
  // Empty arrays may pass a null pointer.
  write_npy(dir.file("empty.npy"), {0, 3}, nullptr);
  CHECK(read_npy(dir.file("empty.npy")).shape == std::vector<std::size_t>{0, 3});
  CHECK_THROWS_AS(write_npy(dir.file("null.npy"), {2}, nullptr), std::invalid_argument);
  CHECK(dir.entries() == std::vector<std::string>{"a.npy", "empty.npy"});
}

TEST_CASE("npy: written header is NumPy's: version 1.0, 64-byte aligned, ends in newline") {
  temp_dir dir;
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  auto check_header = [&](const std::vector<std::size_t>& shape, const std::string& dict) {
    write_npy(dir.file("h.npy"), shape, values.data());
    const std::string bytes = read_file(dir.file("h.npy"));
    REQUIRE(bytes.size() >= 10);
    CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
    const std::size_t header_size = std::uint8_t(bytes[8]) | std::uint8_t(bytes[9]) << 8;
    CHECK((10 + header_size) % 64 == 0);
    const std::string header = bytes.substr(10, header_size);
    CHECK(header.rfind(dict, 0) == 0);
    CHECK(header.back() == '\n');
    CHECK(header.find_first_not_of(' ', dict.size()) == header.size() - 1);
    // Byte for byte what NumPy writes for these shapes.
    CHECK(bytes.substr(0, 10 + header_size) == npy_v1(dict, ""));
  };
  check_header({2, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  check_header({6}, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }");
  check_header({}, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }");
}

TEST_CASE("npy: rank up to 64, as NumPy") {
  temp_dir dir;
  const float value = 42.0f;
  const std::vector<std::size_t> rank_64(64, 1);
  write_npy(dir.file("r64.npy"), rank_64, &value);
  const npy_array array = read_npy(dir.file("r64.npy"));
  CHECK(array.shape == rank_64);
  CHECK(array.values == std::vector<float>{42.0f});
  CHECK_THROWS_WITH_AS(write_npy(dir.file("r65.npy"), std::vector<std::size_t>(65, 1), &value),
                       doctest::Contains("r65.npy: shape has 65 dimensions, more than 64"), file_error);
  CHECK(dir.entries() == std::vector<std::string>{"r64.npy"});
  std::string shape = "(1";
  for (int i = 1; i < 65; ++i) shape += ", 1";
  check_rejected(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + "), }", f32_bytes({1.0f})),
                 "shape has more than 64 dimensions");
}

TEST_CASE("npy: reads the header variants NumPy and other writers produce") {
  temp_dir dir;
  auto read_bytes = [&](const std::string& bytes) {
    write_file(dir.file("v.npy"), bytes);
    return read_npy(dir.file("v.npy"));
  };
  CHECK(read_bytes(npy_v1(dict_3, data_3)).values == std::vector<float>{1.0f, -2.0f, 0.5f});
  CHECK(read_bytes(npy_bytes(2, 0, npy_header(dict_3, 12), data_3)).shape == std::vector<std::size_t>{3});
  CHECK(read_bytes(npy_bytes(3, 0, npy_header(dict_3, 12), data_3)).shape == std::vector<std::size_t>{3});
  // Key order, double quotes, no trailing comma, extra spaces, no padding.
  CHECK(read_bytes(npy_bytes(1, 0, "{ \"shape\" : ( 1 , 3 ) , \"fortran_order\":False,\"descr\":\"<f4\"}", data_3))
            .shape == std::vector<std::size_t>{1, 3});
  CHECK(read_bytes(npy_bytes(1, 0, "{'descr':'<f4','fortran_order':False,'shape':(3, )}\n", data_3)).values.size() ==
        3);
  // Scalar: shape (), one value.
  const npy_array scalar =
      read_bytes(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f32_bytes({9.0f})));
  CHECK(scalar.shape.empty());
  CHECK(scalar.values == std::vector<float>{9.0f});
  // Zero-size with a huge other extent: count 0, no overflow.
  CHECK(read_bytes(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 18446744073709551615), }", ""))
            .values.empty());
  CHECK(read_bytes(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 0), }", ""))
            .values.empty());
}

TEST_CASE("npy: unreadable paths") {
  temp_dir dir;
  CHECK_THROWS_WITH_AS(read_npy(dir.file("missing.npy")),
                       doctest::Contains("missing.npy: cannot open: No such file or directory"), file_error);
  CHECK_THROWS_WITH_AS(read_npy(dir.path().string()), doctest::Contains("is a directory"), file_error);
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(read_npy(fifo), doctest::Contains("not a regular file"), file_error);  // no hang
}

TEST_CASE("npy: magic, version and header length") {
  check_rejected("", "too short");
  check_rejected("\x93NUM", "too short");
  check_rejected("\x93NUMPY\x01", "too short");
  check_rejected("PK\x03\x04 this is a zip", "not a .npy file");
  check_rejected("\x93NUMPz" + npy_v1(dict_3, data_3).substr(6), "not a .npy file");
  check_rejected(npy_bytes(4, 0, npy_header(dict_3, 12), data_3), "unsupported .npy format version 4.0");
  check_rejected(npy_bytes(1, 1, npy_header(dict_3, 12), data_3), "unsupported .npy format version 1.1");
  check_rejected(npy_bytes(0, 0, npy_header(dict_3, 12), data_3), "unsupported .npy format version 0.0");
  check_rejected(std::string("\x93NUMPY\x02\x00\x10\x00", 10), "too short");
  check_rejected(std::string("\x93NUMPY\x01\x00", 8) + little_endian(0xffff, 2) + "{}",
                 "header length 65535 goes beyond the end of the file");
  check_rejected(std::string("\x93NUMPY\x02\x00", 8) + little_endian(0xffffffff, 4) + "{}",
                 "goes beyond the end of the file");
  const std::string long_header = npy_header(dict_3 + std::string(1'000'100, ' '), 12);
  check_rejected(npy_bytes(2, 0, long_header, data_3), "is over the limit of 1000000 bytes");
}

TEST_CASE("npy: dtype and order") {
  check_rejected(npy_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", data_3),
                 "bad.npy: dtype '<f8' is not float32 ('<f4')");
  check_rejected(npy_v1("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", data_3),
                 "dtype '>f4' is not float32");
  check_rejected(npy_v1("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", data_3), "dtype '|u1'");
  check_rejected(npy_v1("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", data_3),
                 "descr is not a string");
  check_rejected(npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", data_3),
                 "bad.npy: Fortran order is not supported");
  check_rejected(npy_v1("{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }", data_3),
                 "fortran_order is not True or False");
  check_rejected(npy_v1("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (3,), }", data_3),
                 "fortran_order is not True or False");
}

TEST_CASE("npy: header dict syntax") {
  auto with_dict = [](const std::string& dict) { return npy_v1(dict, data_3); };
  check_rejected(with_dict("{'descr' '<f4', 'fortran_order': False, 'shape': (3,), }"), "expected ':'");
  check_rejected(with_dict("{'descr': '<f4' 'fortran_order': False, 'shape': (3,), }"), "expected ',' or '}'");
  check_rejected(with_dict("{'descr': '<f4, 'fortran_order': False, 'shape': (3,), }"), "bad header at byte");
  check_rejected(npy_bytes(1, 0, "{'descr': '<f4", data_3), "string not terminated");
  check_rejected(with_dict("{'descr': '<\\x66\\x34', 'fortran_order': False, 'shape': (3,), }"),
                 "escape sequences in strings are not supported");
  check_rejected(with_dict("['descr', '<f4']"), "expected '{'");
  check_rejected(with_dict("{descr: '<f4', 'fortran_order': False, 'shape': (3,), }"), "expected a string");
  check_rejected(npy_bytes(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), ", data_3), "found the end");
  check_rejected(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } x"),
                 "expected the end of the header after '}'");
  check_rejected(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }}"), "after '}'");
  check_rejected(npy_bytes(1, 0, dict_3 + std::string(1, '\0') + "  ", data_3), "after '}'");
  check_rejected(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'extra': 1, }"),
                 "unknown key 'extra'");
  check_rejected(with_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"),
                 "duplicate key 'descr'");
  check_rejected(with_dict("{'descr': '<f4', 'fortran_order': False, 'fortran_order': False, 'shape': (3,), }"),
                 "duplicate key 'fortran_order'");
  check_rejected(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'shape': (3,), }"),
                 "duplicate key 'shape'");
  check_rejected(with_dict("{'fortran_order': False, 'shape': (3,), }"), "no 'descr' key");
  check_rejected(with_dict("{'descr': '<f4', 'shape': (3,), }"), "no 'fortran_order' key");
  check_rejected(with_dict("{'descr': '<f4', 'fortran_order': False, }"), "no 'shape' key");
  check_rejected(with_dict("{}"), "no 'descr' key");
}

TEST_CASE("npy: shape syntax and sizes") {
  auto with_shape = [](const std::string& shape, const std::string& data) {
    return npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }", data);
  };
  check_rejected(with_shape("(3)", data_3), "shape (3) is not a tuple (write (3,))");
  check_rejected(with_shape("[3]", data_3), "shape is not a tuple of non-negative integers");
  check_rejected(with_shape("3", data_3), "shape is not a tuple of non-negative integers");
  check_rejected(with_shape("(-3,)", data_3), "shape is not a tuple of non-negative integers");
  check_rejected(with_shape("(3.0,)", data_3), "expected ',' or ')' in the shape");
  check_rejected(with_shape("(3 4)", data_3), "expected ',' or ')' in the shape");
  check_rejected(with_shape("(,)", data_3), "shape is not a tuple");
  check_rejected(with_shape("(3,,)", data_3), "shape is not a tuple");
  check_rejected(with_shape("(3", data_3), "shape");
  check_rejected(with_shape("(18446744073709551616,)", ""), "shape extent does not fit 64 bits");
  check_rejected(with_shape("(4294967296, 4294967296)", ""), "shape (4294967296, 4294967296) has too many elements");
  check_rejected(with_shape("(4611686018427387904,)", ""), "has too many bytes");
  check_rejected(with_shape("(4,)", data_3), "data is 12 bytes, but shape (4,) of float32 needs 16 (file truncated)");
  check_rejected(with_shape("(2,)", data_3), "data is 12 bytes, but shape (2,) of float32 needs 8 (trailing bytes)");
  check_rejected(with_shape("()", data_3), "needs 4 (trailing bytes)");
  check_rejected(with_shape("(3,)", data_3 + "x"), "trailing bytes");
  check_rejected(with_shape("(3,)", data_3.substr(0, 11)), "file truncated");
}

TEST_CASE("npy: truncation at every length throws file_error") {
  temp_dir dir;
  const std::string path = dir.file("cut.npy");
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  write_npy(path, {2, 3}, values.data());
  const std::string bytes = read_file(path);
  std::size_t not_rejected = 0;
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    write_file(path, bytes.substr(0, size));
    try {
      read_npy(path);
      ++not_rejected;
    } catch (const file_error& error) {
      check_error_message(error, path);
    }
  }
  CHECK(not_rejected == 0);
}

TEST_CASE("npy: random mutations load or throw file_error") {
  temp_dir dir;
  const std::string path = dir.file("mutant.npy");
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  write_npy(path, {2, 3}, values.data());
  const std::string original = read_file(path);
  std::mt19937 generator(20240612);
  std::size_t loaded = 0, rejected = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    // Bias the damage to the 128-byte preamble + header: mutate it alone.
    const std::string header = original.substr(0, 64), rest = original.substr(64);
    write_file(path, iteration % 4 == 0 ? mutate(original, generator) : mutate(header, generator) + rest);
    try {
      const npy_array array = read_npy(path);
      std::size_t count = 1;
      for (const std::size_t extent : array.shape) count *= extent;
      CHECK(array.values.size() == count);
      ++loaded;
    } catch (const file_error& error) {
      check_error_message(error, path);
      ++rejected;
    }
  }
  CHECK(loaded > 0);
  CHECK(rejected > 0);
}

TEST_CASE("npy: reads and writes close their descriptors, also on failure") {
  auto open_descriptors = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator());
  };
  temp_dir dir;
  const auto descriptors = open_descriptors();
  const float value = 1.0f;
  write_npy(dir.file("ok.npy"), {1}, &value);
  CHECK(read_npy(dir.file("ok.npy")).values == std::vector<float>{1.0f});
  write_file(dir.file("bad.npy"), npy_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", "12345678"));
  CHECK_THROWS_AS(read_npy(dir.file("bad.npy")), file_error);
  std::filesystem::create_directory(dir.file("dir.npy"));
  CHECK_THROWS_AS(write_npy(dir.file("dir.npy"), {1}, &value), file_error);
  CHECK(open_descriptors() == descriptors);
}

TEST_CASE("npy: write into a missing directory throws and leaves nothing behind") {
  temp_dir dir;
  const std::string path = dir.file("no/such/dir/out.npy");
  const float value = 1.0f;
  CHECK_THROWS_WITH_AS(write_npy(path, {1}, &value), doctest::Contains("cannot create temporary file"), file_error);
  try {
    write_npy(path, {1}, &value);
  } catch (const file_error& error) {
    check_error_message(error, path);
    CHECK(std::string(error.what()).find("No such file or directory") != std::string::npos);
  }
  CHECK(dir.entries().empty());
}

TEST_CASE("npy: write replaces an existing file atomically") {
  temp_dir dir;
  const std::string path = dir.file("out.npy");
  write_file(path, "old contents, not even a .npy file");
  const std::vector<float> values = {1.5f, 2.5f};
  write_npy(path, {2}, values.data());
  CHECK(read_npy(path).values == values);
  CHECK(dir.entries() == std::vector<std::string>{"out.npy"});  // no temporary left
  // A shorter array over a longer one: no stale bytes survive.
  write_npy(path, {1}, values.data());
  CHECK(read_npy(path).values == std::vector<float>{1.5f});
  CHECK(dir.entries() == std::vector<std::string>{"out.npy"});
}

TEST_CASE("npy: write follows a symbolic link, writes a device or FIFO in place, takes the longest names") {
  temp_dir dir;
  const std::vector<float> values = {1.5f, 2.5f};
  // A link to an existing file: the file is replaced, the link stays a link.
  write_file(dir.file("real.npy"), "old");
  std::filesystem::create_symlink("real.npy", dir.file("link.npy"));
  write_npy(dir.file("link.npy"), {2}, values.data());
  CHECK(std::filesystem::is_symlink(dir.file("link.npy")));
  CHECK(read_npy(dir.file("real.npy")).values == values);
  CHECK(dir.entries() == std::vector<std::string>{"link.npy", "real.npy"});

  // A character device: written in place, still a device afterwards (renaming
  // over it would have replaced the node with a regular file).
  write_npy("/dev/null", {2}, values.data());
  struct stat device {};
  REQUIRE(::stat("/dev/null", &device) == 0);
  CHECK(S_ISCHR(device.st_mode));

  // A FIFO: nobody reading it is an error (not a hang); its reader gets the
  // whole file (small enough for the pipe's buffer), the FIFO stays.
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(write_npy(fifo, {2}, values.data()), doctest::Contains("is a FIFO that no process is reading"),
                       file_error);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  write_npy(fifo, {2}, values.data());
  std::string received(4096, '\0');
  const ssize_t got = ::read(reader, received.data(), received.size());
  ::close(reader);
  REQUIRE(got > 0);
  received.resize(std::size_t(got));
  write_file(dir.file("copy.npy"), received);
  CHECK(read_npy(dir.file("copy.npy")).values == values);
  struct stat pipe {};
  REQUIRE(::stat(fifo.c_str(), &pipe) == 0);
  CHECK(S_ISFIFO(pipe.st_mode));

  // A name at the file system's limit: its temporary's name is shortened.
  const long name_max = ::pathconf(dir.path().c_str(), _PC_NAME_MAX);
  REQUIRE(name_max > 4);
  const std::string longest(std::size_t(name_max) - 4, 'n');
  write_npy(dir.file(longest + ".npy"), {2}, values.data());
  CHECK(read_npy(dir.file(longest + ".npy")).values == values);
  CHECK(dir.entries().size() == 5);  // nothing else left behind
}

TEST_CASE("npy: failed writes leave the existing target untouched") {
  temp_dir dir;
  const float value = 1.0f;
  // The target is a directory: refused before anything is written.
  std::filesystem::create_directory(dir.file("target.npy"));
  write_file(dir.file("target.npy/keep"), "keep");
  CHECK_THROWS_WITH_AS(write_npy(dir.file("target.npy"), {1}, &value), doctest::Contains("is a directory"), file_error);
  CHECK(read_file(dir.file("target.npy/keep")) == "keep");
  CHECK(dir.entries() == std::vector<std::string>{"target.npy"});

  // A write error part way (file size limit: write() fails with EFBIG).
  const std::string path = dir.file("big.npy");
  write_file(path, "previous");
  const std::vector<float> values(1 << 16, 3.0f);  // 256 KiB
  std::optional<std::string> message;
  {
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    rlimit limited = saved;
    limited.rlim_cur = 64 * 1024;
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
    try {
      write_npy(path, {values.size()}, values.data());
    } catch (const file_error& error) {
      message = error.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
  }
  REQUIRE(message.has_value());
  CHECK(message->find("big.npy: cannot write temporary file") != std::string::npos);
  CHECK(message->find("File too large") != std::string::npos);
  CHECK(read_file(path) == "previous");
  CHECK(dir.entries() == std::vector<std::string>{"big.npy", "target.npy"});
}

}  // namespace
