// float32 .npy files (NumPy's format): inputs and outputs of `kvhead run`.
//
// Layout:  "\x93NUMPY" major minor | header length (u16 LE for 1.0, u32 LE for
//          2.0 and 3.0) | header | data
//
//   header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
//            padded with spaces and ending in '\n'
//   data   = product(shape) little-endian float32 values, row-major (C order)
//
// read_npy accepts versions 1.0, 2.0 and 3.0, descr '<f4' only, fortran_order
// False, rank 0 to 64 (NumPy 2's limit; shape () is a scalar: one value),
// headers up to 1,000,000 bytes. The header is parsed as
// the subset of Python literal syntax NumPy writes: a dict with exactly the
// keys 'descr', 'fortran_order', 'shape' (in any order, each once, optional
// trailing comma), string values in '...' or "..." without escapes, True or
// False, and a tuple of non-negative decimal integers ((3,), (), (2, 3)). The
// file must hold exactly product(shape) * 4 bytes after the header: a short
// file or trailing bytes are errors. Everything else throws file_error
// ("<path>: <problem>", one line; file_error.hpp), e.g.
//   "x.npy: dtype '<f8' is not float32 ('<f4')"
//   "x.npy: Fortran order is not supported"
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/io/file_error.hpp"

namespace kvhead::io {

struct npy_array {
  std::vector<std::size_t> shape;  // empty: a scalar
  std::vector<float> values;       // row-major, product(shape) values
};

npy_array read_npy(const std::string& path);

/// Writes `values` (product(shape) floats, row-major; may be null if that is
/// 0) as a version 1.0 file, '<f4', C order, the header padded with spaces to
/// a multiple of 64 bytes and ending in '\n' as NumPy does. Rank above 64 or
/// an element count overflowing std::size_t throws file_error.
///
/// Written whole or not at all (output_file: through a temporary renamed over
/// `path`, which is left untouched on any failure; a symbolic link followed; a
/// device or FIFO written in place); file_error on any failure. A null `values`
/// with a non-empty shape throws std::invalid_argument (a caller bug, not a
/// file problem).
void write_npy(const std::string& path, const std::vector<std::size_t>& shape, const float* values);

}  // namespace kvhead::io
