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
