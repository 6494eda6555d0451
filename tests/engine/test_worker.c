/* test_worker.c - one ferrum-worker process driven by the test acting as
 * its coordinator (a ROUTER socket and a control segment of its own):
 * registration and load, steps whose sampled tokens must equal the
 * in-process generator's, malformed step descriptors answered with an
 * error result (the worker keeps serving), items with proposed tokens
 * (speculative decoding) verified against the generator's greedy tokens,
 * and the worker's exit when its
 * coordinator goes silent. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/fr_util.h"
#include "kv/kv.h"
#include "model/generate.h"
#include "model/model.h"
#include "proto/proto.h"
#include "tests/engine/engine_fx.h"

typedef struct {
  void *ctx, *sock;
  char dir[128], addr[200], instance[32];
  uint8_t ident[256];
  size_t ident_len;
  pid_t pid;
  kv_ctl_t *kv;
  proto_msg_t in;
  proto_buf_t out;
} wfx_t;

static int wfx_recv(wfx_t *f, int timeout_ms) {
  zmq_pollitem_t pi = {.socket = f->sock, .events = ZMQ_POLLIN};
  if (zmq_poll(&pi, 1, timeout_ms) != 1) return -1;
  zmq_msg_t id, body;
  zmq_msg_init(&id), zmq_msg_init(&body);
  zmq_msg_recv(&id, f->sock, 0);
  zmq_msg_recv(&body, f->sock, 0);
  f->ident_len = zmq_msg_size(&id);
  memcpy(f->ident, zmq_msg_data(&id), f->ident_len);
  int rc = proto_msg_decode(&f->in, zmq_msg_data(&body), zmq_msg_size(&body), PROTO_ACCEPT_FROM_WORKER);
  zmq_msg_close(&id), zmq_msg_close(&body);
  return rc ? -1 : (int)f->in.type;
}

static void wfx_send(wfx_t *f, proto_type_t t, const void *body) {
  ck_assert_int_eq(proto_encode(&f->out, t, body), 0);
  zmq_send(f->sock, f->ident, f->ident_len, ZMQ_SNDMORE);
  zmq_send(f->sock, f->out.data, f->out.len, 0);
}

static void wfx_start(wfx_t *f, int hb_timeout_ms) {
  memset(f, 0, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/ferrum-wtest-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(f->dir));
  snprintf(f->addr, sizeof f->addr, "ipc://%s/w.sock", f->dir);
  snprintf(f->instance, sizeof f->instance, "wtest%d", (int)getpid());
  kv_config_t kc = {.instance = f->instance, .epoch = 1, .n_blocks = 64, .block_size = 16, .max_seqs = 8,
                    .max_blocks_per_seq = 16, .enable_prefix_cache = false};
  ck_assert_int_eq(kv_control_create(&f->kv, &kc), 0);
  f->ctx = zmq_ctx_new();
  f->sock = zmq_socket(f->ctx, ZMQ_ROUTER);
  int zero = 0;
  zmq_setsockopt(f->sock, ZMQ_LINGER, &zero, sizeof zero);
  ck_assert_int_eq(zmq_bind(f->sock, f->addr), 0);
  proto_msg_init(&f->in);
  proto_buf_init(&f->out);
  char ppid[16], hb[16];
  snprintf(ppid, sizeof ppid, "%d", (int)getpid());
  snprintf(hb, sizeof hb, "%d", hb_timeout_ms);
  f->pid = fork();
  if (f->pid == 0) {
    execl(efx_bin("ferrum-worker"), "ferrum-worker", "--connect", f->addr, "--instance", f->instance,
          "--coord-pid", ppid, "--hb-timeout-ms", hb, (char *)NULL);
    _exit(127);
  }
  ck_assert_int_eq(wfx_recv(f, 10000), PROTO_T_HELLO);
  ck_assert_int_eq(f->in.u.hello.rank, 0);
  ck_assert_int_eq(f->in.u.hello.pid, f->pid);
  proto_option_t opts[] = {{"device", "cpu"}, {"threads", "2"}, {"max_tokens", "64"}, {"max_seqs", "8"}};
  proto_load_t l = {.path = (char *)efx_model(), .format = "gguf", .tp_size = 1, .n_options = 4, .options = opts};
  wfx_send(f, PROTO_T_LOAD, &l);
  ck_assert_int_eq(wfx_recv(f, 60000), PROTO_T_LOADED);
  ck_assert_int_eq(f->in.u.loaded.error.code, 0);
  ck_assert_int_eq(f->in.u.loaded.kv_blocks, 64);
  ck_assert_int_eq(f->in.u.loaded.n_vocab, 49152);
}

static void wfx_stop(wfx_t *f) {
  if (f->pid > 0) {
    proto_shutdown_t sd = {.reason = "test done"};
    wfx_send(f, PROTO_T_SHUTDOWN, &sd);
    int st;
    for (int i = 0; i < 500 && waitpid(f->pid, &st, WNOHANG) == 0; i++) usleep(10000);
    if (waitpid(f->pid, &st, WNOHANG) == 0) kill(f->pid, SIGKILL), waitpid(f->pid, &st, 0);
  }
  kv_control_destroy(f->kv);
  kv_segment_unlink(f->instance, "kvpool0");
  kv_segment_unlink(f->instance, "logits0");
  zmq_close(f->sock);
  zmq_ctx_term(f->ctx);
  proto_msg_free(&f->in);
  proto_buf_free(&f->out);
  char sock[256];
  snprintf(sock, sizeof sock, "%s/w.sock", f->dir);
  unlink(sock);
  rmdir(f->dir);
}

/* Sends a step and returns the result (in f->in). */
static const proto_result_t *wfx_step(wfx_t *f, proto_step_t *st) {
  static uint64_t id;
  st->step_id = ++id;
  st->epoch = 7;
  wfx_send(f, PROTO_T_STEP, st);
  ck_assert_int_eq(wfx_recv(f, 60000), PROTO_T_RESULT);
  ck_assert_uint_eq(f->in.u.result.step_id, id);
  ck_assert_uint_eq(f->in.u.result.epoch, 7);
  return &f->in.u.result;
}

