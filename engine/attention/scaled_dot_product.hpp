// scaled_dot_product_attention's engine side (kvhead/attention.hpp): the
// flash attention and, on request, the materialized probabilities.
#pragma once

#include "engine/attention/flash_attention.hpp"

namespace kvhead::engine {

/// flash_attention(problem), then, when `probabilities` is set,
/// attention_probabilities. Precision bf16: flash_attention rounds what it
/// reads to nearest even bf16 (round_floats_to_bf16, as the layer rounds its
/// projections): q as each tile gathers its rows, K and V as they are packed
/// (once per call, only the chunks some query sees), each probability before
/// p v; no copy of q, k or v is made (a copy of K and V cost as much memory
/// as the inputs and no less time). The probabilities, when asked for, are
/// the fp32 softmax of the rounded q and k's scores, unrounded, from rounded
/// copies of q and k in the calling thread's scratch.
/// Validated at the public boundary; runs on the caller's task arena.
void scaled_dot_product(const attention_problem& problem, float* probabilities = nullptr);

}  // namespace kvhead::engine
