# Llama tests (included at the end of the top-level CMakeLists, after tests/ defined coshard_test).
set(_llama_tests ${CMAKE_CURRENT_LIST_DIR})
coshard_test(llama_model_test unit ${_llama_tests}/model_test.cpp LIBS coshard::llama)

# Against PyTorch in float64 (Debian's python3-torch through /usr/bin/python3); skips without it.
coshard_test(llama_ref_test ref ${_llama_tests}/ref_test.cpp LIBS coshard::llama coshard::gpt2)
target_compile_definitions(llama_ref_test PRIVATE LLAMA_REF_SCRIPT="${_llama_tests}/../ref/llama_ref.py")

# Multi-process: the FSDP engine against the unsharded model (models_fsdp_check, models/tests).
coshard_test(llama_fsdp_test mp ${_llama_tests}/fsdp_test.cpp)
target_compile_definitions(llama_fsdp_test PRIVATE COSHARD_RUN_BIN="$<TARGET_FILE:coshard-run>"
  MODELS_FSDP_CHECK_BIN="$<TARGET_FILE:models_fsdp_check>")
add_dependencies(llama_fsdp_test coshard-run models_fsdp_check)

# Hugging Face directories: config.json both ways, sharded checkpoints, refusals.
coshard_test(llama_hf_dir_test unit ${_llama_tests}/hf_dir_test.cpp LIBS coshard::llama)