static const int32_t prompt_a[] = {504, 3458, 282, 4649, 314};        /* some token ids */
static const int32_t prompt_b[] = {1, 9690, 198, 2683, 253, 5356, 30}; /* others */

/* Greedy tokens the in-process generator gives after p. */
static void reference(const int32_t *p, int n, int n_out, int32_t *out) {
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  model_gen_t *g = NULL;
  model_load_opts_t lo = {0};
  ck_assert_int_eq(kern_cpu_create(&be, 2), 0);
  ck_assert_int_eq(model_load(&m, efx_model(), be, &lo), 0);
  ck_assert_int_eq(model_gen_create(&g, m, 256), 0);
  ck_assert_int_eq(model_gen_feed(g, p, n), 0);
  for (int k = 0; k < n_out; k++) {
    int32_t best = 0;
    for (int v = 1; v < m->cfg.vocab_size; v++)
      if (g->logits[v] > g->logits[best]) best = v;
    out[k] = best;
    ck_assert_int_eq(model_gen_feed(g, &best, 1), 0);
  }
  model_gen_destroy(g);
  model_destroy(m);
  kern_backend_destroy(be);
}

static proto_step_item_t item(int slot, int pos, const int32_t *tok, int n) {
  proto_step_item_t it = {.slot = (uint32_t)slot, .pos = (uint32_t)pos, .n_tokens = (uint32_t)n,
                          .tokens = (int32_t *)tok, .final = true, .has_sp = true,
                          .sp = proto_sampling_default()};
  it.sp.temperature = 0;
  it.prompt_len = (uint32_t)(pos + n);
  return it;
}

