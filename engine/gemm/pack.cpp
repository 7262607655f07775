#include "engine/gemm/pack.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>

#include <xmmintrin.h>

namespace kvhead::engine {
namespace {

constexpr std::size_t rows_ahead = 4;  // see pack_panels
constexpr std::size_t floats_per_line = 16;

// One 32-bit element's bits from `from` to `to`. The transposing path below
// moves elements only through this, memset and the SSE intrinsics (whose
// loads and stores may alias any type), so it serves 32-bit words that are
// not floats as well (pack_a_words).
void copy_element(float* to, const float* from) { std::memcpy(to, from, sizeof(float)); }

// op(X)(outer, inner): outer indexes the panel's rows (A) or columns (B),
// inner the k axis. Both operands reduce to one strided 2-D read.
struct strided_view {
  const float* data;
  std::size_t outer_stride, inner_stride;
};

// Writes panels of `width` lanes: packed[panel][k][lane] = view(outer0 + panel*width + lane, k0 + k).
void pack_panels(strided_view view, std::size_t outer0, std::size_t count, std::size_t k0, std::size_t depth,
                 std::size_t width, float* packed) {
  const std::size_t panels = (count + width - 1) / width;
  const std::size_t panel_floats = depth * width;
  if (view.outer_stride == 1) {
    // Lanes contiguous in memory: stream each source row once, left to right,
    // scattering it over the panels (reading row by row keeps the hardware
    // prefetchers useful; walking down one panel at a time does not). Each
    // line read also prefetches the line rows_ahead rows below: the rows of
    // a slice of columns are separate short runs (2 KiB, 16 KiB apart, in
    // 32 x 4096 x 128), each a new stream to the hardware, whose first lines
    // came in at full latency (Xeon, the bench built both ways and
    // alternated: 32 x 4096 x 128 0.327-0.341 -> 0.294-0.312 ms in 3 rounds,
    // medians 0.340 -> 0.331 ms in 6 more; 2 and 8 rows ahead no better;
    // 1024^3, S2 and S3 within the noise).
    for (std::size_t k = 0; k < depth; ++k) {
      const float* source = &view.data[outer0 + (k0 + k) * view.inner_stride];
      const float* ahead = k + rows_ahead < depth ? source + rows_ahead * view.inner_stride : nullptr;
      for (std::size_t panel = 0; panel < panels; ++panel) {
        const std::size_t lanes = std::min(width, count - panel * width);
        float* target = packed + panel * panel_floats + k * width;
        const float* row = source + panel * width;
        if (ahead != nullptr)
          for (std::size_t lane = 0; lane < lanes; lane += floats_per_line)
            __builtin_prefetch(ahead + panel * width + lane);
        // Plain loops, not std::copy: a memmove call per NR floats costs
        // more than the copy. A whole panel's copy apart: its compare and
        // select per lane, vectorized with 64-bit lane counters, took half
        // of B's packing.
        if (lanes == width)
          for (std::size_t lane = 0; lane < width; ++lane) target[lane] = row[lane];
        else
          for (std::size_t lane = 0; lane < width; ++lane) target[lane] = lane < lanes ? row[lane] : 0.0f;
      }
    }
    return;
  }
  // k contiguous in memory (inner_stride is 1 here: one of the two strides
  // always is): transpose 4 lanes x 4 k at a time with SSE shuffles (the
  // x86-64 baseline, so this file needs no ISA flags), then pairs of lanes,
  // the rest one by one. The groups of four lanes go k step by k step, all
  // of them at each step: the panel's rows (short runs of `depth` floats,
  // one matrix row apart) are then read together, their misses overlapping,
  // instead of four rows at a time from start to end. Zen 4, A's 504 x 256
  // block of a 1024-wide matrix from DRAM (a loop of its own, 3 rounds of
  // 50): 77-121 -> 57-98 us; a prefetch of the next panel's rows on top of
  // either order gained nothing more. With B's whole-panel copy (above):
  // packing 4.9-6.0% -> 4.5-4.8% of gemm 1024^3 and 2048^3's samples (perf,
  // 1 thread, 4 runs each; their times within the host's noise).
  for (std::size_t panel = 0; panel < panels; ++panel, packed += panel_floats) {
    const std::size_t lanes = std::min(width, count - panel * width), grouped = lanes / 4 * 4;
    auto lane_source = [&](std::size_t lane) {
      return &view.data[(outer0 + panel * width + lane) * view.outer_stride + k0];
    };
    std::size_t k = 0;
    for (; k + 4 <= depth; k += 4)
      for (std::size_t lane = 0; lane < grouped; lane += 4) {
        const float* const row = lane_source(lane) + k;
        __m128 r0 = _mm_loadu_ps(row), r1 = _mm_loadu_ps(row + view.outer_stride);
        __m128 r2 = _mm_loadu_ps(row + 2 * view.outer_stride), r3 = _mm_loadu_ps(row + 3 * view.outer_stride);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
        _mm_storeu_ps(packed + (k + 0) * width + lane, r0);
        _mm_storeu_ps(packed + (k + 1) * width + lane, r1);
        _mm_storeu_ps(packed + (k + 2) * width + lane, r2);
        _mm_storeu_ps(packed + (k + 3) * width + lane, r3);
      }
    for (; k < depth; ++k)
      for (std::size_t lane = 0; lane < grouped; ++lane) copy_element(packed + k * width + lane, lane_source(lane) + k);
    std::size_t lane = grouped;
    // Two lanes (MR = 6 leaves two after the groups of four): 2 x 4 k at a
    // time, interleaved with unpacks and stored as 64-bit lane pairs.
    for (; lane + 2 <= lanes; lane += 2) {
      const float* first = lane_source(lane);
      const float* second = lane_source(lane + 1);
      std::size_t k = 0;
      for (; k + 4 <= depth; k += 4) {
        const __m128 r0 = _mm_loadu_ps(first + k), r1 = _mm_loadu_ps(second + k);
        const __m128 low = _mm_unpacklo_ps(r0, r1), high = _mm_unpackhi_ps(r0, r1);
        _mm_storel_pi(reinterpret_cast<__m64*>(packed + (k + 0) * width + lane), low);
        _mm_storeh_pi(reinterpret_cast<__m64*>(packed + (k + 1) * width + lane), low);
        _mm_storel_pi(reinterpret_cast<__m64*>(packed + (k + 2) * width + lane), high);
        _mm_storeh_pi(reinterpret_cast<__m64*>(packed + (k + 3) * width + lane), high);
      }
      for (; k < depth; ++k) {
        copy_element(packed + k * width + lane, first + k);
        copy_element(packed + k * width + lane + 1, second + k);
      }
    }
    for (; lane < lanes; ++lane)
      for (std::size_t k = 0; k < depth; ++k) copy_element(packed + k * width + lane, lane_source(lane) + k);
    // The lanes past the matrix: one run of zeros per k.
    if (lanes < width)
      for (std::size_t k = 0; k < depth; ++k)
        std::memset(packed + k * width + lanes, 0, (width - lanes) * sizeof(float));
  }
}

}  // namespace

void pack_a(gemm_operand a, std::size_t row0, std::size_t rows, std::size_t k0, std::size_t depth, std::size_t mr,
            float* packed) {
  const strided_view view = a.trans == transpose::no ? strided_view{a.data, a.ld, 1} : strided_view{a.data, 1, a.ld};
  pack_panels(view, row0, rows, k0, depth, mr, packed);
}

void pack_a_words(const void* words, std::size_t ld, std::size_t rows, std::size_t depth, std::size_t mr,
                  void* packed) {
  assert(ld > 1);  // the transposing path (ld is its outer stride), which moves the words' bits as they are
  pack_panels(strided_view{static_cast<const float*>(words), ld, 1}, 0, rows, 0, depth, mr,
              static_cast<float*>(packed));
}

void pack_b(gemm_operand b, std::size_t k0, std::size_t depth, std::size_t col0, std::size_t cols, std::size_t nr,
            float* packed) {
  const strided_view view = b.trans == transpose::no ? strided_view{b.data, 1, b.ld} : strided_view{b.data, b.ld, 1};
  pack_panels(view, col0, cols, k0, depth, nr, packed);
}

}  // namespace kvhead::engine
