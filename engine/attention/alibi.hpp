// ALiBi (attention.hpp, "Variants"): each score of query head h at absolute
// position `position` and key j gets slope_h * float(j - position), the
// distance in integers (exact), converted to float (exact below 2^24 keys
// apart) and multiplied once: the same bits for a key in any chunk, tile or
// batch. Shared by the tiled kernel (chunk_partial.cpp) and the materialized
// probabilities (flash_attention.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvhead::engine {

/// scores[j] += slope * float(first_distance + j) for j < count (first_distance:
/// the first key's position minus the query's).
inline void add_alibi(float* scores, std::size_t count, float slope, std::int64_t first_distance) {
  for (std::size_t j = 0; j < count; ++j) scores[j] += slope * float(first_distance + std::int64_t(j));
}

}  // namespace kvhead::engine
