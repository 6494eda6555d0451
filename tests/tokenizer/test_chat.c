/* test_chat.c - chat template detection and rendering, byte-equal to jinja2
 * rendering the upstream templates (gen_chat_golden.py). */
#include <check.h>
#include <unistd.h>

#include "model/chat.h"
#include "tok_test_util.h"

static char g_path[4200];

static void golden_path(void) {
  const char *b = getenv("FERRUM_BUILD_DIR");
  snprintf(g_path, sizeof(g_path), "%s/tests/tok-golden/chat_golden.json", b ? b : "build");
}

static void print_diff(const char *want, const char *got) {
  size_t i = 0;
  while (want[i] && want[i] == got[i]) i++;
  fprintf(stderr, "  first difference at byte %zu\n  want: \"%.80s\"\n  got:  \"%.80s\"\n", i, want + (i > 20 ? i - 20 : 0),
          got + (i > 20 ? i - 20 : 0));
}

START_TEST(render_matches_jinja) {
  json_t *g = tt_load_json(g_path);
  ck_assert_ptr_nonnull(g);
  json_t *cases = json_object_get(g, "cases"), *c;
  size_t i;
  int bad = 0, rendered = 0, rejected = 0;
  json_array_foreach(cases, i, c) {
    const char *path = json_string_value(json_object_get(c, "template"));
    const char *kind = json_string_value(json_object_get(c, "kind"));
    char *tmpl = tt_read_file(path, NULL);
    ck_assert_msg(tmpl != NULL, "cannot read %s", path);
    model_chat_kind_t k = model_chat_detect(tmpl);
    ck_assert_msg(!strcmp(model_chat_kind_name(k), kind), "%s detected as %s", path, model_chat_kind_name(k));
    json_t *msgs = json_object_get(c, "messages"), *m;
    size_t n = json_array_size(msgs), j;
    model_chat_msg_t *mm = calloc(n, sizeof(*mm));
    json_array_foreach(msgs, j, m) {
      mm[j].role = json_string_value(json_object_get(m, "role"));
      mm[j].content = json_string_value(json_object_get(m, "content"));
    }
    char *out = NULL;
    int rc = model_chat_render(k, mm, n, json_string_value(json_object_get(c, "bos")), &out);
    json_t *exp = json_object_get(c, "expected");
    if (json_is_null(exp)) {
      rejected++;
      if (rc == 0) {
        bad++;
        fprintf(stderr, "case %zu (%s): jinja rejects it, we rendered \"%.60s\"\n", i, kind, out);
      }
    } else if (rc != 0 || strcmp(out, json_string_value(exp))) {
      bad++;
      fprintf(stderr, "case %zu (%s): rc %d (%s)\n", i, kind, rc, rc ? fr_last_error() : "");
      if (!rc) print_diff(json_string_value(exp), out);
    } else {
      rendered++;
    }
    free(out);
    free(mm);
    free(tmpl);
  }
  fprintf(stderr, "chat: %d rendered byte-equal, %d rejected as jinja does, %d bad\n", rendered, rejected, bad);
  ck_assert_int_gt(rendered, 70);
  ck_assert_int_eq(bad, 0);
  json_decref(g);
}
END_TEST

