/* fuzz_hf_listing.c - libFuzzer target over the reader of the Hub's file
 * listing (ferrumctl pull, ctl/hf_pull.c): any bytes as the JSON body; the
 * first byte picks the pattern (none, "Q4_K_M", "gguf"). A listing read
 * gives a 40-digit commit and file names that stay inside the snapshot. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/fr_util.h"
#include "ctl/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether name stays inside a folder: relative, no empty, "." or ".." part. */
static int inside(const char *name) {
  if (!*name || name[0] == '/') return 0;
  for (const char *p = name;;) {
    size_t n = strcspn(p, "/");
    if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
    if (!p[n]) return 1;
    p += n + 1;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const char *const patterns[] = {NULL, "Q4_K_M", "gguf"};
  static char names[64][512];
  char commit[41];
  int n = cli_hf_listing_files("org/name", (const char *)data + 1, size - 1, patterns[data[0] % 3], commit, names, 64);
  if (n < 0) return 0;
  FR_ASSERT(n <= 64 && strlen(commit) == 40);
  for (int i = 0; i < n; i++) {
    size_t len = strnlen(names[i], 512);
    FR_ASSERT(len > 0 && len < 512 && inside(names[i]));
  }
  return 0;
}
