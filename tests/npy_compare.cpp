// npy_compare GOT.npy EXPECTED.npy [RTOL]: the golden-test check for
// `kvhead run`.
//
// Passes (exit 0) when the shapes are equal, NaN sits at the same positions in
// both, infinities match exactly, and for every other element
//   |got - expected| <= RTOL * max|expected|      (RTOL default 1e-4;
//                                                   max over finite values)
// written as !(diff <= tol) so a NaN difference fails. RTOL 0 demands
// bit-for-bit equal values. Prints one summary line on stdout: the largest
// absolute and relative error; a failure adds one line on stderr naming the
// first offending element. Exit 1 on mismatch, 2 on bad arguments or files.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "engine/io/npy.hpp"

namespace {

using kvhead::io::shape_text;

int compare(const std::string& got_path, const std::string& expected_path, double rtol) {
  const kvhead::io::npy_array got = kvhead::io::read_npy(got_path);
  const kvhead::io::npy_array expected = kvhead::io::read_npy(expected_path);
  if (got.shape != expected.shape) {
    std::fprintf(stderr, "npy_compare: shape %s of %s differs from shape %s of %s\n", shape_text(got.shape).c_str(),
                 got_path.c_str(), shape_text(expected.shape).c_str(), expected_path.c_str());
    return 1;
  }
  double scale = 0.0;
  for (float value : expected.values)
    if (std::isfinite(value)) scale = std::fmax(scale, std::fabs(double(value)));
  const double tolerance = rtol * scale;

  double worst = 0.0;
  std::size_t failures = 0, first_failure = 0;
  for (std::size_t i = 0; i < got.values.size(); ++i) {
    const double g = got.values[i], e = expected.values[i];
    bool ok;
    if (std::isnan(e) || std::isnan(g)) {
      ok = std::isnan(e) && std::isnan(g);
    } else if (std::isinf(e) || std::isinf(g)) {
      ok = g == e;
    } else {
      const double diff = std::fabs(g - e);
      worst = std::fmax(worst, diff);
      ok = diff <= tolerance;
    }
    if (!ok && failures++ == 0) first_failure = i;
  }
  std::printf(
      "npy_compare: %zu values, max|got - expected| = %.3e, max|expected| = %.3e, relative %.3e "
      "(tolerance %.1e)\n",
      got.values.size(), worst, scale, scale > 0.0 ? worst / scale : worst, rtol);
  if (failures == 0) return 0;
  std::fprintf(stderr, "npy_compare: %zu of %zu values differ; first at flat index %zu: got %.9g, expected %.9g\n",
               failures, got.values.size(), first_failure, double(got.values[first_failure]),
               double(expected.values[first_failure]));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: npy_compare GOT.npy EXPECTED.npy [RTOL]\n");
    return 2;
  }
  double rtol = 1e-4;
  if (argc == 4) {
    const std::string_view text = argv[3];
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), rtol);
    if (error != std::errc() || end != text.data() + text.size() || !(rtol >= 0.0)) {
      std::fprintf(stderr, "npy_compare: RTOL must be a number >= 0, got '%s'\n", argv[3]);
      return 2;
    }
  }
  try {
    return compare(argv[1], argv[2], rtol);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "npy_compare: %s\n", error.what());
    return 2;
  }
}
