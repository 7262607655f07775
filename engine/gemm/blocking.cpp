#include "engine/gemm/blocking.hpp"

namespace kvhead::engine {

gemm_config gemm_config_for(simd_path path) {
  return dispatch(path, [](auto arch) {
    using blocking = gemm_blocking<decltype(arch)>;
    return gemm_config{blocking::mr,
                       blocking::nr,
                       blocking::mc,
                       blocking::kc,
                       blocking::nc,
                       gemm_kernels<decltype(arch)>::microkernels(),
                       gemm_kernels<decltype(arch)>::row_streams()};
  });
}

}  // namespace kvhead::engine
