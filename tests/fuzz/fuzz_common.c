#include "fuzz_common.h"

#include <string.h>

uint64_t
fuzz_take(const uint8_t *data, size_t size, size_t *pos, int nbytes)
{
    uint64_t v = 0;
    for (int i = 0; i < nbytes && *pos < size; i++) v |= (uint64_t)data[(*pos)++] << (8 * i);
    return v;
}

zb_store *
fuzz_store_from(const uint8_t *data, size_t size, size_t *consumed)
{
    zb_store *s = NULL;
    if (zb_store_open_memory(&s) != ZB_OK) return NULL;
    size_t pos = 0;
    while (pos < size) {
        size_t klen = data[pos++];
        if (klen == 0 || pos + klen > size) break;
        char key[256];
        memcpy(key, data + pos, klen);
        key[klen] = '\0';
        pos += klen;
        size_t vlen = (size_t)fuzz_take(data, size, &pos, 4);
        if (vlen > size - pos) vlen = size - pos;
        (void)zb_store_put(s, key, data + pos, vlen); /* a malformed key is skipped */
        pos += vlen;
    }
    if (consumed) *consumed = pos;
    return s;
}
