/* test_table.c - kv block tables: snapshots and versions, a read-only reader
 * in another process that reads tables while the writer changes them
 * (checked against a journal of what the writer published), writes to the
 * read-only mapping fault, readers cannot call writer functions. */
#include <check.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "kv/kv_impl.h"

#define BS 4
#define SEQS 6
#define BPS 24

static char g_inst[32];

static kv_ctl_t *mk_shm(int n_blocks) {
  snprintf(g_inst, sizeof g_inst, "tkvtab%d", (int)getpid());
  kv_config_t cfg = {.instance = g_inst, .epoch = 7, .n_blocks = n_blocks, .block_size = BS, .max_seqs = SEQS,
                     .max_blocks_per_seq = BPS, .enable_prefix_cache = true};
  kv_ctl_t *ctl = NULL;
  int err = kv_control_create(&ctl, &cfg);
  ck_assert_msg(err == 0, "create: %s", fr_last_error());
  return ctl;
}

START_TEST(test_snapshot_and_version) {
  kv_config_t cfg = {.n_blocks = 16, .block_size = BS, .max_seqs = 2, .max_blocks_per_seq = 4};
  kv_ctl_t *ctl;
  ck_assert_int_eq(kv_control_create(&ctl, &cfg), 0);
  int32_t row[4];
  kv_seq_view_t v;
  ck_assert_int_eq(kv_seq_read(ctl, 1, row, 4, &v), 0);
  ck_assert(!v.in_use);
  ck_assert_int_eq(v.len, 0);
  ck_assert_int_eq(kv_seq_read(ctl, 2, row, 4, &v), -EINVAL);
  ck_assert_int_eq(kv_seq_read(ctl, -1, row, 4, &v), -EINVAL);
  int s;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &s), 0);
  uint32_t v0 = kv_seq_version(ctl, s);
  ck_assert_int_eq(kv_seq_append(ctl, s, 9, &cp), 0);
  ck_assert_uint_eq(kv_seq_version(ctl, s), v0 + 1);
  ck_assert_int_eq(kv_seq_read(ctl, s, row, 4, &v), 0);
  ck_assert(v.in_use);
  ck_assert_int_eq(v.len, 9);
  ck_assert_int_eq(v.n_blocks, 3);
  ck_assert_uint_eq(v.version, v0 + 1);
  ck_assert_int_eq(row[0], 0);
  ck_assert_int_eq(row[2], 2);
  ck_assert_int_eq(kv_seq_read(ctl, s, row, 2, &v), FR_ETOOBIG); /* small buffer */
  ck_assert_int_eq(row[1], 1);
  ck_assert_int_eq(kv_seq_read(ctl, s, NULL, 0, &v), FR_ETOOBIG);
  ck_assert_int_eq(v.len, 9);
  ck_assert_int_eq(kv_seq_truncate(ctl, s, 4), 0);
  ck_assert_int_eq(kv_seq_read(ctl, s, row, 4, &v), 0);
  ck_assert_int_eq(v.n_blocks, 1);
  ck_assert_uint_eq(v.version, v0 + 2);
  ck_assert_int_eq(kv_seq_free(ctl, s), 0);
  ck_assert_int_eq(kv_seq_read(ctl, s, row, 4, &v), 0);
  ck_assert(!v.in_use);
  ck_assert_int_eq(v.n_blocks, 0);
  kv_control_destroy(ctl);
}
END_TEST

