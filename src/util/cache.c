/* A byte-bounded LRU cache of decoded units (and of shard indexes), keyed by (owner, number),
 * one mutex guarding it. Decoded units are pinned (zb__cache_pin) and read in place: an entry's
 * bytes never change once put, so a reader holding a pin reads them without the lock, and an
 * entry evicted while pinned leaves the index and the byte count at once and is freed by its
 * last unpin. Shard indexes are copied out in part (zb__cache_get_part): a few entries, under
 * the lock. */
#include "util/cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

typedef struct entry {
    const void *owner;
    uint64_t unit;
    size_t len;
    unsigned pins;             /* readers holding it (zb__cache_pin) */
    bool evicted;              /* out of the index while pinned: the last unpin frees it */
    struct entry *hnext;       /* hash chain */
    struct entry *prev, *next; /* LRU list, most recent at head */
    uint8_t data[];
} entry;

struct zb__cache {
    pthread_mutex_t mu;
    size_t max_bytes, bytes;
    size_t nbuckets;
    entry **buckets;
    entry *head, *tail;
};

static size_t
hash(const void *owner, uint64_t unit, size_t nb)
{
    uint64_t h = (uint64_t)(uintptr_t)owner * 0x9E3779B97F4A7C15ull ^ unit * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    return (size_t)(h & (nb - 1));
}

zb_status
zb__cache_new(size_t max_bytes, zb__cache **out)
{
    *out = NULL;
    zb__cache *c = calloc(1, sizeof *c);
    if (!c) return zb__err(ZB_E_NOMEM, "cache: out of memory");
    /* about one bucket per 4 KiB held (short chains for caches of small entries, such as
     * encoded inner chunks), at least 4096 */
    c->nbuckets = 4096;
    while (c->nbuckets < ((size_t)1 << 22) && c->nbuckets < max_bytes / 4096) c->nbuckets *= 2;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->buckets) {
        free(c);
        return zb__err(ZB_E_NOMEM, "cache: out of memory");
    }
    c->max_bytes = max_bytes;
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return ZB_OK;
}

void
zb__cache_free(zb__cache *c)
{
    if (!c) return;
    entry *e = c->head;
    while (e) {
        entry *n = e->next;
        free(e);
        e = n;
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void
lru_unlink(zb__cache *c, entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void
lru_push(zb__cache *c, entry *e)
{
    e->next = c->head;
    e->prev = NULL;
    if (c->head) c->head->prev = e;
    c->head = e;
    if (!c->tail) c->tail = e;
}

static void
evict(zb__cache *c, entry *e)
{
    lru_unlink(c, e);
    entry **pp = &c->buckets[hash(e->owner, e->unit, c->nbuckets)];
    while (*pp && *pp != e) pp = &(*pp)->hnext;
    if (*pp) *pp = e->hnext;
    c->bytes -= e->len;
    if (e->pins)
        e->evicted = true;
    else
        free(e);
}

/* The entry for (owner, unit), or NULL (the lock held). */
static entry *
find(zb__cache *c, const void *owner, uint64_t unit)
{
    entry *e = c->buckets[hash(owner, unit, c->nbuckets)];
    while (e && !(e->owner == owner && e->unit == unit)) e = e->hnext;
    return e;
}

bool
zb__cache_get_part(zb__cache *c, const void *owner, uint64_t unit, size_t whole_len, size_t off,
                   void *dst, size_t len)
{
    if (!c || off > whole_len || len > whole_len - off) return false;
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    entry *e = find(c, owner, unit);
    if (e && e->len == whole_len) {
        memcpy(dst, e->data + off, len);
        lru_unlink(c, e);
        lru_push(c, e);
        hit = true;
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

const void *
zb__cache_pin(zb__cache *c, const void *owner, uint64_t unit, size_t len, void **pin)
{
    *pin = NULL;
    if (!c) return NULL;
    pthread_mutex_lock(&c->mu);
    entry *e = find(c, owner, unit);
    if (e && e->len == len) {
        e->pins++;
        lru_unlink(c, e);
        lru_push(c, e);
        *pin = e;
    }
    pthread_mutex_unlock(&c->mu);
    return *pin ? ((entry *)*pin)->data : NULL;
}

void
zb__cache_unpin(zb__cache *c, void *pin)
{
    entry *e = pin;
    if (!e) return;
    pthread_mutex_lock(&c->mu);
    bool gone = --e->pins == 0 && e->evicted;
    pthread_mutex_unlock(&c->mu);
    if (gone) free(e);
}

void
zb__cache_put(zb__cache *c, const void *owner, uint64_t unit, const void *src, size_t len)
{
    if (!c || len > c->max_bytes) return;
    entry *n = malloc(sizeof *n + len);
    if (!n) return; /* a cache that cannot grow just misses */
    n->owner = owner;
    n->unit = unit;
    n->len = len;
    n->pins = 0;
    n->evicted = false;
    memcpy(n->data, src, len);
    pthread_mutex_lock(&c->mu);
    size_t h = hash(owner, unit, c->nbuckets);
    entry *e = find(c, owner, unit);
    if (e) evict(c, e);
    while (c->tail && c->bytes + len > c->max_bytes) evict(c, c->tail);
    n->hnext = c->buckets[h];
    c->buckets[h] = n;
    lru_push(c, n);
    c->bytes += len;
    pthread_mutex_unlock(&c->mu);
}

bool
zb__cache_length(zb__cache *c, const void *owner, uint64_t unit, size_t *len)
{
    if (!c) return false;
    pthread_mutex_lock(&c->mu);
    entry *e = find(c, owner, unit);
    if (e) *len = e->len;
    pthread_mutex_unlock(&c->mu);
    return e != NULL;
}

bool
zb__cache_contains(zb__cache *c, const void *owner, uint64_t unit)
{
    size_t len;
    return zb__cache_length(c, owner, unit, &len);
}

size_t
zb__cache_held(zb__cache *c)
{
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    size_t n = c->bytes;
    pthread_mutex_unlock(&c->mu);
    return n;
}
