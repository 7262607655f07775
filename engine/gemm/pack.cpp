#include "engine/gemm/pack.hpp"

#include <algorithm>

namespace kvhead::engine {
namespace {

// op(X)(outer, inner): outer indexes the panel's rows (A) or columns (B),
// inner the k axis. Both operands reduce to one strided 2-D read.
struct strided_view {
  const float* data;
  std::size_t outer_stride, inner_stride;
};

// Writes panels of `width` lanes: packed[panel][k][lane] = view(outer0 + panel*width + lane, k0 + k).
void pack_panels(strided_view view, std::size_t outer0, std::size_t count, std::size_t k0,
                 std::size_t depth, std::size_t width, float* packed) {
  const std::size_t panels = (count + width - 1) / width;
  const std::size_t panel_floats = depth * width;
  if (view.outer_stride == 1) {
    // Lanes contiguous in memory: stream each source row once, left to right,
    // scattering it over the panels (reading row by row keeps the hardware
    // prefetchers useful; walking down one panel at a time does not).
    for (std::size_t k = 0; k < depth; ++k) {
      const float* source = &view.data[outer0 + (k0 + k) * view.inner_stride];
      for (std::size_t panel = 0; panel < panels; ++panel) {
        const std::size_t lanes = std::min(width, count - panel * width);
        float* target = packed + panel * panel_floats + k * width;
        const float* row = source + panel * width;
        // A plain loop, not std::copy: a memmove call per NR floats costs more than the copy.
        for (std::size_t lane = 0; lane < width; ++lane) target[lane] = lane < lanes ? row[lane] : 0.0f;
      }
    }
    return;
  }
  // k contiguous in memory: transpose lane by lane.
  for (std::size_t panel = 0; panel < panels; ++panel, packed += panel_floats) {
    const std::size_t lanes = std::min(width, count - panel * width);
    for (std::size_t lane = 0; lane < width; ++lane) {
      if (lane < lanes) {
        const float* source =
            &view.data[(outer0 + panel * width + lane) * view.outer_stride + k0 * view.inner_stride];
        for (std::size_t k = 0; k < depth; ++k) packed[k * width + lane] = source[k * view.inner_stride];
      } else {
        for (std::size_t k = 0; k < depth; ++k) packed[k * width + lane] = 0.0f;
      }
    }
  }
}

}  // namespace

void pack_a(gemm_operand a, std::size_t row0, std::size_t rows, std::size_t k0, std::size_t depth,
            std::size_t mr, float* packed) {
  const strided_view view = a.trans == transpose::no ? strided_view{a.data, a.ld, 1}
                                                     : strided_view{a.data, 1, a.ld};
  pack_panels(view, row0, rows, k0, depth, mr, packed);
}

void pack_b(gemm_operand b, std::size_t k0, std::size_t depth, std::size_t col0, std::size_t cols,
            std::size_t nr, float* packed) {
  const strided_view view = b.trans == transpose::no ? strided_view{b.data, 1, b.ld}
                                                     : strided_view{b.data, b.ld, 1};
  pack_panels(view, col0, cols, k0, depth, nr, packed);
}

}  // namespace kvhead::engine
