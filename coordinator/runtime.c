/* runtime.c - the runtime folder, default RPC address, pid files and the
 * instance id. A pid file holds four lines: the server's pid, its instance
 * id, its RPC endpoint and, once the HTTP frontend listens, its address
 * (http://host:port, the host as bound); clients read it (ctl/). */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"

/* Checks the runtime folder through a descriptor opened without following
 * a link, so another local user cannot point it (or its chmod) elsewhere:
 * it must be a real folder owned by this user, and ends up 0700. */
static int coord__runtime_dir_check(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return fr_errorf(-errno, "%s: %s", dir, errno == ELOOP || errno == ENOTDIR ? "not a folder (a link?)" : strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0) rc = fr_errorf(-errno, "stat %s: %s", dir, strerror(errno));
  else if (!S_ISDIR(st.st_mode) || st.st_uid != getuid())
    rc = fr_errorf(-EPERM, "%s is not a folder owned by this user", dir);
  else if ((st.st_mode & 0077) && fchmod(fd, 0700) != 0)
    rc = fr_errorf(-errno, "chmod %s: %s", dir, strerror(errno));
  close(fd);
  return rc;
}

int coord_runtime_dir(char *out, size_t cap) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n = xdg && *xdg ? snprintf(out, cap, "%s/ferrum", xdg) : snprintf(out, cap, "/tmp/ferrum-%u", (unsigned)getuid());
  if (n < 0 || (size_t)n >= cap) return fr_errorf(FR_ETOOBIG, "runtime folder path too long");
  if (mkdir(out, 0700) != 0 && errno != EEXIST) return fr_errorf(-errno, "mkdir %s: %s", out, strerror(errno));
  return coord__runtime_dir_check(out);
}

int coord_default_rpc_addr(char *out, size_t cap) {
  char dir[512];
  int rc = coord_runtime_dir(dir, sizeof dir);
  if (rc) return rc;
  int n = snprintf(out, cap, "ipc://%s/rpc.sock", dir);
  return n < 0 || (size_t)n >= cap ? fr_errorf(FR_ETOOBIG, "RPC address too long") : 0;
}

int coord_pidfile_path(const char *rpc_addr, char *out, size_t cap) {
  char dir[512];
  int rc = coord_runtime_dir(dir, sizeof dir);
  if (rc) return rc;
  uint64_t h = fr_hash64(rpc_addr, strlen(rpc_addr), 0x66657272756d);
  int n = snprintf(out, cap, "%s/server-%016llx.pid", dir, (unsigned long long)h);
  return n < 0 || (size_t)n >= cap ? fr_errorf(FR_ETOOBIG, "pid file path too long") : 0;
}

void coord__instance_id(char *out, size_t cap) {
  uint64_t r = fr_now_ns() ^ ((uint64_t)getpid() << 32);
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    uint64_t x;
    if (read(fd, &x, sizeof x) == (ssize_t)sizeof x) r ^= x;
    close(fd);
  }
  snprintf(out, cap, "p%u.%06llx", (unsigned)getpid(), (unsigned long long)(r & 0xffffff));
}

/* Writes the pid file (pid, instance, RPC endpoint, then the HTTP address
 * when there is one) through a rename, so readers never see half of it. */
static int coord__pidfile_put(coord_t *c, const char *http) {
  char tmp[640];
  snprintf(tmp, sizeof tmp, "%s.tmp%d", c->pidfile, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return fr_errorf(-errno, "%s: %s", tmp, strerror(errno));
  fprintf(f, "%d\n%s\n%s\n", (int)getpid(), c->instance, c->rpc_addr);
  if (http) fprintf(f, "%s\n", http);
  int rc = 0;
  if (fclose(f) != 0 || rename(tmp, c->pidfile) != 0) {
    rc = fr_errorf(-errno, "%s: %s", c->pidfile, strerror(errno));
    unlink(tmp);
  }
  return rc;
}

int coord__pidfile_write(coord_t *c) {
  int rc = coord_pidfile_path(c->rpc_addr, c->pidfile, sizeof c->pidfile);
  if (rc) return rc;
  if ((rc = coord__pidfile_put(c, NULL))) c->pidfile[0] = 0;
  return rc;
}

int coord_set_http_addr(coord_t *c, const char *host, int port) {
  if (!c->pidfile[0]) return fr_errorf(FR_ESTATE, "no pid file");
  char url[320];
  bool v6 = strchr(host, ':') != NULL;
  int n = snprintf(url, sizeof url, "http://%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
  if (n < 0 || (size_t)n >= sizeof url) return fr_errorf(FR_ETOOBIG, "HTTP host too long");
  return coord__pidfile_put(c, url);
}

/* ---- stale files --------------------------------------------------------------- */

/* The pid in an instance id ("p<pid>.<hex>"), or 0. */
static pid_t coord__instance_pid(const char *name) {
  unsigned pid = 0;
  return sscanf(name, "p%u.", &pid) == 1 ? (pid_t)pid : 0;
}

static bool coord__pid_dead(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

/* A pid file of a server that is gone: removes it and its ipc:// socket. */
static void coord__stale_pidfile(const char *dir, const char *name, int *n) {
  char path[1024], rpc[700] = "";
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f) return;
  int pid = 0;
  char inst[64];
  bool ok = fscanf(f, "%d %63s %699s", &pid, inst, rpc) >= 1;
  fclose(f);
  if (!ok || !coord__pid_dead((pid_t)pid)) return;
  if (!strncmp(rpc, "ipc://", 6) && !strncmp(rpc + 6, dir, strlen(dir))) unlink(rpc + 6);
  if (unlink(path) == 0) (*n)++;
}

void coord__runtime_clean_stale(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const char *dot = strrchr(e->d_name, '.');
    if (dot && !strcmp(dot, ".workers") && coord__pid_dead(coord__instance_pid(e->d_name))) {
      char path[1024];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      if (unlink(path) == 0) n++;
    } else if (!strncmp(e->d_name, "server-", 7) && dot && !strcmp(dot, ".pid")) {
      coord__stale_pidfile(dir, e->d_name, &n);
    }
  }
  closedir(d);
  if (n) FR_LOGI("removed %d stale files of dead servers from %s", n, dir);
}
