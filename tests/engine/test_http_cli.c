/* test_http_cli.c - `ferrumctl bench` and `ferrumctl chat` (in-process)
 * against the HTTP frontend and the fake coordinator (http_fake.h): the
 * bench's counts, JSON and PNG; chat's streaming and history. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <png.h>
#include <zmq.h>

#include "ctl/cli.h"
#include "coordinator/http/http.h"
#include "model/source.h"
#include "model/tokenizer.h"
#include "tests/engine/http_fake.h"

#define EP "inproc://fake-coord-cli"

static void *ctx;
static http_fake_t fake;
static coord_http_t *srv;
static char port[16], dir[64];

static void setup(void) {
  ctx = zmq_ctx_new();
  ck_assert_int_eq(http_fake_start(&fake, ctx, EP), 0);
  coord_http_config_t cfg = {.zmq_ctx = ctx, .rpc_endpoint = EP, .served_model_name = "smol", .max_model_len = 1000};
  ck_assert_int_eq(coord_http_start(&srv, &cfg), 0);
  coord_http_set_ready(srv, true);
  snprintf(port, sizeof port, "%d", coord_http_port(srv));
  snprintf(dir, sizeof dir, "/tmp/ferrum-http-cli-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
  coord_http_stop(srv);
  http_fake_stop(&fake);
  zmq_ctx_term(ctx);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_bench_sweep) {
  char json[128], png[128];
  snprintf(json, sizeof json, "%s/r.json", dir);
  snprintf(png, sizeof png, "%s/p.png", dir);
  char *argv[] = {"bench", "--port", port, "--num-prompts", "8", "--random-input-len", "4", "--random-output-len",
                  "3", "--seed", "1", "--sweep", "1,4", "--result-file", json, "--plot", png, NULL};
  ck_assert_int_eq(cli_cmd_bench(17, argv), 0);
  ck_assert_int_eq(atomic_load(&fake.n_submits), 16);
  pthread_mutex_lock(&fake.mu);
  ck_assert_uint_eq(fake.n_tokens, 4);
  ck_assert_uint_eq(fake.max_tokens, 3);
  ck_assert(fake.ignore_eos && fake.stream);
  pthread_mutex_unlock(&fake.mu);
  json_t *j = json_load_file(json, 0, NULL);
  ck_assert_ptr_nonnull(j);
  ck_assert_str_eq(json_string_value(json_object_get(j, "model")), "smol"); /* from /v1/models */
  json_t *runs = json_object_get(j, "runs");
  ck_assert_int_eq(json_array_size(runs), 2);
  for (int i = 0; i < 2; i++) {
    json_t *r = json_array_get(runs, i);
    ck_assert_int_eq(json_integer_value(json_object_get(r, "max_concurrency")), i ? 4 : 1);
    ck_assert_int_eq(json_integer_value(json_object_get(r, "completed")), 8);
    ck_assert_int_eq(json_integer_value(json_object_get(r, "total_input_tokens")), 32);
    ck_assert_int_eq(json_integer_value(json_object_get(r, "total_output_tokens")), 24); /* usage c=3 */
    double ttft = json_real_value(json_object_get(r, "mean_ttft_ms")), e2e = json_real_value(json_object_get(r, "mean_e2el_ms"));
    ck_assert(ttft > 0 && e2e >= ttft);
    ck_assert(json_real_value(json_object_get(r, "p99_itl_ms")) >= json_real_value(json_object_get(r, "median_itl_ms")));
    ck_assert(json_real_value(json_object_get(r, "output_throughput")) > 0);
  }
  json_decref(j);
  /* a real PNG of the asked size */
  png_image img = {.version = PNG_IMAGE_VERSION};
  ck_assert(png_image_begin_read_from_file(&img, png));
  ck_assert_uint_eq(img.width, 900);
  ck_assert_uint_eq(img.height, 600);
  png_image_free(&img);
}
END_TEST

