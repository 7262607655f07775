# kvhead used through add_subdirectory builds only its library: configures
# tests/package/parent (no build) and checks that the tests, benchmarks,
# tools and install rules are off by default and -Werror is in no command.
# Arguments: SOURCE_DIR (kvhead's root), WORK_DIR, GENERATOR, CXX_COMPILER.
cmake_policy(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/parent -B ${WORK_DIR} -G ${GENERATOR}
                        -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DKVHEAD_SOURCE_DIR=${SOURCE_DIR}
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "configuring a parent project failed:\n${output}")
endif()
file(READ ${WORK_DIR}/CMakeCache.txt cache)
foreach(option IN ITEMS KVHEAD_BUILD_TESTS KVHEAD_BUILD_BENCH KVHEAD_BUILD_TOOLS KVHEAD_INSTALL KVHEAD_WERROR)
  if(NOT cache MATCHES "${option}:BOOL=OFF")
    message(FATAL_ERROR "${option} is not OFF by default in a subproject")
  endif()
endforeach()
file(GLOB_RECURSE build_files ${WORK_DIR}/*.ninja ${WORK_DIR}/*Makefile*)
foreach(build_file IN LISTS build_files)
  file(READ ${build_file} text)
  if(text MATCHES "-Werror|kvhead_tests|kvhead_bench|tools/kvhead")
    message(FATAL_ERROR "${build_file} builds more than the library, or with -Werror (${CMAKE_MATCH_0})")
  endif()
endforeach()
message(STATUS "as a subproject, kvhead builds its library only, without -Werror")
