/* hf_pull.c - downloads a model by its Hub name ("org/name", or
 * "org/name:PATTERN" for one GGUF file) into the cache that huggingface_hub
 * keeps, laid out as huggingface_hub lays it out, so that either tool reads
 * what the other downloaded:
 *
 *   models--ORG--NAME/blobs/ETAG            the file (ETAG: the LFS sha256,
 *                                           or the git blob sha1 of a small file)
 *   models--ORG--NAME/blobs/ETAG.incomplete a download in progress (resumed)
 *   models--ORG--NAME/snapshots/COMMIT/FILE a relative symlink to the blob
 *   models--ORG--NAME/refs/REVISION         the commit REVISION points at
 *   .locks/models--ORG--NAME/ETAG.lock      held (flock) while a blob is written
 *
 * The Hub's HTTP API, as huggingface_hub calls it: GET
 * ENDPOINT/api/models/REPO/revision/REV lists the files and the commit; HEAD
 * ENDPOINT/REPO/resolve/COMMIT/FILE gives X-Repo-Commit, X-Linked-Etag (or
 * ETag), X-Linked-Size (or Content-Length) and, for large files, a redirect
 * to where the bytes are. Each download is checked against its etag (sha256
 * for LFS files, the git blob sha1 otherwise) before it becomes a blob.
 * HF_ENDPOINT, HF_TOKEN (or the token file huggingface_hub writes) and
 * HF_HUB_OFFLINE are honoured. */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "ctl/cli.h"

#define HF_PATH 4096
#define HF_MAX_FILES 256
#define HF_RETRIES 5

typedef struct {
  char name[512];       /* path in the repository */
  char etag[80];        /* sha256 (64 hex) or git sha1 (40 hex) */
  char location[HF_PATH]; /* where the bytes are (the resolve URL or its redirect) */
  long long size;       /* -1: unknown */
} hf_file_t;

typedef struct {
  char endpoint[512];     /* HF_ENDPOINT (no trailing '/') or the Hub */
  char auth[1024];        /* "Authorization: Bearer ..." or "" */
  char repo_id[256];      /* org/name */
  char repo_dir[HF_PATH]; /* cache/models--org--name */
  char lock_dir[HF_PATH]; /* cache/.locks/models--org--name */
  char commit[64];
  bool progress;          /* stderr is a terminal: redraw one line */
} hf_pull_t;

/* Headers of one response (the last one when redirects are followed). */
typedef struct {
  long status;
  char commit[64], linked_etag[96], etag[96], location[HF_PATH];
  long long linked_size, length;
} hf_headers_t;

/* ---- small helpers ------------------------------------------------------------------ */

bool cli_hf_offline(void) {
  const char *v = getenv("HF_HUB_OFFLINE");
  return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

/* Whether s is n lowercase hex digits. */
static bool hf_is_hex(const char *s, size_t n) {
  if (strlen(s) != n) return false;
  for (size_t i = 0; i < n; i++)
    if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i])) return false;
  return true;
}

/* A repository file name that stays inside the snapshot: no "..", no
 * absolute path, no empty part. */
static bool hf_safe_name(const char *s) {
  if (!*s || s[0] == '/' || strlen(s) >= 512) return false;
  for (const char *p = s; *p;) {
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return false;
    p += n + (e ? 1 : 0);
  }
  return true;
}

static int hf_mkdirs(const char *path) {
  char p[HF_PATH];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = '\0';
      if (mkdir(p, 0755) != 0 && errno != EEXIST) return fr_errorf(-errno, "mkdir %s: %s", p, strerror(errno));
      *s = '/';
    }
  if (mkdir(p, 0755) != 0 && errno != EEXIST) return fr_errorf(-errno, "mkdir %s: %s", p, strerror(errno));
  return 0;
}

/* The token: HF_TOKEN, else the file huggingface_hub's login writes
 * (HF_TOKEN_PATH, else HF_HOME/token, else ~/.cache/huggingface/token). */
