/* test_proto_codec.c - the proto encoder and decoder against msgpack-c
 * (the outside reference): messages packed by msgpack-c with the keys of
 * docs/PROTOCOL.md decode to the expected structs; our bytes unpack with
 * msgpack-c to the expected keys and values and repack to the same bytes;
 * random messages of every type survive encode -> decode unchanged. */
#include <check.h>
#include <math.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "proto/proto.h"
#include "proto/proto_schema.h"
#include "proto_testutil.h"

/* ------------------------------------------------------- msgpack-c side */

typedef struct {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} mp_t;

static void mp_init(mp_t *m) {
  msgpack_sbuffer_init(&m->sb);
  msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}
static void mp_key(mp_t *m, const char *k) { msgpack_pack_str_with_body(&m->pk, k, strlen(k)); }
static void mp_str(mp_t *m, const char *k, const char *v) {
  mp_key(m, k);
  msgpack_pack_str_with_body(&m->pk, v, strlen(v));
}
static void mp_uint(mp_t *m, const char *k, uint64_t v) {
  mp_key(m, k);
  msgpack_pack_uint64(&m->pk, v);
}
static void mp_int(mp_t *m, const char *k, int64_t v) {
  mp_key(m, k);
  msgpack_pack_int64(&m->pk, v);
}
static void mp_f32(mp_t *m, const char *k, float v) {
  mp_key(m, k);
  msgpack_pack_float(&m->pk, v);
}
static void mp_f64(mp_t *m, const char *k, double v) {
  mp_key(m, k);
  msgpack_pack_double(&m->pk, v);
}
static void mp_bool(mp_t *m, const char *k, int v) {
  mp_key(m, k);
  if (v) msgpack_pack_true(&m->pk);
  else msgpack_pack_false(&m->pk);
}
/* Starts a message map of n body fields plus the envelope. */
static void mp_msg(mp_t *m, const char *type, uint32_t n) {
  msgpack_pack_map(&m->pk, n + 2);
  mp_uint(m, "v", PROTO_VERSION);
  mp_str(m, "t", type);
}

static proto_msg_t msg;

static void setup(void) {
  proto_msg_init(&msg);
  tu_seed(12345);
}
static void teardown(void) {
  proto_msg_free(&msg);
  tu_free_all();
}

static void decode_ok(mp_t *m, proto_type_t want) {
  int rc = proto_msg_decode(&msg, m->sb.data, m->sb.size, PROTO_ACCEPT_ANY);
  ck_assert_msg(rc == 0, "decode: %s", fr_last_error());
  ck_assert_int_eq(msg.type, want);
  msgpack_sbuffer_destroy(&m->sb);
}

/* ------------------------------------------------ reference decoding */

START_TEST(ref_step) {
  mp_t m;
  mp_init(&m);
  mp_msg(&m, "step", 5);
  mp_uint(&m, "id", 77);
  mp_uint(&m, "ep", 5000000000ull);
  mp_key(&m, "it");
  msgpack_pack_array(&m.pk, 2);
  msgpack_pack_map(&m.pk, 5);
  mp_uint(&m, "s", 3);
  mp_uint(&m, "p", 70000);
  mp_key(&m, "tk");
  msgpack_pack_array(&m.pk, 3);
  msgpack_pack_int32(&m.pk, 1);
  msgpack_pack_int32(&m.pk, 300);
  msgpack_pack_int32(&m.pk, 100000);
  mp_bool(&m, "f", 1);
  mp_key(&m, "sp");
  msgpack_pack_map(&m.pk, 10);
  mp_f32(&m, "t", 0.5f);
  mp_int(&m, "k", 40);
  mp_f64(&m, "p", 0.25); /* float64 is taken too */
  mp_f32(&m, "mp", 0.125f);
  mp_int(&m, "rp", 2); /* an int for a float too */
  mp_f32(&m, "pp", -1.5f);
  mp_f32(&m, "fp", 1.5f);
  mp_uint(&m, "sd", 0xfedcba9876543210ull);
  mp_int(&m, "lp", 5);
  mp_bool(&m, "wl", 1);
  msgpack_pack_map(&m.pk, 2); /* second item: defaults */
  mp_uint(&m, "s", 9);
  mp_key(&m, "tk");
  msgpack_pack_array(&m.pk, 1);
  msgpack_pack_int32(&m.pk, -5);
  mp_key(&m, "fr");
  msgpack_pack_array(&m.pk, 2);
  msgpack_pack_uint32(&m.pk, 11);
  msgpack_pack_uint32(&m.pk, 4000000000u);
  mp_key(&m, "cp");
  msgpack_pack_array(&m.pk, 1);
  msgpack_pack_map(&m.pk, 2);
  mp_uint(&m, "s", 100);
  mp_uint(&m, "d", 200);
  decode_ok(&m, PROTO_T_STEP);

  const proto_step_t *s = &msg.u.step;
  ck_assert_uint_eq(s->step_id, 77);
  ck_assert_uint_eq(s->epoch, 5000000000ull);
  ck_assert_uint_eq(s->n_items, 2);
  const proto_step_item_t *a = &s->items[0], *b = &s->items[1];
  ck_assert_uint_eq(a->slot, 3);
  ck_assert_uint_eq(a->pos, 70000);
  ck_assert_uint_eq(a->n_tokens, 3);
  ck_assert_int_eq(a->tokens[0], 1);
  ck_assert_int_eq(a->tokens[1], 300);
  ck_assert_int_eq(a->tokens[2], 100000);
  ck_assert(a->final);
  ck_assert_float_eq(a->sp.temperature, 0.5f);
  ck_assert_int_eq(a->sp.top_k, 40);
  ck_assert_float_eq(a->sp.top_p, 0.25f);
  ck_assert_float_eq(a->sp.min_p, 0.125f);
  ck_assert_float_eq(a->sp.repetition_penalty, 2.0f);
  ck_assert_float_eq(a->sp.presence_penalty, -1.5f);
  ck_assert_float_eq(a->sp.frequency_penalty, 1.5f);
  ck_assert(a->sp.has_seed);
  ck_assert_uint_eq(a->sp.seed, 0xfedcba9876543210ull);
  ck_assert_int_eq(a->sp.logprobs, 5);
  ck_assert(a->sp.want_logits);
  /* defaults of everything left out */
  ck_assert_uint_eq(b->slot, 9);
  ck_assert_uint_eq(b->pos, 0);
  ck_assert_int_eq(b->tokens[0], -5);
  ck_assert(b->final); /* default: the item is sampled */
  ck_assert(!b->has_sp);
  ck_assert_float_eq(b->sp.temperature, 1.0f);
  ck_assert_int_eq(b->sp.top_k, 0);
  ck_assert_float_eq(b->sp.top_p, 1.0f);
  ck_assert_float_eq(b->sp.repetition_penalty, 1.0f);
  ck_assert(!b->sp.has_seed);
  ck_assert_int_eq(b->sp.logprobs, -1);
  ck_assert(!b->sp.want_logits);
  ck_assert_uint_eq(s->n_freed, 2);
  ck_assert_uint_eq(s->freed[1], 4000000000u);
  ck_assert_uint_eq(s->n_copies, 1);
  ck_assert_uint_eq(s->copies[0].src, 100);
  ck_assert_uint_eq(s->copies[0].dst, 200);
}
END_TEST

