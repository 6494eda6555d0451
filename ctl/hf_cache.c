/* hf_cache.c - models named as on the Hugging Face Hub ("org/name", or
 * "org/name:PATTERN" for one GGUF file of a repository, as llama.cpp's -hf
 * takes it), found in the cache that huggingface_hub keeps, and `ferrumctl
 * list` / `ferrumctl rm` over that cache. The layout is huggingface_hub's
 * (HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub; models--ORG--NAME/{blobs,refs,snapshots}),
 * so models that other tools downloaded load without a copy. A name
 * missing from the cache is pulled (hf_pull.c) unless HF_HUB_OFFLINE is set. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "ctl/cli.h"

#define HF_PATH 4096

/* Formats a path into out (HF_PATH bytes); false when it does not fit. */
__attribute__((format(printf, 2, 3))) static bool hf_fmt(char *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, HF_PATH, fmt, ap);
  va_end(ap);
  return n >= 0 && n < HF_PATH;
}

int cli_hf_cache_dir(char *out, size_t cap) {
  const char *hub = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME");
  const char *user = getenv("HOME");
  int n;
  if (hub && *hub) n = snprintf(out, cap, "%s", hub);
  else if (home && *home) n = snprintf(out, cap, "%s/hub", home);
  else if (xdg && *xdg) n = snprintf(out, cap, "%s/huggingface/hub", xdg);
  else n = snprintf(out, cap, "%s/.cache/huggingface/hub", user && *user ? user : "");
  return n >= 0 && (size_t)n < cap ? 0 : fr_errorf(FR_ETOOBIG, "Hugging Face cache path too long");
}

static bool hf_name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'; }

/* Whether s[0..n) is one part of a repository id: name characters, not
 * starting with '.' or '-'. */
static bool hf_part_ok(const char *s, size_t n) {
  if (n == 0 || n > 96 || s[0] == '.' || s[0] == '-') return false;
  for (size_t i = 0; i < n; i++)
    if (!hf_name_char(s[i])) return false;
  return true;
}

bool cli_hf_is_name(const char *s) {
  const char *slash = strchr(s, '/'), *colon = strchr(s, ':');
  size_t end = colon ? (size_t)(colon - s) : strlen(s);
  if (!slash || (size_t)(slash - s) >= end) return false;
  return hf_part_ok(s, (size_t)(slash - s)) && hf_part_ok(slash + 1, end - (size_t)(slash - s) - 1) &&
         (!colon || colon[1] != '\0');
}

/* The repository folder of "org/name[:pattern]": models--org--name. */
static int hf_repo_dir(const char *cache, const char *name, char *out, size_t cap) {
  const char *slash = strchr(name, '/'), *colon = strchr(name, ':');
  int nlen = colon ? (int)(colon - slash - 1) : (int)strlen(slash + 1);
  int n = snprintf(out, cap, "%s/models--%.*s--%.*s", cache, (int)(slash - name), name, nlen, slash + 1);
  return n >= 0 && (size_t)n < cap ? 0 : fr_errorf(FR_ETOOBIG, "%s: path too long", name);
}

/* The snapshot refs/main points at, or the only snapshot; out gets its folder. */
static int hf_snapshot(const char *repo, const char *name, char *out, size_t cap) {
  char path[HF_PATH], rev[128] = "";
  FILE *f = hf_fmt(path, "%s/refs/main", repo) ? fopen(path, "r") : NULL;
  if (f) {
    if (!fgets(rev, sizeof rev, f)) rev[0] = '\0';
    fclose(f);
    rev[strcspn(rev, "\r\n")] = '\0';
  }
  if (!rev[0] || strchr(rev, '/') || rev[0] == '.') { /* no ref: the one snapshot there is */
    DIR *d = hf_fmt(path, "%s/snapshots", repo) ? opendir(path) : NULL;
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));)
      if (e->d_name[0] != '.' && found++ == 0 && strlen(e->d_name) < sizeof rev) strcpy(rev, e->d_name);
    if (d) closedir(d);
    if (found != 1)
      return fr_errorf(FR_ENOTFOUND, "%s: %s in the Hugging Face cache (%s)", name,
                       found ? "several snapshots and no refs/main" : "no snapshot", repo);
  }
  if (cap < HF_PATH || !hf_fmt(out, "%s/snapshots/%s", repo, rev))
    return fr_errorf(FR_ETOOBIG, "%s: path too long", name);
  struct stat st;
  if (stat(out, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  return fr_errorf(FR_ENOTFOUND, "%s: snapshot %s is missing", name, out);
}

static bool hf_has_suffix(const char *s, const char *sfx) {
  size_t a = strlen(s), b = strlen(sfx);
  return a >= b && !strcasecmp(s + a - b, sfx);
}

static int hf_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The snapshot's .gguf files whose name contains pattern (case-insensitive;
 * NULL: all), sorted; returns their count (names owned by the caller). */