static void hf_token(char *out, size_t cap) {
  const char *t = getenv("HF_TOKEN");
  out[0] = '\0';
  if (t && *t) {
    snprintf(out, cap, "%s", t);
    return;
  }
  char path[HF_PATH];
  const char *tp = getenv("HF_TOKEN_PATH"), *home = getenv("HF_HOME"), *user = getenv("HOME");
  if (tp && *tp) snprintf(path, sizeof path, "%s", tp);
  else if (home && *home) snprintf(path, sizeof path, "%s/token", home);
  else snprintf(path, sizeof path, "%s/.cache/huggingface/token", user ? user : "");
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (!fgets(out, (int)cap, f)) out[0] = '\0';
  out[strcspn(out, "\r\n")] = '\0';
  fclose(f);
}

/* ---- HTTP ---------------------------------------------------------------------------- */

/* Copies header value v (n bytes, trimmed) into out. */
static void hf_hdr_copy(char *out, size_t cap, const char *v, size_t n) {
  while (n && (*v == ' ' || *v == '\t')) v++, n--;
  while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
  if (n >= cap) n = cap - 1;
  memcpy(out, v, n);
  out[n] = '\0';
}

static size_t hf_on_header(char *line, size_t size, size_t n, void *arg) {
  hf_headers_t *h = arg;
  size_t len = size * n;
  if (len >= 5 && !strncmp(line, "HTTP/", 5)) { /* a new response (after a redirect): start over */
    memset(h, 0, sizeof *h);
    h->linked_size = h->length = -1;
    const char *sp = memchr(line, ' ', len);
    h->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    return len;
  }
  const char *colon = memchr(line, ':', len);
  if (!colon) return len;
  size_t k = (size_t)(colon - line), vn = len - k - 1;
  const char *v = colon + 1;
  char tmp[32];
#define HF_IS(name) (k == sizeof(name) - 1 && !strncasecmp(line, name, k))
  if (HF_IS("X-Repo-Commit")) hf_hdr_copy(h->commit, sizeof h->commit, v, vn);
  else if (HF_IS("X-Linked-Etag")) hf_hdr_copy(h->linked_etag, sizeof h->linked_etag, v, vn);
  else if (HF_IS("ETag")) hf_hdr_copy(h->etag, sizeof h->etag, v, vn);
  else if (HF_IS("Location")) hf_hdr_copy(h->location, sizeof h->location, v, vn);
  else if (HF_IS("X-Linked-Size")) hf_hdr_copy(tmp, sizeof tmp, v, vn), h->linked_size = atoll(tmp);
  else if (HF_IS("Content-Length")) hf_hdr_copy(tmp, sizeof tmp, v, vn), h->length = atoll(tmp);
#undef HF_IS
  return len;
}

/* Whether url is on the Hub's endpoint (scheme, host and port): the token
 * goes there only, never to the CDN a large file redirects to. */
static bool hf_on_endpoint(const hf_pull_t *p, const char *url) {
  size_t n = strlen(p->endpoint);
  return !strncmp(url, p->endpoint, n) && (url[n] == '/' || url[n] == '\0');
}

/* A curl handle with the common options: the token, a user agent, timeouts
 * that notice a stalled connection (no byte for 30 s) but not a slow one. */
static CURL *hf_curl(const hf_pull_t *p, const char *url, struct curl_slist **hdrs, hf_headers_t *h) {
  CURL *c = curl_easy_init();
  if (!c) return NULL;
  *hdrs = curl_slist_append(NULL, "Accept-Encoding: identity");
  if (p->auth[0] && hf_on_endpoint(p, url)) *hdrs = curl_slist_append(*hdrs, p->auth);
  memset(h, 0, sizeof *h);
  h->linked_size = h->length = -1;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "ferrum; hf_hub-compatible");
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, hf_on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 20L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  return c;
}

/* The error for an HTTP status other than 2xx. */
static int hf_status_error(const hf_pull_t *p, long status, const char *what) {
  if (status == 401 || status == 403)
    return fr_errorf(FR_EAUTH, "%s: HTTP %ld for %s: no such repository, or a gated or private one that needs a "
                               "token that may read it (HF_TOKEN, or `huggingface-cli login`)", p->repo_id, status, what);
  if (status == 404)
    return fr_errorf(FR_ENOTFOUND, "%s: HTTP 404 for %s: no such repository, revision or file", p->repo_id, what);
  return fr_errorf(FR_EPROTO, "%s: HTTP %ld for %s", p->repo_id, status, what);
}

typedef struct {
  char *data;
  size_t len, cap;
} hf_buf_t;

