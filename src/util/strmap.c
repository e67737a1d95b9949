/* String -> index map (strmap.h). */
#include <stdlib.h>
#include <string.h>

#include "util/status.h"
#include "util/strmap.h"

static uint64_t
fnv1a(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static const char *
key_at(const zb_strings *k, uint64_t i, size_t *len)
{
    *len = (size_t)(k->offsets[i + 1] - k->offsets[i]);
    return k->data + k->offsets[i];
}

int64_t
zb__strmap_find(const zb__strmap *m, const char *s, size_t len)
{
    if (!m->slots) return -1;
    for (size_t h = (size_t)fnv1a(s, len) & m->mask;; h = (h + 1) & m->mask) {
        uint64_t v = m->slots[h];
        if (!v) return -1;
        size_t klen;
        const char *k = key_at(m->keys, v - 1, &klen);
        if (klen == len && !memcmp(k, s, len)) return (int64_t)(v - 1);
    }
}

zb_status
zb__strmap_build(zb__strmap *m, const zb_strings *keys, uint64_t *dup)
{
    memset(m, 0, sizeof *m);
    if (dup) *dup = UINT64_MAX;
    size_t cap = 16;
    while (cap < 2 * keys->n) {
        if (cap > SIZE_MAX / 4)
            return zb__err(ZB_E_OVERFLOW, "a map of %llu strings", (unsigned long long)keys->n);
        cap *= 2;
    }
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return zb__err(ZB_E_NOMEM, "a map of %llu strings", (unsigned long long)keys->n);
    m->mask = cap - 1;
    m->keys = keys;
    for (uint64_t i = 0; i < keys->n; i++) {
        size_t len;
        const char *s = key_at(keys, i, &len);
        size_t h = (size_t)fnv1a(s, len) & m->mask;
        for (;; h = (h + 1) & m->mask) {
            uint64_t v = m->slots[h];
            if (!v) {
                m->slots[h] = i + 1;
                break;
            }
            size_t klen;
            const char *k = key_at(keys, v - 1, &klen);
            if (klen == len && !memcmp(k, s, len)) {
                if (dup && *dup == UINT64_MAX) *dup = i;
                break;
            }
        }
    }
    return ZB_OK;
}

void
zb__strmap_free(zb__strmap *m)
{
    if (!m) return;
    free(m->slots);
    memset(m, 0, sizeof *m);
}
