// Every kvhead kernel instantiated for one ISA (avx512_arch). This TU alone is
// built with the ISA's flags (-mavx512f -mavx512cd -mavx512dq -mavx512bw); see engine/CMakeLists.txt.
#include "engine/gemm/microkernel_impl.hpp"
#include "engine/softmax/softmax_impl.hpp"

namespace kvhead::engine {

template struct gemm_kernels<avx512_arch, 12, 32>;  // compiled_tiles<avx512_arch> (blocking.hpp)
template struct row_stream_kernels<avx512_arch>;
template struct softmax_kernels<avx512_arch>;

}  // namespace kvhead::engine
