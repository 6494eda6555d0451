/* tok_unicode.c - UTF-8 helpers and the GPT-2 byte <-> unicode mapping. */
#include <stdint.h>

#include "model/tok_internal.h"

/* The valid range of the second byte for each lead byte (Unicode table 3-7). */
static int utf8_expect(unsigned char c, unsigned char *lo, unsigned char *hi) {
  *lo = 0x80, *hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c == 0xE0) { *lo = 0xA0; return 3; }
  if (c >= 0xE1 && c <= 0xEC) return 3;
  if (c == 0xED) { *hi = 0x9F; return 3; }
  if (c >= 0xEE && c <= 0xEF) return 3;
  if (c == 0xF0) { *lo = 0x90; return 4; }
  if (c >= 0xF1 && c <= 0xF3) return 4;
  if (c == 0xF4) { *hi = 0x8F; return 4; }
  return 0;
}

int tok__utf8_prefix(const unsigned char *s, size_t n, int *full) {
  unsigned char lo, hi;
  int need = utf8_expect(s[0], &lo, &hi);
  *full = 0;
  if (need == 0) return 1;
  if (need == 1) { *full = 1; return 1; }
  int i = 1;
  for (; i < need && (size_t)i < n; i++) {
    unsigned char c = s[i];
    if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
  }
  *full = (i == need) ? 1 : ((size_t)i == n ? 2 : 0);
  return i;
}

int tok__utf8_len(const unsigned char *s, size_t n) {
  if (n == 0) return 0;
  int full, l = tok__utf8_prefix(s, n, &full);
  return full == 1 ? l : 0;
}

uint32_t tok__utf8_cp(const unsigned char *s, int l) {
  switch (l) {
  case 1: return s[0];
  case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
  case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
  default:
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
  }
}

int tok__utf8_put(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

static bool byte_is_printable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok__byte_to_cp(uint8_t b) {
  if (byte_is_printable(b)) return b;
  int n = 0; /* index among the non-printable bytes, in byte order */
  for (int i = 0; i < b; i++) n += !byte_is_printable(i);
  return 256u + (uint32_t)n;
}

int tok__cp_to_byte(uint32_t cp) {
  if (cp < 256) return byte_is_printable((int)cp) ? (int)cp : -1;
  if (cp >= 256 + 68) return -1;
  int n = (int)(cp - 256);
  for (int i = 0; i < 256; i++) {
    if (!byte_is_printable(i) && n-- == 0) return i;
  }
  return -1;
}

size_t tok__utf8_lossy(const unsigned char *in, size_t n, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    int full, l = tok__utf8_prefix(in + i, n - i, &full);
    if (full == 1) {
      for (int k = 0; k < l; k++) out[o++] = (char)in[i + k];
    } else {
      o += (size_t)tok__utf8_put(0xFFFD, out + o);
    }
    i += (size_t)l;
  }
  return o;
}

bool tok__is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
