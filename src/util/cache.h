/* A byte-bounded LRU cache keyed by (owner pointer, number): the dataset's decoded-unit cache
 * and its shard-index cache (cache.c). Thread-safe: one mutex guards it. */
#ifndef ZB_UTIL_CACHE_H
#define ZB_UTIL_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

typedef struct zb__cache zb__cache;

zb_status zb__cache_new(size_t max_bytes, zb__cache **out);
void zb__cache_free(zb__cache *c);
/* Bytes [off, off + len) of an entry of whole_len bytes (a hit needs that length). */
bool zb__cache_get_part(zb__cache *c, const void *arr, uint64_t unit, size_t whole_len, size_t off,
                        void *dst, size_t len);
/* Pins the cached unit of `len` bytes and returns its bytes, to be read in place until
 * zb__cache_unpin(c, *pin); NULL (and *pin NULL) on a miss. Eviction takes a pinned entry out of
 * the cache and its byte count at once but frees it at the last unpin, so the memory held can
 * pass max_bytes by the entries pinned at that moment (one per reading thread, or the units of
 * one unit row chunked by columns: exec.c serve_columns). */
const void *zb__cache_pin(zb__cache *c, const void *arr, uint64_t unit, size_t len, void **pin);
/* Releases a pin (NULL: nothing). */
void zb__cache_unpin(zb__cache *c, void *pin);
bool zb__cache_contains(zb__cache *c, const void *arr, uint64_t unit);
/* Whether the cache holds the entry, and its length (an entry of a length the caller cannot
 * know in advance, such as a whole object). */
bool zb__cache_length(zb__cache *c, const void *arr, uint64_t unit, size_t *len);
void zb__cache_put(zb__cache *c, const void *arr, uint64_t unit, const void *src, size_t len);

/* Bytes held now (the entries' lengths). */
size_t zb__cache_held(zb__cache *c);
/* Bytes of memory the cache keeps for its entries, in use or free for the next ones: about
 * max_bytes plus an eighth at most, plus the entries pinned when evicted (cache.c). */
size_t zb__cache_blocks(zb__cache *c);

#endif
