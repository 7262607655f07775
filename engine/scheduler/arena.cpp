#include "engine/scheduler/arena.hpp"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

#include <tbb/info.h>

#include "kvhead/config.hpp"

namespace kvhead {
namespace {

struct arena_setting {
  std::mutex mutex;
  std::size_t threads = 0;
  std::shared_ptr<tbb::task_arena> arena;  // calls in flight keep the old one alive
};

arena_setting& setting() {
  static arena_setting value;
  return value;
}

}  // namespace

void set_num_threads(std::size_t threads) {
  if (threads > 4096)
    throw std::invalid_argument("set_num_threads: " + std::to_string(threads) + " threads is more than 4096");
  // More threads than the CPUs this process may use would not run (oneTBB
  // caps its workers there and warns on stderr): the arena is capped, as the
  // C API's is; num_threads() still returns the setting.
  const std::size_t cpus = std::size_t(std::max(1, tbb::info::default_concurrency()));
  arena_setting& current = setting();
  const std::lock_guard lock(current.mutex);
  current.threads = threads;
  current.arena = threads == 0 ? nullptr : std::make_shared<tbb::task_arena>(static_cast<int>(std::min(threads, cpus)));
}

std::size_t num_threads() {
  arena_setting& current = setting();
  const std::lock_guard lock(current.mutex);
  return current.threads;
}

std::shared_ptr<tbb::task_arena> engine::configured_arena() {
  arena_setting& current = setting();
  const std::lock_guard lock(current.mutex);
  return current.arena;
}

}  // namespace kvhead