START_TEST(test_reader_attach) {
  kv_ctl_t *w = mk_shm(32), *r = NULL;
  int err = kv_control_attach(&r, g_inst);
  ck_assert_msg(err == 0, "attach: %s", fr_last_error());
  kv_info_t wi, ri;
  kv_control_info(w, &wi);
  kv_control_info(r, &ri);
  ck_assert_int_eq(ri.n_blocks, 32);
  ck_assert_int_eq(ri.block_size, BS);
  ck_assert_int_eq(ri.max_seqs, SEQS);
  ck_assert_int_eq(ri.max_blocks_per_seq, BPS);
  ck_assert(ri.prefix_cache);
  ck_assert_uint_eq(ri.epoch, 7);
  ck_assert_ptr_nonnull(kv_control_segment(r));
  ck_assert_int_eq(kv_control_segment(r)->writable, 0);
  int s, x;
  kv_copy_t cp;
  ck_assert_int_eq(kv_seq_alloc_slot(w, 0, &s), 0);
  ck_assert_int_eq(kv_seq_append(w, s, 10, &cp), 0);
  int32_t row[BPS];
  kv_seq_view_t v;
  ck_assert_int_eq(kv_seq_read(r, s, row, BPS, &v), 0);
  ck_assert_int_eq(v.len, 10);
  ck_assert_int_eq(row[2], 2);
  /* Writer functions refuse a reader handle instead of faulting. */
  ck_assert_int_eq(kv_seq_alloc_slot(r, 0, &x), -EPERM);
  ck_assert_int_eq(kv_seq_append(r, s, 1, &cp), -EPERM);
  ck_assert_int_eq(kv_seq_truncate(r, s, 1), -EPERM);
  ck_assert_int_eq(kv_seq_free(r, s), -EPERM);
  ck_assert_int_eq(kv_seq_fork(r, s, &x), -EPERM);
  ck_assert_int_eq(kv_prefix_commit(r, s, row, 0), -EPERM);
  ck_assert_int_eq(kv_prefix_lookup(r, row, 0, 0, &x, NULL, 0, NULL), -EPERM);
  kv_control_destroy(r);
  /* A fork()ed child's destroy of the inherited writer handle unlinks nothing. */
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    kv_control_destroy(w);
    _exit(0);
  }
  ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
  ck_assert_int_eq(kv_control_attach(&r, g_inst), 0);
  kv_control_destroy(r);
  /* The writer's destroy unlinks the segment. */
  kv_control_destroy(w);
  ck_assert_int_eq(kv_control_attach(&r, g_inst), -ENOENT);
}
END_TEST

START_TEST(test_attach_rejects_bad_layout) {
  kv_ctl_t *w = mk_shm(32), *r = NULL;
  kv__ctl_hdr_t *h = w->hdr;
  int32_t saved = h->n_blocks;
  h->n_blocks = 1 << 20; /* layout no longer fits the segment */
  ck_assert_int_eq(kv_control_attach(&r, g_inst), FR_EFORMAT);
  h->n_blocks = saved;
  h->off_tables += 64;
  ck_assert_int_eq(kv_control_attach(&r, g_inst), FR_EFORMAT);
  h->off_tables -= 64;
  h->version = 99;
  ck_assert_int_eq(kv_control_attach(&r, g_inst), FR_EVERSION);
  h->version = KV__CTL_VERSION;
  h->block_size = 0;
  ck_assert_int_eq(kv_control_attach(&r, g_inst), FR_EFORMAT);
  h->block_size = BS;
  ck_assert_int_eq(kv_control_attach(&r, g_inst), 0);
  kv_control_destroy(r);
  /* A segment of another kind is not a control segment. */
  kv_segment_t seg;
  char inst[32];
  snprintf(inst, sizeof inst, "tkvbad%d", (int)getpid());
  ck_assert_int_eq(kv_segment_create(&seg, inst, KV_CTL_WHAT, 64, 1), 0);
  ck_assert_int_eq(kv_control_attach(&r, inst), FR_EFORMAT);
  kv_segment_detach(&seg);
  ck_assert_int_eq(kv_segment_unlink(inst, KV_CTL_WHAT), 0);
  kv_control_destroy(w);
}
END_TEST

START_TEST(test_readonly_write_faults) {
  kv_ctl_t *w = mk_shm(32);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    kv_ctl_t *r = NULL;
    if (kv_control_attach(&r, g_inst) != 0) _exit(3);
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    ((volatile int32_t *)r->tables)[0] = 1; /* must fault */
    _exit(0);
  }
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS),
                "child status %#x: the write did not fault", st);
  ck_assert_int_eq(w->tables[0], 0);
  kv_control_destroy(w);
}
END_TEST

/* ---- concurrent reader -------------------------------------------------- */

#define JOURNAL 1024 /* versions remembered per slot */

typedef struct {
  uint32_t version; /* published last (release) */
  int32_t len;
  uint64_t hash;    /* of the table entries */
} jentry_t;

typedef struct {
  int stop;
  jentry_t e[SEQS][JOURNAL];
} journal_t;

static uint64_t table_hash(const int32_t *row, int n) { return fr_hash64(row, (size_t)n * sizeof *row, 0x51); }

