// scaled_dot_product_attention's engine side (kvhead/attention.hpp): at bf16
// precision its inputs rounded first, then the flash attention and, on
// request, the materialized probabilities.
#pragma once

#include "engine/attention/flash_attention.hpp"

namespace kvhead::engine {

/// Precision f32: flash_attention(problem), then, when `probabilities` is
/// set, attention_probabilities(problem, probabilities).
/// Precision bf16: the same on copies of k and v rounded to nearest even
/// bf16 (round_floats_to_bf16, as the layer rounds its projections), dense
/// [batch, heads, seq, head_dim] in the calling thread's scratch: the rows
/// flash_attention reads, from the 256-key chunk holding the first key a
/// query sees to the last key one sees (a sliding window's decode step
/// rounds its window, not the past); every row of k when the probabilities
/// are asked for (they are then the fp32 softmax of the rounded q and k's
/// scores, unrounded), and then a rounded copy of q as well. Otherwise q is
/// rounded as each tile gathers its rows, and flash_attention rounds the
/// probabilities for p v (attention_tile::precision).
/// Validated at the public boundary; runs on the caller's task arena.
void scaled_dot_product(const attention_problem& problem, float* probabilities = nullptr);

}  // namespace kvhead::engine