START_TEST(ref_result) {
  mp_t m;
  mp_init(&m);
  mp_msg(&m, "result", 6);
  mp_uint(&m, "id", 8);
  mp_uint(&m, "ep", 2);
  mp_int(&m, "r", 1);
  mp_key(&m, "it");
  msgpack_pack_array(&m.pk, 1);
  msgpack_pack_map(&m.pk, 5);
  mp_uint(&m, "s", 4);
  mp_int(&m, "tok", 1234);
  mp_f32(&m, "lp", -0.75f);
  mp_key(&m, "top");
  msgpack_pack_array(&m.pk, 2);
  msgpack_pack_map(&m.pk, 2);
  mp_int(&m, "t", 1234);
  mp_f32(&m, "l", -0.75f);
  msgpack_pack_map(&m.pk, 2);
  mp_int(&m, "t", 99);
  mp_f32(&m, "l", -2.5f);
  mp_key(&m, "lh");
  msgpack_pack_map(&m.pk, 3);
  mp_uint(&m, "g", 1);
  mp_uint(&m, "s", 4);
  mp_uint(&m, "r", 17);
  mp_key(&m, "tm");
  msgpack_pack_map(&m.pk, 3);
  mp_uint(&m, "fw", 100);
  mp_uint(&m, "sa", 20);
  mp_uint(&m, "to", 130);
  mp_key(&m, "err");
  msgpack_pack_map(&m.pk, 2);
  mp_int(&m, "c", 500);
  mp_str(&m, "m", "oops");
  decode_ok(&m, PROTO_T_RESULT);
  const proto_result_t *r = &msg.u.result;
  ck_assert_uint_eq(r->step_id, 8);
  ck_assert_uint_eq(r->epoch, 2);
  ck_assert_int_eq(r->rank, 1);
  ck_assert_uint_eq(r->n_items, 1);
  const proto_result_item_t *it = &r->items[0];
  ck_assert_uint_eq(it->slot, 4);
  ck_assert_int_eq(it->token, 1234);
  ck_assert_float_eq(it->logprob, -0.75f);
  ck_assert_uint_eq(it->n_top, 2);
  ck_assert_int_eq(it->top[1].token, 99);
  ck_assert_float_eq(it->top[1].logprob, -2.5f);
  ck_assert(it->has_logits);
  ck_assert_uint_eq(it->logits.segment, 1);
  ck_assert_uint_eq(it->logits.slot, 4);
  ck_assert_uint_eq(it->logits.row, 17);
  ck_assert_uint_eq(r->timings.forward_us, 100);
  ck_assert_uint_eq(r->timings.sample_us, 20);
  ck_assert_uint_eq(r->timings.total_us, 130);
  ck_assert_int_eq(r->error.code, 500);
  ck_assert_str_eq(r->error.message, "oops");
}
END_TEST

