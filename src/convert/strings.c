/* Growing string tables (zb_strings) for the converter: gene lists, category tables. */
#include <stdlib.h>
#include <string.h>

#include "convert/convert_int.h"
#include "util/buf.h"
#include "util/status.h"

zb_status
cv_strbuf_push(cv_strbuf *b, const char *p, size_t len)
{
    if (!b->s.offsets) {
        b->s.offsets = malloc(16 * sizeof *b->s.offsets);
        if (!b->s.offsets) return zb__err(ZB_E_NOMEM, "a string table");
        b->s.offsets[0] = 0;
        b->cap_n = 15;
    }
    if (b->s.n == b->cap_n) {
        uint64_t *o = realloc(b->s.offsets, (size_t)(2 * b->cap_n + 1) * sizeof *o);
        if (!o) return zb__err(ZB_E_NOMEM, "a string table of %llu", (unsigned long long)b->s.n);
        b->s.offsets = o;
        b->cap_n *= 2;
    }
    uint64_t at = b->s.offsets[b->s.n];
    if (at + len + 1 > b->cap_bytes) {
        uint64_t cap = b->cap_bytes ? b->cap_bytes : 256;
        while (cap < at + len + 1) cap *= 2;
        if (cap > ZB_BUF_MAX)
            return zb__err(ZB_E_OVERFLOW, "a string table of %llu bytes", (unsigned long long)cap);
        char *d = realloc(b->s.data, (size_t)cap);
        if (!d) return zb__err(ZB_E_NOMEM, "a string table of %llu bytes", (unsigned long long)cap);
        b->s.data = d;
        b->cap_bytes = cap;
    }
    memcpy(b->s.data + at, p, len);
    b->s.data[at + len] = '\0'; /* not counted: the next string overwrites it */
    b->s.offsets[++b->s.n] = at + len;
    return ZB_OK;
}

zb_status
cv_strbuf_push_from(cv_strbuf *b, const zb_strings *s, uint64_t i)
{
    return cv_strbuf_push(b, s->data + s->offsets[i], (size_t)(s->offsets[i + 1] - s->offsets[i]));
}

bool
cv_strings_equal(const zb_strings *a, const zb_strings *b)
{
    if (a->n != b->n) return false;
    if (a->n == 0) return true;
    for (uint64_t i = 0; i < a->n; i++) {
        uint64_t la = a->offsets[i + 1] - a->offsets[i], lb = b->offsets[i + 1] - b->offsets[i];
        if (la != lb || memcmp(a->data + a->offsets[i], b->data + b->offsets[i], (size_t)la))
            return false;
    }
    return true;
}

/* Byte order of two items, shorter first on a common prefix (Python's str order for UTF-8). */
int
cv_strings_cmp(const zb_strings *a, uint64_t i, const zb_strings *b, uint64_t j)
{
    uint64_t la = a->offsets[i + 1] - a->offsets[i], lb = b->offsets[j + 1] - b->offsets[j];
    int c = memcmp(a->data + a->offsets[i], b->data + b->offsets[j], (size_t)(la < lb ? la : lb));
    if (c) return c;
    return la < lb ? -1 : la > lb ? 1 : 0;
}