START_TEST(test_bench_fixed_rate) {
  char *argv[] = {"bench", "--base-url", NULL, "--model", "smol", "--num-prompts", "5", "--request-rate", "50",
                  "--input-len", "2", "--output-len", "3", NULL};
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%s", port);
  argv[2] = url;
  ck_assert_int_eq(cli_cmd_bench(13, argv), 0);
  ck_assert_int_eq(atomic_load(&fake.n_submits), 5);
  char *bad[] = {"bench", "--port", port, "--model", "nope", "--num-prompts", "2", NULL};
  ck_assert_int_eq(cli_cmd_bench(7, bad), 1); /* every request 404s */
  char *usage[] = {"bench", "--num-prompts", "0", NULL};
  ck_assert_int_eq(cli_cmd_bench(3, usage), 2);
  char *both[] = {"bench", "--rpc", "ipc:///nonexistent", "--port", port, NULL}; /* one way to name the server */
  ck_assert_int_eq(cli_cmd_bench(5, both), 2);
}
END_TEST

/* A small file of ShareGPT's format: entries vLLM's sampling skips (one
 * turn, a prompt under 4 tokens, a prompt over 1024, no conversations)
 * among three that it takes. */
static void write_sharegpt(const char *path, char long_prompt[8000]) {
  memset(long_prompt, 0, 8000);
  for (int i = 0; i < 1500; i++) strcat(long_prompt, "a ");
  json_t *d = json_array(), *turn;
  const char *pairs[][2] = {{"Tell me about the moon and its phases please.", "The moon has eight phases in all."},
                            {"Hi", "Hello there, how can I help?"},
                            {"Write a haiku about the sea at night.", "Dark waves fold on sand, salt wind hums."},
                            {long_prompt, "Too long to take."},
                            {"What is two plus two, in words?", "Four."}};
  for (size_t i = 0; i < 5; i++) {
    json_t *conv = json_array();
    json_array_append_new(conv, json_pack("{s:s,s:s}", "from", "human", "value", pairs[i][0]));
    json_array_append_new(conv, json_pack("{s:s,s:s}", "from", "gpt", "value", pairs[i][1]));
    json_array_append_new(d, json_pack("{s:s,s:o}", "id", "x", "conversations", conv));
  }
  turn = json_array();
  json_array_append_new(turn, json_pack("{s:s,s:s}", "from", "human", "value", "only one turn here, no answer"));
  json_array_append_new(d, json_pack("{s:o}", "conversations", turn));
  json_array_append_new(d, json_pack("{s:s}", "id", "no conversations"));
  ck_assert_int_eq(json_dump_file(d, path, 0), 0);
  json_decref(d);
}

/* ShareGPT prompts: the entries vLLM would take, tokenized by the model's
 * tokenizer (token counts from the tokenizer, checked against HF
 * `tokenizers` by the tokenizer suite), each sent as token ids with its
 * answer's token count as max_tokens (the answer "Four." is under 4 tokens:
 * skipped). 6 requests of 2 valid pairs: each used three times. */
