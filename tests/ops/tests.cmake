# ops suites: every kernel's forward against a float64 reference and its backward against float64
# central differences; optimizers against float64 reimplementations of the torch formulas. Suite
# names start with "Ops" (ctest -R Ops). ops_cast_test is registered in tests/CMakeLists.txt.
foreach(suite linear layernorm gelu cross_entropy embedding attention optim grad_norm)
  coshard_test(ops_${suite}_test unit ops/${suite}_test.cpp LIBS coshard::ops)
endforeach()

# CUDA versions against the CPU ops (label gpu: skipped with the reason where no device is usable).
if(COSHARD_HAVE_CUDA)
  coshard_test(ops_cuda_test gpu ops/cuda_ops_test.cpp LIBS coshard::ops)
endif()
