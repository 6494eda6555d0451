/* kv_shm.c - named shared-memory segments: create, attach, unlink, stale scan. */
#include "kv/kv_shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

#define KV__SHM_DIR "/dev/shm"
#define KV__PREFIX "ferrum-"

static int kv__name_ok(const char *s, int allow_dash) {
  size_t n = 0;
  for (; s[n]; n++) {
    char c = s[n];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
             c == '.' || (allow_dash && c == '-');
    if (!ok || n >= KV_INSTANCE_MAX - 1) return 0;
  }
  return n > 0;
}

int kv_segment_name(char *out, size_t cap, const char *instance, const char *what) {
  if (!instance || !kv__name_ok(instance, 0))
    return fr_errorf(-EINVAL, "kv: bad instance id '%s' (1..31 of [A-Za-z0-9_.])", instance ? instance : "");
  if (!what || !kv__name_ok(what, 1))
    return fr_errorf(-EINVAL, "kv: bad segment kind '%s' (1..31 of [A-Za-z0-9_.-])", what ? what : "");
  int n = snprintf(out, cap, "/" KV__PREFIX "%s-%s", instance, what);
  if (n < 0 || (size_t)n >= cap) return fr_errorf(-EINVAL, "kv: segment name buffer too small");
  return 0;
}

/* Start time of a process in clock ticks since boot (field 22 of
 * /proc/<pid>/stat); *zombie is set when its state is Z or X. Returns 0, or
 * -ENOENT when there is no such process, or another -errno. */
static int kv__proc_start(int pid, uint64_t *start, int *zombie) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int err = n < 0 ? -errno : 0;
  close(fd);
  if (err) return err;
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* comm may hold spaces and parens */
  if (!p) return -EIO;
  p++;
  char state = 0;
  unsigned long long st = 0;
  /* fields 3 (state) .. 22 (starttime) */
  if (sscanf(p, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", &state,
             &st) != 2)
    return -EIO;
  *start = st;
  *zombie = state == 'Z' || state == 'X';
  return 0;
}

static uint64_t kv__self_start(void) {
  uint64_t st = 0;
  int z = 0;
  return kv__proc_start((int)getpid(), &st, &z) == 0 ? st : 0;
}

int kv_segment_owner_alive(const kv_seg_header_t *hdr) {
  int pid = hdr->owner_pid;
  if (pid <= 0) return 0;
  uint64_t st = 0;
  int zombie = 0;
  int err = kv__proc_start(pid, &st, &zombie);
  if (err == -ENOENT) return 0;
  if (err == 0) return !zombie && (hdr->owner_start == 0 || st == hdr->owner_start);
  /* No /proc: fall back to kill(pid, 0); EPERM means it exists. */
  return kill(pid, 0) == 0 || errno == EPERM;
}

static size_t kv__page_round(size_t n, int *overflow) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), out;
  if (pg < KV_SEG_DATA_OFFSET) pg = KV_SEG_DATA_OFFSET;
  if (fr_add_size(n, pg - 1, &out)) {
    *overflow = 1;
    return 0;
  }
  return out / pg * pg;
}

static void kv__header_init(kv_seg_header_t *h, const char *instance, const char *what, size_t total,
                            size_t data_bytes, uint64_t epoch) {
  h->version = KV_SEG_VERSION;
  h->data_offset = KV_SEG_DATA_OFFSET;
  h->total_bytes = total;
  h->data_bytes = data_bytes;
  h->epoch = epoch;
  h->owner_pid = (int32_t)getpid();
  h->owner_start = kv__self_start();
  snprintf(h->instance, sizeof h->instance, "%s", instance);
  snprintf(h->what, sizeof h->what, "%s", what);
  __atomic_store_n(&h->magic, KV_SEG_MAGIC, __ATOMIC_RELEASE); /* publish last */
}