static int hf_ggufs(const char *snap, const char *pattern, char **names, int cap) {
  DIR *d = opendir(snap);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    if (hf_has_suffix(e->d_name, ".gguf") && (!pattern || strcasestr(e->d_name, pattern)) && n < cap)
      names[n++] = strdup(e->d_name);
  if (d) closedir(d);
  qsort(names, (size_t)n, sizeof *names, hf_cmp);
  return n;
}

int cli_hf_resolve(const char *name, char *out, size_t cap) {
  char cache[HF_PATH], repo[HF_PATH], snap[HF_PATH], path[HF_PATH];
  const char *colon = strchr(name, ':'), *pattern = colon ? colon + 1 : NULL;
  int rc = cli_hf_cache_dir(cache, sizeof cache);
  if (!rc) rc = hf_repo_dir(cache, name, repo, sizeof repo);
  if (rc) return rc;
  struct stat st;
  if (stat(repo, &st) != 0)
    return fr_errorf(FR_ENOTFOUND, "%s is neither a path nor a model in the Hugging Face cache (%s)", name, cache);
  if ((rc = hf_snapshot(repo, name, snap, sizeof snap))) return rc;
  bool folder = !pattern && hf_fmt(path, "%s/config.json", snap) && access(path, R_OK) == 0;
  if (folder) return snprintf(out, cap, "%s", snap) < (int)cap ? 0 : fr_errorf(FR_ETOOBIG, "%s: path too long", name);
  char *files[64];
  int n = hf_ggufs(snap, pattern, files, 64);
  if (n == 1) rc = snprintf(out, cap, "%s/%s", snap, files[0]) < (int)cap ? 0 : fr_errorf(FR_ETOOBIG, "path too long");
  else if (n == 0)
    rc = fr_errorf(FR_ENOTFOUND, "%s: no %s in %s", name, pattern ? "matching .gguf file" : "config.json or .gguf file",
                   snap);
  else {
    char list[1024] = "";
    for (int i = 0; i < n; i++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", files[i]);
    rc = fr_errorf(FR_EFORMAT, "%s: %d .gguf files match; name one, as %s:Q4_K_M (files: %s)", name, n,
                   name, list);
  }
  for (int i = 0; i < n; i++) free(files[i]);
  return rc;
}

int cli_hf_find(const char *name, char *out, size_t cap) {
  int rc = cli_hf_resolve(name, out, cap);
  if (rc == FR_ENOTFOUND && cli_hf_offline())
    return fr_errorf(rc, "%s (HF_HUB_OFFLINE is set: nothing is downloaded)", fr_last_error());
  if (rc == FR_ENOTFOUND) {
    rc = cli_hf_pull(name, NULL);
    if (!rc) rc = cli_hf_resolve(name, out, cap);
  }
  return rc;
}

int cli_model_resolve(const char *arg, char *out, size_t cap) {
  struct stat st;
  if (stat(arg, &st) != 0 && cli_hf_is_name(arg)) {
    char snap[HF_PATH];
    int rc = cli_hf_find(arg, snap, sizeof snap);
    return rc ? rc : cli_model_path_abs(snap, out, cap);
  }
  return cli_model_path_abs(arg, out, cap);
}

/* ---- ferrumctl list / rm ----------------------------------------------------------- */

/* Bytes of the files directly in dir (a repository's blobs), as huggingface_hub counts them. */
static unsigned long long hf_dir_bytes(const char *dir) {
  unsigned long long total = 0;
  DIR *d = opendir(dir);
  char p[HF_PATH];
  struct stat st;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] != '.' && hf_fmt(p, "%s/%s", dir, e->d_name) && stat(p, &st) == 0 && S_ISREG(st.st_mode))
      total += (unsigned long long)st.st_size;
  }
  if (d) closedir(d);
  return total;
}

