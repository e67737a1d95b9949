/* A store that digests what is put below a prefix (convert_int.h, cv_digest): the gather
 * task writes a dataset through it and gets the dataset's checksum from the bytes as they
 * were written; the finishing step reads the files back and must find the same.
 *
 * The read-back of large objects starts as soon as they are written: a checker thread reads
 * each one back from the inner store while the gather goes on (the reads are the device's, the
 * gather's threads keep computing) and marks its record verified when it reads the bytes that
 * were put; the finishing step then takes those objects' CRCs from cv_output_remember instead of
 * reading them again at the end, when nothing else runs. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_int.h"
#include "util/status.h"

typedef struct record {
    char *key; /* relative to the prefix */
    uint64_t size, crc;
    uint64_t gen;  /* the put that wrote it */
    bool verified; /* read back from the inner store equal to what was put */
} record;

typedef struct check_job {
    char *key; /* the whole key */
    uint64_t gen;
} check_job;

#define CHECK_BLOCK ((size_t)4 << 20)

struct cv_digest {
    zb_store *inner;
    char prefix[1024];
    size_t prefix_len;
    pthread_mutex_t lock;
    record *recs;
    size_t n, cap;
    uint64_t gens;

    /* the checker: a queue of objects to read back (lock), and what it found */
    pthread_t checker;
    bool checking, busy, stop;
    pthread_cond_t more, idle;
    check_job *queue;
    size_t q_head, q_n, q_cap;
    uint8_t *buf; /* CHECK_BLOCK bytes, aligned for direct reads */
    zb_status check_st;
    char check_msg[1024];
};

/* The key relative to the prefix, or NULL when the key lies elsewhere. */
static const char *
relative(const cv_digest *dg, const char *key)
{
    if (strncmp(key, dg->prefix, dg->prefix_len) || key[dg->prefix_len] != '/') return NULL;
    return key + dg->prefix_len + 1;
}

static record *
find(cv_digest *dg, const char *rel)
{
    for (size_t i = 0; i < dg->n; i++)
        if (!strcmp(dg->recs[i].key, rel)) return &dg->recs[i];
    return NULL;
}

static void
drop(cv_digest *dg, record *r)
{
    free(r->key);
    *r = dg->recs[--dg->n];
}

static zb_status
d_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    return zb_store_get(((cv_digest *)self)->inner, key, offset, length, dst, nread);
}

static zb_status
d_size(void *self, const char *key, uint64_t *size)
{
    return zb_store_size(((cv_digest *)self)->inner, key, size);
}

static zb_status
d_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    return zb_store_list(((cv_digest *)self)->inner, prefix, fn, ctx);
}

/* Queues object `key` (put as `gen`) for the checker (lock held). Without memory for it the
 * object is simply not checked early: the finishing step reads it. */
static void
enqueue(cv_digest *dg, const char *key, uint64_t gen)
{
    if (dg->q_n == dg->q_cap) {
        size_t cap = dg->q_cap ? 2 * dg->q_cap : 64;
        check_job *q = realloc(dg->queue, cap * sizeof *q);
        if (!q) return;
        dg->queue = q;
        dg->q_cap = cap;
    }
    char *k = strdup(key);
    if (!k) return;
    dg->queue[dg->q_n++] = (check_job){k, gen};
    pthread_cond_signal(&dg->more);
}

/* Reads each queued object back and marks its record verified when the bytes are the ones
 * put; a record rewritten, renamed or erased since is left to the finishing step. */
static void *
checker_main(void *arg)
{
    cv_digest *dg = arg;
    pthread_mutex_lock(&dg->lock);
    for (;;) {
        while (dg->q_head == dg->q_n && !dg->stop) pthread_cond_wait(&dg->more, &dg->lock);
        if (dg->stop) break; /* cv_digest_free: what is still queued is dropped */
        check_job j = dg->queue[dg->q_head++];
        if (dg->q_head == dg->q_n) dg->q_head = dg->q_n = 0;
        dg->busy = true;
        pthread_mutex_unlock(&dg->lock);
        uint64_t size = 0, crc = 0;
        char msg[512] = "";
        zb_status st = cv_object_crc(dg->inner, j.key, dg->buf, CHECK_BLOCK, &size, &crc);
        if (st != ZB_OK) snprintf(msg, sizeof msg, "%s", zb_last_error());
        pthread_mutex_lock(&dg->lock);
        const char *rel = relative(dg, j.key);
        record *r = rel ? find(dg, rel) : NULL;
        if (r && r->gen == j.gen) {
            if (st == ZB_OK && size == r->size && crc == r->crc) {
                r->verified = true;
            } else if (dg->check_st == ZB_OK) {
                dg->check_st = st != ZB_OK ? st : ZB_E_CHECKSUM;
                if (st == ZB_OK)
                    snprintf(dg->check_msg, sizeof dg->check_msg,
                             "%s: read back %" PRIu64 " bytes with CRC-64 %016" PRIx64
                             ", but %" PRIu64 " bytes with CRC-64 %016" PRIx64 " were written",
                             j.key, size, crc, r->size, r->crc);
                else
                    snprintf(dg->check_msg, sizeof dg->check_msg, "reading back %s: %s", j.key,
                             msg);
            }
        }
        free(j.key);
        dg->busy = false;
        pthread_cond_broadcast(&dg->idle);
    }
    pthread_mutex_unlock(&dg->lock);
    return NULL;
}

