# libkvhead.so exports the public API only: every defined dynamic symbol is a
# kvh_* C function or belongs to namespace kvhead outside its internal parts
# (engine, io, capi, the pimpls); none is from nlohmann_json, xsimd, oneTBB
# or the standard library.
# Run as: cmake -DLIBRARY=<libkvhead.so> -P check_exports.cmake
cmake_policy(VERSION 3.25)
find_program(NM nm REQUIRED)
find_program(CXXFILT c++filt REQUIRED)
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY} COMMAND ${CXXFILT}
  OUTPUT_VARIABLE symbols RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIBRARY}")
endif()
string(REPLACE "\n" ";" lines "${symbols}")
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