START_TEST(detect_names_and_unknown) {
  ck_assert_int_eq(model_chat_detect(NULL), MODEL_CHAT_UNKNOWN);
  ck_assert_int_eq(model_chat_detect("{{ messages }}"), MODEL_CHAT_UNKNOWN);
  ck_assert_int_eq(model_chat_detect("llama3"), MODEL_CHAT_LLAMA3);
  ck_assert_int_eq(model_chat_detect("qwen2.5"), MODEL_CHAT_QWEN25);
  ck_assert_int_eq(model_chat_detect("chatml"), MODEL_CHAT_CHATML);
  ck_assert_str_eq(model_chat_kind_name(MODEL_CHAT_QWEN3), "qwen3");
  ck_assert_str_eq(model_chat_kind_name((model_chat_kind_t)99), "unknown");
  model_chat_msg_t m = {"user", "hi", NULL};
  char *out = (char *)1;
  ck_assert_int_eq(model_chat_render(MODEL_CHAT_UNKNOWN, &m, 1, NULL, &out), FR_EUNSUPPORTED);
  ck_assert_ptr_null(out);
  ck_assert_int_ne(model_chat_render(MODEL_CHAT_CHATML, &m, 0, NULL, &out), 0);
  model_chat_msg_t tool[] = {{"user", "q", NULL}, {"tool", "r", NULL}};
  ck_assert_int_eq(model_chat_render(MODEL_CHAT_QWEN3, tool, 2, NULL, &out), FR_EUNSUPPORTED);
  /* NULL bos: nothing written in its place */
  ck_assert_int_eq(model_chat_render(MODEL_CHAT_LLAMA3, &m, 1, NULL, &out), 0);
  ck_assert_str_eq(out, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  free(out);
}
END_TEST

/* model_chat_apply on the test model's tokenizer: its own template (the
 * GGUF's), a built-in name, content parts joined or passed as a list, the
 * extra variables, and a template error as an error value. */
START_TEST(apply_with_the_model_template) {
  const char *path = getenv("FERRUM_MODEL");
  model_gguf_t *g = NULL;
  model_tokenizer_t *tok = path && access(path, R_OK) == 0 ? tt_open_gguf(path, &g) : NULL;
  if (!tok) return; /* no model: the golden test above covers the renderers */
  model_chat_msg_t parts[] = {{"user", "ab", "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
                                             " {\"type\": \"text\", \"text\": \"b\"}]}"}};
  model_chat_t chat = {.msgs = parts, .n = 1};
  char *out = NULL;
  ck_assert_int_eq(model_chat_apply(tok, &chat, &out), 0); /* SmolLM2's template does not loop over content: joined */
  ck_assert_str_eq(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                        "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n");
  free(out);
  model_tokenizer_set_chat_template(tok, "{% for m in messages %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endfor %}"
                                         "{{ tools|length }}{{ flag }}{{ bos_token }}");
  chat.vars = "{\"tools\": [1, 2], \"flag\": \"F\", \"messages\": \"not these\"}";
  ck_assert_int_eq(model_chat_apply(tok, &chat, &out), 0); /* it loops over content: the parts as given */
  ck_assert_str_eq(out, "[a][b]2F<|im_start|>");
  free(out);
  model_tokenizer_set_chat_template(tok, "{{ raise_exception('no ' ~ messages[0].role ~ ' here') }}");
  ck_assert_int_eq(model_chat_apply(tok, &chat, &out), FR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "no user here"));
  ck_assert_ptr_null(out);
  model_tokenizer_set_chat_template(tok, "chatml"); /* a built-in name: the hand-written renderer */
  ck_assert_int_eq(model_chat_apply(tok, &chat, &out), 0);
  ck_assert_str_eq(out, "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n");
  free(out);
  model_tokenizer_set_chat_template(tok, NULL);
  ck_assert_int_eq(model_chat_apply(tok, &chat, &out), FR_EUNSUPPORTED);
  model_tokenizer_destroy(tok);
  model_gguf_close(g);
}
END_TEST

static void write_file(const char *dir, const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* Where a Hugging Face folder's template comes from: tokenizer_config.json's
 * chat_template (a string, or the "default" of a list), and a
 * chat_template.jinja beside tokenizer.json over both. */
START_TEST(template_sources_of_a_folder) {
  char dir[] = "/tmp/ferrum-chat-XXXXXX", tj[600], cj[600];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
  snprintf(cj, sizeof cj, "%s/tokenizer_config.json", dir);
  write_file(dir, "tokenizer.json",
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"<s>\": 2}, \"merges\": []},"
             " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"added_tokens\": []}");
  write_file(dir, "tokenizer_config.json",
             "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
             " {\"name\": \"default\", \"template\": \"D{{ messages|length }}\"}]}");
  model_tokenizer_t *t = NULL;
  ck_assert_msg(model_tokenizer_from_json_files(&t, tj, cj) == 0, "%s", fr_last_error());
  ck_assert_str_eq(model_tokenizer_chat_template(t), "D{{ messages|length }}");
  model_chat_msg_t m = {"user", "a", NULL};
  model_chat_t chat = {.msgs = &m, .n = 1};
  char *out = NULL;
  ck_assert_int_eq(model_chat_apply(t, &chat, &out), 0);
  ck_assert_str_eq(out, "D1");
  free(out);
  model_tokenizer_destroy(t);
  write_file(dir, "chat_template.jinja", "J{{ messages[0].content }}\n");
  ck_assert_int_eq(model_tokenizer_from_json_files(&t, tj, cj), 0);
  ck_assert_int_eq(model_chat_apply(t, &chat, &out), 0);
  ck_assert_str_eq(out, "Ja"); /* the file's trailing newline is dropped, as jinja2 does */
  free(out);
  model_tokenizer_destroy(t);
  char rm[700];
  snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(rm), 0);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static int chat_setup(int argc, char **argv) {
  golden_path();
  if (access(g_path, R_OK) != 0) {
    fprintf(stderr, "skip: %s missing\n", g_path);
    return TEST_SKIP;
  }
  return 0;
}

static Suite *chat_suite(void) {
  Suite *s = suite_create("chat");
  TCase *tc = tcase_create("chat");
  tcase_add_test(tc, render_matches_jinja);
  tcase_add_test(tc, detect_names_and_unknown);
  tcase_add_test(tc, apply_with_the_model_template);
  tcase_add_test(tc, template_sources_of_a_folder);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {chat_suite}, .setup = chat_setup};