START_TEST(test_bench_sharegpt) {
  const char *model = getenv("FERRUM_MODEL");
  if (!model || access(model, R_OK)) return; /* no tokenizer: nothing to count with */
  char path[128], json[128], *long_prompt = malloc(8000);
  snprintf(path, sizeof path, "%s/sg.json", dir);
  snprintf(json, sizeof json, "%s/r.json", dir);
  write_sharegpt(path, long_prompt);
  free(long_prompt);
  char *argv[] = {"bench", "--port", port, "--num-prompts", "6", "--dataset-name", "sharegpt", "--dataset-path", path,
                  "--tokenizer", (char *)model, "--result-file", json, NULL};
  ck_assert_int_eq(cli_cmd_bench(13, argv), 0);
  ck_assert_int_eq(atomic_load(&fake.n_submits), 6);
  /* the two pairs that pass, as the tokenizer counts them (BOS added when the model adds one) */
  model_source_t *src = NULL;
  model_tokenizer_t *tok = NULL;
  ck_assert_int_eq(model_source_open(&src, model), 0);
  ck_assert_int_eq(model_tokenizer_from_gguf(&tok, src->gguf), 0);
  const char *ok[][2] = {{"Tell me about the moon and its phases please.", "The moon has eight phases in all."},
                         {"Write a haiku about the sea at night.", "Dark waves fold on sand, salt wind hums."}};
  uint64_t in = 0, out = 0;
  for (int i = 0; i < 2; i++) {
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(model_tokenize(tok, ok[i][0], strlen(ok[i][0]), true, false, &ids, &n), 0);
    in += n, free(ids);
    ck_assert_int_eq(model_tokenize(tok, ok[i][1], strlen(ok[i][1]), true, false, &ids, &n), 0);
    out += n, free(ids);
  }
  model_tokenizer_destroy(tok);
  model_source_close(src);
  pthread_mutex_lock(&fake.mu);
  ck_assert_uint_eq(fake.sum_tokens, 3 * in);
  ck_assert_uint_eq(fake.sum_max_tokens, 3 * out);
  pthread_mutex_unlock(&fake.mu);
  json_t *j = json_load_file(json, 0, NULL);
  ck_assert_ptr_nonnull(j);
  json_t *r = j; /* one run: the run's object itself (vLLM's shape) */
  ck_assert_int_eq(json_integer_value(json_object_get(r, "total_input_tokens")), (json_int_t)(3 * in));
  ck_assert_int_eq(json_integer_value(json_object_get(r, "completed")), 6);
  json_decref(j);
  /* a fixed output length; a dataset with nothing usable; the flags go together */
  char *fixed[] = {"bench", "--port", port, "--num-prompts", "2", "--dataset-name", "sharegpt", "--dataset-path", path,
                   "--tokenizer", (char *)model, "--sharegpt-output-len", "7", NULL};
  ck_assert_int_eq(cli_cmd_bench(13, fixed), 0);
  pthread_mutex_lock(&fake.mu);
  ck_assert_uint_eq(fake.max_tokens, 7);
  pthread_mutex_unlock(&fake.mu);
  FILE *f = fopen(path, "w");
  fputs("[{\"conversations\": [{\"value\": \"Hi\"}, {\"value\": \"Yo\"}]}]", f);
  fclose(f);
  ck_assert_int_eq(cli_cmd_bench(11, argv), 1);
  char *alone[] = {"bench", "--port", port, "--dataset-name", "sharegpt", NULL};
  ck_assert_int_eq(cli_cmd_bench(5, alone), 2);
}
END_TEST

START_TEST(test_chat_history) {
  char in[128], out[128];
  snprintf(in, sizeof in, "%s/in.txt", dir);
  snprintf(out, sizeof out, "%s/out.txt", dir);
  FILE *f = fopen(in, "w");
  fputs("hi\n\nthere\n/exit\nnot sent\n", f);
  fclose(f);
  ck_assert_ptr_nonnull(freopen(in, "r", stdin));
  ck_assert_ptr_nonnull(freopen(out, "w", stdout));
  char *argv[] = {"chat", "--port", port, "--system", "be brief", NULL};
  ck_assert_int_eq(cli_cmd_chat(5, argv), 0);
  fflush(stdout);
  ck_assert_int_eq(atomic_load(&fake.n_submits), 2);
  pthread_mutex_lock(&fake.mu);
  ck_assert_uint_eq(fake.n_messages, 4); /* system, user, assistant, user */
  ck_assert(fake.stream);
  pthread_mutex_unlock(&fake.mu);
  char buf[256] = "";
  f = fopen(out, "r");
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  ck_assert_str_eq(buf, "Hello world\nHello world\n");
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static Suite *cli_suite(void) {
  Suite *s = suite_create("http_cli");
  TCase *tc = tcase_create("cli");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_bench_sweep);
  tcase_add_test(tc, test_bench_fixed_rate);
  tcase_add_test(tc, test_bench_sharegpt);
  tcase_add_test(tc, test_chat_history);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {cli_suite}};
