add_library(ferrum_model STATIC model_load.c forward.c rope.c sampler.c generate.c prompt.c dummy.c)
target_link_libraries(ferrum_model PUBLIC ferrum_formats ferrum_tokenizer ferrum_kernels ferrum_common m)

# Throughput of the layer stack outside the engine (bench/, not a test).
add_executable(model_bench ${CMAKE_SOURCE_DIR}/bench/model_bench.c ${CMAKE_SOURCE_DIR}/coordinator/cli_common.c)
target_link_libraries(model_bench PRIVATE ferrum_model)

# Feeds ids to a model and prints logits / greedy tokens for the parity
# scripts in tests/parity (GPU vs transformers, CPU vs CUDA).
add_executable(run_model ${CMAKE_SOURCE_DIR}/tests/parity/run_model.c ${CMAKE_SOURCE_DIR}/coordinator/cli_common.c)
target_link_libraries(run_model PRIVATE ferrum_model)