static zb_status
d_put(void *self, const char *key, const void *data, uint64_t length)
{
    cv_digest *dg = self;
    ZB_TRY(zb_store_put(dg->inner, key, data, length));
    const char *rel = relative(dg, key);
    if (!rel) return ZB_OK;
    uint64_t crc = cv_crc64(0, data, (size_t)length);
    pthread_mutex_lock(&dg->lock);
    zb_status st = ZB_OK;
    record *r = find(dg, rel);
    if (!r) {
        if (dg->n == dg->cap) {
            size_t cap = dg->cap ? 2 * dg->cap : 64;
            record *p = realloc(dg->recs, cap * sizeof *p);
            if (!p) st = zb__err(ZB_E_NOMEM, "digest of %s", key);
            if (p) dg->recs = p, dg->cap = cap;
        }
        if (st == ZB_OK) {
            r = &dg->recs[dg->n];
            if (!(r->key = strdup(rel)))
                st = zb__err(ZB_E_NOMEM, "digest of %s", key);
            else
                dg->n++;
        }
    }
    if (st == ZB_OK) {
        r->size = length;
        r->crc = crc;
        r->gen = ++dg->gens;
        r->verified = false;
        if (dg->checking && length >= ZB_STORE_DIRECT_MIN_BYTES) enqueue(dg, key, r->gen);
    }
    pthread_mutex_unlock(&dg->lock);
    return st;
}

static zb_status
d_erase(void *self, const char *key)
{
    cv_digest *dg = self;
    ZB_TRY(zb_store_erase(dg->inner, key));
    const char *rel = relative(dg, key);
    if (!rel) return ZB_OK;
    pthread_mutex_lock(&dg->lock);
    record *r = find(dg, rel);
    if (r) drop(dg, r);
    pthread_mutex_unlock(&dg->lock);
    return ZB_OK;
}

static zb_status
d_rename(void *self, const char *from, const char *to)
{
    cv_digest *dg = self;
    ZB_TRY(zb_store_rename(dg->inner, from, to));
    const char *rf = relative(dg, from), *rt = relative(dg, to);
    pthread_mutex_lock(&dg->lock);
    zb_status st = ZB_OK;
    record *old = rt ? find(dg, rt) : NULL;
    if (old) drop(dg, old);
    record *r = rf ? find(dg, rf) : NULL;
    if (r && rt) {
        char *k = strdup(rt);
        if (!k) st = zb__err(ZB_E_NOMEM, "digest of %s", to);
        if (k) free(r->key), r->key = k;
    } else if (r) {
        drop(dg, r);
    } else if (rt) { /* renamed in from outside the prefix: not seen being written */
        st = zb__err(ZB_E_INVALID, "digest: %s was renamed into the dataset from %s", to, from);
    }
    pthread_mutex_unlock(&dg->lock);
    return st;
}

static zb_status
d_view(void *self, const char *key, uint64_t offset, uint64_t length, const uint8_t **data,
       uint64_t *nread, void **token)
{
    return zb_store_view(((cv_digest *)self)->inner, key, offset, length, data, nread, token);
}

static void
d_release(void *self, void *token)
{
    zb_store_release(((cv_digest *)self)->inner, token);
}

static void
d_close(void *self)
{
    ((cv_digest *)self)->inner = NULL; /* borrowed */
}

static const zb_store_methods digest_methods = {
    .scheme = "file",
    .get = d_get,
    .size = d_size,
    .list = d_list,
    .put = d_put,
    .erase = d_erase,
    .rename = d_rename,
    .close = d_close,
    .view = d_view,
    .release = d_release,
};

