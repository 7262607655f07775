#include "bench/cached_decode.hpp"

#include <cmath>

#include "engine/cache/kv_cache_internals.hpp"

namespace kvhead::bench {
namespace {

kv_cache_config cache_config(const decode_shape& shape) {
  kv_cache_config config;
  config.num_kv_heads = shape.kv_heads;
  config.head_dim = shape.head_dim;
  config.block_size = shape.block_size;
  config.dtype = shape.dtype;
  const std::size_t block_size = shape.block_size != 0 ? shape.block_size : kv_cache_default_block_size;
  std::size_t blocks = 0;
  for (std::size_t j = 0; j < shape.sequences(); ++j) blocks += (shape.past(j) + 1 + block_size - 1) / block_size;
  config.capacity_bytes = blocks * kv_cache_block_bytes(config);
  return config;
}

// The sequence's positions [past, length) as the rows from row0 of a call.
engine::cached_rows rows(const kv_cache& cache, sequence_id id, std::size_t past, std::size_t row0) {
  std::size_t count = 0;
  const std::uint32_t* table = engine::kv_cache_internals::block_table(cache, id, &count);
  return {table, cache.length(id), past, row0};
}

}  // namespace

filled_cache::filled_cache(const decode_shape& shape) : cache(cache_config(shape)) {
  for (std::size_t j = 0; j < shape.sequences(); ++j) {
    const sequence_id id = cache.create();
    cache.append(id, shape.past(j) + 1);
    ids.push_back(id);
  }
  // Each sequence's K/V generated once, written into each of its copies.
  for (std::size_t i = 0; i < shape.pasts.size(); ++i) {
    const auto kv = decode_kv(shape, i);
    for (std::size_t j = i; j < shape.sequences(); j += shape.pasts.size()) {
      write(j, *kv);
      engine::kv_cache_internals::set_written(cache, ids[j], 0, shape.past(j) + 1);  // as a forward would
    }
  }
}

void filled_cache::write(std::size_t i, const sequence_kv& kv) {
  engine::write_cached_kv(cache, 0, {rows(cache, ids[i], 0, 0)}, kv.k.data(), kv.v.data(), active_simd_path());
}

cached_decode::cached_decode(const decode_shape& shape) : shape_(shape), filled_(shape), calls_(shape.calls()) {
  for (std::size_t j = 0; j < shape.sequences(); ++j) {
    std::vector<engine::cached_rows>& call = calls_[j / shape.per_call];
    call.push_back(rows(filled_.cache, filled_.ids[j], shape.past(j), call.size()));
  }
}

void cached_decode::run(std::size_t call, const float* q, float* out) const {
  engine::cached_attention(filled_.cache, 0, calls_[call], shape_.heads, q, out,
                           1.0f / std::sqrt(float(shape_.head_dim)), shape_.window, active_simd_path());
}

}  // namespace kvhead::bench