START_TEST(ref_worker_small) {
  mp_t m;
  mp_init(&m);
  mp_msg(&m, "hello", 7);
  mp_int(&m, "r", 1);
  mp_int(&m, "w", 2);
  mp_str(&m, "dev", "cuda:1");
  mp_uint(&m, "kvb", 5000);
  mp_uint(&m, "bs", 16);
  mp_uint(&m, "mb", 256);
  mp_uint(&m, "pid", 4242);
  decode_ok(&m, PROTO_T_HELLO);
  const proto_hello_t *h = &msg.u.hello;
  ck_assert_int_eq(h->rank, 1);
  ck_assert_int_eq(h->world_size, 2);
  ck_assert_str_eq(h->device, "cuda:1");
  ck_assert_uint_eq(h->kv_blocks, 5000);
  ck_assert_uint_eq(h->block_size, 16);
  ck_assert_uint_eq(h->max_batch, 256);
  ck_assert_uint_eq(h->pid, 4242);

  mp_init(&m);
  mp_msg(&m, "load", 5);
  mp_str(&m, "path", "/m/x.gguf");
  mp_str(&m, "fmt", "gguf");
  mp_str(&m, "dt", "bf16");
  mp_uint(&m, "tp", 2);
  mp_key(&m, "opt");
  msgpack_pack_array(&m.pk, 1);
  msgpack_pack_map(&m.pk, 2);
  mp_str(&m, "k", "max_ctx");
  mp_str(&m, "v", "4096");
  decode_ok(&m, PROTO_T_LOAD);
  const proto_load_t *l = &msg.u.load;
  ck_assert_str_eq(l->path, "/m/x.gguf");
  ck_assert_str_eq(l->format, "gguf");
  ck_assert_str_eq(l->dtype, "bf16");
  ck_assert_uint_eq(l->tp_size, 2);
  ck_assert_uint_eq(l->n_options, 1);
  ck_assert_str_eq(l->options[0].key, "max_ctx");
  ck_assert_str_eq(l->options[0].value, "4096");

  mp_init(&m);
  mp_msg(&m, "loaded", 5);
  mp_int(&m, "r", 0);
  mp_uint(&m, "kvb", 900);
  mp_uint(&m, "nv", 49152);
  mp_uint(&m, "ctx", 8192);
  mp_key(&m, "err");
  msgpack_pack_map(&m.pk, 1);
  mp_int(&m, "c", 503);
  decode_ok(&m, PROTO_T_LOADED);
  ck_assert_uint_eq(msg.u.loaded.kv_blocks, 900);
  ck_assert_uint_eq(msg.u.loaded.n_vocab, 49152);
  ck_assert_uint_eq(msg.u.loaded.max_ctx, 8192);
  ck_assert_int_eq(msg.u.loaded.error.code, 503);
  ck_assert_ptr_null(msg.u.loaded.error.message);

  /* a load that asks the worker to size its KV pool, then the pool messages */
  mp_init(&m);
  mp_msg(&m, "load", 5);
  mp_str(&m, "path", "/m/x.gguf");
  mp_str(&m, "fmt", "gguf");
  mp_f64(&m, "kvu", 0.5);
  mp_uint(&m, "bs", 32);
  mp_uint(&m, "kvn", 256);
  decode_ok(&m, PROTO_T_LOAD);
  ck_assert(proto_load_sizes_kv(&msg.u.load));
  ck_assert_float_eq(msg.u.load.kv_util, 0.5f);
  ck_assert_uint_eq(msg.u.load.kv_bytes, 0);
  ck_assert_uint_eq(msg.u.load.kv_blocks, 0);
  ck_assert_uint_eq(msg.u.load.block_size, 32);
  ck_assert_uint_eq(msg.u.load.kv_min_blocks, 256);

  mp_init(&m);
  mp_msg(&m, "load", 4);
  mp_str(&m, "path", "/m/x.gguf");
  mp_str(&m, "fmt", "gguf");
  mp_uint(&m, "kvm", 5ull << 32);
  mp_uint(&m, "bs", 16);
  decode_ok(&m, PROTO_T_LOAD);
  ck_assert_uint_eq(msg.u.load.kv_bytes, 5ull << 32);
  ck_assert_uint_eq(msg.u.load.kv_min_blocks, 1); /* default */

  mp_init(&m);
  mp_msg(&m, "loaded", 3);
  mp_int(&m, "r", 1);
  mp_uint(&m, "kvb", 70000);
  mp_uint(&m, "bpb", 368640);
  decode_ok(&m, PROTO_T_LOADED);
  ck_assert_uint_eq(msg.u.loaded.kv_blocks, 70000);
  ck_assert_uint_eq(msg.u.loaded.block_bytes, 368640);

  mp_init(&m);
  mp_msg(&m, "kv_init", 1);
  mp_uint(&m, "kvb", 1234);
  decode_ok(&m, PROTO_T_KV_INIT);
  ck_assert_uint_eq(msg.u.kv_init.kv_blocks, 1234);

  mp_init(&m);
  mp_msg(&m, "kv_ready", 3);
  mp_int(&m, "r", 2);
  mp_uint(&m, "kvb", 1234);
  mp_key(&m, "err");
  msgpack_pack_map(&m.pk, 2);
  mp_int(&m, "c", 429);
  mp_str(&m, "m", "out of device memory");
  decode_ok(&m, PROTO_T_KV_READY);
  ck_assert_int_eq(msg.u.kv_ready.rank, 2);
  ck_assert_uint_eq(msg.u.kv_ready.kv_blocks, 1234);
  ck_assert_int_eq(msg.u.kv_ready.error.code, 429);
  ck_assert_str_eq(msg.u.kv_ready.error.message, "out of device memory");

  mp_init(&m);
  mp_msg(&m, "hb", 3);
  mp_int(&m, "r", 3);
  mp_uint(&m, "seq", 9);
  mp_uint(&m, "ts", 123456789012ull);
  decode_ok(&m, PROTO_T_HEARTBEAT);
  ck_assert_int_eq(msg.u.heartbeat.rank, 3);
  ck_assert_uint_eq(msg.u.heartbeat.seq, 9);
  ck_assert_uint_eq(msg.u.heartbeat.ts_ns, 123456789012ull);

  mp_init(&m);
  mp_msg(&m, "shutdown", 2);
  mp_str(&m, "why", "bye");
  mp_bool(&m, "dr", 1);
  decode_ok(&m, PROTO_T_SHUTDOWN);
  ck_assert_str_eq(msg.u.shutdown.reason, "bye");
  ck_assert(msg.u.shutdown.drain);

  mp_init(&m);
  mp_msg(&m, "hb", 0);
  decode_ok(&m, PROTO_T_HEARTBEAT);
  ck_assert_int_eq(msg.u.heartbeat.rank, -1); /* default */
}
END_TEST