START_TEST(test_worker_steps_match_generator) {
  if (access(efx_model(), R_OK)) return;
  int32_t ref_a[3], ref_b[3];
  reference(prompt_a, 5, 3, ref_a);
  reference(prompt_b, 7, 3, ref_b);
  wfx_t f;
  wfx_start(&f, 30000);
  int sa, sb;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sa), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sb), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sa, 5, &cp), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sb, 7, &cp), 0);
  /* both prompts in one step, then two batched decodes */
  proto_step_item_t its[2] = {item(sa, 0, prompt_a, 5), item(sb, 0, prompt_b, 7)};
  proto_step_t st = {.n_items = 2, .items = its};
  int32_t ta = 0, tb = 0;
  for (int k = 0; k < 3; k++) {
    const proto_result_t *r = wfx_step(&f, &st);
    ck_assert_int_eq(r->error.code, 0);
    ck_assert_uint_eq(r->n_items, 2);
    ck_assert_int_eq(r->items[0].slot, sa);
    ck_assert_int_eq(r->items[0].token, ref_a[k]);
    ck_assert_int_eq(r->items[1].token, ref_b[k]);
    ta = r->items[0].token, tb = r->items[1].token;
    ck_assert_int_eq(kv_seq_append(f.kv, sa, 1, &cp), 0);
    ck_assert_int_eq(kv_seq_append(f.kv, sb, 1, &cp), 0);
    its[0] = item(sa, 5 + k, &ta, 1);
    its[1] = item(sb, 7 + k, &tb, 1);
  }
  wfx_stop(&f);
}
END_TEST

/* Speculative decoding: an item whose last tokens are proposals (ns)
 * returns the proposals the model agrees with (greedy: its own tokens,
 * from the in-process generator), then its own token at the first
 * disagreement, or after all of them the next one; a plain decode beside
 * it in the same step is unchanged. */
START_TEST(test_worker_verifies_proposals) {
  if (access(efx_model(), R_OK)) return;
  int32_t ra[7], rb[2];
  reference(prompt_a, 5, 7, ra);
  reference(prompt_b, 7, 2, rb);
  wfx_t f;
  wfx_start(&f, 30000);
  int sa, sb;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sa), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sb), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sa, 5, &cp), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sb, 7, &cp), 0);
  proto_step_item_t its[2] = {item(sa, 0, prompt_a, 5), item(sb, 0, prompt_b, 7)};
  its[0].sp.logprobs = 2;
  proto_step_t st = {.n_items = 2, .items = its};
  const proto_result_t *r = wfx_step(&f, &st);
  ck_assert_int_eq(r->items[0].token, ra[0]);
  /* ra[0] fed, proposals ra[1], ra[2], a wrong one, ra[4]: two accepted, then the model's ra[3] */
  int32_t va[5] = {ra[0], ra[1], ra[2], (ra[3] + 1) % 1000, ra[4]}, tb = rb[0];
  ck_assert_int_eq(kv_seq_append(f.kv, sa, 5, &cp), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sb, 1, &cp), 0);
  its[0] = item(sa, 5, va, 5), its[1] = item(sb, 7, &tb, 1);
  its[0].n_spec = 4, its[0].sp.logprobs = 2;
  r = wfx_step(&f, &st);
  ck_assert_int_eq(r->error.code, 0);
  ck_assert_uint_eq(r->n_items, 2);
  const proto_result_item_t *a = r->items[0].slot == (uint32_t)sa ? &r->items[0] : &r->items[1];
  const proto_result_item_t *b = a == &r->items[0] ? &r->items[1] : &r->items[0];
  ck_assert_int_eq(a->token, ra[1]);
  ck_assert_uint_eq(a->n_extra, 2);
  ck_assert_int_eq(a->extra[0], ra[2]);
  ck_assert_int_eq(a->extra[1], ra[3]);
  ck_assert_uint_eq(a->n_extra_lp, 2);
  ck_assert_uint_eq(a->n_top, 2);
  ck_assert_uint_eq(a->n_extra_top, 4);
  ck_assert_int_eq(a->extra_top[2].token, ra[3]); /* greedy: the token is its position's top logprob */
  ck_assert_float_eq_tol(a->extra_top[2].logprob, a->extra_lp[1], 1e-6);
  ck_assert_int_eq(b->token, rb[1]);
  ck_assert_uint_eq(b->n_extra, 0);
  /* the coordinator keeps 5 + 1 + 2 tokens; then every proposal right: all kept and one more */
  ck_assert_int_eq(kv_seq_truncate(f.kv, sa, 8), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sa, 3, &cp), 0);
  int32_t vb[3] = {ra[3], ra[4], ra[5]};
  its[0] = item(sa, 8, vb, 3);
  its[0].n_spec = 2;
  st.n_items = 1;
  r = wfx_step(&f, &st);
  ck_assert_int_eq(r->items[0].token, ra[4]);
  ck_assert_uint_eq(r->items[0].n_extra, 2);
  ck_assert_int_eq(r->items[0].extra[0], ra[5]);
  ck_assert_int_eq(r->items[0].extra[1], ra[6]);
  wfx_stop(&f);
}
END_TEST

