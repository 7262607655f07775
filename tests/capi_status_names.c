/* kvh_status_name over every int a C caller may pass (C99): the names of the
   statuses, and "unknown status" for any other value (C++ may not read such
   a value as the enum: the library reads its bytes as an int). Exit 0 when
   every name is as kvhead.h says. */
#include <stdio.h>
#include <string.h>

#include <kvhead/kvhead.h>

static int failures = 0;

static void expect(kvh_status status, const char* name) {
  if (strcmp(kvh_status_name(status), name) == 0) return;
  fprintf(stderr, "capi_status_names: status %d is named '%s', not '%s'\n", (int)status, kvh_status_name(status), name);
  ++failures;
}

int main(void) {
  expect(KVH_OK, "KVH_OK");
  expect(KVH_ERR_INVALID_ARGUMENT, "KVH_ERR_INVALID_ARGUMENT");
  expect(KVH_ERR_IO, "KVH_ERR_IO");
  expect(KVH_ERR_FORMAT, "KVH_ERR_FORMAT");
  expect(KVH_ERR_CAPACITY, "KVH_ERR_CAPACITY");
  expect(KVH_ERR_NOT_FOUND, "KVH_ERR_NOT_FOUND");
  expect(KVH_ERR_INTERNAL, "KVH_ERR_INTERNAL");
  const int others[] = {7, 8, 99, 1 << 30, -1, -(1 << 30)};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; ++i) expect((kvh_status)others[i], "unknown status");
  return failures == 0 ? 0 : 1;
}