START_TEST(ref_submit) {
  mp_t m;
  mp_init(&m);
  mp_msg(&m, "submit", 9);
  mp_uint(&m, "id", 31);
  mp_str(&m, "m", "smol");
  mp_key(&m, "msgs");
  msgpack_pack_array(&m.pk, 2);
  msgpack_pack_map(&m.pk, 2);
  mp_str(&m, "r", "system");
  mp_str(&m, "c", "be brief");
  msgpack_pack_map(&m.pk, 2);
  mp_str(&m, "r", "user");
  mp_key(&m, "c");
  msgpack_pack_str_with_body(&m.pk, "a\0b", 3); /* content may hold NULs */
  mp_key(&m, "sp");
  msgpack_pack_map(&m.pk, 3);
  mp_f32(&m, "t", 0.0f);
  mp_key(&m, "lb");
  msgpack_pack_array(&m.pk, 2);
  msgpack_pack_map(&m.pk, 2);
  mp_int(&m, "t", 5);
  mp_f32(&m, "b", -100.0f);
  msgpack_pack_map(&m.pk, 2);
  mp_int(&m, "t", 9);
  mp_f64(&m, "b", 2.5);
  mp_uint(&m, "mn", 3);
  mp_uint(&m, "mt", 64);
  mp_key(&m, "stop");
  msgpack_pack_map(&m.pk, 4);
  mp_key(&m, "s");
  msgpack_pack_array(&m.pk, 2);
  msgpack_pack_str_with_body(&m.pk, "\n\n", 2);
  msgpack_pack_str_with_body(&m.pk, "END", 3);
  mp_key(&m, "i");
  msgpack_pack_array(&m.pk, 1);
  msgpack_pack_int32(&m.pk, 2);
  mp_bool(&m, "ie", 1);
  mp_bool(&m, "inc", 1);
  mp_bool(&m, "str", 1);
  mp_bool(&m, "rl", 1);
  mp_int(&m, "pr", -3);
  decode_ok(&m, PROTO_T_SUBMIT);
  const proto_submit_t *s = &msg.u.submit;
  ck_assert_uint_eq(s->id, 31);
  ck_assert_str_eq(s->model, "smol");
  ck_assert_ptr_null(s->prompt);
  ck_assert_uint_eq(s->n_tokens, 0);
  ck_assert_uint_eq(s->n_messages, 2);
  ck_assert_str_eq(s->messages[0].role, "system");
  ck_assert_str_eq(s->messages[0].content, "be brief");
  ck_assert_uint_eq(s->messages[1].content_len, 3);
  ck_assert(memcmp(s->messages[1].content, "a\0b", 3) == 0);
  ck_assert_float_eq(s->sp.temperature, 0.0f);
  ck_assert_float_eq(s->sp.top_p, 1.0f);
  ck_assert_uint_eq(s->max_tokens, 64);
  ck_assert_uint_eq(s->sp.n_bias, 2);
  ck_assert_int_eq(s->sp.bias[0].token, 5);
  ck_assert_float_eq(s->sp.bias[0].bias, -100.0f);
  ck_assert_int_eq(s->sp.bias[1].token, 9);
  ck_assert_float_eq(s->sp.bias[1].bias, 2.5f);
  ck_assert_uint_eq(s->sp.min_tokens, 3);
  ck_assert_uint_eq(s->stop.n_strs, 2);
  ck_assert_str_eq(s->stop.strs[0], "\n\n");
  ck_assert_str_eq(s->stop.strs[1], "END");
  ck_assert_uint_eq(s->stop.n_ids, 1);
  ck_assert_int_eq(s->stop.ids[0], 2);
  ck_assert(s->stop.ignore_eos && s->stop.include && s->stream && s->return_logits);
  ck_assert_int_eq(s->priority, -3);

  mp_init(&m);
  mp_msg(&m, "submit", 2);
  mp_uint(&m, "id", 1);
  mp_key(&m, "tk");
  msgpack_pack_array(&m.pk, 2);
  msgpack_pack_int32(&m.pk, 5);
  msgpack_pack_int32(&m.pk, 6);
  decode_ok(&m, PROTO_T_SUBMIT);
  ck_assert_uint_eq(msg.u.submit.n_tokens, 2);
  ck_assert_int_eq(msg.u.submit.tokens[1], 6);
  ck_assert(!msg.u.submit.stream);
  ck_assert_uint_eq(msg.u.submit.max_tokens, 0);
  ck_assert_ptr_null(msg.u.submit.guide.after);

  mp_init(&m); /* v5: a guide that starts after a text */
  mp_msg(&m, "submit", 3);
  mp_uint(&m, "id", 2);
  mp_str(&m, "p", "x");
  mp_key(&m, "gd");
  msgpack_pack_map(&m.pk, 3);
  mp_str(&m, "k", "regex");
  mp_str(&m, "s", "[a-z]+");
  mp_str(&m, "a", "</think>");
  decode_ok(&m, PROTO_T_SUBMIT);
  ck_assert_int_eq(msg.u.submit.guide.kind, PROTO_GUIDE_REGEX);
  ck_assert_uint_eq(msg.u.submit.guide.spec_len, 6);
  ck_assert_uint_eq(msg.u.submit.guide.after_len, 8);
  ck_assert(!memcmp(msg.u.submit.guide.after, "</think>", 8));
}
END_TEST

START_TEST(ref_event) {
  float logits[3] = {1.5f, -2.0f, 1e30f};
  uint8_t le[12];
  for (int i = 0; i < 3; i++) {
    uint32_t bits;
    memcpy(&bits, &logits[i], 4);
    for (int j = 0; j < 4; j++) le[4 * i + j] = (uint8_t)(bits >> (8 * j));
  }
  mp_t m;
  mp_init(&m);
  mp_msg(&m, "event", 9);
  mp_uint(&m, "id", 12);
  mp_str(&m, "tx", "Hi!");
  mp_key(&m, "tk");
  msgpack_pack_array(&m.pk, 1);
  msgpack_pack_int32(&m.pk, 9000);
  mp_key(&m, "lp");
  msgpack_pack_array(&m.pk, 1);
  msgpack_pack_float(&m.pk, -0.5f);
  mp_uint(&m, "k", 1);
  mp_key(&m, "top");
  msgpack_pack_array(&m.pk, 1);
  msgpack_pack_map(&m.pk, 2);
  mp_int(&m, "t", 9000);
  mp_f32(&m, "l", -0.5f);
  mp_str(&m, "fin", "length");
  mp_key(&m, "u");
  msgpack_pack_map(&m.pk, 3);
  mp_uint(&m, "p", 10);
  mp_uint(&m, "c", 1);
  mp_uint(&m, "k", 8);
  mp_key(&m, "lg");
  msgpack_pack_bin_with_body(&m.pk, le, sizeof le);
  decode_ok(&m, PROTO_T_EVENT);
  const proto_event_t *e = &msg.u.event;
  ck_assert_uint_eq(e->id, 12);
  ck_assert_uint_eq(e->text_len, 3);
  ck_assert_str_eq(e->text, "Hi!");
  ck_assert_int_eq(e->tokens[0], 9000);
  ck_assert_float_eq(e->logprobs[0], -0.5f);
  ck_assert_uint_eq(e->top_n, 1);
  ck_assert_int_eq(e->top[0].token, 9000);
  ck_assert_int_eq(e->finish, PROTO_FINISH_LENGTH);
  ck_assert(e->has_usage);
  ck_assert_uint_eq(e->usage.prompt_tokens, 10);
  ck_assert_uint_eq(e->usage.completion_tokens, 1);
  ck_assert_uint_eq(e->usage.cached_tokens, 8);
  ck_assert_uint_eq(e->n_logits, 3);
  ck_assert(memcmp(e->logits, logits, sizeof logits) == 0);
  ck_assert_int_eq(e->error.code, 0);
}
END_TEST