static size_t hf_on_body(char *d, size_t size, size_t n, void *arg) {
  hf_buf_t *b = arg;
  size_t len = size * n;
  if (b->len + len + 1 > (4u << 20)) return 0; /* a listing past 4 MiB is not the Hub's */
  if (b->len + len + 1 > b->cap) {
    b->cap = (b->len + len + 1) * 2;
    b->data = realloc(b->data, b->cap);
    if (!b->data) abort();
  }
  memcpy(b->data + b->len, d, len);
  b->len += len;
  b->data[b->len] = '\0';
  return len;
}

/* GET url into a JSON document (*out, owned by the caller). */
static int hf_get_json(const hf_pull_t *p, const char *url, json_t **out) {
  struct curl_slist *hdrs = NULL;
  hf_headers_t h;
  hf_buf_t b = {0};
  CURL *c = hf_curl(p, url, &hdrs, &h);
  if (!c) return fr_errorf(-ENOMEM, "curl_easy_init failed");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hf_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  CURLcode cc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  curl_slist_free_all(hdrs);
  int rc = 0;
  if (cc != CURLE_OK) rc = fr_errorf(FR_EPROTO, "%s: %s: %s", p->repo_id, url, curl_easy_strerror(cc));
  else if (status < 200 || status >= 300) rc = hf_status_error(p, status, url);
  else {
    json_error_t je;
    *out = json_loadb(b.data ? b.data : "", b.len, 0, &je);
    if (!*out) rc = fr_errorf(FR_EFORMAT, "%s: %s: not JSON: %s", p->repo_id, url, je.text);
  }
  free(b.data);
  return rc;
}

/* HEAD the file's resolve URL (relative redirects followed, as huggingface_hub
 * does; an absolute one is where the bytes are) into f. */
static int hf_head(const hf_pull_t *p, hf_file_t *f) {
  char url[HF_PATH];
  snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", p->endpoint, p->repo_id, p->commit, f->name);
  for (int hops = 0; hops < 5; hops++) {
    struct curl_slist *hdrs = NULL;
    hf_headers_t h;
    CURL *c = hf_curl(p, url, &hdrs, &h);
    if (!c) return fr_errorf(-ENOMEM, "curl_easy_init failed");
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    if (cc != CURLE_OK) return fr_errorf(FR_EPROTO, "%s: HEAD %s: %s", p->repo_id, url, curl_easy_strerror(cc));
    bool redirect = status >= 300 && status < 400 && h.location[0];
    if (redirect && h.location[0] == '/') { /* relative: a renamed repository; ask again there */
      snprintf(url, sizeof url, "%s%s", p->endpoint, h.location);
      continue;
    }
    if (!redirect && (status < 200 || status >= 300)) return hf_status_error(p, status, f->name);
    const char *etag = h.linked_etag[0] ? h.linked_etag : h.etag;
    if (!strncmp(etag, "W/", 2)) etag += 2;
    size_t n = strlen(etag);
    if (n >= 2 && etag[0] == '"') etag++, n -= 2;
    snprintf(f->etag, sizeof f->etag, "%.*s", (int)n, etag);
    if (!hf_is_hex(f->etag, 64) && !hf_is_hex(f->etag, 40))
      return fr_errorf(FR_EFORMAT, "%s: %s: the server's etag '%s' is neither a sha256 nor a git sha1", p->repo_id,
                       f->name, f->etag);
    f->size = h.linked_size >= 0 ? h.linked_size : redirect ? -1 : h.length;
    snprintf(f->location, sizeof f->location, "%s", redirect ? h.location : url);
    return 0;
  }
  return fr_errorf(FR_EPROTO, "%s: %s: too many redirects", p->repo_id, f->name);
}

/* ---- one blob ------------------------------------------------------------------------ */

typedef struct {
  FILE *out;
  const hf_pull_t *p;
  const hf_file_t *f;
  const hf_headers_t *h; /* the response being received */
  bool ranged;           /* this GET asked for a range: a 200 starts over */
  long long have;        /* bytes on disk, this transfer's included */
  struct timespec last;  /* last progress line */
} hf_xfer_t;

/* Appends body bytes, but a 2xx other than 206 to a ranged request is the
 * whole file (the server ignored the range): truncate and start over. */
