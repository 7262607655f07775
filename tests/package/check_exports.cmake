# libkvhead.so exports the public API only: every defined dynamic symbol is a
# kvh_* C function or belongs to namespace kvhead outside its internal parts
# (engine, io, capi, the pimpls); none is from nlohmann_json, xsimd, oneTBB
# or the standard library.
# Run as: cmake -DLIBRARY=<libkvhead.so> [-DSTATIC_LIBRARY=<libkvhead.a>] -P check_exports.cmake
cmake_policy(VERSION 3.25)
find_program(NM nm REQUIRED)
find_program(CXXFILT c++filt REQUIRED)

# nm's lines for `library` (its `flags`), demangled or not, into `lines`.
function(symbol_lines library flags demangle)
  set(filter "")
  if(demangle)
    set(filter COMMAND ${CXXFILT})
  endif()
  execute_process(COMMAND ${NM} ${flags} --defined-only ${library} ${filter}
    OUTPUT_VARIABLE symbols RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "nm failed on ${library}")
  endif()
  string(REPLACE "\n" ";" split "${symbols}")
  set(lines "${split}" PARENT_SCOPE)
  set(symbols "${symbols}" PARENT_SCOPE)
endfunction()

symbol_lines(${LIBRARY} -D ON)
set(public 0)
set(leaked "")
foreach(line IN LISTS lines)
  if(line MATCHES "kvh_layer_open$|kvh_decode$|kvhead::attention_layer::forward")
    math(EXPR public "${public} + 1")
  endif()
  string(REGEX REPLACE "^[0-9a-f]* +[A-Za-z] +" "" name "${line}")
  if(NOT name STREQUAL "" AND (NOT name MATCHES "^kvh_|^kvhead::|^(typeinfo|typeinfo name|vtable) for kvhead::" OR
                               name MATCHES "nlohmann|xsimd|tbb::|kvhead::(engine|io|capi)::|::impl::"))
    string(APPEND leaked "  ${name}\n")
  endif()
endforeach()
if(NOT public GREATER_EQUAL 3)
  message(FATAL_ERROR "${LIBRARY} does not export the public API (kvh_layer_open, kvh_decode, "
                      "attention_layer::forward):\n${symbols}")
endif()
if(NOT leaked STREQUAL "")
  message(FATAL_ERROR "${LIBRARY} exports internal symbols:\n${leaked}")
endif()
list(LENGTH lines count)
message(STATUS "${LIBRARY}: ${count} exported symbols, none internal")

# The static library: its objects' strong global symbols (T, D, B, R) are all
# kvh_* C functions or in namespace kvhead (mangled _ZN6kvhead..., its
# vtables and typeinfo), so that none can clash with a symbol of the program
# it is linked into (an unprefixed extern "C" helper did). Weak symbols (the
# instantiations of std, oneTBB and xsimd templates) merge with the program's.
if(STATIC_LIBRARY)
  symbol_lines(${STATIC_LIBRARY} -g OFF)
  set(strong 0)
  set(clashing "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^[0-9a-f]+ [TDBR] (.+)$")
      set(name "${CMAKE_MATCH_1}")
      math(EXPR strong "${strong} + 1")
      if(NOT name MATCHES "^(kvh_|_ZN6kvhead|_ZNK6kvhead|_ZT[VIS]N6kvhead)")
        string(APPEND clashing "  ${name}\n")
      endif()
    endif()
  endforeach()
  if(strong EQUAL 0)
    message(FATAL_ERROR "${STATIC_LIBRARY} defines no strong global symbol:\n${symbols}")
  endif()
  if(NOT clashing STREQUAL "")
    message(FATAL_ERROR "${STATIC_LIBRARY} defines global symbols outside kvh_* and namespace kvhead:\n${clashing}")
  endif()
  message(STATUS "${STATIC_LIBRARY}: ${strong} strong global symbols, all kvh_* or kvhead::")
endif()