START_TEST(ref_rpc_small) {
  mp_t m;
  mp_init(&m);
  mp_msg(&m, "cancel", 1);
  mp_uint(&m, "id", 99);
  decode_ok(&m, PROTO_T_CANCEL);
  ck_assert_uint_eq(msg.u.cancel.id, 99);

  mp_init(&m);
  mp_msg(&m, "status", 2);
  mp_uint(&m, "rid", 5);
  mp_str(&m, "m", "smol");
  decode_ok(&m, PROTO_T_STATUS);
  ck_assert_uint_eq(msg.u.status.rid, 5);
  ck_assert_str_eq(msg.u.status.model, "smol");

  mp_init(&m);
  mp_msg(&m, "status_r", 7);
  mp_uint(&m, "rid", 5);
  mp_str(&m, "m", "smol");
  mp_uint(&m, "q", 3);
  mp_uint(&m, "run", 4);
  mp_uint(&m, "kvu", 100);
  mp_uint(&m, "kvt", 1000);
  mp_uint(&m, "nw", 2);
  decode_ok(&m, PROTO_T_STATUS_R);
  const proto_status_reply_t *st = &msg.u.status_r;
  ck_assert_uint_eq(st->rid, 5);
  ck_assert_str_eq(st->model, "smol");
  ck_assert_uint_eq(st->queued, 3);
  ck_assert_uint_eq(st->running, 4);
  ck_assert_uint_eq(st->kv_used_blocks, 100);
  ck_assert_uint_eq(st->kv_total_blocks, 1000);
  ck_assert_uint_eq(st->n_workers, 2);

  mp_init(&m);
  mp_msg(&m, "models", 0);
  decode_ok(&m, PROTO_T_MODELS);

  mp_init(&m);
  mp_msg(&m, "models_r", 2);
  mp_uint(&m, "rid", 6);
  mp_key(&m, "ms");
  msgpack_pack_array(&m.pk, 2);
  msgpack_pack_map(&m.pk, 2);
  mp_str(&m, "n", "a");
  mp_uint(&m, "ctx", 2048);
  msgpack_pack_map(&m.pk, 1);
  mp_str(&m, "n", "b");
  decode_ok(&m, PROTO_T_MODELS_R);
  ck_assert_uint_eq(msg.u.models_r.n_models, 2);
  ck_assert_str_eq(msg.u.models_r.models[0].name, "a");
  ck_assert_uint_eq(msg.u.models_r.models[0].max_ctx, 2048);
  ck_assert_str_eq(msg.u.models_r.models[1].name, "b");

  mp_init(&m);
  mp_msg(&m, "error", 4);
  mp_int(&m, "c", 429);
  mp_str(&m, "m", "busy");
  mp_uint(&m, "id", 3);
  mp_uint(&m, "rid", 4);
  decode_ok(&m, PROTO_T_ERROR);
  ck_assert_int_eq(msg.u.error.code, 429);
  ck_assert_str_eq(msg.u.error.message, "busy");
  ck_assert_uint_eq(msg.u.error.id, 3);
  ck_assert_uint_eq(msg.u.error.rid, 4);
}
END_TEST

/* ------------------------------------------------ reference encoding */

static const msgpack_object *map_get(const msgpack_object *map, const char *key) {
  ck_assert_int_eq(map->type, MSGPACK_OBJECT_MAP);
  const msgpack_object *found = NULL;
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    ck_assert_int_eq(kv->key.type, MSGPACK_OBJECT_STR);
    if (kv->key.via.str.size == strlen(key) && !memcmp(kv->key.via.str.ptr, key, strlen(key))) {
      ck_assert_msg(!found, "key %s twice", key);
      found = &kv->val;
    }
  }
  return found;
}

static void unpack(const proto_buf_t *b, msgpack_unpacked *up) {
  size_t off = 0;
  msgpack_unpacked_init(up);
  ck_assert_int_eq(msgpack_unpack_next(up, (const char *)b->data, b->len, &off), MSGPACK_UNPACK_SUCCESS);
  ck_assert_uint_eq(off, b->len);
}

