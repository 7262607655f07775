#include "engine/scheduler/split_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace kvhead::engine {

double work_plan::largest_share() const {
  if (tasks.empty() || total_cost <= 0.0) return 0.0;
  return tasks.front().cost / total_cost;
}

void plan_work(const std::vector<work_unit>& units, std::size_t threads, work_plan& plan) {
  plan.tasks.clear();
  plan.split.assign(units.size(), false);
  plan.total_cost = 0.0;
  for (const work_unit& unit : units) plan.total_cost += unit.cost;
  // Four pieces per worker leave room for stealing to even out what the
  // estimate gets wrong.
  const double piece = plan.total_cost / double(4 * std::max<std::size_t>(1, threads));
  for (std::size_t index = 0; index < units.size(); ++index) {
    const work_unit& unit = units[index];
    std::size_t pieces = 1;  // a unit with no chunk still gets its task (it writes the empty result)
    if (piece > 0.0 && unit.cost > piece)
      pieces = std::min(unit.chunks, static_cast<std::size_t>(std::ceil(unit.cost / piece)));
    plan.split[index] = pieces > 1;
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::size_t begin = unit.chunks * p / pieces, end = unit.chunks * (p + 1) / pieces;
      plan.tasks.push_back(
          {index, begin, end, unit.chunks == 0 ? 0.0 : unit.cost * double(end - begin) / double(unit.chunks)});
    }
  }
  // Largest first; ties keep their order (std::sort with an index tie-break:
  // stable_sort may allocate).
  std::sort(plan.tasks.begin(), plan.tasks.end(), [](const work_task& a, const work_task& b) {
    if (a.cost != b.cost) return a.cost > b.cost;
    if (a.unit != b.unit) return a.unit < b.unit;
    return a.chunk_begin < b.chunk_begin;
  });
}

}  // namespace kvhead::engine