/* Writer side: records the slot's current table under its version. */
static void journal_put(journal_t *j, const kv_ctl_t *ctl, int s) {
  int32_t row[BPS];
  kv_seq_view_t v;
  ck_assert_int_eq(kv_seq_read(ctl, s, row, BPS, &v), 0);
  jentry_t *e = &j->e[s][v.version % JOURNAL];
  __atomic_store_n(&e->version, UINT32_MAX, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(&e->len, v.len, __ATOMIC_RELAXED);
  __atomic_store_n(&e->hash, table_hash(row, v.n_blocks), __ATOMIC_RELAXED);
  __atomic_store_n(&e->version, v.version, __ATOMIC_RELEASE);
}

/* Reader side: 1 match, 0 not checkable, -1 mismatch. */
static int journal_check(journal_t *j, const kv_ctl_t *r, int s, const kv_seq_view_t *v, const int32_t *row) {
  jentry_t *e = &j->e[s][v->version % JOURNAL];
  for (int spin = 0; spin < 100000; spin++) {
    uint32_t ver = __atomic_load_n(&e->version, __ATOMIC_ACQUIRE);
    if (ver == v->version) {
      int32_t len = __atomic_load_n(&e->len, __ATOMIC_RELAXED);
      uint64_t h = __atomic_load_n(&e->hash, __ATOMIC_RELAXED);
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (__atomic_load_n(&e->version, __ATOMIC_RELAXED) != ver) return 0;
      return len == v->len && h == table_hash(row, v->n_blocks) ? 1 : -1;
    }
    /* The writer journals a version before it changes the slot again: if
     * the slot moved on, this version is one it never journals (a fork's
     * first step). */
    if (kv_seq_version(r, s) != v->version) return 0;
    if (spin > 100) sched_yield();
  }
  return 0;
}

/* Reads every slot until told to stop; exit status 0 = all good. */
static int reader_main(journal_t *j) {
  kv_ctl_t *r = NULL;
  if (kv_control_attach(&r, g_inst) != 0) return 10;
  long matched = 0, reads = 0;
  int32_t row[BPS];
  while (!__atomic_load_n(&j->stop, __ATOMIC_ACQUIRE)) {
    for (int s = 0; s < SEQS; s++) {
      kv_seq_view_t v;
      int err = kv_seq_read(r, s, row, BPS, &v); /* checks len vs n_blocks, ids in range */
      if (err) return fprintf(stderr, "read: %s\n", fr_last_error()), 11;
      reads++;
      for (int a = 0; a < v.n_blocks; a++) /* a slot never holds a block twice */
        for (int b = a + 1; b < v.n_blocks; b++)
          if (row[a] == row[b]) return 12;
      int c = journal_check(j, r, s, &v, row);
      if (c < 0) return fprintf(stderr, "slot %d version %u: torn table\n", s, v.version), 13;
      matched += c;
    }
  }
  fprintf(stderr, "reader: %ld reads, %ld checked against the journal\n", reads, matched);
  kv_control_destroy(r);
  return matched > 1000 ? 0 : 14;
}

static void writer_step(kv_ctl_t *w, journal_t *j, uint64_t *rng) {
  int s = (int)(fr_mix64(++*rng) % SEQS), c;
  int op = (int)(fr_mix64(++*rng) % 10);
  kv_copy_t cp;
  if (!w->slots[s].in_use) {
    if (kv_seq_alloc_slot(w, 0, &c) == 0) journal_put(j, w, c);
    return;
  }
  int len = kv_seq_len(w, s);
  if (op < 5) {
    if (kv_seq_append(w, s, 1 + (int)(fr_mix64(++*rng) % 20), &cp) == 0) journal_put(j, w, s);
  } else if (op < 8) {
    ck_assert_int_eq(kv_seq_truncate(w, s, len / 2), 0);
    journal_put(j, w, s);
  } else if (op < 9) {
    if (kv_seq_fork(w, s, &c) == 0) journal_put(j, w, c);
  } else {
    ck_assert_int_eq(kv_seq_free(w, s), 0);
    journal_put(j, w, s);
  }
}

/* Sliding-window release: a long generation holds a bounded number of
 * blocks, released entries read as KV_HOLE, the prefix cache keeps
 * committing past the holes (and the released blocks stay findable), and
 * fork, truncate and free handle the holes; every invariant holds after
 * each step. window: tokens a query sees, itself included. */
static void release_run(bool prefix_cache) {
  const int window = 6, n_blocks = 12, bps = 64;
  kv_config_t cfg = {.n_blocks = n_blocks, .block_size = BS, .max_seqs = 3, .max_blocks_per_seq = bps,
                     .enable_prefix_cache = prefix_cache};
  kv_ctl_t *ctl;
  ck_assert_int_eq(kv_control_create(&ctl, &cfg), 0);
  int s, held_max = 0;
  kv_copy_t cp;
  int32_t tok[256], row[64];
  for (int i = 0; i < 256; i++) tok[i] = 1000 + i;
  ck_assert_int_eq(kv_seq_alloc_slot(ctl, 0, &s), 0);
  ck_assert_int_eq(kv_seq_append(ctl, s, 9, &cp), 0); /* a prompt of 9, then 191 decodes */
  ck_assert_int_eq(kv_prefix_commit(ctl, s, tok, 9), 0);
  for (int len = 9; len < 200; len++) { /* the scheduler's order: release, append, (step), commit */
    int rel = kv_seq_release_before(ctl, s, len - window + 1);
    ck_assert_int_ge(rel, 0);
    ck_assert_int_eq(kv_seq_append(ctl, s, 1, &cp), 0);
    ck_assert_int_eq(kv_prefix_commit(ctl, s, tok, len + 1), 0);
    ck_assert_int_eq(kv_control_verify(ctl), 0);
    int held = n_blocks - kv_blocks_free_count(ctl);
    held_max = FR_MAX(held_max, held);
    kv_seq_view_t v;
    ck_assert_int_eq(kv_seq_read(ctl, s, row, bps, &v), 0);
    ck_assert_int_eq(v.len, len + 1);
    for (int b = 0; b < v.n_blocks; b++) /* every block the next query's window touches is real */
      ck_assert(b * BS + BS <= len + 1 - window + 1 ? row[b] == KV_HOLE || b >= kv_seq_released(ctl, s)
                                                    : row[b] >= 0 && row[b] < n_blocks);
  }
  /* 200 tokens = 50 blocks in a pool of 12: at most ceil(window / BS) + 1 blocks of the window, and one more
   * for the block being filled */
  ck_assert_int_le(held_max, (window + BS - 1) / BS + 2);
  ck_assert_int_ge(kv_seq_released(ctl, s), 45);
  if (prefix_cache) { /* the chain went on past the holes: the last full block's hash is the whole prefix's */
    ck_assert_int_eq(ctl->slots[s].n_committed, 200 / BS);
    uint64_t h[2], p[2];
    kv__hash_root(0, h);
    for (int b = 0; b < 200 / BS; b++) {
      memcpy(p, h, sizeof p);
      kv__hash_block(p, tok + b * BS, BS, 0, h);
    }
    const int32_t last = kv__table(ctl, s)[200 / BS - 1];
    ck_assert(ctl->blocks[last].h[0] == h[0] && ctl->blocks[last].h[1] == h[1]);
  }
  /* fork shares the live blocks and the holes; truncating into the holes is refused */
  int c;
  ck_assert_int_eq(kv_seq_fork(ctl, s, &c), 0);
  ck_assert_int_eq(kv_seq_released(ctl, c), kv_seq_released(ctl, s));
  ck_assert_int_eq(kv_control_verify(ctl), 0);
  ck_assert_int_eq(kv_seq_truncate(ctl, c, 10), -EINVAL);
  ck_assert_int_eq(kv_seq_truncate(ctl, c, 198), 0);
  ck_assert_int_eq(kv_seq_append(ctl, c, 3, &cp), 0);
  ck_assert_int_eq(kv_control_verify(ctl), 0);
  ck_assert_int_eq(kv_seq_free(ctl, c), 0);
  ck_assert_int_eq(kv_seq_free(ctl, s), 0);
  ck_assert_int_eq(kv_control_verify(ctl), 0);
  ck_assert_int_eq(kv_blocks_free_count(ctl), n_blocks);
  ck_assert_int_eq(kv_seq_release_before(ctl, s, 100), -EINVAL); /* a free slot */
  kv_control_destroy(ctl);
}

START_TEST(test_release_before) {
  release_run(true);
  release_run(false);
}
END_TEST

START_TEST(test_concurrent_reader) {
  kv_ctl_t *w = mk_shm(SEQS * BPS);
  journal_t *j = mmap(NULL, sizeof *j, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(j, MAP_FAILED);
  memset(j, 0xff, sizeof *j);
  j->stop = 0;
  for (int s = 0; s < SEQS; s++) journal_put(j, w, s);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) _exit(reader_main(j));
  uint64_t rng = 99, t0 = fr_now_ns();
  long steps = 0;
  while (fr_now_ns() - t0 < 1500000000ull) {
    writer_step(w, j, &rng);
    steps++;
  }
  __atomic_store_n(&j->stop, 1, __ATOMIC_RELEASE);
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reader failed: status %#x (writer %ld steps)", st, steps);
  ck_assert_int_eq(kv_control_verify(w), 0);
  munmap(j, sizeof *j);
  kv_control_destroy(w);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("kv_table");
  TCase *tc = tcase_create("table");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_snapshot_and_version);
  tcase_add_test(tc, test_reader_attach);
  tcase_add_test(tc, test_attach_rejects_bad_layout);
  tcase_add_test(tc, test_readonly_write_faults);
  tcase_add_test(tc, test_concurrent_reader);
  tcase_add_test(tc, test_release_before);
  suite_add_tcase(s, tc);
  return s;
}

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

const test_prog_t test_prog = {.suites = {suite}};
