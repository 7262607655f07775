// What the C API's opaque handles hold (include/kvhead/kvhead.h).
#pragma once

#include <cstddef>
#include <memory>

#include <tbb/task_arena.h>

#include "kvhead/attention.hpp"
#include "kvhead/kv_cache.hpp"
#include "kvhead/kvhead.h"

struct kvh_layer {
  kvhead::attention_layer layer;
  /// kvh_layer_options.kv_dtype: how caches created from this layer store K/V.
  kvhead::kv_dtype cache_dtype = kvhead::kv_dtype::f32;
  /// kvh_layer_options.kv_block_size: their tokens per block (0: the default).
  std::size_t cache_block_size = 0;
  /// kvh_layer_options.threads > 0: the arena every call of this layer runs
  /// in (initialized at open, so concurrent calls never race to create it);
  /// null: the caller's arena.
  std::unique_ptr<tbb::task_arena> arena;

  /// Runs work() in this layer's arena.
  template <class Work>
  void run(const Work& work) const {
    if (arena == nullptr) {
      work();
      return;
    }
    arena->execute(work);
  }
};

struct kvh_cache {
  kvhead::kv_cache cache;
};
