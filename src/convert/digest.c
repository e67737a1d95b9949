/* A store that digests what is put below a prefix (convert_int.h, cv_digest): the gather
 * task writes a dataset through it and gets the dataset's checksum from the bytes as they
 * were written; the finishing step reads the files back and must find the same. */
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
} record;

struct cv_digest {
    zb_store *inner;
    char prefix[1024];
    size_t prefix_len;
    pthread_mutex_t lock;
    record *recs;
    size_t n, cap;
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
cv_digest_open(zb_store *inner, const char *prefix, cv_digest **out, zb_store **store)
{
    *out = NULL;
    *store = NULL;
    cv_digest *dg = calloc(1, sizeof *dg);
    if (!dg) return zb__err(ZB_E_NOMEM, "digest");
    snprintf(dg->prefix, sizeof dg->prefix, "%s", prefix);
    dg->prefix_len = strlen(dg->prefix);
    pthread_mutex_init(&dg->lock, NULL);
    dg->inner = inner;
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

void
cv_digest_free(cv_digest *dg)
{
    if (!dg) return;
    for (size_t i = 0; i < dg->n; i++) free(dg->recs[i].key);
    free(dg->recs);
    pthread_mutex_destroy(&dg->lock);
    free(dg);
}
