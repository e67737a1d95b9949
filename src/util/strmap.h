/* A read-only map from strings to their position in a zb_strings table (gene names, category
 * labels): open addressing over FNV-1a hashes, built once, looked up by any number of threads. */
#ifndef ZB_UTIL_STRMAP_H
#define ZB_UTIL_STRMAP_H

#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

typedef struct zb__strmap {
    const zb_strings *keys; /* borrowed: must outlive the map */
    uint64_t *slots;        /* key index + 1; 0 = empty */
    size_t mask;            /* slots - 1 (a power of two, at least twice the keys) */
} zb__strmap;

/* Builds the map over keys->n strings. When two keys are equal, *dup (if not NULL) receives the
 * index of the second one and the map still answers with the first; otherwise UINT64_MAX.
 * ZB_E_NOMEM / ZB_E_OVERFLOW. */
zb_status zb__strmap_build(zb__strmap *m, const zb_strings *keys, uint64_t *dup);

/* The index of the string s[0..len) among the keys, or -1. */
int64_t zb__strmap_find(const zb__strmap *m, const char *s, size_t len);

void zb__strmap_free(zb__strmap *m);

#endif
