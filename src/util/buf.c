/* Growable byte buffers. */
#include "util/buf.h"

#include <stdlib.h>
#include <string.h>

#include "util/status.h"

zb_status
zb__buf_reserve(zb__buf *b, size_t n)
{
    if (n <= b->cap) return ZB_OK;
    if (n > ZB_BUF_MAX) return zb__err(ZB_E_OVERFLOW, "buffer of %zu bytes exceeds the cap", n);
    size_t cap = b->cap ? b->cap : 256;
    while (cap < n) cap = cap > ZB_BUF_MAX / 2 ? ZB_BUF_MAX : cap * 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p) return zb__err(ZB_E_NOMEM, "cannot allocate %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return ZB_OK;
}

zb_status
zb__buf_append(zb__buf *b, const void *src, size_t n)
{
    if (n == 0) return ZB_OK;
    if (b->len > SIZE_MAX - n) return zb__err(ZB_E_OVERFLOW, "buffer length overflows");
    ZB_TRY(zb__buf_reserve(b, b->len + n));
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return ZB_OK;
}

zb_status
zb__buf_for_read(zb__buf *b, uint64_t offset, size_t n, uint8_t **dst)
{
    if (n > ZB_BUF_MAX - 64)
        return zb__err(ZB_E_OVERFLOW, "buffer of %zu bytes exceeds the cap", n);
    ZB_TRY(zb__buf_reserve(b, n + 63));
    *dst = b->data + ((offset - (uintptr_t)b->data) & 63);
    return ZB_OK;
}

void
zb__buf_free(zb__buf *b)
{
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