static size_t hf_on_blob(char *d, size_t size, size_t n, void *arg) {
  hf_xfer_t *x = arg;
  if (x->h->status >= 200 && x->h->status < 300 && x->h->status != 206 && x->ranged) {
    x->ranged = false;
    if (ftruncate(fileno(x->out), 0) != 0 || fseek(x->out, 0, SEEK_SET) != 0) return 0;
    x->have = 0;
  }
  if (x->h->status < 200 || x->h->status >= 300) return size * n; /* an error page: not the file */
  size_t w = fwrite(d, size, n, x->out);
  x->have += (long long)(w * size);
  return w * size;
}

static void hf_progress(hf_xfer_t *x, bool last) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  double dt = (double)(now.tv_sec - x->last.tv_sec) + (double)(now.tv_nsec - x->last.tv_nsec) / 1e9;
  if (!last && dt < (x->p->progress ? 0.25 : 10.0)) return;
  x->last = now;
  double mb = (double)x->have / 1e6, total = (double)x->f->size / 1e6;
  if (x->f->size > 0)
    fprintf(stderr, "%s%s: %.1f / %.1f MB (%.0f%%)%s", x->p->progress ? "\r" : "", x->f->name, mb, total,
            100.0 * mb / total, x->p->progress && !last ? "" : "\n");
  else
    fprintf(stderr, "%s%s: %.1f MB%s", x->p->progress ? "\r" : "", x->f->name, mb, x->p->progress && !last ? "" : "\n");
}

static int hf_on_xferinfo(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
  (void)dt, (void)dn, (void)ut, (void)un;
  hf_progress(arg, false);
  return 0;
}

/* One GET of f's bytes from offset x->have on, appended to x->out. Returns
 * 0 when the body is complete, 1 when the transfer broke off (retry). */
static int hf_get_once(const hf_pull_t *p, const hf_file_t *f, hf_xfer_t *x) {
  struct curl_slist *hdrs = NULL;
  hf_headers_t h;
  CURL *c = hf_curl(p, f->location, &hdrs, &h);
  if (!c) return fr_errorf(-ENOMEM, "curl_easy_init failed");
  char range[64];
  x->h = &h;
  x->ranged = x->have > 0;
  if (x->ranged) {
    snprintf(range, sizeof range, "%lld-", x->have);
    curl_easy_setopt(c, CURLOPT_RANGE, range);
  }
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hf_on_blob);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, hf_on_xferinfo);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
  CURLcode cc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  curl_slist_free_all(hdrs);
  fflush(x->out);
  if (status == 416 && f->size >= 0 && x->have == f->size) return 0; /* already whole */
  if (status && (status < 200 || status >= 300)) {
    if (status >= 500 || status == 429) return 1;
    return hf_status_error(p, status, f->name);
  }
  if (cc == CURLE_WRITE_ERROR) return fr_errorf(-EIO, "%s: writing %s: %s", p->repo_id, f->name, strerror(errno));
  return cc == CURLE_OK ? 0 : 1;
}

/* Opens the .incomplete file for appending; *have gets its size. */
static FILE *hf_open_partial(const char *path, long long *have) {
  FILE *out = fopen(path, "ab");
  struct stat st;
  *have = out && fstat(fileno(out), &st) == 0 ? (long long)st.st_size : 0;
  return out;
}

/* The file's digest as lowercase hex: sha256, or the git blob sha1
 * ("blob SIZE\0" + bytes) when the etag is 40 digits. */
static int hf_digest(const char *path, size_t etag_len, char *hex) {
  FILE *in = fopen(path, "rb");
  if (!in) return fr_errorf(-errno, "%s: %s", path, strerror(errno));
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  bool sha1 = etag_len == 40;
  EVP_DigestInit_ex(md, sha1 ? EVP_sha1() : EVP_sha256(), NULL);
  if (sha1) {
    struct stat st;
    char head[64];
    int n = fstat(fileno(in), &st) == 0 ? snprintf(head, sizeof head, "blob %lld", (long long)st.st_size) : 0;
    EVP_DigestUpdate(md, head, (size_t)n + 1); /* with its NUL */
  }
  static unsigned char buf[1 << 20];
  for (size_t n; (n = fread(buf, 1, sizeof buf, in)) > 0;) EVP_DigestUpdate(md, buf, n);
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned dn = 0;
  EVP_DigestFinal_ex(md, d, &dn);
  EVP_MD_CTX_free(md);
  int bad = ferror(in);
  fclose(in);
  for (unsigned i = 0; i < dn; i++) sprintf(hex + 2 * i, "%02x", d[i]);
  return bad ? fr_errorf(-EIO, "%s: read error", path) : 0;
}

