# Warning flags, sanitizers and the helpers every coshard target is made with.
add_library(coshard_warnings INTERFACE)
target_compile_options(coshard_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${COSHARD_WERROR}>>:-Werror>)

add_library(coshard_sanitize INTERFACE)
if(COSHARD_SANITIZE)
  set(_san "-fsanitize=${COSHARD_SANITIZE}" -fno-omit-frame-pointer)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND COSHARD_SANITIZE MATCHES "undefined")
    # clang 14 cannot compile coroutine code with -fsanitize=function (toolchain.md).
    list(APPEND _san -fno-sanitize=function)
  endif()
  if(COSHARD_SANITIZE MATCHES "undefined")
    list(APPEND _san -fno-sanitize-recover=undefined)
  endif()
  if(COSHARD_FUZZ)
    if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      message(FATAL_ERROR "COSHARD_FUZZ needs clang (libFuzzer); configure with CXX=clang++")
    endif()
    # Coverage feedback for the fuzzers from every coshard library, not only the targets.
    list(APPEND _san -fsanitize=fuzzer-no-link)
  endif()
  target_compile_options(coshard_sanitize INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_san}>)
  target_link_options(coshard_sanitize INTERFACE ${_san})
endif()

function(coshard_target_defaults target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:coshard_warnings> $<BUILD_INTERFACE:coshard_sanitize>)
  coshard_unity(${target})
endfunction()

# With COSHARD_UNITY_BUILD, the target's sources compile in batches of 8 (CMake's unity build): a
# library's files share most of their headers, and clang spent most of each compile on them (the
# runtime's first eight files: 19 s apart, 6 s as one). Only for the libraries and tools: test
# programs and doc snippets are one file each, or files whose local names repeat on purpose. The
# main build of scripts/test stays file by file, so a file that lacks an include of its own still
# fails there.
function(coshard_unity target)
  if(COSHARD_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()

# For targets whose loops are written to vectorise (kernels, reductions, optimizer, casts). GCC's
# -O2 cost model ("very-cheap") skips every loop whose trip count is not a known multiple of the
# vector width, i.e. all of them; sqrt only vectorises when it need not set errno (nothing in
# coshard reads errno); and GCC if-converts a float comparison (the selects of a clamp, a mask,
# a max) only when it may assume comparisons do not trap (nothing in coshard reads the floating
# point exception flags; clang assumes this by default). Rounding stays IEEE: no -ffast-math, and
# no contraction into FMA (clang's default), so a loop gives the same bits at every vector width
# and on machines with and without FMA.
function(coshard_hot_loops target)
  target_compile_options(${target} PRIVATE "$<$<CXX_COMPILER_ID:GNU>:-fvect-cost-model=dynamic;-fno-trapping-math>"
    -fno-math-errno -ffp-contract=off)
endfunction()

# Public sanitizer flags must reach executables that link our libraries.
function(coshard_executable_defaults target)
  target_link_libraries(${target} PRIVATE coshard_warnings coshard_sanitize)
endfunction()

# coshard_library(<folder> SOURCES...): the library target coshard_<folder> with its public headers
# under <folder>/include, the alias coshard::<folder> and the export name <folder>.
function(coshard_library folder)
  set(target coshard_${folder})
  add_library(${target} ${ARGN})
  add_library(coshard::${folder} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${folder} OUTPUT_NAME ${target})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${target} PUBLIC cxx_std_20)
  coshard_target_defaults(${target})
endfunction()
