# ferrum_formats: GGUF and safetensors readers, model configs, model sources.
add_library(ferrum_formats STATIC
  ${CMAKE_CURRENT_LIST_DIR}/gguf.c
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.c
  ${CMAKE_CURRENT_LIST_DIR}/config.c
  ${CMAKE_CURRENT_LIST_DIR}/source.c)
# kern_type_traits() lives in ferrum_kernels (kernels/ never depends on model/).
target_link_libraries(ferrum_formats PUBLIC ferrum_kernels ferrum_common PkgConfig::JANSSON m)
