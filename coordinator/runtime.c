/* runtime.c - the runtime folder, default RPC address, pid files and the
 * instance id. A pid file holds four lines: the server's pid, its instance
 * id, its RPC endpoint and, once the HTTP frontend listens, its address
 * (http://host:port, the host as bound); clients read it (ctl/). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_hash.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"

int coord_runtime_dir(char *out, size_t cap) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n = xdg && *xdg ? snprintf(out, cap, "%s/ferrum", xdg) : snprintf(out, cap, "/tmp/ferrum-%u", (unsigned)getuid());
  if (n < 0 || (size_t)n >= cap) return fr_errorf(FR_ETOOBIG, "runtime folder path too long");
  if (mkdir(out, 0700) != 0 && errno != EEXIST) return fr_errorf(-errno, "mkdir %s: %s", out, strerror(errno));
  struct stat st;
  if (stat(out, &st) != 0) return fr_errorf(-errno, "stat %s: %s", out, strerror(errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != getuid())
    return fr_errorf(-EPERM, "%s is not a folder owned by this user", out);
  if ((st.st_mode & 0077) && chmod(out, 0700) != 0) return fr_errorf(-errno, "chmod %s: %s", out, strerror(errno));
  return 0;
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