START_TEST(test_worker_rejects_bad_steps) {
  if (access(efx_model(), R_OK)) return;
  wfx_t f;
  wfx_start(&f, 30000);
  int s;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &s), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, s, 5, &cp), 0);
  int32_t bad_tok[5] = {504, 3458, 1 << 30, 4649, 314};
  proto_step_item_t it;
  proto_step_t st = {.n_items = 1, .items = &it};
  /* items the worker refuses fail alone: the step stands, the item reports the error */
  proto_step_item_t bad[4] = {item(7, 0, prompt_a, 5) /* a free slot */, item(100, 0, prompt_a, 5) /* past
                                 max_seqs */, item(s, 3, prompt_a, 5) /* past the slot's length */,
                              item(s, 0, bad_tok, 5) /* a token outside the vocabulary */};
  for (int k = 0; k < 4; k++) {
    it = bad[k];
    const proto_result_t *r = wfx_step(&f, &st);
    ck_assert_int_eq(r->error.code, 0);
    ck_assert_uint_eq(r->n_items, 1);
    ck_assert_int_eq(r->items[0].error, PROTO_ERR_BAD_REQUEST);
    ck_assert_int_eq(r->items[0].token, -1);
  }
  proto_copy_t c = {.src = 1, .dst = 5000};
  proto_step_t cs = {.n_copies = 1, .copies = &c};
  ck_assert_int_ne(wfx_step(&f, &cs)->error.code, 0);
  uint32_t freed[1] = {9999};
  proto_step_t fs = {.n_freed = 1, .freed = freed};
  ck_assert_int_eq(wfx_step(&f, &fs)->error.code, 0); /* unknown freed slots are ignored */
  /* still serving: a good step and a heartbeat */
  it = item(s, 0, prompt_a, 5);
  const proto_result_t *r = wfx_step(&f, &st);
  ck_assert_int_eq(r->error.code, 0);
  ck_assert_uint_eq(r->n_items, 1);
  proto_heartbeat_t hb = {.seq = 42};
  wfx_send(&f, PROTO_T_HEARTBEAT, &hb);
  ck_assert_int_eq(wfx_recv(&f, 5000), PROTO_T_HEARTBEAT);
  ck_assert_uint_eq(f.in.u.heartbeat.seq, 42);
  wfx_stop(&f);
}
END_TEST

/* One refused item in a step: that item fails alone, the other one in the
 * same step gets the reference tokens. */
START_TEST(test_worker_bad_item_fails_alone) {
  if (access(efx_model(), R_OK)) return;
  int32_t ref_b[2];
  reference(prompt_b, 7, 2, ref_b);
  wfx_t f;
  wfx_start(&f, 30000);
  int sa, sb;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sa), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sb), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sa, 5, &cp), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sb, 7, &cp), 0);
  int32_t bad_tok[5] = {504, 3458, 49152, 4649, 314}; /* one past the embedding rows */
  proto_step_item_t its[2] = {item(sa, 0, bad_tok, 5), item(sb, 0, prompt_b, 7)};
  proto_step_t st = {.n_items = 2, .items = its};
  const proto_result_t *r = wfx_step(&f, &st);
  ck_assert_int_eq(r->error.code, 0);
  ck_assert_uint_eq(r->n_items, 2);
  for (uint32_t k = 0; k < 2; k++) {
    const proto_result_item_t *ri = &r->items[k];
    ck_assert_int_eq(ri->error, ri->slot == (uint32_t)sa ? PROTO_ERR_BAD_REQUEST : 0);
    if (ri->slot == (uint32_t)sb) ck_assert_int_eq(ri->token, ref_b[0]);
  }
  int32_t tb = ref_b[0];
  ck_assert_int_eq(kv_seq_append(f.kv, sb, 1, &cp), 0);
  its[0] = item(sb, 7, &tb, 1);
  st.n_items = 1;
  r = wfx_step(&f, &st);
  ck_assert_int_eq(r->error.code, 0);
  ck_assert_int_eq(r->items[0].token, ref_b[1]);
  wfx_stop(&f);
}
END_TEST

