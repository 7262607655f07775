// Scalar emulation of the bf16 instructions, as the Intel SDM documents
// them, and of the bf16 micro-kernels built on them (bf16_microkernel.hpp)
// over the same packed buffers. ISA-free: the tests run the driver, the
// packing and the kernels' index arithmetic through it on any CPU, and the
// AMX self-test compares the tiles against it.
//
// Semantics of both instructions: inputs subnormal are read as zero (DAZ),
// subnormal results are flushed to zero (FTZ), every step rounds to nearest
// even (RNE), MXCSR is ignored. A bf16 value widens exactly to fp32.
#pragma once

#include "engine/gemm/bf16_microkernel.hpp"

namespace kvhead::engine {

/// One fp32 lane of vdpbf16ps: acc += a_odd * b_odd, then acc += a_even * b_even,
/// each a fused multiply-add with DAZ, FTZ and RNE.
float emulate_vdpbf16ps(float acc, bf16_bits a_even, bf16_bits a_odd, bf16_bits b_even, bf16_bits b_odd);

/// One element of tdpbf16ps over `pairs` pairs of k (16 for a full tile):
/// even = odd = 0; for each pair q: even += a[2q] * b[2q], odd += a[2q+1] * b[2q+1]
/// (fused, DAZ, FTZ, RNE); then acc + (even + odd), each add with FTZ and RNE.
/// a and b hold 2 * pairs elements (k in order).
float emulate_tdpbf16ps(float acc, const bf16_bits* a, const bf16_bits* b, std::size_t pairs);

/// The kernels of `unit` (avx512bf16 or amx) in scalar code: the unit's
/// blocking (mr, pair multiple, skinny shapes), layouts and order exactly.
const bf16_kernels& emulated_bf16_kernels(bf16_unit unit);

/// The paged kernels of `unit` (avx512bf16: bf16_paged_params; amx: the
/// staging and staged kernels) in scalar code.
const bf16_paged_kernels& emulated_bf16_paged_kernels(bf16_unit unit = bf16_unit::avx512bf16);

}  // namespace kvhead::engine
