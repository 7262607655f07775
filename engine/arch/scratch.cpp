// The registry of every thread's scratch stacks, and kvhead::release_scratch.
#include "engine/arch/scratch.hpp"

#include <algorithm>

#include "kvhead/config.hpp"

namespace kvhead {
namespace engine {
namespace {

struct registry {
  std::mutex mutex;
  std::vector<thread_scratch*> threads;
};

/// Never destroyed: threads may exit (and unregister) during static
/// destruction.
registry& threads() {
  static registry* const all = new registry;
  return *all;
}

}  // namespace

thread_scratch& thread_scratch::current() {
  thread_local thread_scratch scratch;
  return scratch;
}

thread_scratch::thread_scratch() {
  registry& all = threads();
  const std::lock_guard lock(all.mutex);
  all.threads.push_back(this);
}

thread_scratch::~thread_scratch() {
  registry& all = threads();
  const std::lock_guard lock(all.mutex);
  all.threads.erase(std::find(all.threads.begin(), all.threads.end(), this));
}

void thread_scratch::remove(scratch_stack* stack) {
  stacks_.erase(std::find(stacks_.begin(), stacks_.end(), stack));
}

void thread_scratch::release_unused() {
  const std::lock_guard lock(mutex_);
  for (scratch_stack* stack : stacks_) stack->release_unused();
}

}  // namespace engine

void release_scratch() noexcept {
  engine::registry& all = engine::threads();
  const std::lock_guard lock(all.mutex);
  for (engine::thread_scratch* thread : all.threads) thread->release_unused();
}

}  // namespace kvhead
