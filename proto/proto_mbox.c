/* proto_mbox.c - the shared-memory mailbox (protocol in proto_mbox.h). */
#include "proto/proto_mbox.h"

#include <stdbool.h>
#include <string.h>

_Static_assert(offsetof(proto_mbox_t, taken) == 64 && offsetof(proto_mbox_t, data) == 128,
               "producer and consumer fields on their own cache lines");

size_t proto_mbox_bytes(int n_ranks) { return (size_t)n_ranks * 2 * sizeof(proto_mbox_t); }

proto_mbox_t *proto_mbox_at(void *base, int rank, int dir) {
  return (proto_mbox_t *)base + (size_t)rank * 2 + (size_t)dir;
}

int proto_mbox_post(proto_mbox_t *m, const void *data, size_t len) {
  uint64_t seq = atomic_load_explicit(&m->seq, memory_order_relaxed);
  if (len > PROTO_MBOX_CAP || atomic_load_explicit(&m->taken, memory_order_acquire) != seq) return PROTO_MBOX_BUSY;
  memcpy(m->data, data, len);
  m->len = (uint32_t)len;
  atomic_store(&m->seq, seq + 1); /* seq_cst: ordered before the load of `sleeping` */
  return atomic_load(&m->sleeping) ? PROTO_MBOX_RING : PROTO_MBOX_POSTED;
}

const void *proto_mbox_peek(proto_mbox_t *m, size_t *len) {
  uint64_t seq = atomic_load(&m->seq); /* seq_cst: after a store of `sleeping` */
  if (seq == atomic_load_explicit(&m->taken, memory_order_relaxed)) return NULL;
  const uint32_t n = m->len; /* another process wrote it: never past the mailbox (a decode then fails) */
  *len = n <= PROTO_MBOX_CAP ? n : PROTO_MBOX_CAP;
  return m->data;
}

void proto_mbox_done(proto_mbox_t *m) {
  atomic_store_explicit(&m->taken, atomic_load_explicit(&m->seq, memory_order_relaxed), memory_order_release);
}

void proto_mbox_skip(proto_mbox_t *m) { proto_mbox_done(m); }

void proto_mbox_sleeping(proto_mbox_t *m, bool sleeping) { atomic_store(&m->sleeping, sleeping ? 1u : 0u); }