int kv_segment_create(kv_segment_t *seg, const char *instance, const char *what, size_t data_bytes,
                      uint64_t epoch) {
  memset(seg, 0, sizeof *seg);
  seg->fd = -1;
  int err = kv_segment_name(seg->name, sizeof seg->name, instance, what);
  if (err) return err;
  int overflow = 0;
  size_t total = 0;
  if (fr_add_size(data_bytes, KV_SEG_DATA_OFFSET, &total)) overflow = 1;
  total = kv__page_round(total, &overflow);
  if (overflow || total > (size_t)INT64_MAX)
    return fr_errorf(FR_ETOOBIG, "kv: segment %s: %zu bytes is too large", seg->name, data_bytes);
  int fd = shm_open(seg->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return fr_errorf(-errno, "kv: shm_open(%s): %s", seg->name, strerror(errno));
  if (ftruncate(fd, (off_t)total) != 0) {
    err = fr_errorf(-errno, "kv: ftruncate(%s, %zu): %s", seg->name, total, strerror(errno));
    goto fail_unlink;
  }
  /* Reserve every page now: a tmpfs that fills up later would kill the
   * process that touches a page past its end (SIGBUS) in the middle of a
   * step; short of room, the start fails here and says so. */
  int fe = posix_fallocate(fd, 0, (off_t)total);
  if (fe != 0) {
    err = fr_errorf(-fe, "kv: %s needs %.1f MiB of shared memory (/dev/shm): %s%s", seg->name,
                    (double)total / 1048576.0, strerror(fe),
                    fe == ENOSPC ? "; give /dev/shm more room (a container's --shm-size) or ask for fewer KV blocks" : "");
    goto fail_unlink;
  }
  void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    err = fr_errorf(-errno, "kv: mmap(%s, %zu): %s", seg->name, total, strerror(errno));
    goto fail_unlink;
  }
  kv__header_init(base, instance, what, total, data_bytes, epoch);
  seg->base = base;
  seg->size = total;
  seg->fd = fd;
  seg->writable = 1;
  return 0;

fail_unlink:
  shm_unlink(seg->name);
  close(fd);
  return err;
}

/* Checks a header read from a segment of `size` bytes named instance/what
 * (what may be NULL: not compared). */
static int kv__header_check(const kv_seg_header_t *h, size_t size, const char *name, const char *instance,
                            const char *what) {
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != KV_SEG_MAGIC)
    return fr_errorf(FR_EFORMAT, "kv: %s: bad magic (not a ferrum segment, or still being created)", name);
  if (h->version != KV_SEG_VERSION)
    return fr_errorf(FR_EVERSION, "kv: %s: layout version %u, expected %u", name, h->version, KV_SEG_VERSION);
  if (h->data_offset != KV_SEG_DATA_OFFSET || h->total_bytes != size || h->data_bytes > size - KV_SEG_DATA_OFFSET)
    return fr_errorf(FR_EFORMAT, "kv: %s: header sizes do not match the segment (%zu bytes)", name, size);
  if (memchr(h->instance, 0, sizeof h->instance) == NULL || memchr(h->what, 0, sizeof h->what) == NULL)
    return fr_errorf(FR_EFORMAT, "kv: %s: unterminated instance or kind", name);
  if (strcmp(h->instance, instance) != 0 || (what && strcmp(h->what, what) != 0))
    return fr_errorf(FR_EFORMAT, "kv: %s: header names %s-%s", name, h->instance, h->what);
  return 0;
}

