/* kvhead/export.h: KVHEAD_API marks what the shared library exports,
   KVHEAD_HIDDEN a nested implementation type of an exported class.

   libkvhead.so is compiled with hidden visibility: only declarations marked
   KVHEAD_API (the C API of kvhead.h, the classes and functions of the C++
   headers) are exported; every engine symbol, and every symbol of the
   header-only libraries kvhead uses inside (xsimd, nlohmann_json), stays
   internal. A class's nested types share its visibility, so an exported
   class declares its pimpl `struct KVHEAD_HIDDEN impl;`. A linker version
   script (engine/package/kvhead.map) also keeps the standard library's
   template instantiations out of the exported symbols. The marks are
   harmless in the static library and in the programs that include these
   headers. C and C++. */
#ifndef KVHEAD_EXPORT_H
#define KVHEAD_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define KVHEAD_API __attribute__((visibility("default")))
#define KVHEAD_HIDDEN __attribute__((visibility("hidden")))
#else
#define KVHEAD_API
#define KVHEAD_HIDDEN
#endif

#endif
