# One golden case end to end (ctest entry golden_<case>, tests/CMakeLists.txt):
#   kvhead run --weights <case>/weights.safetensors --input <case>/input.npy
#              --output OUTPUT <flags from <case>/args>
# or, for a model folder (<case>/config.json), kvhead run --model <case> ...
# must exit 0 with nothing on stderr, and npy_compare must accept OUTPUT
# against <case>/expected.npy (relative tolerance 1e-4 of max|expected|).
#
#   cmake -DKVHEAD=<kvhead> -DCOMPARE=<npy_compare> -DCASE_DIR=<dir> -DOUTPUT=<file.npy>
#         -P cli_golden.cmake
foreach(variable KVHEAD COMPARE CASE_DIR OUTPUT)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "cli_golden.cmake: -D${variable}=... is required")
  endif()
endforeach()

file(STRINGS "${CASE_DIR}/args" args_line LIMIT_COUNT 1)
separate_arguments(args UNIX_COMMAND "${args_line}")
file(REMOVE "${OUTPUT}")

# A Hugging Face model folder (tests/data/models/<case>: config.json) runs
# with --model; a weights case (tests/data/golden/<case>) with --weights.
if(EXISTS "${CASE_DIR}/config.json")
  set(weights --model "${CASE_DIR}")
else()
  set(weights --weights "${CASE_DIR}/weights.safetensors")
endif()
execute_process(
  COMMAND "${KVHEAD}" run ${weights} --input "${CASE_DIR}/input.npy" --output "${OUTPUT}" ${args}
  RESULT_VARIABLE run_result
  OUTPUT_VARIABLE run_stdout
  ERROR_VARIABLE run_stderr)
if(NOT run_result STREQUAL "0" OR NOT run_stderr STREQUAL "")
  message(FATAL_ERROR "kvhead run ${args_line}: exit ${run_result}\nstderr: ${run_stderr}")
endif()

execute_process(
  COMMAND "${COMPARE}" "${OUTPUT}" "${CASE_DIR}/expected.npy" 1e-4
  RESULT_VARIABLE compare_result
  OUTPUT_VARIABLE compare_stdout
  ERROR_VARIABLE compare_stderr)
message(STATUS "${CASE_DIR}: ${compare_stdout}${compare_stderr}")
if(NOT compare_result STREQUAL "0")
  message(FATAL_ERROR "golden output differs (npy_compare exit ${compare_result})")
endif()