START_TEST(enc_step_keys) {
  int32_t toks[2] = {-7, 50000};
  uint32_t freed[1] = {12};
  proto_step_item_t items[2] = {{.slot = 1, .pos = 33, .n_tokens = 2, .tokens = toks, .final = true},
                                {.slot = 2, .n_tokens = 1, .tokens = toks}};
  items[0].sp = proto_sampling_default();
  items[1].sp = proto_sampling_default();
  items[0].has_sp = true;
  items[0].sp.temperature = 0.7f;
  items[0].sp.has_seed = true;
  items[0].sp.seed = 1ull << 40;
  proto_step_t s = {.step_id = 5, .epoch = 1, .n_items = 2, .items = items, .n_freed = 1, .freed = freed};
  proto_buf_t b;
  proto_buf_init(&b);
  ck_assert_int_eq(proto_step_encode(&b, &s), 0);
  msgpack_unpacked up;
  unpack(&b, &up);
  const msgpack_object *root = &up.data;
  ck_assert_uint_eq(root->via.map.size, 2 + 4); /* v t id ep it fr: no "cp" */
  ck_assert_uint_eq(map_get(root, "v")->via.u64, proto_type_version(PROTO_T_STEP));
  ck_assert(!memcmp(map_get(root, "t")->via.str.ptr, "step", 4));
  ck_assert_uint_eq(map_get(root, "id")->via.u64, 5);
  ck_assert_ptr_null(map_get(root, "cp"));
  const msgpack_object *it = map_get(root, "it");
  ck_assert_uint_eq(it->via.array.size, 2);
  const msgpack_object *i0 = &it->via.array.ptr[0], *i1 = &it->via.array.ptr[1];
  ck_assert_uint_eq(map_get(i0, "p")->via.u64, 33);
  ck_assert_int_eq(map_get(i0, "tk")->via.array.ptr[0].via.i64, -7);
  ck_assert_uint_eq(map_get(i0, "tk")->via.array.ptr[1].via.u64, 50000);
  ck_assert_ptr_null(map_get(i0, "f")); /* final is the default */
  const msgpack_object *sp = map_get(i0, "sp");
  ck_assert_uint_eq(sp->via.map.size, 2); /* only what differs from the defaults */
  ck_assert_int_eq(map_get(sp, "t")->type, MSGPACK_OBJECT_FLOAT32);
  ck_assert_float_eq((float)map_get(sp, "t")->via.f64, 0.7f);
  ck_assert_uint_eq(map_get(sp, "sd")->via.u64, 1ull << 40);
  ck_assert_uint_eq(i1->via.map.size, 3); /* s, tk, f (false): no "sp" without has_sp */
  ck_assert(!map_get(i1, "f")->via.boolean);
  ck_assert_ptr_null(map_get(i1, "sp"));
  ck_assert_uint_eq(map_get(root, "fr")->via.array.ptr[0].via.u64, 12);
  msgpack_unpacked_destroy(&up);
  proto_buf_free(&b);
}
END_TEST

START_TEST(enc_event_keys) {
  float lg[2] = {0.25f, -3.0f};
  int32_t tk[1] = {77};
  proto_event_t e;
  proto_body_default(PROTO_T_EVENT, &e);
  e.id = 4;
  e.text = "ok";
  e.n_tokens = 1;
  e.tokens = tk;
  e.finish = PROTO_FINISH_STOP;
  e.has_usage = true; /* all zero, but present */
  e.n_logits = 2;
  e.logits = lg;
  proto_buf_t b;
  proto_buf_init(&b);
  ck_assert_int_eq(proto_event_encode(&b, &e), 0);
  msgpack_unpacked up;
  unpack(&b, &up);
  const msgpack_object *root = &up.data;
  ck_assert_uint_eq(root->via.map.size, 2 + 6);
  ck_assert(!memcmp(map_get(root, "tx")->via.str.ptr, "ok", 2));
  ck_assert(!memcmp(map_get(root, "fin")->via.str.ptr, "stop", 4));
  ck_assert_uint_eq(map_get(root, "u")->via.map.size, 0);
  const msgpack_object *bin = map_get(root, "lg");
  ck_assert_int_eq(bin->type, MSGPACK_OBJECT_BIN);
  ck_assert_uint_eq(bin->via.bin.size, 8);
  ck_assert_uint_eq((uint8_t)bin->via.bin.ptr[3], 0x3e); /* 0.25f = 0x3e800000, little-endian */
  ck_assert_uint_eq((uint8_t)bin->via.bin.ptr[2], 0x80);
  msgpack_unpacked_destroy(&up);
  proto_buf_free(&b);
}
END_TEST

/* ------------------------------------------------------- round trips */

/* Every message type, random contents, encode -> decode -> compare; the
 * bytes are also checked with msgpack-c: one object, repacked identically. */
START_TEST(round_trip_all) {
  proto_buf_t b, b2;
  proto_buf_init(&b);
  proto_buf_init(&b2);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  int rounds = 0;
  for (int t = 1; t < PROTO_T_COUNT; t++) {
    for (int i = 0; i < 150; i++) {
      _Alignas(16) uint8_t body[sizeof msg.u];
      tu_rand_body((proto_type_t)t, body, i % 3 == 0);
      int rc = proto_encode(&b, (proto_type_t)t, body);
      ck_assert_msg(rc == 0, "%s: encode: %s", proto_type_name(t), fr_last_error());
      rc = proto_msg_decode(&msg, b.data, b.len, PROTO_MASK(t));
      ck_assert_msg(rc == 0, "%s: decode: %s", proto_type_name(t), fr_last_error());
      char why[256];
      ck_assert_msg(tu_compare((proto_type_t)t, body, &msg.u, why, sizeof why) == 0, "%s round %d: %s",
                    proto_type_name(t), i, why);
      /* re-encoding the decoded message gives the same bytes */
      ck_assert_int_eq(proto_msg_encode(&b2, &msg), 0);
      ck_assert(b2.len == b.len && !memcmp(b.data, b2.data, b.len));
      /* msgpack-c reads one object and packs it back to the same bytes */
      msgpack_unpacked up;
      unpack(&b, &up);
      msgpack_sbuffer_init(&sb);
      msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
      msgpack_pack_object(&pk, up.data);
      ck_assert_msg(sb.size == b.len && !memcmp(sb.data, b.data, b.len), "%s: not canonical msgpack",
                    proto_type_name(t));
      msgpack_sbuffer_destroy(&sb);
      msgpack_unpacked_destroy(&up);
      tu_free_all();
      rounds++;
    }
  }
  ck_assert_int_eq(rounds, 150 * (PROTO_T_COUNT - 1));
  proto_buf_free(&b);
  proto_buf_free(&b2);
}
END_TEST

