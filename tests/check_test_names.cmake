# Fails when a doctest test case name holds a ';': doctest_discover_tests
# reads the names as a CMake list, so such a name becomes two ctest entries
# whose filters match no test case, and both pass without running anything.
# TEST_EXECUTABLES: the doctest binaries to list, separated by '|'.
string(REPLACE "|" ";" executables "${TEST_EXECUTABLES}")
foreach(executable IN LISTS executables)
  execute_process(COMMAND "${executable}" --list-test-cases --no-version
                  OUTPUT_VARIABLE listing RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${executable} --list-test-cases failed (${status})")
  endif()
  string(REGEX MATCHALL "[^\n]*;[^\n]*" bad_names "${listing}")
  if(bad_names)
    string(REPLACE ";" "<;>" shown "${bad_names}")
    message(FATAL_ERROR "${executable}: test case names with ';' (ctest would run nothing for them): ${shown}")
  endif()
  string(REGEX MATCHALL "\n" lines "${listing}")
  list(LENGTH lines line_count)
  message(STATUS "${executable}: ${line_count} lines listed, no name with ';'")
endforeach()
