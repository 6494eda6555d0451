add_library(ferrum_model STATIC model_load.c forward.c rope.c sampler.c generate.c prompt.c dummy.c)
target_link_libraries(ferrum_model PUBLIC ferrum_formats ferrum_tokenizer ferrum_kernels ferrum_common m)
