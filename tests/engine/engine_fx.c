/* engine_fx.c - see engine_fx.h. */
#include "tests/engine/engine_fx.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_util.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/sampler.h"

const char *efx_model(void) {
  const char *m = getenv("FERRUM_MODEL");
  return m && *m ? m : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

const char *efx_bin(const char *name) {
  static char p[2][1024];
  static int k;
  const char *b = getenv("FERRUM_BUILD_DIR");
  k ^= 1;
  snprintf(p[k], sizeof p[k], "%s/bin/%s", b ? b : ".", name);
  return p[k];
}

static int efx__read_instance(efx_server_t *s) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/ferrum", s->dir);
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *e;
  int rc = -1;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, "server-", 7) && strstr(e->d_name, ".pid")) {
      char path[600];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      FILE *f = fopen(path, "r");
      int pid;
      if (f && fscanf(f, "%d %63s", &pid, s->instance) == 2) rc = 0;
      if (f) fclose(f);
    }
  closedir(d);
  return rc;
}

int efx_status(const efx_server_t *s, proto_status_reply_t *st) {
  static char model[256]; /* the reply's strings die with the client: the one a test reads is copied */
  fr_client_t *c = NULL;
  int rc = fr_client_connect(&c, s->rpc);
  if (rc == 0) {
    fr_client_set_timeout(c, 5000);
    rc = fr_client_status(c, NULL, st);
  }
  if (rc == 0 && st->model) {
    snprintf(model, sizeof model, "%s", st->model);
    st->model = model;
  }
  fr_client_close(c);
  return rc;
}

static void efx__exec(const efx_server_t *s, const efx_opts_t *o, const char *const *extra) {
  const char *argv[64];
  char exe[4096]; /* absolute: the program is found after the chdir */
  int n = 0;
  if (!realpath(efx_bin("ferrumctl"), exe)) _exit(127);
  argv[n++] = exe;
  argv[n++] = "serve";
  if (o->http) argv[n++] = "--host", argv[n++] = "127.0.0.1", argv[n++] = "--port", argv[n++] = "0";
  else argv[n++] = "--no-http";
  argv[n++] = "--model", argv[n++] = o->model ? o->model : efx_model();
  argv[n++] = "--rpc", argv[n++] = s->rpc, argv[n++] = "--threads", argv[n++] = "2";
  for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  int fd = open(s->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) dup2(fd, 2), dup2(fd, 1), close(fd);
  setenv("XDG_RUNTIME_DIR", s->dir, 1);
  prctl(PR_SET_PDEATHSIG, SIGTERM); /* a test that fails midway does not leave a server behind */
  if (o->cwd && chdir(o->cwd) != 0) _exit(126);
  execv(argv[0], (char *const *)argv);
  _exit(127);
}

int efx_start(efx_server_t *s, const char *const *extra) {
  efx_opts_t o = {0};
  return efx_start_opts(s, &o, extra);
}

/* The first line of a /proc file into buf ("" when unreadable). */
static void efx__proc_line(const char *path, char *buf, size_t cap) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (!fgets(buf, (int)cap, f)) buf[0] = 0;
  fclose(f);
  buf[strcspn(buf, "\n")] = 0;
}

/* One line per thread of pid: its state and the kernel function it waits
 * in (where a hung process sits). */
static void efx__dump_threads(pid_t pid, const char *who) {
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[384], stat[512], wchan[128], comm[64];
    snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
    efx__proc_line(path, stat, sizeof stat);
    snprintf(path, sizeof path, "%s/%s/wchan", dir, e->d_name);
    efx__proc_line(path, wchan, sizeof wchan);
    snprintf(path, sizeof path, "%s/%s/comm", dir, e->d_name);
    efx__proc_line(path, comm, sizeof comm);
    const char *st = strrchr(stat, ')');
    fprintf(stderr, "  %s pid %d tid %s (%s): state %c, wchan %s\n", who, (int)pid, e->d_name, comm,
            st && st[1] ? st[2] : '?', wchan[0] ? wchan : "-");
  }
  closedir(d);
}