/* Downloads f into blobs/ETAG (resuming blobs/ETAG.incomplete), retrying a
 * transfer that breaks off, and checks its digest. */
static int hf_fetch_blob(const hf_pull_t *p, const hf_file_t *f, const char *blob) {
  char part[HF_PATH + 256], hex[2 * EVP_MAX_MD_SIZE + 1];
  snprintf(part, sizeof part, "%s.incomplete", blob);
  hf_xfer_t x = {.p = p, .f = f};
  int rc = 1;
  for (int attempt = 0; rc == 1 && attempt <= HF_RETRIES; attempt++) {
    if (attempt) {
      fprintf(stderr, "%s: transfer broke off at %.1f MB; resuming (try %d of %d)\n", f->name, (double)x.have / 1e6,
              attempt, HF_RETRIES);
      sleep((unsigned)attempt);
    }
    if (!(x.out = hf_open_partial(part, &x.have))) return fr_errorf(-errno, "%s: %s", part, strerror(errno));
    if (f->size >= 0 && x.have > f->size) { /* longer than the file: not ours to resume */
      fclose(x.out);
      if (!(x.out = fopen(part, "wb"))) return fr_errorf(-errno, "%s: %s", part, strerror(errno));
      x.have = 0;
    }
    rc = f->size >= 0 && x.have == f->size ? 0 : hf_get_once(p, f, &x);
    fclose(x.out);
  }
  if (rc == 1) return fr_errorf(FR_EPROTO, "%s: %s: the download kept breaking off (%d tries); run again to resume",
                                p->repo_id, f->name, HF_RETRIES + 1);
  if (rc) return rc;
  hf_progress(&x, true);
  struct stat st;
  if (stat(part, &st) != 0 || (f->size >= 0 && st.st_size != f->size)) {
    unlink(part);
    return fr_errorf(FR_ETRUNCATED, "%s: %s: got %lld bytes, the Hub says %lld", p->repo_id, f->name,
                     (long long)st.st_size, f->size);
  }
  if ((rc = hf_digest(part, strlen(f->etag), hex))) return rc;
  if (strcmp(hex, f->etag)) {
    unlink(part);
    return fr_errorf(FR_EFORMAT, "%s: %s: the downloaded bytes' %s is %s, not %s as the Hub says; removed it",
                     p->repo_id, f->name, strlen(f->etag) == 40 ? "git sha1" : "sha256", hex, f->etag);
  }
  if (rename(part, blob) != 0) return fr_errorf(-errno, "rename %s: %s", part, strerror(errno));
  return 0;
}

/* Makes blobs/ETAG exist, under the blob's lock (another ferrumctl or
 * huggingface_hub writing the same blob waits). */
static int hf_ensure_blob(const hf_pull_t *p, const hf_file_t *f) {
  char blob[HF_PATH + 128], lock[HF_PATH + 128];
  snprintf(blob, sizeof blob, "%s/blobs/%s", p->repo_dir, f->etag);
  snprintf(lock, sizeof lock, "%s/%s.lock", p->lock_dir, f->etag);
  struct stat st;
  if (stat(blob, &st) == 0 && (f->size < 0 || st.st_size == f->size)) return 0;
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return fr_errorf(-errno, "%s: %s", lock, strerror(errno));
  flock(fd, LOCK_EX);
  int rc = stat(blob, &st) == 0 && (f->size < 0 || st.st_size == f->size) ? 0 : hf_fetch_blob(p, f, blob);
  flock(fd, LOCK_UN);
  close(fd);
  return rc;
}

