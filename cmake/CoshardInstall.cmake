# Install and export, after prometheus-cpp's model: namespaced targets, a config file that finds
# the dependencies again, and a version file.
include(CMakePackageConfigHelpers)
set(COSHARD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/coshard)
