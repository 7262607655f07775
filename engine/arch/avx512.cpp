// The softmax kernels and the KV cache row encoders instantiated for one ISA (avx512_arch). This TU is built
// with the ISA's flags (-mavx512f -mavx512cd -mavx512dq -mavx512bw); see engine/CMakeLists.txt. The GEMM kernels are
// in engine/gemm/kernels_<isa>.cpp.
#include "engine/attention/kv_encode_impl.hpp"
#include "engine/softmax/softmax_impl.hpp"

namespace kvhead::engine {

template struct softmax_kernels<avx512_arch>;
template struct kv_encode_kernels<avx512_arch>;

}  // namespace kvhead::engine
