/* remote.c - what a remote worker (a rank on another host, no shared
 * memory) gets instead of the control segment: with each step, the block
 * table changes of the step's slots since the last step.
 *
 * The coordinator keeps a mirror of the tables it has sent. For each item
 * whose slot's version moved (kv_seq_view_t.version), the slot's table is
 * read from the control segment and compared with the mirror; the entries
 * from the first difference on go out ("tb" in the step descriptor,
 * docs/PROTOCOL.md). A freed slot's mirror empties with the step that
 * frees it, as the worker's copy does; a remote worker that (re)joins
 * starts with every mirror empty. Workers on this host map the segment
 * and ignore the changes.
 */
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"

/* Sizes the mirror for the control segment (once it exists). */
static void coord__remote_alloc(coord_t *c) {
  size_t S = (size_t)c->kvi.max_seqs, mb = (size_t)c->kvi.max_blocks_per_seq;
  c->rt.mb = (int)mb;
  c->rt.blocks = fr_malloc(S * mb * sizeof(int32_t));
  c->rt.len = fr_calloc(S, sizeof(int32_t));
  c->rt.ver = fr_calloc(S, sizeof(uint32_t));
  c->rt.row = fr_malloc(mb * sizeof(int32_t));
  c->rt.tables = fr_calloc(S, sizeof(proto_table_t));
}

void coord__remote_reset(coord_t *c) {
  if (!c->rt.len) return;
  memset(c->rt.len, 0, (size_t)c->kvi.max_seqs * sizeof(int32_t));
  memset(c->rt.ver, 0, (size_t)c->kvi.max_seqs * sizeof(uint32_t));
}

/* The change of one slot into *t, the mirror updated; false when none. */
static bool coord__remote_diff(coord_t *c, int slot, proto_table_t *t) {
  if (kv_seq_version(c->kv, slot) == c->rt.ver[slot]) return false; /* unchanged since sent: no table read */
  kv_seq_view_t v;
  if (kv_seq_read(c->kv, slot, c->rt.row, c->rt.mb, &v) != 0) return false;
  int32_t *mine = c->rt.blocks + (size_t)slot * (size_t)c->rt.mb;
  int old = c->rt.len[slot], first = 0, common = FR_MIN(old, v.n_blocks);
  while (first < common && mine[first] == c->rt.row[first]) first++;
  c->rt.ver[slot] = v.version;
  if (first == v.n_blocks && v.n_blocks == old) return false; /* a new version, the same table */
  memcpy(mine + first, c->rt.row + first, (size_t)(v.n_blocks - first) * sizeof(int32_t));
  c->rt.len[slot] = v.n_blocks;
  *t = (proto_table_t){.slot = (uint32_t)slot, .first = (uint32_t)first, .n_blocks = (uint32_t)(v.n_blocks - first),
                       .blocks = mine + first};
  return true;
}

void coord__remote_tables(coord_t *c, const coord_sched_batch_t *b, proto_step_t *st) {
  st->n_tables = 0;
  st->tables = NULL;
  if (!c->n_remote || !c->kv) return;
  if (!c->rt.len) coord__remote_alloc(c);
  for (int i = 0; i < b->n_freed; i++) /* the worker empties them first, too */
    if (b->freed[i] < (uint32_t)c->kvi.max_seqs) c->rt.len[b->freed[i]] = 0, c->rt.ver[b->freed[i]] = 0;
  for (int i = 0; i < b->n_items; i++) {
    proto_table_t t;
    if (coord__remote_diff(c, b->items[i].slot, &t)) c->rt.tables[st->n_tables++] = t;
  }
  st->tables = c->rt.tables;
}

void coord__remote_free(coord_t *c) {
  free(c->rt.blocks), free(c->rt.len), free(c->rt.ver), free(c->rt.row), free(c->rt.tables);
  memset(&c->rt, 0, sizeof c->rt);
}