/* The tables: keys short, unique, packed right; fields inside the struct
 * and not overlapping. */
static void check_schema(const proto_schema_t *s, int depth) {
  ck_assert(depth < 4);
  uint8_t used[512] = {0};
  ck_assert_uint_le(s->size, sizeof used);
  for (uint32_t i = 0; i < s->n_fields; i++) {
    const proto_field_t *f = &s->fields[i];
    ck_assert_uint_le(strlen(f->key), 7);
    ck_assert_uint_eq(strlen(f->key), f->klen);
    uint64_t k = (uint64_t)f->klen << 56;
    for (int j = 0; j < f->klen; j++) k |= (uint64_t)(uint8_t)f->key[j] << (8 * j);
    ck_assert_uint_eq(k, f->kpack);
    for (uint32_t j = 0; j < i; j++) ck_assert_str_ne(f->key, s->fields[j].key);
    size_t size;
    switch (f->type) {
    case PF_U64: size = 8; break;
    case PF_BOOL: size = sizeof(bool); break;
    case PF_OBJ: size = f->sub->size; break;
    case PF_U32: case PF_I32: case PF_F32: case PF_ENUM: size = 4; break;
    default: size = sizeof(void *); break;
    }
    ck_assert_uint_le(f->off + size, s->size);
    for (size_t b = f->off; b < f->off + size; b++) {
      ck_assert_msg(!used[b], "%s.%s overlaps", s->name, f->key);
      used[b] = 1;
    }
    int has_n = f->type >= PF_TEXT && f->type != PF_OBJ;
    if (has_n || (f->flags & PF_HAS)) {
      size_t nsize = (f->flags & PF_HAS) ? sizeof(bool) : 4;
      ck_assert_uint_le(f->off_n + nsize, s->size);
      for (size_t b = f->off_n; b < f->off_n + nsize; b++) {
        ck_assert_msg(!used[b], "%s.%s count overlaps", s->name, f->key);
        used[b] = 1;
      }
    }
    if (f->type == PF_OBJ || f->type == PF_OBJS) check_schema(f->sub, depth + 1);
  }
}

START_TEST(schema_tables) {
  for (int t = 1; t < PROTO_T_COUNT; t++) {
    const proto_schema_t *s = proto__schema((proto_type_t)t);
    ck_assert_ptr_nonnull(s);
    for (uint32_t i = 0; i < s->n_fields; i++) { /* envelope keys stay free */
      ck_assert_str_ne(s->fields[i].key, "v");
      ck_assert_str_ne(s->fields[i].key, "t");
    }
    check_schema(s, 0);
    ck_assert_int_eq(proto_type_from_name(proto_type_name(t), strlen(proto_type_name(t))), t);
  }
  ck_assert_int_eq(proto_type_from_name("nope", 4), PROTO_T_NONE);
}
END_TEST

/* The encoder refuses what the decoder would refuse. */
START_TEST(encode_refuses) {
  proto_buf_t b;
  proto_buf_init(&b);
  proto_hello_t h = {.rank = 0, .world_size = 1, .device = NULL, .block_size = 16, .max_batch = 1};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_HELLO, &h), FR_EPROTO); /* required string NULL */
  ck_assert_uint_eq(b.len, 0);
  h.device = "cpu";
  ck_assert_int_eq(proto_encode(&b, PROTO_T_HELLO, &h), 0);
  h.rank = 1;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_HELLO, &h), FR_EPROTO); /* rank >= world */

  proto_submit_t s = {.id = 1, .prompt = "x", .sp = proto_sampling_default()};
  char *stops[PROTO_MAX_STOP + 1];
  for (uint32_t i = 0; i <= PROTO_MAX_STOP; i++) stops[i] = "s";
  s.stop.strs = stops;
  s.stop.n_strs = PROTO_MAX_STOP + 1;
  ck_assert_int_eq(proto_submit_encode(&b, &s), FR_ETOOBIG);
  s.stop.n_strs = PROTO_MAX_STOP;
  ck_assert_int_eq(proto_submit_encode(&b, &s), 0);
  s.n_tokens = 1; /* two inputs */
  s.tokens = (int32_t[]){1};
  ck_assert_int_eq(proto_submit_encode(&b, &s), FR_EPROTO);
  s.n_tokens = 0;
  s.sp.top_p = NAN;
  ck_assert_int_eq(proto_submit_encode(&b, &s), FR_EPROTO);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "top_p"));
  s.sp.top_p = 1;
  proto_bias_t lb[2] = {{.token = 7, .bias = 1}, {.token = 7, .bias = 2}};
  s.sp.bias = lb, s.sp.n_bias = 2; /* a token twice */
  ck_assert_int_eq(proto_submit_encode(&b, &s), FR_EPROTO);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "logit bias"));
  lb[1] = (proto_bias_t){.token = 8, .bias = 100.5f}; /* out of range */
  ck_assert_int_eq(proto_submit_encode(&b, &s), FR_EPROTO);
  lb[1].bias = -100;
  ck_assert_int_eq(proto_submit_encode(&b, &s), 0);
  s.sp.n_bias = 0;
  s.stop.n_strs = 3;
  s.stop.strs = NULL; /* a count without data */
  ck_assert_int_eq(proto_submit_encode(&b, &s), FR_EPROTO);
  proto_step_item_t it = {.slot = 1, .n_tokens = 0, .sp = proto_sampling_default()};
  proto_step_t st = {.n_items = 1, .items = &it};
  ck_assert_int_eq(proto_step_encode(&b, &st), FR_EPROTO); /* an item without tokens */
  ck_assert_int_eq(proto_encode(&b, PROTO_T_NONE, &st), FR_EPROTO);
  proto_buf_free(&b);
}
END_TEST

