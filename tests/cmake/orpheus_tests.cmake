# The ways a test enters ctest. Every test runs in ${ORPHEUS_TEST_WORKDIR} (the
# build's tests/ folder) whichever folder declares it, with ${ORPHEUS_TEST_ENV}.

# orpheus_unit_test(NAME [TARGET exe] src... LIBS lib...): one Catch2 executable
# (named NAME unless TARGET names it), one ctest entry NAME, label "unit".
function(orpheus_unit_test name)
  cmake_parse_arguments(T "" "TARGET" "LIBS" ${ARGN})
  if(NOT T_TARGET)
    set(T_TARGET ${name})
  endif()
  add_executable(${T_TARGET} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${T_TARGET} PRIVATE orpheus_catch_main ${T_LIBS})
  add_test(NAME ${name} COMMAND ${T_TARGET} WORKING_DIRECTORY ${ORPHEUS_TEST_WORKDIR})
  set_tests_properties(${name} PROPERTIES LABELS unit ENVIRONMENT "${ORPHEUS_TEST_ENV}" TIMEOUT 300)
endfunction()

# orpheus_mpi_test(NAME TARGET tgt NP n... [ARGS a...]): runs an MPI program under
# mpiexec once per rank count, as ctest entries NAME_np<n> labelled "mpi".
function(orpheus_mpi_test name)
  cmake_parse_arguments(T "" "TARGET" "NP;ARGS" ${ARGN})
  foreach(np IN LISTS T_NP)
    add_test(NAME ${name}_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${ORPHEUS_MPIEXEC_FLAGS}
              $<TARGET_FILE:${T_TARGET}> ${T_ARGS}
      WORKING_DIRECTORY ${ORPHEUS_TEST_WORKDIR})
    set_tests_properties(${name}_np${np} PROPERTIES LABELS mpi ENVIRONMENT "${ORPHEUS_TEST_ENV}" TIMEOUT 300)
  endforeach()
endfunction()

# orpheus_script_test(NAME LABEL label COMMAND ...): a scripted test of the built binary.
function(orpheus_script_test name)
  cmake_parse_arguments(T "" "LABEL" "COMMAND" ${ARGN})
  add_test(NAME ${name} COMMAND ${T_COMMAND} WORKING_DIRECTORY ${ORPHEUS_TEST_WORKDIR})
  set_tests_properties(${name} PROPERTIES LABELS ${T_LABEL} ENVIRONMENT "${ORPHEUS_TEST_ENV}" TIMEOUT 900)
  # End-to-end runs use every core: run them one at a time.
  if(T_LABEL STREQUAL "e2e")
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()
