// The process-wide reduction order (kvhead/config.hpp).
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kvhead/config.hpp"

namespace kvhead {
namespace {

reduction_order from_environment() {
  const char* value = std::getenv("KVHEAD_REDUCTION");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "fixed") return reduction_order::fixed;
  if (std::string_view(value) == "fastest") return reduction_order::fastest;
  throw std::runtime_error("KVHEAD_REDUCTION=" + std::string(value) +
                           ": unknown reduction order; use fixed or fastest");
}

std::atomic<reduction_order>& order() {
  static std::atomic<reduction_order> current{from_environment()};  // retried if it threw
  return current;
}

}  // namespace

void set_reduction_order(reduction_order value) {
  if (value != reduction_order::fixed && value != reduction_order::fastest)
    throw std::invalid_argument("set_reduction_order: unknown reduction order " + std::to_string(int(value)) +
                                "; use reduction_order::fixed or reduction_order::fastest");
  order().store(value, std::memory_order_relaxed);
}

reduction_order current_reduction_order() { return order().load(std::memory_order_relaxed); }

}  // namespace kvhead
