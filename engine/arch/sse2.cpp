// The softmax kernels and the KV cache row encoders instantiated for one ISA (sse2_arch). This TU is built
// with the ISA's flags (none: the x86-64 baseline); see engine/CMakeLists.txt. The GEMM kernels are
// in engine/gemm/kernels_<isa>.cpp.
#include "engine/attention/kv_encode_impl.hpp"
#include "engine/softmax/softmax_impl.hpp"

namespace kvhead::engine {

template struct softmax_kernels<sse2_arch>;
template struct kv_encode_kernels<sse2_arch>;

}  // namespace kvhead::engine
