# Runs one fuzzer from a clean working corpus (WORK, where libFuzzer writes
# the inputs it finds) plus the committed seeds (SEEDS, only read), so the run
# is the same every time: cmake -DFUZZER=... -DWORK=... -DSEEDS=... -DDICT=...
# -DFLAGS="-runs=N;-seed=S;..." -P run_fuzzer.cmake. A crashing input is
# written to WORK/../<fuzzer name>-crash-<sha1> and fails the test.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
get_filename_component(name ${FUZZER} NAME)
get_filename_component(parent ${WORK} DIRECTORY)
execute_process(
  COMMAND ${FUZZER} ${FLAGS} -dict=${DICT} -artifact_prefix=${parent}/${name}- ${WORK} ${SEEDS}
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${name} failed (exit ${result}); the input is in ${parent}")
endif()