int kv_segment_attach(kv_segment_t *seg, const char *instance, const char *what, int mode) {
  memset(seg, 0, sizeof *seg);
  seg->fd = -1;
  int err = kv_segment_name(seg->name, sizeof seg->name, instance, what);
  if (err) return err;
  int rw = mode == KV_SEG_RDWR;
  int fd = shm_open(seg->name, (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd < 0) return fr_errorf(-errno, "kv: shm_open(%s): %s", seg->name, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    err = fr_errorf(-errno, "kv: fstat(%s): %s", seg->name, strerror(errno));
    goto fail_close;
  }
  if (st.st_size < (off_t)KV_SEG_DATA_OFFSET) {
    err = fr_errorf(FR_ETRUNCATED, "kv: %s: %lld bytes, smaller than its header", seg->name, (long long)st.st_size);
    goto fail_close;
  }
  size_t size = (size_t)st.st_size;
  void *base = mmap(NULL, size, rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    err = fr_errorf(-errno, "kv: mmap(%s): %s", seg->name, strerror(errno));
    goto fail_close;
  }
  err = kv__header_check(base, size, seg->name, instance, what);
  if (err) goto fail_unmap;
  seg->base = base;
  seg->size = size;
  seg->fd = fd;
  seg->writable = rw;
  return 0;

fail_unmap:
  munmap(base, size);
fail_close:
  close(fd);
  return err;
}

void kv_segment_detach(kv_segment_t *seg) {
  if (!seg) return;
  if (seg->base) munmap(seg->base, seg->size);
  if (seg->fd >= 0) close(seg->fd);
  seg->base = NULL;
  seg->size = 0;
  seg->fd = -1;
}

int kv_segment_unlink(const char *instance, const char *what) {
  char name[KV_SEG_NAME_MAX];
  int err = kv_segment_name(name, sizeof name, instance, what);
  if (err) return err;
  if (shm_unlink(name) != 0) return fr_errorf(-errno, "kv: shm_unlink(%s): %s", name, strerror(errno));
  return 0;
}

int kv_segment_adopt(kv_segment_t *seg, uint64_t epoch) {
  if (!seg->writable) return fr_errorf(-EPERM, "kv: %s: adopt needs a read-write mapping", seg->name);
  kv_seg_header_t *h = seg->base;
  h->epoch = epoch;
  h->owner_start = kv__self_start();
  __atomic_store_n(&h->owner_pid, (int32_t)getpid(), __ATOMIC_RELEASE);
  return 0;
}

/* Looks at one /dev/shm entry: returns 1 if removed, 0 if live, -1 if not
 * recognised. */
static int kv__scan_one(const char *entry) {
  char name[300];
  kv_seg_header_t h;
  snprintf(name, sizeof name, "/%s", entry);
  int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct stat st;
  ssize_t n = -1;
  if (fstat(fd, &st) == 0 && st.st_size >= (off_t)KV_SEG_DATA_OFFSET) n = pread(fd, &h, sizeof h, 0);
  close(fd);
  if (n != (ssize_t)sizeof h) return -1;
  /* The name must be the one the header describes. */
  char want[KV_SEG_NAME_MAX];
  if (memchr(h.instance, 0, sizeof h.instance) == NULL || memchr(h.what, 0, sizeof h.what) == NULL) return -1;
  if (kv_segment_name(want, sizeof want, h.instance, h.what) != 0 || strcmp(want, name) != 0) return -1;
  fr_error_clear();
  if (kv__header_check(&h, (size_t)st.st_size, name, h.instance, h.what) != 0) {
    fr_error_clear();
    return -1;
  }
  if (kv_segment_owner_alive(&h)) return 0;
  return shm_unlink(name) == 0 ? 1 : -1;
}

int kv_segment_scan_stale(int *n_removed, int *n_live) {
  int removed = 0, live = 0;
  DIR *d = opendir(KV__SHM_DIR);
  if (!d) return fr_errorf(-errno, "kv: opendir(%s): %s", KV__SHM_DIR, strerror(errno));
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, KV__PREFIX, strlen(KV__PREFIX)) != 0) continue;
    int r = kv__scan_one(e->d_name);
    if (r == 1) removed++;
    if (r == 0) live++;
  }
  closedir(d);
  if (n_removed) *n_removed = removed;
  if (n_live) *n_live = live;
  return 0;
}

int kv_pool_data_bytes(const kv_pool_geom_t *g, size_t *out) {
  if (g->n_layers <= 0 || g->n_kv_heads <= 0 || g->head_dim <= 0 || g->elem_bytes <= 0 || g->block_size <= 0 ||
      g->n_blocks <= 0)
    return fr_errorf(-EINVAL, "kv: pool geometry has a non-positive field");
  size_t f[] = {(size_t)g->n_layers, 2, (size_t)g->n_blocks, (size_t)g->block_size,
                (size_t)g->n_kv_heads, (size_t)g->head_dim, (size_t)g->elem_bytes};
  size_t n = 1;
  for (size_t i = 0; i < FR_ARRAY_SIZE(f); i++)
    if (fr_mul_size(n, f[i], &n)) return fr_errorf(FR_ETOOBIG, "kv: pool size overflows");
  *out = n;
  return 0;
}

int kv_pool_bytes(const kv_pool_geom_t *g, size_t *out) {
  size_t n = 0;
  int err = kv_pool_data_bytes(g, &n);
  if (err) return err;
  int overflow = 0;
  if (fr_add_size(n, KV_SEG_DATA_OFFSET, &n)) overflow = 1;
  n = kv__page_round(n, &overflow);
  if (overflow) return fr_errorf(FR_ETOOBIG, "kv: pool size overflows");
  *out = n;
  return 0;
}
