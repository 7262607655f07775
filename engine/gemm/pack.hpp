// Packing of A and B into the micro-kernel's panel layouts (microkernel.hpp),
// zero-padded at the matrix edges so edge tiles run through the same kernel.
#pragma once

#include <cstddef>

#include "engine/gemm/gemm.hpp"

namespace kvhead::engine {

/// Packs op(A)[row0 : row0+rows, k0 : k0+depth] into ceil(rows / mr) panels,
/// each depth x mr floats ([k][mr]), rows past `rows` zero.
void pack_a(gemm_operand a, std::size_t row0, std::size_t rows, std::size_t k0, std::size_t depth, std::size_t mr,
            float* packed);

/// pack_a's layout over 32-bit words that need not be floats (gemm_bf16's
/// pairs of bf16): rows x depth words at `words`, row r at r * ld (ld > 1),
/// into ceil(rows / mr) panels of depth x mr words, rows past `rows` zero;
/// every word's bits moved unchanged.
void pack_a_words(const void* words, std::size_t ld, std::size_t rows, std::size_t depth, std::size_t mr, void* packed);

/// Packs op(B)[k0 : k0+depth, col0 : col0+cols] into ceil(cols / nr) panels,
/// each depth x nr floats ([k][nr]), columns past `cols` zero.
void pack_b(gemm_operand b, std::size_t k0, std::size_t depth, std::size_t col0, std::size_t cols, std::size_t nr,
            float* packed);

}  // namespace kvhead::engine
