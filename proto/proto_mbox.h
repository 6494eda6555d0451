/* proto_mbox.h - a one-message mailbox in shared memory: the coordinator's
 * steps to a worker on the same host, and that worker's results back.
 *
 * Each direction between the coordinator and a local worker is one mailbox
 * holding the last message posted (encoded as on ZeroMQ). A consumer that
 * polls sees a post within a memory load, where a ZeroMQ message crosses
 * both processes' I/O threads (tens of microseconds a hop, more when the
 * host is busy: docs/bench/engine.md). A consumer that sleeps in zmq_poll
 * says so in the mailbox, and the producer then also sends a doorbell (an
 * empty ZeroMQ frame) that wakes it.
 *
 * The protocol (C11 atomics, sequentially consistent where it matters):
 *   producer, post:  if taken != seq (the last message not decoded yet) or
 *                    the message is larger than the mailbox: send it over
 *                    ZeroMQ instead. Else copy it in, seq += 1, then read
 *                    `sleeping`: set means ring the doorbell.
 *   consumer, peek:  seq != taken means a message is there; decode it
 *                    (proto_msg_decode copies everything out), then
 *                    done(): taken = seq, so the bytes may be overwritten.
 *   consumer, sleep: sleeping = 1, peek once more, block in zmq_poll,
 *                    sleeping = 0. Either the peek sees the post or the
 *                    producer sees `sleeping` (both orders are seq_cst).
 * A consumer that starts (a restarted worker) first skips what is there
 * (proto_mbox_skip): it was meant for its predecessor.
 *
 * Threads: one producer and one consumer process per mailbox.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Message bytes a mailbox holds; larger ones go over ZeroMQ. A decode step
 * of 256 sequences is ~4 KiB, one with 2048 prompt tokens ~10 KiB. */
#define PROTO_MBOX_CAP (256u << 10)

typedef struct {
  /* written by the producer */
  _Atomic uint64_t seq; /* messages posted so far */
  uint32_t len;         /* bytes of message `seq` */
  uint8_t pad0[52];
  /* written by the consumer (its own cache line) */
  _Atomic uint64_t taken;    /* the last message decoded */
  _Atomic uint32_t sleeping; /* 1: blocked in zmq_poll, wants a doorbell */
  uint8_t pad1[52];
  uint8_t data[PROTO_MBOX_CAP];
} proto_mbox_t;

/* The two mailboxes of rank r in a segment of proto_mbox_bytes(n_ranks). */
enum { PROTO_MBOX_DOWN = 0, PROTO_MBOX_UP = 1 }; /* coordinator -> worker, worker -> coordinator */
size_t proto_mbox_bytes(int n_ranks);
proto_mbox_t *proto_mbox_at(void *base, int rank, int dir);

/* Results of proto_mbox_post. */
enum { PROTO_MBOX_BUSY = 0, PROTO_MBOX_POSTED = 1, PROTO_MBOX_RING = 2 };

/* Producer: posts len bytes. PROTO_MBOX_BUSY: not posted (too large, or
 * the last message not decoded yet): send it over ZeroMQ; POSTED; RING:
 * posted, and the consumer sleeps: send it a doorbell. */
int proto_mbox_post(proto_mbox_t *m, const void *data, size_t len);

/* Consumer: the message waiting (its bytes and length, at most
 * PROTO_MBOX_CAP whatever the other process wrote) or NULL. */
const void *proto_mbox_peek(proto_mbox_t *m, size_t *len);
/* Consumer: the message peeked is decoded; its bytes may be overwritten. */
void proto_mbox_done(proto_mbox_t *m);
/* Consumer: drops whatever is there (a restarted consumer's start). */
void proto_mbox_skip(proto_mbox_t *m);
/* Consumer: about to block (true) or awake (false); see the protocol. */
void proto_mbox_sleeping(proto_mbox_t *m, bool sleeping);

#ifdef __cplusplus
}
#endif
