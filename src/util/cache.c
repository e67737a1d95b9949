/* A byte-bounded LRU cache of decoded units (and of shard indexes), keyed by (owner, number),
 * one mutex guarding it. Decoded units are pinned (zb__cache_pin) and read in place: an entry's
 * bytes never change once put, so a reader holding a pin reads them without the lock, and an
 * entry evicted while pinned leaves the index and the byte count at once and goes back to the
 * free blocks at its last unpin. Shard indexes are copied out in part (zb__cache_get_part): a
 * few entries, under the lock.
 *
 * Entries live in blocks the cache keeps: a block is malloc'd once in one of a fixed set of size
 * classes (eight per power of two, so a block wastes under an eighth) and, when its entry is
 * evicted, goes onto its class's free list for the next entry of that class, not back to the
 * allocator. A cache churned through by a store bigger than it (every put evicts) therefore
 * writes into memory it has already touched: fresh memory from malloc (pages the kernel must
 * fault in, and that glibc hands back to the kernel on free) costs far more per byte than the
 * copy into a reused block (docs/PERFORMANCE.md, issue 17). A put that finds no free block of
 * its class gives free blocks of other classes back to malloc until a new one fits under
 * max_bytes plus an eighth: the blocks kept, in use or free, stay under that bound, unless the
 * entries in use alone take more (the rounding and the headers of entries of a few hundred
 * bytes), and beyond it by the entries pinned when evicted. */
#include "util/cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

typedef struct entry {
    struct entry *free_next; /* on a free list: the next free block of its class */
    size_t block;            /* the block's bytes, this header included */
    const void *owner;
    uint64_t unit;
    size_t len;
    unsigned pins;             /* readers holding it (zb__cache_pin) */
    bool evicted;              /* out of the index while pinned: the last unpin frees it */
    struct entry *hnext;       /* hash chain */
    struct entry *prev, *next; /* LRU list, most recent at head */
    uint8_t data[];
} entry;

/* Size classes: blocks of up to MIN_BLOCK bytes are class 0; above, eight classes per power of
 * two. */
#define MIN_BLOCK 256
#define NCLASSES (8 * 64)

struct zb__cache {
    pthread_mutex_t mu;
    size_t max_bytes, bytes;
    size_t blocks_cap;     /* the most bytes of blocks kept (max_bytes and its rounding) */
    size_t block_bytes;    /* bytes of the blocks malloc'd and not freed, in use or free */
    size_t free_bytes;     /* ... of them on the free lists */
    entry *free[NCLASSES]; /* free blocks by size class */
    size_t reclaim;        /* the class where freeing surplus blocks resumes */
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
    c->blocks_cap = max_bytes > SIZE_MAX / 9 * 8 ? SIZE_MAX : max_bytes + max_bytes / 8;
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
    for (size_t k = 0; k < NCLASSES; k++)
        for (e = c->free[k]; e;) {
            entry *n = e->free_next;
            free(e);
            e = n;
        }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The size class of a block of n bytes, and the class's block size. */
static size_t
size_class(size_t n, size_t *block)
{
    if (n <= MIN_BLOCK) {
        *block = MIN_BLOCK;
        return 0;
    }
    unsigned b = 0; /* n in (2^b, 2^(b+1)] */
    while (((size_t)2 << b) < n) b++;
    size_t step = (size_t)1 << (b - 3), steps = (n + step - 1) / step; /* 9..16 */
    *block = steps * step;
    return (b - 8) * 8 + (steps - 8);
}

/* Puts an entry's block on its class's free list (the lock held). */
static void
block_release(zb__cache *c, entry *e)
{
    size_t block;
    size_t k = size_class(e->block, &block);
    e->free_next = c->free[k];
    c->free[k] = e;
    c->free_bytes += e->block;
}

/* A block for an entry of len bytes (the lock held): a free one of its class, else a new one
 * after freeing blocks of other classes while the blocks kept would pass blocks_cap. NULL when
 * malloc fails. */
static entry *
block_take(zb__cache *c, size_t len)
{
    if (len > SIZE_MAX / 4) return NULL;
    size_t block, k = size_class(sizeof(entry) + len, &block);
    entry *e = c->free[k];
    if (e) {
        c->free[k] = e->free_next;
        c->free_bytes -= e->block;
        return e;
    }
    while (c->free_bytes && c->block_bytes + block > c->blocks_cap) {
        entry **fl = &c->free[c->reclaim];
        if (!*fl) {
            c->reclaim = (c->reclaim + 1) % NCLASSES;
            continue;
        }
        entry *f = *fl;
        *fl = f->free_next;
        c->free_bytes -= f->block;
        c->block_bytes -= f->block;
        free(f);
    }
    e = malloc(block);
    if (!e) return NULL;
    e->block = block;
    c->block_bytes += block;
    return e;
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
        block_release(c, e);
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
    if (--e->pins == 0 && e->evicted) block_release(c, e);
    pthread_mutex_unlock(&c->mu);
}

void
zb__cache_put(zb__cache *c, const void *owner, uint64_t unit, const void *src, size_t len)
{
    if (!c || len > c->max_bytes) return;
    /* room first (the evicted blocks are the likeliest of its class), then the block, filled
     * outside the lock: not in the index yet, no other thread sees it */
    pthread_mutex_lock(&c->mu);
    entry *e = find(c, owner, unit);
    if (e) evict(c, e);
    while (c->tail && c->bytes + len > c->max_bytes) evict(c, c->tail);
    entry *n = block_take(c, len);
    pthread_mutex_unlock(&c->mu);
    if (!n) return; /* a cache that cannot grow just misses */
    n->owner = owner;
    n->unit = unit;
    n->len = len;
    n->pins = 0;
    n->evicted = false;
    memcpy(n->data, src, len);
    pthread_mutex_lock(&c->mu);
    size_t h = hash(owner, unit, c->nbuckets);
    /* another thread may have put the same key, or filled the room, meanwhile */
    e = find(c, owner, unit);
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
zb__cache_blocks(zb__cache *c)
{
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    size_t n = c->block_bytes;
    pthread_mutex_unlock(&c->mu);
    return n;
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
