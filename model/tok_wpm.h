/* tok_wpm.h - private to the WordPiece tokenizer (tok_wpm.c): the Unicode
 * tables model/gen_wpm_tables.py generates into tok_wpm_tables.c. Every
 * table is sorted by its first column. */
#pragma once

#include <stddef.h>
#include <stdint.h>

extern const uint32_t tok__wpm_other[][2]; /* ranges of categories Cc, Cf, Co, Cs */
extern const size_t tok__wpm_other_n;
extern const uint32_t tok__wpm_punct[][2]; /* ranges of categories P* */
extern const size_t tok__wpm_punct_n;
extern const uint32_t tok__wpm_mn[][2];    /* ranges of category Mn */
extern const size_t tok__wpm_mn_n;
extern const uint32_t tok__wpm_nfd_pool[];
extern const uint32_t tok__wpm_nfd[][3];   /* code point, first in the pool, count */
extern const size_t tok__wpm_nfd_n;
extern const uint32_t tok__wpm_lower[][2]; /* code point, its lowercase */
extern const size_t tok__wpm_lower_n;
