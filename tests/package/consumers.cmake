# kvhead as an installed package: install the build into a temporary prefix,
# move the prefix elsewhere (every installed path must be relative), then,
# outside kvhead's tree,
#   1. build tests/package/consumer (C++) with find_package(kvhead CONFIG),
#      against the shared and the static library, and run both;
#   2. build tests/package/c_consumer (C only: tests/capi_example.c) with
#      find_package(kvhead CONFIG), against both libraries, and run both;
#   3. compile tests/capi_example.c (C) with the flags of
#      `pkg-config --cflags --libs kvhead` and run it on golden weights.
# Arguments: SANITIZED, BUILD_DIR, WORK_DIR, GENERATOR, C_COMPILER,
# CXX_COMPILER, SOURCE_DIR (tests/).
cmake_policy(VERSION 3.25)
if(SANITIZED)
  message("SKIPPED: a sanitizer build's library cannot be loaded by uninstrumented consumers; "
          "the release build runs this test")
  return()
endif()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  message("$ ${ARGN}\n${output}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(installed ${WORK_DIR}/installed)
set(prefix ${WORK_DIR}/moved-prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${installed})
file(RENAME ${installed} ${prefix})

# 1. C++ through the CMake package.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/package/consumer -B ${WORK_DIR}/consumer -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer_shared)
run(${WORK_DIR}/consumer/consumer_static)

# 2. C through the CMake package, in a project that enables no C++: the static
# library brings its C++ runtime along.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/package/c_consumer -B ${WORK_DIR}/c_consumer_cmake -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/c_consumer_cmake)
foreach(library IN ITEMS kvhead kvhead_static)
  run(${WORK_DIR}/c_consumer_cmake/c_consumer_${library} ${SOURCE_DIR}/data/golden/gqa_causal_rope/weights.safetensors 8 2
      10000)
endforeach()

# 3. C through pkg-config (the .pc file finds the prefix from its own folder).
find_program(PKG_CONFIG pkg-config REQUIRED)
file(GLOB pc_file ${prefix}/lib*/pkgconfig/kvhead.pc ${prefix}/lib*/*/pkgconfig/kvhead.pc)
if(NOT pc_file)
  message(FATAL_ERROR "no kvhead.pc under ${prefix}")
endif()
get_filename_component(pc_dir ${pc_file} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs kvhead OUTPUT_VARIABLE flags RESULT_VARIABLE result
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs kvhead failed")
endif()
message("pkg-config --cflags --libs kvhead: ${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")
get_filename_component(lib_dir ${pc_dir} DIRECTORY)
run(${C_COMPILER} -std=c99 -Wall -Wextra -Werror ${SOURCE_DIR}/capi_example.c ${flags} -Wl,-rpath,${lib_dir}
    -o ${WORK_DIR}/c_consumer)
run(${WORK_DIR}/c_consumer ${SOURCE_DIR}/data/golden/gqa_causal_rope/weights.safetensors 8 2 10000)
