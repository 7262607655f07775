// kvhead's side of the decode benchmarks: a kv_cache holding every sequence
// of a decode_shape (bench/shapes.hpp) and one decode step per call, the
// calls rotating over groups of per_call sequences so K/V come from DRAM.
#pragma once

#include <cstddef>
#include <vector>

#include "bench/shapes.hpp"
#include "engine/cache/cached_attention.hpp"
#include "kvhead/kv_cache.hpp"

namespace kvhead::bench {

// A cache holding every sequence's past + 1 tokens of K/V (decode_kv), for
// each of the shape's replicas.
struct filled_cache {
  kv_cache cache;
  std::vector<sequence_id> ids;  // sequence j of the rotation (decode_shape::past)

  explicit filled_cache(const decode_shape& shape);

  /// Writes a sequence's whole K/V (decode_kv) into the blocks of layer 0 of
  /// sequence j of the rotation, converted to the cache's dtype, as a prefill does.
  void write(std::size_t i, const sequence_kv& kv);
};

class cached_decode {
 public:
  explicit cached_decode(const decode_shape& shape);

  /// out [per_call, heads, head_dim] := attention of the newest token of each
  /// sequence of call `call` (< shape.calls()) over its cached K/V, for the
  /// queries q [per_call, heads, head_dim].
  void run(std::size_t call, const float* q, float* out) const;

 private:
  decode_shape shape_;
  filled_cache filled_;
  std::vector<std::vector<engine::cached_rows>> calls_;
};

}  // namespace kvhead::bench
