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
  for (std::size_t panel_start = 0; panel_start < count; panel_start += width) {
    const std::size_t lanes = std::min(width, count - panel_start);
    if (view.outer_stride == 1) {  // lanes contiguous in memory: copy rows of the panel
      for (std::size_t k = 0; k < depth; ++k) {
        const float* source = &view.data[(outer0 + panel_start) + (k0 + k) * view.inner_stride];
        float* target = packed + k * width;
        std::copy(source, source + lanes, target);
        std::fill(target + lanes, target + width, 0.0f);
      }
    } else {  // k contiguous: transpose lane by lane
      for (std::size_t lane = 0; lane < width; ++lane) {
        if (lane < lanes) {
          const float* source = &view.data[(outer0 + panel_start + lane) * view.outer_stride +
                                           k0 * view.inner_stride];
          for (std::size_t k = 0; k < depth; ++k) packed[k * width + lane] = source[k * view.inner_stride];
        } else {
          for (std::size_t k = 0; k < depth; ++k) packed[k * width + lane] = 0.0f;
        }
      }
    }
    packed += depth * width;
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