/* What the server's processes are doing and what its scheduler holds. */
static void efx__dump_server(const efx_server_t *s) {
  if (s->pid <= 0) return;
  efx__dump_threads(s->pid, "server");
  pid_t w[8];
  int n = efx_worker_pids(s, w, 8);
  for (int i = 0; i < n; i++) efx__dump_threads(w[i], "worker");
  proto_status_reply_t st;
  if (efx_status(s, &st) == 0)
    fprintf(stderr, "  status: %u queued, %u running, %u workers ready, %u restarts, KV %u/%u blocks\n", st.queued,
            st.running, st.n_workers, st.worker_restarts, st.kv_used_blocks, st.kv_total_blocks);
  else
    fprintf(stderr, "  status: no answer (%s)\n", fr_last_error());
}

/* Says on stderr why a call failed (fr_last_error), what the server's
 * processes are doing and the end of its log, so a failure in CI explains
 * itself. */
static void efx__report(const efx_server_t *s, const char *what) {
  fprintf(stderr, "efx: %s failed: %s\n", what, fr_last_error());
  efx__dump_server(s);
  fprintf(stderr, "--- end of %s\n", s->err_path);
  FILE *f = fopen(s->err_path, "r");
  if (!f) return;
  char line[512], tail[40][512];
  int n = 0;
  while (fgets(line, sizeof line, f)) snprintf(tail[n++ % 40], sizeof tail[0], "%s", line);
  fclose(f);
  for (int i = n > 40 ? n - 40 : 0; i < n; i++) fputs(tail[i % 40], stderr);
  fputs("---\n", stderr);
}

int efx_start_opts(efx_server_t *s, const efx_opts_t *o, const char *const *extra) {
  memset(s, 0, sizeof *s);
  snprintf(s->dir, sizeof s->dir, "/tmp/ferrum-enginetest-XXXXXX");
  if (!mkdtemp(s->dir)) return -1;
  snprintf(s->rpc, sizeof s->rpc, "ipc://%s/rpc.sock", s->dir);
  snprintf(s->err_path, sizeof s->err_path, "%s/serve.log", s->dir);
  s->pid = fork();
  if (s->pid == 0) efx__exec(s, o, extra);
  uint64_t deadline = fr_now_ns() + 120ull * 1000000000ull;
  while (fr_now_ns() < deadline) {
    int st;
    if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
      fprintf(stderr, "efx: server exited early (see %s)\n", s->err_path);
      s->exit_status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      s->pid = 0;
      return -1;
    }
    proto_status_reply_t r;
    /* ready: every rank (a tensor-parallel group's ranks become ready one by one) */
    if (efx_status(s, &r) == 0 && r.n_workers > 0 && r.n_workers >= r.tp.size) return efx__read_instance(s);
    usleep(50000);
  }
  fprintf(stderr, "efx: server not ready after 120 s\n");
  return -1;
}