/* snapshots/COMMIT/NAME -> ../../blobs/ETAG (one more ../ per folder in NAME). */
static int hf_link(const hf_pull_t *p, const hf_file_t *f) {
  char path[HF_PATH + 600], target[HF_PATH], dir[HF_PATH + 600];
  snprintf(path, sizeof path, "%s/snapshots/%s/%s", p->repo_dir, p->commit, f->name);
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  int rc = hf_mkdirs(dir);
  if (rc) return rc;
  size_t n = 0;
  target[0] = '\0';
  for (const char *s = f->name; (s = strchr(s, '/')); s++) n += (size_t)snprintf(target + n, sizeof target - n, "../");
  snprintf(target + n, sizeof target - n, "../../blobs/%s", f->etag);
  unlink(path);
  if (symlink(target, path) != 0) return fr_errorf(-errno, "symlink %s: %s", path, strerror(errno));
  return 0;
}

/* ---- which files ------------------------------------------------------------------- */

static bool hf_suffix(const char *s, const char *sfx) {
  size_t a = strlen(s), b = strlen(sfx);
  return a >= b && !strcasecmp(s + a - b, sfx);
}

/* What ferrum loads from a safetensors repository: weights, configs,
 * tokenizer files and chat templates (top level only). */
static bool hf_wanted(const char *name) {
  if (strchr(name, '/')) return false;
  return hf_suffix(name, ".safetensors") || hf_suffix(name, ".json") || hf_suffix(name, ".jinja") ||
         !strcmp(name, "tokenizer.model");
}

/* Picks the files to download from the listing's siblings: the safetensors
 * folder when config.json is there (and no pattern), else the one .gguf
 * the pattern matches. */
