# ferrum_tokenizer: byte-level BPE and SentencePiece tokenizers (GGUF metadata
# or tokenizer.json), streaming detokenizer, chat templates.
add_library(ferrum_tokenizer STATIC
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_gguf.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json.c
  ${CMAKE_CURRENT_LIST_DIR}/tok_bpe.c
  ${CMAKE_CURRENT_LIST_DIR}/tok_spm.c
  ${CMAKE_CURRENT_LIST_DIR}/tok_unicode.c
  ${CMAKE_CURRENT_LIST_DIR}/chat.c)
target_link_libraries(ferrum_tokenizer PUBLIC ferrum_formats ferrum_common PkgConfig::PCRE2 PkgConfig::JANSSON)
