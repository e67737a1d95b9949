/* A byte-bounded LRU cache of decoded units (and of shard indexes), keyed by (owner, number).
 * One mutex guards it: a lookup is a hash probe plus one memcpy, which is small next to the
 * decode it saves. */
#include "util/cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

typedef struct entry {
    const void *owner;
    uint64_t unit;
    size_t len;
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
    free(e);
}

bool
zb__cache_get_part(zb__cache *c, const void *owner, uint64_t unit, size_t whole_len, size_t off,
                   void *dst, size_t len)
{
    if (!c || off > whole_len || len > whole_len - off) return false;
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    entry *e = c->buckets[hash(owner, unit, c->nbuckets)];
    while (e && !(e->owner == owner && e->unit == unit)) e = e->hnext;
    if (e && e->len == whole_len) {
        memcpy(dst, e->data + off, len);
        lru_unlink(c, e);
        lru_push(c, e);
        hit = true;
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

bool
zb__cache_get(zb__cache *c, const void *owner, uint64_t unit, void *dst, size_t dst_len)
{
    return zb__cache_get_part(c, owner, unit, dst_len, 0, dst, dst_len);
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
    memcpy(n->data, src, len);
    pthread_mutex_lock(&c->mu);
    size_t h = hash(owner, unit, c->nbuckets);
    entry *e = c->buckets[h];
    while (e && !(e->owner == owner && e->unit == unit)) e = e->hnext;
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
    entry *e = c->buckets[hash(owner, unit, c->nbuckets)];
    while (e && !(e->owner == owner && e->unit == unit)) e = e->hnext;
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