static int hf_select(const hf_pull_t *p, json_t *siblings, const char *pattern, hf_file_t *files, int *n_files) {
  const char *names[HF_MAX_FILES];
  int n = 0, n_gguf = 0, has_config = 0;
  size_t i;
  json_t *s;
  json_array_foreach(siblings, i, s) {
    const char *name = json_string_value(json_object_get(s, "rfilename"));
    if (!name || !hf_safe_name(name)) continue;
    if (!strcmp(name, "config.json")) has_config = 1;
    if (hf_suffix(name, ".gguf") && (!pattern || strcasestr(name, pattern)) && n < HF_MAX_FILES) names[n++] = name;
  }
  n_gguf = n;
  if (!pattern && has_config) {
    n = 0;
    json_array_foreach(siblings, i, s) {
      const char *name = json_string_value(json_object_get(s, "rfilename"));
      if (name && hf_safe_name(name) && hf_wanted(name) && n < HF_MAX_FILES) names[n++] = name;
    }
  } else if (n_gguf != 1) {
    char list[1024] = "";
    for (int k = 0; k < n_gguf; k++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", names[k]);
    return n_gguf ? fr_errorf(FR_EFORMAT, "%s: %d .gguf files match; name one, as %s:Q4_K_M (files: %s)",
                              p->repo_id, n_gguf, p->repo_id, list)
                  : fr_errorf(FR_ENOTFOUND, "%s: no %s in the repository", p->repo_id,
                              pattern ? "matching .gguf file" : "config.json or .gguf file");
  }
  for (int k = 0; k < n; k++) {
    memset(&files[k], 0, sizeof files[k]);
    snprintf(files[k].name, sizeof files[k].name, "%s", names[k]);
  }
  *n_files = n;
  return 0;
}

/* ---- the pull ---------------------------------------------------------------------- */

static int hf_pull_init(hf_pull_t *p, const char *name) {
  memset(p, 0, sizeof *p);
  const char *ep = getenv("HF_ENDPOINT");
  snprintf(p->endpoint, sizeof p->endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
  for (size_t n = strlen(p->endpoint); n && p->endpoint[n - 1] == '/';) p->endpoint[--n] = '\0';
  char token[512], cache[HF_PATH];
  hf_token(token, sizeof token);
  if (token[0]) snprintf(p->auth, sizeof p->auth, "Authorization: Bearer %s", token);
  const char *colon = strchr(name, ':');
  snprintf(p->repo_id, sizeof p->repo_id, "%.*s", colon ? (int)(colon - name) : (int)strlen(name), name);
  int rc = cli_hf_cache_dir(cache, sizeof cache);
  if (rc) return rc;
  char folder[300];
  snprintf(folder, sizeof folder, "models--%s", p->repo_id);
  *strchr(folder, '/') = '\0';
  snprintf(folder + strlen(folder), sizeof folder - strlen(folder), "--%s", strchr(p->repo_id, '/') + 1);
  int a = snprintf(p->repo_dir, sizeof p->repo_dir, "%s/%s", cache, folder);
  int b = snprintf(p->lock_dir, sizeof p->lock_dir, "%s/.locks/%s", cache, folder);
  if (a < 0 || b < 0 || (size_t)a >= sizeof p->repo_dir || (size_t)b >= sizeof p->lock_dir)
    return fr_errorf(FR_ETOOBIG, "%s: cache path too long", name);
  p->progress = isatty(STDERR_FILENO);
  return 0;
}

/* The listing of REVISION: its commit into p->commit, its files' names. */
static int hf_list(hf_pull_t *p, const char *revision, const char *pattern, hf_file_t *files, int *n) {
  char url[HF_PATH], *rev = curl_easy_escape(NULL, revision, 0);
  snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", p->endpoint, p->repo_id, rev ? rev : revision);
  curl_free(rev);
  json_t *info = NULL;
  int rc = hf_get_json(p, url, &info);
  if (rc) return rc;
  const char *sha = json_string_value(json_object_get(info, "sha"));
  json_t *siblings = json_object_get(info, "siblings");
  if (!sha || !hf_is_hex(sha, 40) || !json_is_array(siblings))
    rc = fr_errorf(FR_EFORMAT, "%s: the Hub's listing has no commit sha or file list", p->repo_id);
  else {
    snprintf(p->commit, sizeof p->commit, "%s", sha);
    rc = hf_select(p, siblings, pattern, files, n);
  }
  json_decref(info);
  return rc;
}

static int hf_write_ref(const hf_pull_t *p, const char *revision) {
  if (!strcmp(revision, p->commit)) return 0;
  char path[HF_PATH + 300], tmp[HF_PATH + 310];
  snprintf(path, sizeof path, "%s/refs/%s", p->repo_dir, revision);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  char dir[HF_PATH + 300];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  int rc = hf_mkdirs(dir);
  FILE *f = rc ? NULL : fopen(tmp, "w");
  if (!f) return rc ? rc : fr_errorf(-errno, "%s: %s", tmp, strerror(errno));
  fputs(p->commit, f);
  if (fclose(f) != 0 || rename(tmp, path) != 0) return fr_errorf(-errno, "%s: %s", path, strerror(errno));
  return 0;
}

int cli_hf_pull(const char *name, const char *revision) {
  if (!cli_hf_is_name(name)) return fr_errorf(-EINVAL, "'%s' is not a model name (ORG/NAME[:PATTERN])", name);
  if (!revision || !*revision) revision = "main";
  if (strstr(revision, "..") || revision[0] == '/' || strlen(revision) > 200)
    return fr_errorf(-EINVAL, "'%s' is not a revision", revision);
  if (cli_hf_offline())
    return fr_errorf(FR_ENOTFOUND, "%s is not in the Hugging Face cache and HF_HUB_OFFLINE is set: nothing is "
                                   "downloaded", name);
  fprintf(stderr, "pulling %s (revision %s) from %s\n", name, revision,
          getenv("HF_ENDPOINT") && *getenv("HF_ENDPOINT") ? getenv("HF_ENDPOINT") : "the Hub");
  hf_pull_t p;
  static hf_file_t files[HF_MAX_FILES];
  int n = 0, rc = hf_pull_init(&p, name);
  const char *colon = strchr(name, ':');
  if (!rc) rc = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : fr_errorf(-ENOMEM, "curl_global_init");
  if (!rc) rc = hf_list(&p, revision, colon ? colon + 1 : NULL, files, &n);
  char blobs[HF_PATH + 8];
  snprintf(blobs, sizeof blobs, "%s/blobs", p.repo_dir);
  if (!rc) rc = hf_mkdirs(blobs);
  if (!rc) rc = hf_mkdirs(p.lock_dir);
  for (int i = 0; !rc && i < n; i++) {
    rc = hf_head(&p, &files[i]);
    if (!rc) rc = hf_ensure_blob(&p, &files[i]);
    if (!rc) rc = hf_link(&p, &files[i]);
  }
  if (!rc) rc = hf_write_ref(&p, revision);
  if (!rc) fprintf(stderr, "pulled %s (revision %s, commit %.12s, %d file%s) into %s\n", name, revision, p.commit, n,
                   n == 1 ? "" : "s", p.repo_dir);
  return rc;
}