static int efx__rm(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

void efx_cleanup(const efx_server_t *s) { nftw(s->dir, efx__rm, 16, FTW_DEPTH | FTW_PHYS); }

int efx_stop(efx_server_t *s, bool use_cli) {
  if (s->pid <= 0) return -1;
  if (use_cli) {
    pid_t p = fork();
    if (p == 0) {
      setenv("XDG_RUNTIME_DIR", s->dir, 1);
      execl(efx_bin("ferrumctl"), "ferrumctl", "stop", "--rpc", s->rpc, "--timeout", "60", (char *)NULL);
      _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
  } else {
    kill(s->pid, SIGTERM);
  }
  uint64_t deadline = fr_now_ns() + 60ull * 1000000000ull;
  int st = 0;
  while (waitpid(s->pid, &st, WNOHANG) == 0) {
    if (fr_now_ns() > deadline) {
      kill(s->pid, SIGKILL);
      waitpid(s->pid, &st, 0);
      s->pid = 0;
      return -1;
    }
    usleep(20000);
  }
  s->pid = 0;
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (rc == 0 && efx_shm_count(s) == 0) efx_cleanup(s); /* else keep the log */
  return rc;
}

int efx_shm_count(const efx_server_t *s) {
  char prefix[128];
  snprintf(prefix, sizeof prefix, "ferrum-%s-", s->instance);
  DIR *d = opendir("/dev/shm");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
  closedir(d);
  return n;
}

proto_submit_t efx_greedy(const char *prompt, uint32_t max_tokens) {
  proto_submit_t r = {.prompt = (char *)prompt, .sp = proto_sampling_default(), .max_tokens = max_tokens,
                      .stop.ignore_eos = true, .stream = true};
  r.sp.temperature = 0;
  return r;
}

static efx_job_t *efx__find(efx_job_t *jobs, int n, uint64_t id) {
  for (int i = 0; i < n; i++)
    if (jobs[i].id == id) return &jobs[i];
  return NULL;
}

/* Adds one event to its job in jobs (if it is one of them). */
static void efx__take(efx_job_t *jobs, int n, const proto_event_t *ev, int *left) {
  efx_job_t *j = efx__find(jobs, n, ev->id);
  if (!j) return;
  j->n_events++;
  for (uint32_t i = 0; i < ev->n_tokens && j->n_tokens < 4096; i++) j->tokens[j->n_tokens++] = ev->tokens[i];
  if (ev->text_len && j->text_len + ev->text_len < sizeof j->text) {
    memcpy(j->text + j->text_len, ev->text, ev->text_len);
    j->text_len += ev->text_len;
  }
  if (ev->finish != PROTO_FINISH_NONE) {
    j->finish = ev->finish;
    j->usage = ev->usage;
    j->error = ev->error.code;
    (*left)--;
  }
}

int efx_collect_until(fr_client_t *c, efx_job_t *jobs, int n, int k, int n_events, int timeout_ms) {
  uint64_t deadline = fr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  int left = 0;
  for (int i = 0; i < n; i++) left += jobs[i].finish == PROTO_FINISH_NONE;
  while (left > 0 && (k < 0 || jobs[k].n_events < n_events)) {
    int64_t ms = (int64_t)(deadline - fr_now_ns()) / 1000000;
    if ((int64_t)(deadline - fr_now_ns()) <= 0) return -1;
    proto_event_t ev;
    if (fr_client_next_event(c, (int)ms, &ev)) return -1;
    efx__take(jobs, n, &ev, &left);
  }
  return 0;
}

int efx_collect(fr_client_t *c, efx_job_t *jobs, int n, int timeout_ms) {
  return efx_collect_until(c, jobs, n, -1, 0, timeout_ms);
}

int efx_run_one(const efx_server_t *s, const proto_submit_t *req, efx_job_t *out) {
  memset(out, 0, sizeof *out);
  fr_client_t *c = NULL;
  int rc = fr_client_connect(&c, s->rpc);
  if (rc == 0) rc = fr_client_submit(c, req, &out->id);
  if (rc == 0) rc = efx_collect(c, out, 1, 120000);
  if (rc) efx__report(s, "job");
  fr_client_close(c);
  return rc;
}

int efx_reference(const char *prompt, int n_out, int32_t *out) {
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  model_gen_t *g = NULL;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  int n = -1;
  if (kern_cpu_create(&be, 2)) goto done;
  model_load_opts_t lo = {0};
  if (model_load(&m, efx_model(), be, &lo)) goto done;
  if (model_tokenize(m->tok, prompt, strlen(prompt), true, true, &ids, &n_ids)) goto done;
  if (model_gen_create(&g, m, 0) || model_gen_feed(g, ids, (int)n_ids)) goto done;
  for (n = 0; n < n_out; n++) {
    int32_t best = 0;
    for (int v = 1; v < m->cfg.vocab_size; v++)
      if (g->logits[v] > g->logits[best]) best = v;
    out[n] = best;
    if (n + 1 < n_out && model_gen_feed(g, &best, 1)) break;
  }
done:
  free(ids);
  model_gen_destroy(g);
  model_destroy(m);
  kern_backend_destroy(be);
  return n;
}

int efx_worker_pids(const efx_server_t *s, pid_t *pids, int cap) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < cap) {
    int pid = atoi(e->d_name);
    if (pid <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    const char *p = strrchr(buf, ')');
    int ppid = 0;
    char state = 0;
    if (!p || sscanf(p + 2, "%c %d", &state, &ppid) != 2 || ppid != s->pid || state == 'Z') continue;
    if (strstr(buf, "ferrum-worker")) pids[n++] = pid;
  }
  closedir(d);
  return n;
}
