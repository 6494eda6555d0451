# tests/engine/http.cmake - the HTTP frontend's tests (label engine):
# test_http (against a fake coordinator), test_http_cli (ferrumctl's chat
# and bench clients against the same fake), test_http_json (request parsing,
# response shapes, metrics text), fuzz_http_json, test_http_streams (streams
# of a real `ferrumctl serve` that wait for a hung worker or are drained) and
# test_http_openai.py (the real openai client against `ferrumctl serve` with
# the real model), test_http_chat_template.py (a --chat-template file
# against jinja2), test_http_sampling.py (logit_bias, min_tokens and
# include_stop_str_in_output with the real model), test_http_choices.py
# (n, best_of, several prompts, truncation, stop_reason and the audit of
# OpenAI's request fields, with the real model), test_http_load.py (1000
# clients at once; a full queue answers 429), test_http_spec.py (speculative
# decoding: greedy outputs identical with and without, through preemption,
# chunked prefill, the prefix cache and a worker restart),
# test_http_spec_draft.py (the same with a draft model, and its temperature-1
# distribution against plain sampling), test_http_tools and
# fuzz_http_tools (the tool call parsers on each family's documented
# formats, whole and in pieces), test_http_tool_calls.py (tool calls with
# the real model and the openai client: parsed, streamed, forced),
# test_http_structured.py (structured output with the real model:
# json_schema answers validated by jsonschema), test_http_prompt_logprobs.py
# (prompt logprobs and echo with logprobs against llama.cpp's on the same
# GGUF, chunked prefill, the prefix cache, skip_special_tokens false),
# test_http_embed_pooling.py (--task embed --pooling mean and cls on the real
# SmolLM2 against llama.cpp's pooled embeddings of the same GGUF),
# test_lm_eval.py (lm-evaluation-harness's local-completions against the
# server on two small local tasks, scores compared with llama.cpp's; label
# lm_eval, not engine: the sanitizer runs leave it out).
set(_t ${CMAKE_CURRENT_LIST_DIR})
ferrum_add_check(test_http SOURCES ${_t}/test_http.c ${_t}/http_fake.c
                 LIBS ferrum_http ferrum_ctl Threads::Threads LABELS engine TIMEOUT 120)
ferrum_add_check(test_http_cli SOURCES ${_t}/test_http_cli.c ${_t}/http_fake.c
                 LIBS ferrum_ctl ferrum_http Threads::Threads LABELS engine TIMEOUT 120)
ferrum_add_check(test_http_json SOURCES ${_t}/test_http_json.c
                 LIBS ferrum_http_json ferrum_metrics LABELS engine TIMEOUT 60)
ferrum_add_fuzz(http_json SOURCES ${_t}/fuzz_http_json.c LIBS ferrum_http_json)
ferrum_add_check(test_http_tools SOURCES ${_t}/test_http_tools.c LIBS ferrum_http_json LABELS engine TIMEOUT 60)
ferrum_add_check(test_http_reason SOURCES ${_t}/test_http_reason.c LIBS ferrum_http_json LABELS engine TIMEOUT 60)
ferrum_add_fuzz(http_tools SOURCES ${_t}/fuzz_http_tools.c LIBS ferrum_http_json)
ferrum_add_fuzz(http_reason SOURCES ${_t}/fuzz_http_reason.c LIBS ferrum_http_json)
ferrum_add_check(test_http_streams SOURCES ${_t}/test_http_streams.c ${_t}/engine_fx.c
                 LIBS ferrum_ctl ferrum_model ferrum_kv Threads::Threads LABELS engine TIMEOUT 600)
add_dependencies(test_http_streams ferrumctl ferrum-worker)

# A Python end-to-end test against `ferrumctl serve` with the real model.
function(ferrum_http_py name timeout)
  add_test(NAME ${name} COMMAND ${FERRUM_PYTHON} ${_t}/${name}.py)
  set_tests_properties(${name} PROPERTIES LABELS engine SKIP_RETURN_CODE 77 TIMEOUT ${timeout}
    ENVIRONMENT "FERRUM_MODEL=${FERRUM_MODEL};FERRUMCTL=$<TARGET_FILE:ferrumctl>")
endfunction()
ferrum_http_py(test_http_load 600)
ferrum_http_py(test_http_openai 300)
ferrum_http_py(test_http_chat_template 300)
ferrum_http_py(test_http_sampling 300)
ferrum_http_py(test_http_choices 600)
ferrum_http_py(test_http_spec 600)
ferrum_http_py(test_http_spec_draft 900)
ferrum_http_py(test_http_tool_calls 300)
ferrum_http_py(test_http_structured 600)
ferrum_http_py(test_http_embeddings 300)
ferrum_http_py(test_http_embed_pooling 300)
ferrum_http_py(test_http_embed_bert 300)
ferrum_http_py(test_http_reasoning 300)
ferrum_http_py(test_http_prompt_logprobs 300)
ferrum_http_py(test_lm_eval 600)
set_tests_properties(test_lm_eval PROPERTIES LABELS lm_eval)
# The longest suites of CI's ThreadSanitizer runner (184 and 131 s of its 240
# on two cores): a high COST starts them first, beside the short ones.
set_tests_properties(test_http_openai test_worker PROPERTIES COST 1000)