zb_status
cv_digest_open(zb_store *inner, const char *prefix, bool check, cv_digest **out, zb_store **store)
{
    *out = NULL;
    *store = NULL;
    cv_digest *dg = calloc(1, sizeof *dg);
    if (!dg) return zb__err(ZB_E_NOMEM, "digest");
    snprintf(dg->prefix, sizeof dg->prefix, "%s", prefix);
    dg->prefix_len = strlen(dg->prefix);
    pthread_mutex_init(&dg->lock, NULL);
    pthread_cond_init(&dg->more, NULL);
    pthread_cond_init(&dg->idle, NULL);
    dg->inner = inner;
    /* no checker (and nothing verified early) when its buffer or thread cannot be had */
    if (check && (dg->buf = aligned_alloc(ZB_STORE_DIRECT_ALIGN, CHECK_BLOCK)) != NULL)
        dg->checking = pthread_create(&dg->checker, NULL, checker_main, dg) == 0;
    zb_status st = zb_store_new(&digest_methods, dg, store);
    if (st != ZB_OK) {
        cv_digest_free(dg);
        return st;
    }
    *out = dg;
    return ZB_OK;
}

int
cv_cmp_walk(const char *x, const char *y)
{
    for (;;) {
        size_t lx = strcspn(x, "/"), ly = strcspn(y, "/");
        char cx[1024], cy[1024];
        snprintf(cx, sizeof cx, "%.*s", (int)lx, x);
        snprintf(cy, sizeof cy, "%.*s", (int)ly, y);
        int c = strcmp(cx, cy);
        if (c) return c;
        if (!x[lx] || !y[ly]) return x[lx] ? 1 : y[ly] ? -1 : 0;
        x += lx + 1;
        y += ly + 1;
    }
}

static int
cmp_records(const void *a, const void *b)
{
    return cv_cmp_walk(((const record *)a)->key, ((const record *)b)->key);
}

zb_status
cv_digest_result(cv_digest *dg, uint64_t *files, uint64_t *bytes, uint64_t *crc)
{
    pthread_mutex_lock(&dg->lock);
    while (dg->q_head != dg->q_n || dg->busy) pthread_cond_wait(&dg->idle, &dg->lock);
    if (dg->check_st != ZB_OK) {
        zb_status st = zb__err(dg->check_st, "%s", dg->check_msg);
        pthread_mutex_unlock(&dg->lock);
        return st;
    }
    qsort(dg->recs, dg->n, sizeof *dg->recs, cmp_records);
    uint64_t c = 0, total = 0;
    for (size_t i = 0; i < dg->n; i++) {
        char line[4200];
        int n = snprintf(line, sizeof line, "%s\t%" PRIu64 "\t%016" PRIx64 "\n", dg->recs[i].key,
                         dg->recs[i].size, dg->recs[i].crc);
        c = cv_crc64(c, line, (size_t)n);
        total += dg->recs[i].size;
    }
    *files = dg->n;
    *bytes = total;
    *crc = c;
    pthread_mutex_unlock(&dg->lock);
    return ZB_OK;
}

zb_status
cv_digest_remember(cv_digest *dg, zb_convert *cv)
{
    char key[4200];
    zb_status st = ZB_OK;
    pthread_mutex_lock(&dg->lock);
    for (size_t i = 0; i < dg->n && st == ZB_OK; i++) {
        if (!dg->recs[i].verified) continue;
        snprintf(key, sizeof key, "%s/%s", dg->prefix, dg->recs[i].key);
        st = cv_output_remember(cv, key, dg->recs[i].size, dg->recs[i].crc);
    }
    pthread_mutex_unlock(&dg->lock);
    return st;
}

void
cv_digest_free(cv_digest *dg)
{
    if (!dg) return;
    if (dg->checking) {
        pthread_mutex_lock(&dg->lock);
        dg->stop = true;
        pthread_cond_signal(&dg->more);
        pthread_mutex_unlock(&dg->lock);
        pthread_join(dg->checker, NULL);
    }
    for (size_t i = dg->q_head; i < dg->q_n; i++) free(dg->queue[i].key);
    free(dg->queue);
    free(dg->buf);
    for (size_t i = 0; i < dg->n; i++) free(dg->recs[i].key);
    free(dg->recs);
    pthread_cond_destroy(&dg->more);
    pthread_cond_destroy(&dg->idle);
    pthread_mutex_destroy(&dg->lock);
    free(dg);
}
