# find_package(CUDAToolkit) that configures with Debian's stock CMake 3.25.1 and CUDA 13. That
# module sets a deprecation property on CUDA::nvToolsExt whenever the project requires CMake 3.25,
# whether or not it made the target, and CUDA 13 ships no nvToolsExt library, so configure fails
# ("set_property could not find TARGET CUDA::nvToolsExt"). The property only words a warning: the
# call sees a lower minimum instead. Included by coshard's build and by its installed config, whose
# consumers meet the same module. A macro, so that CUDAToolkit's results land in the caller's scope.
macro(coshard_find_cuda_toolkit)
  set(_coshard_cuda_min "${CMAKE_MINIMUM_REQUIRED_VERSION}")
  if(CMAKE_VERSION VERSION_LESS 3.26 AND CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)
    set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
  endif()
  find_package(CUDAToolkit ${ARGN})
  set(CMAKE_MINIMUM_REQUIRED_VERSION "${_coshard_cuda_min}")
  unset(_coshard_cuda_min)
endmacro()
