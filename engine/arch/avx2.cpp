// Every kvhead kernel instantiated for one ISA (avx2_arch). This TU alone is
// built with the ISA's flags (-mavx2 -mfma); see engine/CMakeLists.txt.
#include "engine/gemm/microkernel_impl.hpp"
#include "engine/softmax/softmax_impl.hpp"

namespace kvhead::engine {

template struct gemm_kernels<avx2_arch, 6, 16>;  // compiled_tiles<avx2_arch> (blocking.hpp)
template struct row_stream_kernels<avx2_arch>;
template struct softmax_kernels<avx2_arch>;

}  // namespace kvhead::engine
