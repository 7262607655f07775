# tools/run refuses bad invocations with exit 2 and a line naming the slip,
# before it installs or builds anything (each case returns at once).
# Run as: cmake -DRUN=<tools/run> -P tools_run_usage.cmake
cmake_policy(VERSION 3.25)
function(expect_refusal text)
  execute_process(COMMAND ${RUN} ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
  if(NOT result EQUAL 2)
    message(FATAL_ERROR "tools/run ${ARGN}: exit ${result}, expected 2\n${out}${err}")
  endif()
  string(FIND "${err}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "tools/run ${ARGN}: stderr does not say '${text}':\n${err}")
  endif()
  message(STATUS "tools/run ${ARGN}: refused, '${text}'")
endfunction()
expect_refusal("unknown command 'bogus'" bogus)
expect_refusal("test: unexpected arguments: --bogus" test --bogus)
expect_refusal("help: unexpected arguments: extra" help extra)
expect_refusal("build: unknown preset 'bogus' (the build presets of CMakePresets.json: release" build bogus)
expect_refusal("build: unexpected arguments: extra" build release extra)
expect_refusal("build: unknown preset 'rel.ase'" build rel.ase)  # a name, not a pattern
