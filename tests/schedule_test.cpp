// The scheduler's partition of the benchmark shapes for large servers: a
// simulation (no threads), printed as a table, with the largest task kept a
// small enough share that 64 cores stay busy on S1 and S2.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/attention/flash_attention.hpp"
#include "engine/scheduler/split_schedule.hpp"

namespace {

using kvhead::engine::attention_tile;

struct sequence_shape {
  std::size_t q_len, past;  // new queries after `past` cached keys (causal)
};

// The tiles the drivers create (flash_attention, cached_attention) for these
// sequences; data pointers are not needed to plan.
std::vector<attention_tile> tiles_for(const std::vector<sequence_shape>& sequences, std::size_t heads,
                                      std::size_t kv_heads, std::size_t head_dim, bool causal) {
  const std::size_t group = heads / kv_heads, positions = kvhead::engine::tile_positions(group, kvhead::simd_path::sse2);
  std::vector<attention_tile> tiles;
  for (const sequence_shape& s : sequences)
    for (std::size_t kv_head = 0; kv_head < kv_heads; ++kv_head)
      for (std::size_t p = 0; p < s.q_len; p += positions)
        tiles.push_back({nullptr, 0, 0, nullptr, 0, 0, kv_head, group, head_dim, p, std::min(positions, s.q_len - p),
                         s.past, s.past + s.q_len, causal, nullptr, 0, 1.0f, kvhead::simd_path::sse2});
  return tiles;
}

struct shape_case {
  const char* name;
  std::vector<attention_tile> tiles;
};

}  // namespace

TEST_CASE("scheduler: partition of the S shapes for 16, 64 and 128 threads") {
  std::vector<sequence_shape> ragged;
  for (std::size_t i = 0; i < 16; ++i) ragged.push_back({1, 256 + i * (4096 - 256) / 15});
  const std::vector<shape_case> shapes = {
      {"S1_decode_gqa", tiles_for({{1, 4096}}, 32, 8, 128, true)},
      {"S2_prefill_gqa_causal", tiles_for({{1024, 0}}, 32, 8, 128, true)},
      {"S3_mha_layer (attention)", tiles_for(std::vector<sequence_shape>(4, {512, 0}), 8, 8, 64, false)},
      {"S4_decode_mqa", tiles_for({{1, 8192}}, 32, 1, 128, true)},
      {"S5_decode_ragged16", tiles_for(ragged, 32, 8, 128, true)},
  };
  std::string table = "shape                      threads  tasks  largest task share\n";
  for (const shape_case& shape : shapes) {
    std::vector<kvhead::engine::work_unit> units;
    kvhead::engine::tile_work_units(shape.tiles, units);
    for (std::size_t threads : {16, 64, 128}) {
      kvhead::engine::work_plan plan;
      kvhead::engine::plan_work(units, threads, plan);
      char line[128];
      std::snprintf(line, sizeof line, "%-26s %7zu %6zu  %6.3f%% (1/%.0f)\n", shape.name, threads, plan.tasks.size(),
                    100.0 * plan.largest_share(), 1.0 / plan.largest_share());
      table += line;
      // Costs add up, every unit is covered exactly once.
      double covered = 0.0;
      for (const auto& task : plan.tasks) covered += task.cost;
      CHECK(covered == doctest::Approx(plan.total_cost));
      if (threads == 64 &&
          (std::string(shape.name).rfind("S1", 0) == 0 || std::string(shape.name).rfind("S2", 0) == 0)) {
        INFO(shape.name << " at 64 threads");
        CHECK(plan.tasks.size() >= 64);
        CHECK(plan.largest_share() <= 1.0 / 64.0);
      }
    }
  }
  MESSAGE("\n" << table);
}

TEST_CASE("scheduler: every chunk of every unit is in exactly one task") {
  const std::vector<kvhead::engine::work_unit> units = {{0, 0.0}, {1, 5.0}, {17, 100.0}, {3, 1.0}, {40, 900.0}};
  for (std::size_t threads : {1, 2, 3, 8, 64}) {
    kvhead::engine::work_plan plan;
    kvhead::engine::plan_work(units, threads, plan);
    std::vector<std::vector<int>> seen(units.size());
    for (std::size_t u = 0; u < units.size(); ++u) seen[u].assign(units[u].chunks, 0);
    std::vector<int> tasks_of(units.size(), 0);
    for (const auto& task : plan.tasks) {
      ++tasks_of[task.unit];
      for (std::size_t c = task.chunk_begin; c < task.chunk_end; ++c) ++seen[task.unit][c];
    }
    for (std::size_t u = 0; u < units.size(); ++u) {
      CHECK(tasks_of[u] >= 1);
      CHECK(plan.split[u] == (tasks_of[u] > 1));
      for (int count : seen[u]) CHECK(count == 1);
    }
    for (std::size_t t = 1; t < plan.tasks.size(); ++t) CHECK(plan.tasks[t - 1].cost >= plan.tasks[t].cost);
  }
}

TEST_CASE("scheduler: a sliding-window decode tile counts only the chunks and keys inside its window") {
  // S6's decode: past 16384, window 4096, against S1's past 4096 without one.
  std::vector<attention_tile> windowed = tiles_for({{1, 16384}}, 32, 8, 128, true);
  for (attention_tile& tile : windowed) tile.window = 4096;
  const std::vector<attention_tile> full = tiles_for({{1, 4096}}, 32, 8, 128, true);
  std::vector<kvhead::engine::work_unit> windowed_units, full_units;
  kvhead::engine::tile_work_units(windowed, windowed_units);
  kvhead::engine::tile_work_units(full, full_units);
  REQUIRE(windowed_units.size() == full_units.size());
  for (std::size_t t = 0; t < windowed_units.size(); ++t) {
    const kvhead::engine::chunk_range chunks = kvhead::engine::tile_chunks(windowed[t]);
    CHECK(chunks.first == (16385 - 4096) / kvhead::engine::kv_chunk);  // the chunk holding key 12289
    CHECK(chunks.end == (16385 + kvhead::engine::kv_chunk - 1) / kvhead::engine::kv_chunk);
    CHECK(windowed_units[t].chunks == full_units[t].chunks);  // 17: keys 12289..16384 and 0..4096
    CHECK(windowed_units[t].cost == doctest::Approx(full_units[t].cost * 4096.0 / 4097.0));
  }
  // Every query of a tile beyond the window of its keys (valid_len) sees none.
  std::vector<attention_tile> none = tiles_for({{3, 100}}, 4, 1, 16, false);
  for (attention_tile& tile : none) {
    tile.window = 5;
    tile.key_limit = 50;  // queries at 100.. see keys from 96 on: none exist
  }
  std::vector<kvhead::engine::work_unit> none_units;
  kvhead::engine::tile_work_units(none, none_units);
  CHECK(none_units[0].chunks == 0);
  CHECK(none_units[0].cost == 0.0);
}
