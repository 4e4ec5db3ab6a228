# The Open MPI baseline of the collective benchmarks is optional: built when a whole MPI is there.
# openmpi-bin alone ships mpicxx, whose flags name the headers of libopenmpi-dev; FindMPI believes
# that wrapper and then fails the whole configure on the missing include directory. So the wrapper
# must first compile an #include <mpi.h>. Sets COSHARD_HAVE_MPI and COSHARD_MPI_STATUS (the summary).
set(COSHARD_HAVE_MPI OFF)
find_program(COSHARD_MPICXX NAMES mpicxx mpic++ mpiCC)
mark_as_advanced(COSHARD_MPICXX)
if(NOT COSHARD_MPICXX)
  set(COSHARD_MPI_STATUS "OFF (no mpicxx: Debian's libopenmpi-dev; scripts/setup installs it)")
else()
  set(_probe ${PROJECT_BINARY_DIR}/CMakeFiles/coshard_mpi_probe.cpp)
  file(WRITE ${_probe} "#include <mpi.h>\nint main() { return MPI_Finalized(nullptr); }\n")
  execute_process(COMMAND ${COSHARD_MPICXX} -fsyntax-only ${_probe}
    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err TIMEOUT 120)
  if(NOT _rc EQUAL 0)
    string(REGEX MATCH "[^\n]*" _err "${_err}")
    string(REGEX REPLACE "^[^ ]*coshard_mpi_probe.cpp:[0-9:]* *" "" _err "${_err}")
    set(COSHARD_MPI_STATUS "OFF (${COSHARD_MPICXX} cannot compile #include <mpi.h>: ${_err}. Install "
                           "Debian's libopenmpi-dev, which scripts/setup does)")
  else()
    set(MPI_CXX_COMPILER ${COSHARD_MPICXX})
    find_package(MPI COMPONENTS CXX QUIET)  # the C API, from C++
    if(MPI_CXX_FOUND)
      set(COSHARD_HAVE_MPI ON)
      set(COSHARD_MPI_STATUS "ON (MPI ${MPI_CXX_VERSION}, ${COSHARD_MPICXX})")
    else()
      set(COSHARD_MPI_STATUS "OFF (FindMPI did not take ${COSHARD_MPICXX}; see CMakeFiles/CMakeError.log)")
    endif()
  endif()
endif()
string(REPLACE ";" "" COSHARD_MPI_STATUS "${COSHARD_MPI_STATUS}")  # the pieces of a long line
