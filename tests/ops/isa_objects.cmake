# cmake -DNM=<nm> -DOBJECT=<kernels.cpp.o of one ISA> -DISA=<name> -P isa_objects.cmake
#
# An object built with -march=x86-64-v4 (or v3) must define no external symbol but its table():
# any other one (an inline helper the compiler did not inline, a std:: template instance) is a weak
# symbol the linker may pick for the whole library, and code built for the baseline would then run
# AVX-512 instructions on a CPU without them (SIGILL). -O0 builds inline nothing, which is where
# this shows: tests/ops/tests.cmake also checks an -O0 build of each ISA's kernels.
execute_process(COMMAND "${NM}" -g -C --defined-only "${OBJECT}"
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${OBJECT} (${rc}): ${err}")
endif()
string(REGEX REPLACE "\n$" "" out "${out}")
string(REPLACE "\n" ";" lines "${out}")
set(table "coshard::ops::detail::isa_${ISA}::table()")
set(found 0)
set(others "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "^[0-9a-fA-F]* *[A-Za-z] " "" symbol "${line}")
  if(symbol STREQUAL table)
    set(found 1)
  else()
    string(APPEND others "\n  ${line}")
  endif()
endforeach()
if(others)
  message(FATAL_ERROR "the ${ISA} kernels (${OBJECT}) define external symbols besides ${table}:${others}\n"
    "give them internal linkage (ops/src/vec_math.hpp) and use builtins instead of std:: templates")
endif()
if(NOT found)
  message(FATAL_ERROR "the ${ISA} kernels (${OBJECT}) do not define ${table}:\n${out}")
endif()
message(STATUS "${ISA}: only ${table} is external")
