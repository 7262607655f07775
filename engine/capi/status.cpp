// The C API's last-error buffer and status names (engine/capi/status.hpp).
#include "engine/capi/status.hpp"

#include <cstdio>
#include <cstring>

#include "kvhead/config.hpp"

namespace kvhead::capi {

namespace {

// Long enough for a path and a shape or two; longer messages are cut.
thread_local char last_error[2048] = "";

}  // namespace

kvh_status record_error(const char* function, kvh_status status, const char* problem) noexcept {
  std::snprintf(last_error, sizeof last_error, "%s: %s", function, problem);
  return status;
}

}  // namespace kvhead::capi

extern "C" {

const char* kvh_last_error(void) { return kvhead::capi::last_error; }

const char* kvh_status_name(kvh_status status) {
  // C passes any int as a kvh_status; in C++ a value outside the enumerators'
  // range (0-7 here) may not be read as the enum, so its bytes are read as an int.
  static_assert(sizeof(kvh_status) == sizeof(int));
  int value = 0;
  std::memcpy(&value, &status, sizeof value);
  switch (value) {
    case KVH_OK:
      return "KVH_OK";
    case KVH_ERR_INVALID_ARGUMENT:
      return "KVH_ERR_INVALID_ARGUMENT";
    case KVH_ERR_IO:
      return "KVH_ERR_IO";
    case KVH_ERR_FORMAT:
      return "KVH_ERR_FORMAT";
    case KVH_ERR_CAPACITY:
      return "KVH_ERR_CAPACITY";
    case KVH_ERR_NOT_FOUND:
      return "KVH_ERR_NOT_FOUND";
    case KVH_ERR_INTERNAL:
      return "KVH_ERR_INTERNAL";
  }
  return "unknown status";
}

const char* kvh_version(void) { return kvhead::version(); }

}  // extern "C"
