/* A growable byte buffer with a hard cap. */
#ifndef ZB_UTIL_BUF_H
#define ZB_UTIL_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

/* Upper bound for any buffer grown from storage-controlled sizes (16 GiB). */
#define ZB_BUF_MAX ((size_t)1 << 34)

typedef struct zb__buf {
    uint8_t *data;
    size_t len;
    size_t cap;
} zb__buf;

/* Ensures cap >= n (contents kept); ZB_E_NOMEM on failure, ZB_E_OVERFLOW above ZB_BUF_MAX. */
zb_status zb__buf_reserve(zb__buf *b, size_t n);
/* Appends `n` bytes. */
zb_status zb__buf_append(zb__buf *b, const void *src, size_t n);
void zb__buf_free(zb__buf *b);
/* A destination inside `b` for `n` bytes read from storage offset `offset`: reserves n + 63
 * bytes and sets *dst congruent to `offset` modulo 64. The kernel's copy out of the page cache
 * slows down several-fold when destination and source lie a few bytes apart modulo the page
 * (docs/PERFORMANCE.md, "Figures behind the code's decisions"); congruent addresses never do. */
zb_status zb__buf_for_read(zb__buf *b, uint64_t offset, size_t n, uint8_t **dst);

/* Overflow-checked arithmetic: return false on overflow. */
static inline int
zb__mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline int
zb__add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

#endif
