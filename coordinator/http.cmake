# coordinator/http.cmake - the HTTP frontend (ferrum_http) and the HTTP-side
# ferrumctl commands (chat, bench). coordinator/CMakeLists.txt includes this
# file when it exists (and defines ferrum_metrics).
if(NOT TARGET ferrum_http AND MHD_FOUND)
  set(_h ${CMAKE_CURRENT_LIST_DIR})
  find_package(PNG REQUIRED)

  # The request parser and response shapes alone (the fuzz target's unit).
  add_library(ferrum_http_json STATIC ${_h}/http_req.c ${_h}/http_resp.c)
  target_include_directories(ferrum_http_json PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(ferrum_http_json PUBLIC ferrum_proto ferrum_common PkgConfig::JANSSON)
  if(TARGET ferrum_tokenizer)
    target_compile_definitions(ferrum_http_json PRIVATE COORD_HTTP_HAVE_TOKENIZER)
    target_link_libraries(ferrum_http_json PUBLIC ferrum_tokenizer)
  endif()

  add_library(ferrum_http STATIC ${_h}/http.c ${_h}/http_job.c ${_h}/http_rpc.c ${_h}/http_client.c
                                 ${_h}/http_plot.c ${_h}/cli_bench.c ${_h}/cli_chat.c)
  target_include_directories(ferrum_http PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(ferrum_http PUBLIC ferrum_http_json ferrum_metrics ferrum_proto ferrum_common
                        PkgConfig::MHD PkgConfig::JANSSON PkgConfig::ZMQ PNG::PNG Threads::Threads m)
endif()
