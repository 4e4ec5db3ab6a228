# ops suites: every kernel's forward against a float64 reference and its backward against float64
# central differences; optimizers against float64 reimplementations of the torch formulas. Suite
# names start with "Ops" (ctest -R Ops). ops_cast_test is registered in tests/CMakeLists.txt.
foreach(suite linear layernorm gelu cross_entropy embedding attention optim grad_norm)
  coshard_test(ops_${suite}_test unit ops/${suite}_test.cpp LIBS coshard::ops)
endforeach()
