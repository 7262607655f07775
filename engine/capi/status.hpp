// How the C API (include/kvhead/kvhead.h) checks its arguments and turns C++
// failures into statuses.
//
// Every exported function runs its body through guarded(): a capi_error
// carries its own status; otherwise the exception's type decides
// (io::file_error: KVH_ERR_IO when the file could not be had at all, else
// KVH_ERR_FORMAT; std::invalid_argument:
// KVH_ERR_INVALID_ARGUMENT, kv_cache_error: KVH_ERR_NOT_FOUND,
// std::bad_alloc, and std::system_error resource_unavailable_try_again (a
// thread that could not start, run_in_arena): KVH_ERR_CAPACITY, anything
// else: KVH_ERR_INTERNAL). The
// message, "<function>: <problem>", goes to this thread's last-error buffer,
// a fixed array: recording an error never allocates and never fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include "engine/arch/checked_size.hpp"
#include "engine/io/file_error.hpp"
#include "kvhead/kv_cache.hpp"
#include "kvhead/kvhead.h"

namespace kvhead::capi {

/// A failure with the status the C caller sees.
class capi_error : public std::runtime_error {
 public:
  capi_error(kvh_status status, const std::string& problem) : std::runtime_error(problem), status_(status) {}
  kvh_status status() const { return status_; }

 private:
  kvh_status status_;
};

/// Throws capi_error(status, message()) when `condition` is false; the
/// message is built only then.
template <class Message>
void check(bool condition, kvh_status status, const Message& message) {
  if (!condition) [[unlikely]]
    throw capi_error(status, std::string(message()));
}

/// Records "<function>: <problem>" as this thread's last error (cut to the
/// buffer's size) and returns status.
kvh_status record_error(const char* function, kvh_status status, const char* problem) noexcept;

/// Runs body(); KVH_OK, or the failure's status with the error recorded.
template <class Body>
kvh_status guarded(const char* function, const Body& body) noexcept {
  try {
    body();
    return KVH_OK;
  } catch (const capi_error& error) {
    return record_error(function, error.status(), error.what());
  } catch (const io::file_error& error) {
    return record_error(function, error.kind() == io::file_problem::access ? KVH_ERR_IO : KVH_ERR_FORMAT, error.what());
  } catch (const std::invalid_argument& error) {
    return record_error(function, KVH_ERR_INVALID_ARGUMENT, error.what());
  } catch (const kv_cache_error& error) {
    return record_error(function, KVH_ERR_NOT_FOUND, error.what());
  } catch (const std::bad_alloc&) {
    return record_error(function, KVH_ERR_CAPACITY, "out of host memory");
  } catch (const std::system_error& error) {
    const bool shortage = error.code() == std::errc::resource_unavailable_try_again;
    return record_error(function, shortage ? KVH_ERR_CAPACITY : KVH_ERR_INTERNAL, error.what());
  } catch (const std::exception& error) {
    return record_error(function, KVH_ERR_INTERNAL, error.what());
  } catch (...) {
    return record_error(function, KVH_ERR_INTERNAL, "unknown exception");
  }
}

/// `value` as a count, or a capi_error (KVH_ERR_INVALID_ARGUMENT) naming it
/// when it is < 1.
inline std::size_t positive_count(const char* name, std::int64_t value) {
  check(value >= 1, KVH_ERR_INVALID_ARGUMENT,
        [&] { return std::string(name) + " = " + std::to_string(value) + " (must be >= 1)"; });
  return static_cast<std::size_t>(value);
}

/// Throws capi_error(KVH_ERR_INVALID_ARGUMENT) naming `name` when `pointer` is NULL.
inline void not_null(const void* pointer, const char* name) {
  check(pointer != nullptr, KVH_ERR_INVALID_ARGUMENT, [&] { return std::string(name) + " is NULL"; });
}

/// The product of `factors`, or a capi_error (KVH_ERR_INVALID_ARGUMENT)
/// naming `what` when it overflows std::size_t.
inline std::size_t checked_product(std::initializer_list<std::size_t> factors, const char* what) {
  const std::optional<std::size_t> product = engine::checked_product(factors);
  check(product.has_value(), KVH_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + " overflows size_t"; });
  return *product;
}

/// x and y, `floats` floats each, must not overlap (KVH_ERR_INVALID_ARGUMENT).
inline void check_disjoint(const float* x, const float* y, std::size_t floats) {
  const auto x_begin = reinterpret_cast<std::uintptr_t>(x), y_begin = reinterpret_cast<std::uintptr_t>(y);
  const std::size_t bytes = checked_product({floats, sizeof(float)}, "the bytes of x");
  check(x_begin + bytes <= y_begin || y_begin + bytes <= x_begin, KVH_ERR_INVALID_ARGUMENT,
        [&] { return "x and y overlap (" + std::to_string(floats) + " floats each)"; });
}

}  // namespace kvhead::capi
