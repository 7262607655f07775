#include "engine/scheduler/split_schedule.hpp"

#include <algorithm>
#include <cmath>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

namespace kvhead::engine {

double work_plan::largest_share() const {
  if (tasks.empty() || total_cost <= 0.0) return 0.0;
  return tasks.front().cost / total_cost;
}

work_plan plan_work(const std::vector<work_unit>& units, std::size_t threads) {
  work_plan plan;
  plan.split.assign(units.size(), false);
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
      plan.tasks.push_back({index, begin, end, unit.chunks == 0 ? 0.0 : unit.cost * double(end - begin) / double(unit.chunks)});
    }
  }
  std::stable_sort(plan.tasks.begin(), plan.tasks.end(),
                   [](const work_task& a, const work_task& b) { return a.cost > b.cost; });
  return plan;
}

void run_tasks(const work_plan& plan, const std::function<void(const work_task&)>& body) {
  run_indices(plan.tasks.size(), [&](std::size_t index) { body(plan.tasks[index]); });
}

void run_indices(std::size_t count, const std::function<void(std::size_t)>& body) {
  // One index per task, in order: the largest tasks start first.
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, 1),
                    [&](const tbb::blocked_range<std::size_t>& range) {
                      for (std::size_t index = range.begin(); index != range.end(); ++index) body(index);
                    },
                    tbb::simple_partitioner());
}

}  // namespace kvhead::engine
