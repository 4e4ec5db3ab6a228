# GPT-2 tests (included at the end of the top-level CMakeLists, after tests/ defined coshard_test).
set(_gpt2_tests ${CMAKE_CURRENT_LIST_DIR})
find_package(nlohmann_json 3 REQUIRED)
coshard_test(gpt2_model_test unit ${_gpt2_tests}/model_test.cpp LIBS coshard::gpt2)
coshard_test(gpt2_files_test unit ${_gpt2_tests}/files_test.cpp LIBS coshard::gpt2)
coshard_test(gpt2_interop_test unit ${_gpt2_tests}/interop_test.cpp LIBS coshard::gpt2 nlohmann_json::nlohmann_json)

# Multi-process: GPT-2 on the FSDP engine against the unsharded model (ranks by coshard-run; the
# rank program is the models' models_fsdp_check, models/tests/tests.cmake).
coshard_test(gpt2_fsdp_test mp ${_gpt2_tests}/fsdp_test.cpp)
target_compile_definitions(gpt2_fsdp_test PRIVATE COSHARD_RUN_BIN="$<TARGET_FILE:coshard-run>"
  GPT2_FSDP_CHECK_BIN="$<TARGET_FILE:models_fsdp_check>")
add_dependencies(gpt2_fsdp_test coshard-run models_fsdp_check)

# Against PyTorch (Debian's python3-torch through /usr/bin/python3); skips when torch is missing.
coshard_test(gpt2_ref_test ref ${_gpt2_tests}/ref_test.cpp LIBS coshard::gpt2)
target_compile_definitions(gpt2_ref_test PRIVATE GPT2_REF_SCRIPT="${_gpt2_tests}/../ref/gpt2_ref.py")

# The model's pieces on a CUDA stream against the CPU model (label gpu: skipped with the reason
# where no CUDA device is usable).
coshard_test(gpt2_model_cuda_test gpu ${_gpt2_tests}/model_cuda_test.cpp LIBS coshard::gpt2)
