# Install and export, after prometheus-cpp's model: namespaced targets, a config file that finds
# the dependencies again, and a version file.
include(CMakePackageConfigHelpers)
set(COSHARD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/coshard)

set(_coshard_targets coshard coshard_kernels coshard_runtime coshard_ops coshard_transport coshard_fsdp coshard_metrics)
install(TARGETS ${_coshard_targets}
  EXPORT coshard-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(dir kernels runtime ops transport fsdp metrics)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(EXPORT coshard-targets NAMESPACE coshard:: DESTINATION ${COSHARD_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/coshard-config.cmake.in
  ${PROJECT_BINARY_DIR}/coshard-config.cmake INSTALL_DESTINATION ${COSHARD_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/coshard-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/coshard-config.cmake ${PROJECT_BINARY_DIR}/coshard-config-version.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake
  DESTINATION ${COSHARD_CMAKE_DIR})
