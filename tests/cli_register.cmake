# `kvhead run` tests (included from tests/CMakeLists.txt):
#   golden_<case>  one per folder of tests/data/golden and tests/data/models
#                  (Hugging Face model folders, run with --model): kvhead run
#                  with the case's args, compared with expected.npy
#                  (cli_golden.cmake, npy_compare);
#   cli.<name>     the error contract and the other behaviour of the command
#                  (cli_test.cpp, the binary run as a child process) and the
#                  layer loader (cli_loader_test.cpp); `kvhead decode`
#                  (cli_decode_test.cpp: byte-identical to run --causal) and
#                  `kvhead demo` / `kvhead kernels` (cli_demo_test.cpp).

add_executable(npy_compare npy_compare.cpp)
target_link_libraries(npy_compare PRIVATE kvhead_internal kvhead_warnings)

file(GLOB golden_case_dirs LIST_DIRECTORIES true CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/data/golden/*"
     "${CMAKE_CURRENT_SOURCE_DIR}/data/models/*")
set(golden_output_dir "${CMAKE_CURRENT_BINARY_DIR}/golden_output")
file(MAKE_DIRECTORY "${golden_output_dir}")
foreach(case_dir IN LISTS golden_case_dirs)
  if(IS_DIRECTORY "${case_dir}" AND EXISTS "${case_dir}/args")
    get_filename_component(case_name "${case_dir}" NAME)
    add_test(NAME golden_${case_name}
      COMMAND ${CMAKE_COMMAND} "-DKVHEAD=$<TARGET_FILE:kvhead_cli>" "-DCOMPARE=$<TARGET_FILE:npy_compare>"
              "-DCASE_DIR=${case_dir}" "-DOUTPUT=${golden_output_dir}/${case_name}.npy"
              -P "${CMAKE_CURRENT_SOURCE_DIR}/cli_golden.cmake")
    set_tests_properties(golden_${case_name} PROPERTIES TIMEOUT 60)
  endif()
endforeach()

add_executable(kvhead_cli_tests cli_test.cpp cli_loader_test.cpp cli_decode_test.cpp cli_demo_test.cpp
  cli_model_test.cpp cli_precision_test.cpp)
target_link_libraries(kvhead_cli_tests PRIVATE kvhead_internal kvhead_warnings doctest::doctest
  nlohmann_json::nlohmann_json)
target_compile_definitions(kvhead_cli_tests PRIVATE
  "KVHEAD_CLI_PATH=\"$<TARGET_FILE:kvhead_cli>\""
  "KVHEAD_GOLDEN_DIR=\"${CMAKE_CURRENT_SOURCE_DIR}/data/golden\""
  "KVHEAD_MODELS_DIR=\"${CMAKE_CURRENT_SOURCE_DIR}/data/models\"")
add_dependencies(kvhead_cli_tests kvhead_cli)
doctest_discover_tests(kvhead_cli_tests TEST_PREFIX "cli." PROPERTIES TIMEOUT 120)
