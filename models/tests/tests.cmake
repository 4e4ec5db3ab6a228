# What the models' tests share (included at the end of the top-level CMakeLists, as each model's).
# The FSDP parity rank program of every family: the engine's training against the same model in
# one process (models/tests/fsdp_check.cpp).
add_executable(models_fsdp_check ${CMAKE_CURRENT_LIST_DIR}/fsdp_check.cpp)
target_link_libraries(models_fsdp_check PRIVATE coshard::gpt2 coshard::llama coshard::transport)
coshard_executable_defaults(models_fsdp_check)