/* The KV sizing fields and messages: what is refused, both ways. */
static int decode_kv(mp_t *m) {
  int rc = proto_msg_decode(&msg, m->sb.data, m->sb.size, PROTO_ACCEPT_ANY);
  msgpack_sbuffer_destroy(&m->sb);
  return rc;
}

START_TEST(kv_sizing_refused) {
  proto_buf_t b;
  proto_buf_init(&b);
  proto_load_t l = {.path = "m", .format = "gguf", .tp_size = 1, .kv_min_blocks = 1};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_LOAD, &l), 0);
  l.kv_util = 0.9f; /* sizing without a block size */
  ck_assert_int_eq(proto_encode(&b, PROTO_T_LOAD, &l), FR_EPROTO);
  l.block_size = 16;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_LOAD, &l), 0);
  l.kv_bytes = 1 << 20; /* both a budget and a fraction */
  ck_assert_int_eq(proto_encode(&b, PROTO_T_LOAD, &l), FR_EPROTO);
  l.kv_bytes = 0;
  l.kv_blocks = 100; /* a fixed count too */
  ck_assert_int_eq(proto_encode(&b, PROTO_T_LOAD, &l), FR_EPROTO);
  l.kv_blocks = 0;
  float bad[] = {1.5f, -0.1f, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    l.kv_util = bad[i];
    ck_assert_int_eq(proto_encode(&b, PROTO_T_LOAD, &l), FR_EPROTO);
  }
  l.kv_util = 1.0f;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_LOAD, &l), 0);
  proto_kv_init_t ki = {.kv_blocks = 0};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_KV_INIT, &ki), FR_EPROTO);
  ki.kv_blocks = 1;
  ck_assert_int_eq(proto_encode(&b, PROTO_T_KV_INIT, &ki), 0);
  ck_assert_int_eq(proto_msg_decode(&msg, b.data, b.len, PROTO_ACCEPT_WORKER), 0);
  ck_assert_int_eq(proto_msg_decode(&msg, b.data, b.len, PROTO_ACCEPT_FROM_WORKER), FR_EPROTO);
  proto_kv_ready_t kr = {.rank = 0, .kv_blocks = 9};
  ck_assert_int_eq(proto_encode(&b, PROTO_T_KV_READY, &kr), 0);
  ck_assert_int_eq(proto_msg_decode(&msg, b.data, b.len, PROTO_ACCEPT_FROM_WORKER), 0);
  ck_assert_int_eq(proto_msg_decode(&msg, b.data, b.len, PROTO_ACCEPT_WORKER), FR_EPROTO);
  proto_buf_free(&b);

  /* decoder: the same rules on bytes from outside */
  mp_t m;
  mp_init(&m);
  mp_msg(&m, "kv_init", 1);
  mp_uint(&m, "kvb", 0);
  ck_assert_int_eq(decode_kv(&m), FR_EPROTO);
  mp_init(&m);
  mp_msg(&m, "kv_init", 0); /* kvb is required */
  ck_assert_int_eq(decode_kv(&m), FR_EPROTO);
  mp_init(&m);
  mp_msg(&m, "kv_init", 1);
  mp_int(&m, "kvb", -5);
  ck_assert_int_eq(decode_kv(&m), FR_EPROTO);
  mp_init(&m);
  mp_msg(&m, "kv_ready", 1);
  mp_uint(&m, "kvb", 5); /* rank is required */
  ck_assert_int_eq(decode_kv(&m), FR_EPROTO);
  mp_init(&m);
  mp_msg(&m, "load", 4);
  mp_str(&m, "path", "m");
  mp_str(&m, "fmt", "gguf");
  mp_f32(&m, "kvu", 0.9f);
  mp_uint(&m, "kvm", 1000); /* both */
  ck_assert_int_eq(decode_kv(&m), FR_EPROTO);
  mp_init(&m);
  mp_msg(&m, "load", 4);
  mp_str(&m, "path", "m");
  mp_str(&m, "fmt", "gguf");
  mp_f64(&m, "kvu", 2.0);
  mp_uint(&m, "bs", 16);
  ck_assert_int_eq(decode_kv(&m), FR_EPROTO);
  ck_assert_ptr_nonnull(strstr(fr_last_error(), "(0, 1]"));
  mp_init(&m);
  mp_msg(&m, "load", 3);
  mp_str(&m, "path", "m");
  mp_str(&m, "fmt", "gguf");
  mp_uint(&m, "kvm", 1000); /* no block size */
  ck_assert_int_eq(decode_kv(&m), FR_EPROTO);
}
END_TEST

/* Decoding into the same proto_msg_t reuses its arena; big then small. */
START_TEST(arena_reuse) {
  proto_buf_t b;
  proto_buf_init(&b);
  for (int i = 0; i < 50; i++) {
    _Alignas(16) uint8_t body[sizeof msg.u];
    tu_rand_body(PROTO_T_STEP, body, 1);
    ck_assert_int_eq(proto_step_encode(&b, (proto_step_t *)body), 0);
    ck_assert_int_eq(proto_msg_decode(&msg, b.data, b.len, PROTO_ACCEPT_WORKER), 0);
    char why[256];
    ck_assert_msg(tu_compare(PROTO_T_STEP, body, &msg.u, why, sizeof why) == 0, "%s", why);
    tu_free_all();
  }
  proto_buf_free(&b);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("proto_codec");
  TCase *tc = tcase_create("codec");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, ref_step);
  tcase_add_test(tc, ref_result);
  tcase_add_test(tc, ref_worker_small);
  tcase_add_test(tc, ref_submit);
  tcase_add_test(tc, ref_event);
  tcase_add_test(tc, ref_rpc_small);
  tcase_add_test(tc, enc_step_keys);
  tcase_add_test(tc, enc_event_keys);
  tcase_add_test(tc, round_trip_all);
  tcase_add_test(tc, schema_tables);
  tcase_add_test(tc, encode_refuses);
  tcase_add_test(tc, kv_sizing_refused);
  tcase_add_test(tc, arena_reuse);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {suite}};
