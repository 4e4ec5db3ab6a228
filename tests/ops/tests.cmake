# ops suites: every kernel's forward against a float64 reference and its backward against float64
# central differences; optimizers against float64 reimplementations of the torch formulas. Suite
# names start with "Ops" (ctest -R Ops). ops_cast_test is registered in tests/CMakeLists.txt.
foreach(suite linear layernorm rmsnorm gelu swiglu columns cross_entropy embedding attention attention_gqa rope optim grad_norm
              threads thread_team kernels)
  coshard_test(ops_${suite}_test unit ops/${suite}_test.cpp LIBS coshard::ops)
endforeach()
target_include_directories(ops_threads_test PRIVATE ${PROJECT_SOURCE_DIR}/ops/src)
target_include_directories(ops_thread_team_test PRIVATE ${PROJECT_SOURCE_DIR}/ops/src)
foreach(count 2 two)
  add_test(NAME OpsBlas.Environment.${count}
    COMMAND ops_linear_test --gtest_filter=OpsBlas.TheEnvironmentGivesTheCountOrAnError)
  set_tests_properties(OpsBlas.Environment.${count} PROPERTIES LABELS unit
    ENVIRONMENT OPENBLAS_NUM_THREADS=${count} ${COSHARD_LOAD_computes})
endforeach()

# The kernels of every instruction set this CPU runs give the same bits; the process picks the widest
# or what COSHARD_CPU_ISA asks for (run once as is, once asking for baseline, once for a bad name).
coshard_test(ops_cpu_isa_test unit ops/cpu_isa_test.cpp LIBS coshard::ops)
target_include_directories(ops_cpu_isa_test PRIVATE ${PROJECT_SOURCE_DIR}/ops/src)
foreach(ask baseline no-such-isa)
  add_test(NAME OpsCpuIsa.Asked.${ask}
    COMMAND ops_cpu_isa_test --gtest_filter=OpsCpuIsa.TheProcessRunsTheWidestOrTheOneAsked)
  set_tests_properties(OpsCpuIsa.Asked.${ask} PROPERTIES LABELS unit
    ENVIRONMENT COSHARD_CPU_ISA=${ask} ${COSHARD_LOAD_computes})
endforeach()
# Each ISA's object exports only its table: a weak helper built for AVX-512 could be the copy the
# linker keeps for baseline callers (isa_objects.cmake). Checked on the object the library links,
# and on an -O0 build of the same source with the same flags (never linked), where nothing is
# inlined and a helper that would leak shows whatever the build type.
foreach(isa baseline avx2 avx512 avx512_bf16)
  if(NOT TARGET coshard_ops_${isa})
    continue()  # not built for this processor (ops/CMakeLists.txt)
  endif()
  get_target_property(sources coshard_ops_${isa} SOURCES)
  get_target_property(dir coshard_ops_${isa} SOURCE_DIR)
  list(TRANSFORM sources PREPEND "${dir}/")
  add_library(isa_o0_${isa} OBJECT ${sources})
  target_compile_features(isa_o0_${isa} PRIVATE cxx_std_20)
  target_link_libraries(isa_o0_${isa} PRIVATE coshard::kernels)
  target_compile_definitions(isa_o0_${isa} PRIVATE $<TARGET_PROPERTY:coshard_ops_${isa},COMPILE_DEFINITIONS>)
  target_compile_options(isa_o0_${isa} PRIVATE $<TARGET_PROPERTY:coshard_ops_${isa},COMPILE_OPTIONS> -O0)
  foreach(variant "" .O0)
    set(target coshard_ops_${isa})
    if(variant)
      set(target isa_o0_${isa})
    endif()
    add_test(NAME OpsCpuIsa.ObjectExportsOnlyItsTable.${isa}${variant}
      COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} -DOBJECT=$<TARGET_OBJECTS:${target}> -DISA=${isa}
        -P ${CMAKE_CURRENT_LIST_DIR}/isa_objects.cmake)
    set_tests_properties(OpsCpuIsa.ObjectExportsOnlyItsTable.${isa}${variant} PROPERTIES LABELS unit
      ${COSHARD_LOAD_computes})
  endforeach()
endforeach()

# The bf16 GEMM: every implementation this CPU runs against float64, and the choice between them
# (once as is, once with the AVX-512 kernels ruled out).
coshard_test(ops_gemm_bf16_test unit ops/gemm_bf16_test.cpp LIBS coshard::ops)
target_include_directories(ops_gemm_bf16_test PRIVATE ${PROJECT_SOURCE_DIR}/ops/src)
add_test(NAME OpsGemmBf16.Asked.avx2 COMMAND ops_gemm_bf16_test --gtest_filter=GemmBf16Choice.*:*LinearBf16*)
set_tests_properties(OpsGemmBf16.Asked.avx2 PROPERTIES LABELS unit ENVIRONMENT COSHARD_CPU_ISA=avx2
  ${COSHARD_LOAD_computes})

# Attention's tile products on coshard's own kernel, where an instruction set has one; and the
# attention suite again with that kernel ruled out (OpenBLAS computes the tiles).
coshard_test(ops_tile_gemm_test unit ops/tile_gemm_test.cpp LIBS coshard::ops)
target_include_directories(ops_tile_gemm_test PRIVATE ${PROJECT_SOURCE_DIR}/ops/src)
if(TARGET coshard_ops_avx2)
  add_test(NAME OpsAttention.Asked.avx2 COMMAND ops_attention_test)
  set_tests_properties(OpsAttention.Asked.avx2 PROPERTIES LABELS unit ENVIRONMENT COSHARD_CPU_ISA=avx2
    ${COSHARD_LOAD_computes})
endif()

# CUDA versions against the CPU ops (label gpu: skipped with the reason where no device is usable).
if(COSHARD_HAVE_CUDA)
  coshard_test(ops_cuda_test gpu ops/cuda_ops_test.cpp LIBS coshard::ops)
endif()
