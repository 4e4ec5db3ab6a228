# Every dependency is found on the system (Debian packages, CUDA under /usr/local/cuda); none is vendored.
find_package(Threads REQUIRED)

find_path(ASIO_INCLUDE_DIR asio.hpp)
if(NOT ASIO_INCLUDE_DIR)
  message(FATAL_ERROR "Asio not found: install Debian's libasio-dev (scripts/setup does it)")
endif()
if(NOT TARGET coshard_asio)
  # Asio ships no CMake config or .pc file; header-only, standalone.
  add_library(coshard_asio INTERFACE)
  target_include_directories(coshard_asio SYSTEM INTERFACE ${ASIO_INCLUDE_DIR})
  target_link_libraries(coshard_asio INTERFACE Threads::Threads)
  # clang 14 with libstdc++: Asio 1.22 does not detect co_await support by itself.
  target_compile_definitions(coshard_asio INTERFACE ASIO_STANDALONE ASIO_NO_DEPRECATED
    $<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_CO_AWAIT=1>)
endif()

if(COSHARD_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(COSHARD_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
