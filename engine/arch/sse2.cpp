// Every kvhead kernel instantiated for one ISA (sse2_arch). This TU alone is
// built with the ISA's flags (none: the x86-64 baseline); see engine/CMakeLists.txt.
#include "engine/gemm/microkernel_impl.hpp"
#include "engine/softmax/softmax_impl.hpp"

namespace kvhead::engine {

template struct gemm_kernels<sse2_arch, 6, 8>;  // compiled_tiles<sse2_arch> (blocking.hpp)
template struct row_stream_kernels<sse2_arch>;
template struct softmax_kernels<sse2_arch>;

}  // namespace kvhead::engine
