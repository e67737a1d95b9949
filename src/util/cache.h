/* A byte-bounded LRU cache keyed by (owner pointer, number): the dataset's decoded-unit cache
 * and its shard-index cache (cache.c). Thread-safe: one mutex guards it. */
#ifndef ZB_UTIL_CACHE_H
#define ZB_UTIL_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

typedef struct zb_cache zb_cache;

zb_status zb_cache_new(size_t max_bytes, zb_cache **out);
void zb_cache_free(zb_cache *c);
/* Copies the cached unit into dst (dst_len bytes) and returns true on a hit. */
bool zb_cache_get(zb_cache *c, const void *arr, uint64_t unit, void *dst, size_t dst_len);
/* Bytes [off, off + len) of an entry of whole_len bytes (a hit needs that length). */
bool zb_cache_get_part(zb_cache *c, const void *arr, uint64_t unit, size_t whole_len, size_t off,
                       void *dst, size_t len);
bool zb_cache_contains(zb_cache *c, const void *arr, uint64_t unit);
void zb_cache_put(zb_cache *c, const void *arr, uint64_t unit, const void *src, size_t len);

/* Bytes held now. */
size_t zb_cache_held(zb_cache *c);

#endif
