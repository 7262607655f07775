// The C API's cache and sequence functions and decoding
// (include/kvhead/kvhead.h), over kvhead::kv_cache and
// attention_layer::forward(cache, ...).
//
// A decoding call checks, in this order and before touching the cache:
// 1. pointers and counts (KVH_ERR_INVALID_ARGUMENT), ids listed twice,
//    the layer's geometry against the cache's, x and y disjoint;
// 2. every id (KVH_ERR_NOT_FOUND);
// 3. room: the blocks the new tokens need at least (KVH_ERR_CAPACITY);
// then reserves the tokens one sequence at a time (rolled back if one fails)
// and runs the layer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/capi/handles.hpp"
#include "engine/capi/status.hpp"

namespace kvhead::capi {

namespace {

/// One call's sequences, reused across calls on a thread (a decode step
/// allocates only when a batch is larger than any before on its thread).
struct batch_scratch {
  std::vector<sequence_tokens> batch;  // (id, new tokens), in the caller's order
  std::vector<std::size_t> lengths;    // each sequence's length before the call
  std::vector<sequence_id> sorted_ids;
};

batch_scratch& scratch() {
  thread_local batch_scratch reused;
  return reused;
}

/// The length of live sequence `id`, or KVH_ERR_NOT_FOUND.
std::size_t live_length(const kv_cache& cache, std::int64_t id) {
  const auto unknown = [&] {
    return "sequence " + std::to_string(id) + " is unknown or was freed (ids are never reused)";
  };
  check(id >= 1, KVH_ERR_NOT_FOUND, unknown);
  try {
    return cache.length(sequence_id(id));
  } catch (const kv_cache_error&) {
    throw capi_error(KVH_ERR_NOT_FOUND, unknown());
  }
}

/// Step 1 (counts, duplicates) and 2 (ids) of the top of this file for
/// seq_ids/num_tokens; fills scratch().batch and .lengths; returns the sum
/// of num_tokens.
std::size_t read_batch(const kv_cache& cache, const std::int64_t* seq_ids, const std::int64_t* num_tokens,
                       std::int64_t num_seqs) {
  not_null(seq_ids, "seq_ids");
  not_null(num_tokens, "num_tokens");
  const std::size_t count = positive_count("num_seqs", num_seqs);
  batch_scratch& work = scratch();
  work.batch.resize(count);
  work.lengths.resize(count);
  work.sorted_ids.resize(count);
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    check(num_tokens[i] >= 1, KVH_ERR_INVALID_ARGUMENT, [&] {
      return "num_tokens[" + std::to_string(i) + "] = " + std::to_string(num_tokens[i]) + " (must be >= 1)";
    });
    check(!__builtin_add_overflow(total, std::size_t(num_tokens[i]), &total), KVH_ERR_INVALID_ARGUMENT,
          [] { return std::string("the sum of num_tokens overflows size_t"); });
    work.batch[i] = {sequence_id(seq_ids[i]), std::size_t(num_tokens[i])};
    work.sorted_ids[i] = sequence_id(seq_ids[i]);
  }
  std::sort(work.sorted_ids.begin(), work.sorted_ids.end());
  const auto twice = std::adjacent_find(work.sorted_ids.begin(), work.sorted_ids.end());
  check(twice == work.sorted_ids.end(), KVH_ERR_INVALID_ARGUMENT,
        [&] { return "sequence " + std::to_string(std::int64_t(*twice)) + " is listed twice in seq_ids"; });
  for (std::size_t i = 0; i < count; ++i) work.lengths[i] = live_length(cache, seq_ids[i]);
  return total;
}

/// The layer's geometry must be the cache's.
void check_geometry(const kvh_layer& layer, const kv_cache& cache) {
  const attention_config& layer_config = layer.layer.config();
  const kv_cache_config& cache_config = cache.config();
  check(layer_config.num_kv_heads == cache_config.num_kv_heads && layer_config.head_dim == cache_config.head_dim,
        KVH_ERR_INVALID_ARGUMENT, [&] {
          return "the layer has num_kv_heads " + std::to_string(layer_config.num_kv_heads) + " and head_dim " +
                 std::to_string(layer_config.head_dim) + ", the cache holds num_kv_heads " +
                 std::to_string(cache_config.num_kv_heads) + " and head_dim " + std::to_string(cache_config.head_dim);
        });
}

/// Truncates the first `count` sequences of scratch().batch back to their
/// lengths before the call.
void roll_back(kv_cache& cache, std::size_t count) noexcept {
  const batch_scratch& work = scratch();
  for (std::size_t i = 0; i < count; ++i) cache.truncate(work.batch[i].sequence, work.lengths[i]);
}

/// Step 3 of the top of this file, then the appends of scratch().batch.
void reserve(kv_cache& cache) {
  const batch_scratch& work = scratch();
  const std::size_t block_size = cache.config().block_size;
  const auto blocks = [&](std::size_t tokens) { return tokens / block_size + (tokens % block_size != 0); };
  std::size_t at_least = 0;  // a partly filled last block shared with a fork costs one more (copy-on-write)
  for (std::size_t i = 0; i < work.batch.size(); ++i) {
    const std::size_t length = work.lengths[i], tokens = work.batch[i].tokens;
    check(length + tokens >= length, KVH_ERR_INVALID_ARGUMENT, [&] {
      return "sequence " + std::to_string(work.batch[i].sequence) + " of length " + std::to_string(length) +
             " cannot grow by " + std::to_string(tokens) + " tokens (overflow)";
    });
    at_least += blocks(length + tokens) - blocks(length);
  }
  const std::size_t free_blocks = cache.free_blocks();
  check(at_least <= free_blocks, KVH_ERR_CAPACITY, [&] {
    return "no room: the new tokens need " + std::to_string(at_least) + " blocks of " + std::to_string(block_size) +
           " tokens, the cache has " + std::to_string(free_blocks) + " free";
  });
  for (std::size_t i = 0; i < work.batch.size(); ++i) {
    try {
      cache.append(work.batch[i].sequence, work.batch[i].tokens);
    } catch (const kv_cache_error& error) {  // the pool filled up (another thread, or copy-on-write)
      roll_back(cache, i);
      throw capi_error(KVH_ERR_CAPACITY, std::string("no room: ") + error.what());
    } catch (...) {
      roll_back(cache, i);
      throw;
    }
  }
}

/// Runs the layer for scratch().batch's newest tokens, as layer layer_index.
/// (The batch is taken here: the layer's arena may run the work on another
/// thread, with another scratch().)
void run_layer(const kvh_layer& layer, kv_cache& cache, std::size_t layer_index, const float* x, float* y) {
  const std::vector<sequence_tokens>& batch = scratch().batch;
  layer.run([&] { layer.layer.forward(cache, layer_index, batch, x, y); });
}

/// x and y [total tokens, d_model] must not overlap.
void check_rows(const kvh_layer& layer, std::size_t tokens, const float* x, float* y) {
  not_null(x, "x");
  not_null(y, "y");
  check_disjoint(x, y, checked_product({tokens, layer.layer.config().d_model}, "sum(num_tokens) * d_model"));
}

kvh_status create_cache(const char* function, const kvh_layer* layer, std::int64_t num_layers, std::size_t byte_budget,
                        kvh_cache** out) {
  return guarded(function, [&] {
    not_null(layer, "layer");
    not_null(out, "out");
    const std::size_t layers = positive_count("num_layers", num_layers);
    check(byte_budget >= 1, KVH_ERR_INVALID_ARGUMENT, [] { return std::string("byte_budget = 0 (must be >= 1)"); });
    const attention_config& config = layer->layer.config();
    *out = new kvh_cache{kv_cache(
        {layers, config.num_kv_heads, config.head_dim, layer->cache_block_size, byte_budget, layer->cache_dtype})};
  });
}

}  // namespace

}  // namespace kvhead::capi