/* One line per snapshot of the repository folder models--ORG--NAME. */
static void hf_list_repo(const char *cache, const char *entry) {
  char id[512], repo[HF_PATH], dir[HF_PATH];
  const char *sep = strstr(entry + 8, "--");
  if (!sep) return;
  snprintf(id, sizeof id, "%.*s/%s", (int)(sep - entry - 8), entry + 8, sep + 2);
  if (!hf_fmt(repo, "%s/%s", cache, entry) || !hf_fmt(dir, "%s/blobs", repo)) return;
  unsigned long long bytes = hf_dir_bytes(dir);
  DIR *d = hf_fmt(dir, "%s/snapshots", repo) ? opendir(dir) : NULL;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char snap[HF_PATH], cfg[HF_PATH], *files[64];
    if (!hf_fmt(snap, "%s/%s", dir, e->d_name) || !hf_fmt(cfg, "%s/config.json", snap)) continue;
    int n = hf_ggufs(snap, NULL, files, 64);
    printf("%-48s %-12.12s %10.1f MB  %s", id, e->d_name, (double)bytes / 1e6,
           access(cfg, R_OK) == 0 ? "safetensors folder" : n ? "" : "(nothing ferrum loads)");
    for (int i = 0; i < n; i++) {
      printf("%s%s", i ? " " : "", files[i]);
      free(files[i]);
    }
    printf("\n");
  }
  if (d) closedir(d);
}

static int hf_names_cmp(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static int hf_is_repo(const struct dirent *e) { return !strncmp(e->d_name, "models--", 8); }

int cli_cmd_list(int argc, char **argv) {
  if (argc > 1) {
    printf("usage: ferrumctl list\n  the models in the Hugging Face cache (HF_HUB_CACHE, HF_HOME/hub, "
           "~/.cache/huggingface/hub): id, revision, size, what loads\n");
    return strcmp(argv[1], "--help") && strcmp(argv[1], "-h") ? 2 : 0;
  }
  char cache[HF_PATH];
  if (cli_hf_cache_dir(cache, sizeof cache)) return 1;
  struct dirent **es;
  int n = scandir(cache, &es, hf_is_repo, hf_names_cmp);
  if (n < 0) {
    printf("no models: %s does not exist\n", cache);
    return 0;
  }
  for (int i = 0; i < n; i++) {
    hf_list_repo(cache, es[i]->d_name);
    free(es[i]);
  }
  free(es);
  return 0;
}

static int hf_rm_one(const char *p, const struct stat *st, int type, struct FTW *ftw) {
  (void)st, (void)type, (void)ftw;
  return remove(p) == 0 ? 0 : -1;
}

int cli_cmd_rm(int argc, char **argv) {
  if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    printf("usage: ferrumctl rm ORG/NAME\n  deletes a model (every revision) from the Hugging Face cache\n");
    return argc == 2 ? 0 : 2;
  }
  char cache[HF_PATH], repo[HF_PATH];
  struct stat st;
  if (!cli_hf_is_name(argv[1]) || strchr(argv[1], ':')) {
    fprintf(stderr, "ferrumctl rm: '%s' is not a model name (ORG/NAME)\n", argv[1]);
    return 2;
  }
  if (cli_hf_cache_dir(cache, sizeof cache) || hf_repo_dir(cache, argv[1], repo, sizeof repo)) return 1;
  if (stat(repo, &st) != 0) {
    fprintf(stderr, "ferrumctl rm: %s is not in the Hugging Face cache (%s)\n", argv[1], cache);
    return 1;
  }
  if (nftw(repo, hf_rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    fprintf(stderr, "ferrumctl rm: removing %s: %s\n", repo, strerror(errno));
    return 1;
  }
  printf("removed %s (%s)\n", argv[1], repo);
  return 0;
}
