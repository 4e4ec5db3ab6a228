# Install and export, after prometheus-cpp's model: namespaced targets, a config file that finds
# the dependencies again, and a version file.
include(CMakePackageConfigHelpers)
set(COSHARD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/coshard)

set(_coshard_targets coshard coshard_kernels coshard_core coshard_runtime coshard_launch coshard_ops coshard_transport coshard_fsdp coshard_metrics)
install(TARGETS ${_coshard_targets}
  EXPORT coshard-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(dir kernels runtime/core runtime/device launch ops transport fsdp metrics)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(EXPORT coshard-targets NAMESPACE coshard:: DESTINATION ${COSHARD_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/coshard-config.cmake.in
  ${PROJECT_BINARY_DIR}/coshard-config.cmake INSTALL_DESTINATION ${COSHARD_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/coshard-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/coshard-config.cmake ${PROJECT_BINARY_DIR}/coshard-config-version.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake ${PROJECT_SOURCE_DIR}/cmake/CoshardFindCUDAToolkit.cmake
  DESTINATION ${COSHARD_CMAKE_DIR})

# pkg-config (coshard.pc), as prometheus-cpp ships one: relocatable (paths from ${pcfiledir}), with
# what the static libraries need at the final link. Metrics' stack floor needs its symbol exported.
set(COSHARD_PC_CFLAGS "")
set(COSHARD_PC_LIBS "${COSHARD_OPENBLAS_LIBRARY} -Wl,--export-dynamic-symbol=pthread_attr_setstacksize")
foreach(lib ${CMAKE_DL_LIBS})
  string(APPEND COSHARD_PC_LIBS " -l${lib}")
endforeach()
if(COSHARD_HAVE_CUDA)
  # The toolkit is outside the loader's default path (/usr/local/cuda): rpaths, as CMake gives.
  list(JOIN CUDAToolkit_INCLUDE_DIRS " -I" _cuda_includes)
  get_filename_component(_nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
  string(APPEND COSHARD_PC_CFLAGS " -DCOSHARD_HAVE_CUDA=1 -I${_cuda_includes}")
  string(APPEND COSHARD_PC_LIBS " ${NCCL_LIBRARY} -L${CUDAToolkit_LIBRARY_DIR} -lcublas -lcudart"
    " -Wl,-rpath,${CUDAToolkit_LIBRARY_DIR} -Wl,-rpath,${_nccl_dir}")
endif()
string(APPEND COSHARD_PC_LIBS " -pthread")
file(RELATIVE_PATH COSHARD_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" COSHARD_PC_TO_PREFIX "${COSHARD_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/coshard.pc.in ${PROJECT_BINARY_DIR}/coshard.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/coshard.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