/* Allowed-token masks (constrained decoding) in one step with an
 * unmasked item: a mask allowing one token gets that token, a mask
 * allowing none fails its item alone (no token drawn outside it), and the
 * unmasked item gets the reference token. */
START_TEST(test_worker_masks) {
  if (access(efx_model(), R_OK)) return;
  int32_t ref_b[1];
  reference(prompt_b, 7, 1, ref_b);
  wfx_t f;
  wfx_start(&f, 30000);
  int sa, sb, sc;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sa), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sb), 0);
  ck_assert_int_eq(kv_seq_alloc_slot(f.kv, 0, &sc), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sa, 5, &cp), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sb, 7, &cp), 0);
  ck_assert_int_eq(kv_seq_append(f.kv, sc, 5, &cp), 0);
  enum { WORDS = 49152 / 32, ONE = 12345 };
  static uint32_t none[WORDS], one[WORDS];
  memset(none, 0, sizeof none), memset(one, 0, sizeof one);
  one[ONE / 32] = 1u << (ONE % 32);
  proto_step_item_t its[3] = {item(sa, 0, prompt_a, 5), item(sb, 0, prompt_b, 7), item(sc, 0, prompt_a, 5)};
  its[0].mask = none, its[0].n_mask = WORDS;
  its[2].mask = one, its[2].n_mask = WORDS;
  proto_step_t st = {.n_items = 3, .items = its};
  const proto_result_t *r = wfx_step(&f, &st);
  ck_assert_int_eq(r->error.code, 0);
  ck_assert_uint_eq(r->n_items, 3);
  for (uint32_t k = 0; k < 3; k++) {
    const proto_result_item_t *ri = &r->items[k];
    ck_assert_int_eq(ri->error, ri->slot == (uint32_t)sa ? PROTO_ERR_BAD_REQUEST : 0);
    if (ri->slot == (uint32_t)sa) ck_assert_int_eq(ri->token, -1);
    if (ri->slot == (uint32_t)sb) ck_assert_int_eq(ri->token, ref_b[0]);
    if (ri->slot == (uint32_t)sc) ck_assert_int_eq(ri->token, ONE);
  }
  wfx_stop(&f);
}
END_TEST

START_TEST(test_worker_exits_when_coordinator_silent) {
  if (access(efx_model(), R_OK)) return;
  wfx_t f;
  wfx_start(&f, 1000);
  uint64_t t0 = fr_now_ns();
  int st = 0;
  while (waitpid(f.pid, &st, WNOHANG) == 0) {
    ck_assert_msg(fr_now_ns() - t0 < 5000000000ull, "worker still running 5 s after the coordinator went silent");
    usleep(20000);
  }
  ck_assert(WIFEXITED(st));
  f.pid = 0;
  wfx_stop(&f);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static int worker_setup(int argc, char **argv) {
  if (access(efx_model(), R_OK) != 0) {
    fprintf(stderr, "skip: no model at %s\n", efx_model());
    return TEST_SKIP;
  }
  return 0;
}

static Suite *worker_suite(void) {
  Suite *s = suite_create("worker");
  TCase *t = tcase_create("worker");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, test_worker_steps_match_generator);
  tcase_add_test(t, test_worker_rejects_bad_steps);
  tcase_add_test(t, test_worker_verifies_proposals);
  tcase_add_test(t, test_worker_bad_item_fails_alone);
  tcase_add_test(t, test_worker_masks);
  tcase_add_test(t, test_worker_exits_when_coordinator_silent);
  suite_add_tcase(s, t);
  return s;
}

const test_prog_t test_prog = {.suites = {worker_suite}, .setup = worker_setup};