using namespace kvhead::capi;
using kvhead::sequence_id;

extern "C" {

kvh_status kvh_cache_create(const kvh_layer* layer, size_t byte_budget, kvh_cache** out) {
  return create_cache("kvh_cache_create", layer, 1, byte_budget, out);
}

kvh_status kvh_cache_create_layers(const kvh_layer* layer, int32_t num_layers, size_t byte_budget, kvh_cache** out) {
  return create_cache("kvh_cache_create_layers", layer, num_layers, byte_budget, out);
}

int32_t kvh_cache_num_layers(const kvh_cache* cache) {
  return cache == nullptr ? 0 : int32_t(cache->cache.config().num_layers);
}

int64_t kvh_cache_free_tokens(const kvh_cache* cache) {
  return cache == nullptr ? -1 : int64_t(cache->cache.free_tokens());
}

void kvh_cache_destroy(kvh_cache* cache) { delete cache; }

kvh_status kvh_sequence_create(kvh_cache* cache, int64_t* seq_id) {
  return guarded("kvh_sequence_create", [&] {
    not_null(cache, "cache");
    not_null(seq_id, "seq_id");
    *seq_id = int64_t(cache->cache.create());
  });
}

kvh_status kvh_sequence_fork(kvh_cache* cache, int64_t parent, int64_t* child) {
  return guarded("kvh_sequence_fork", [&] {
    not_null(cache, "cache");
    not_null(child, "child");
    live_length(cache->cache, parent);
    *child = int64_t(cache->cache.fork(sequence_id(parent)));
  });
}

kvh_status kvh_sequence_truncate(kvh_cache* cache, int64_t seq_id, int64_t length) {
  return guarded("kvh_sequence_truncate", [&] {
    not_null(cache, "cache");
    check(length >= 0, KVH_ERR_INVALID_ARGUMENT,
          [&] { return "length = " + std::to_string(length) + " (must be >= 0)"; });
    const std::size_t current = live_length(cache->cache, seq_id);
    check(std::size_t(length) <= current, KVH_ERR_INVALID_ARGUMENT, [&] {
      return "length " + std::to_string(length) + " is beyond sequence " + std::to_string(seq_id) + "'s length " +
             std::to_string(current);
    });
    const std::size_t dropped = cache->cache.dropped(sequence_id(seq_id));
    check(std::size_t(length) >= dropped, KVH_ERR_INVALID_ARGUMENT, [&] {
      return "length " + std::to_string(length) + " is below sequence " + std::to_string(seq_id) + "'s " +
             std::to_string(dropped) + " positions dropped by kvh_sequence_drop_outside_window";
    });
    cache->cache.truncate(sequence_id(seq_id), std::size_t(length));
  });
}

kvh_status kvh_sequence_drop_outside_window(kvh_cache* cache, int64_t seq_id, int64_t window, int64_t* dropped_tokens) {
  return guarded("kvh_sequence_drop_outside_window", [&] {
    not_null(cache, "cache");
    check(window >= 1, KVH_ERR_INVALID_ARGUMENT,
          [&] { return "window = " + std::to_string(window) + " (must be >= 1)"; });
    live_length(cache->cache, seq_id);
    cache->cache.drop_outside_window(sequence_id(seq_id), std::size_t(window));
    if (dropped_tokens != nullptr) *dropped_tokens = int64_t(cache->cache.dropped(sequence_id(seq_id)));
  });
}

int64_t kvh_sequence_length(const kvh_cache* cache, int64_t seq_id) {
  int64_t length = -1;
  guarded("kvh_sequence_length", [&] {
    not_null(cache, "cache");
    length = int64_t(live_length(cache->cache, seq_id));
  });
  return length;
}

kvh_status kvh_sequence_free(kvh_cache* cache, int64_t seq_id) {
  return guarded("kvh_sequence_free", [&] {
    not_null(cache, "cache");
    live_length(cache->cache, seq_id);
    cache->cache.free(sequence_id(seq_id));
  });
}

kvh_status kvh_decode(const kvh_layer* layer, kvh_cache* cache, const int64_t* seq_ids, const int64_t* num_tokens,
                      int64_t num_seqs, const float* x, float* y) {
  return guarded("kvh_decode", [&] {
    not_null(layer, "layer");
    not_null(cache, "cache");
    kvhead::kv_cache& kv = cache->cache;
    check(kv.config().num_layers == 1, KVH_ERR_INVALID_ARGUMENT, [&] {
      return "the cache has " + std::to_string(kv.config().num_layers) +
             " layers: decode it with kvh_sequence_append and kvh_decode_layer";
    });
    check_geometry(*layer, kv);
    const std::size_t tokens = read_batch(kv, seq_ids, num_tokens, num_seqs);
    check_rows(*layer, tokens, x, y);
    reserve(kv);
    try {
      run_layer(*layer, kv, 0, x, y);
    } catch (...) {
      roll_back(kv, scratch().batch.size());
      throw;
    }
  });
}

kvh_status kvh_sequence_append(kvh_cache* cache, const int64_t* seq_ids, const int64_t* num_tokens, int64_t num_seqs) {
  return guarded("kvh_sequence_append", [&] {
    not_null(cache, "cache");
    read_batch(cache->cache, seq_ids, num_tokens, num_seqs);
    reserve(cache->cache);
  });
}

kvh_status kvh_decode_layer(const kvh_layer* layer, kvh_cache* cache, int32_t layer_index, const int64_t* seq_ids,
                            const int64_t* num_tokens, int64_t num_seqs, const float* x, float* y) {
  return guarded("kvh_decode_layer", [&] {
    not_null(layer, "layer");
    not_null(cache, "cache");
    kvhead::kv_cache& kv = cache->cache;
    const std::size_t layers = kv.config().num_layers;
    check(layer_index >= 0 && std::size_t(layer_index) < layers, KVH_ERR_INVALID_ARGUMENT, [&] {
      return "layer_index = " + std::to_string(layer_index) + " (the cache has " + std::to_string(layers) + " layers)";
    });
    check_geometry(*layer, kv);
    const std::size_t tokens = read_batch(kv, seq_ids, num_tokens, num_seqs);
    check_rows(*layer, tokens, x, y);
    const batch_scratch& work = scratch();
    for (std::size_t i = 0; i < work.batch.size(); ++i)
      check(work.batch[i].tokens <= work.lengths[i], KVH_ERR_INVALID_ARGUMENT, [&] {
        return "num_tokens[" + std::to_string(i) + "] = " + std::to_string(work.batch[i].tokens) +
               " is more than sequence " + std::to_string(work.batch[i].sequence) + "'s length " +
               std::to_string(work.lengths[i]) + " (reserve the tokens with kvh_sequence_append first)";
      });
    run_layer(*layer, kv, std::size_t(layer_index), x, y);
  });
}

}  // extern "C"
