/* The store layer: key normalisation and the dispatch onto a backend's methods table. */
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/remote.h"
#include "util/status.h"

#define ZB_KEY_MAX 4096

zb_status
zb_key_normalize(const char *key, char *out, size_t cap)
{
    if (!key || !out || cap == 0) return zb__err(ZB_E_INVALID, "null key");
    size_t o = 0;
    const char *p = key;
    for (;;) {
        while (*p == '/' || *p == '\\') p++;
        if (!*p) break;
        const char *s = p;
        while (*p && *p != '/' && *p != '\\') p++;
        size_t n = (size_t)(p - s);
        if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
            return zb__err(ZB_E_BADKEY, "key '%s': '%.*s' segments are not allowed", key, (int)n,
                           s);
        if (o + n + 2 > cap) return zb__err(ZB_E_INVALID, "key '%.64s...' is too long", key);
        if (o) out[o++] = '/';
        memcpy(out + o, s, n);
        o += n;
    }
    out[o] = '\0';
    return ZB_OK;
}

zb_status
zb_store_new(const zb_store_methods *methods, void *self, zb_store **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_store_new: null out");
    *out = NULL;
    if (!methods || !methods->get || !methods->size)
        return zb__err(ZB_E_INVALID, "zb_store_new: a backend needs get and size");
    zb_store *s = calloc(1, sizeof *s);
    if (!s) return zb__err(ZB_E_NOMEM, "zb_store_new: out of memory");
    s->m = methods;
    s->self = self;
    snprintf(s->fallback, sizeof s->fallback, "%s://", methods->scheme ? methods->scheme : "");
    *out = s;
    return ZB_OK;
}

void
zb_store_close(zb_store *store)
{
    if (!store) return;
    if (store->m->close) store->m->close(store->self);
    free(store);
}

const char *
zb_store_scheme(const zb_store *store)
{
    return store && store->m->scheme ? store->m->scheme : "";
}

const char *
zb_store_name(const zb_store *store)
{
    if (!store) return "";
    return store->name ? store->name : store->fallback;
}

zb_status
zb_store_open_opts(const char *url, const zb_store_opts *opts, zb_store **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_store_open: null out");
    *out = NULL;
    if (!url || !*url) return zb__err(ZB_E_INVALID, "zb_store_open: empty URL");
    if (!strncmp(url, "file://", 7)) return zb_store_open_file_opts(url + 7, opts, out);
    const zb_remote_opts *remote = opts ? opts->remote : NULL;
    if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8))
        return zb__store_open_http(url, remote, out);
    if (!strncmp(url, "s3://", 5)) return zb__store_open_s3(url, remote, out);
    if (!strncmp(url, "memory://", 9)) return zb_store_open_memory(out);
    return zb_store_open_file_opts(url, opts, out);
}

zb_status
zb_store_open(const char *url, zb_store **out)
{
    return zb_store_open_opts(url, NULL, out);
}

void
zb_store_get_stats(const zb_store *store, zb_store_stats *stats)
{
    if (!stats) return;
    memset(stats, 0, sizeof *stats);
    if (store && store->m->stats) store->m->stats(store->self, stats);
}

/* Normalises `key` into a stack buffer named `var`, returning on error. */
#define NORMALIZE(var, key)                                                                        \
    char var[ZB_KEY_MAX];                                                                          \
    ZB_TRY(zb_key_normalize((key), var, sizeof var))

zb_status
zb_store_get(zb_store *store, const char *key, uint64_t offset, uint64_t length, void *dst,
             uint64_t *nread)
{
    if (!store || !dst || !nread) return zb__err(ZB_E_INVALID, "zb_store_get: null argument");
    *nread = 0;
    NORMALIZE(k, key);
    return store->m->get(store->self, k, offset, length, dst, nread);
}

zb_status
zb_store_view(zb_store *store, const char *key, uint64_t offset, uint64_t length,
              const uint8_t **data, uint64_t *nread, void **token)
{
    if (!store || !data || !nread || !token)
        return zb__err(ZB_E_INVALID, "zb_store_view: null argument");
    *data = NULL;
    *nread = 0;
    *token = NULL;
    if (!store->m->view || !store->m->release)
        return zb__err(ZB_E_UNSUPPORTED, "%s store: no views", store->m->scheme);
    NORMALIZE(k, key);
    return store->m->view(store->self, k, offset, length, data, nread, token);
}

void
zb_store_release(zb_store *store, void *token)
{
    if (store && token && store->m->release) store->m->release(store->self, token);
}

zb_status
zb_store_size(zb_store *store, const char *key, uint64_t *size)
{
    if (!store || !size) return zb__err(ZB_E_INVALID, "zb_store_size: null argument");
    NORMALIZE(k, key);
    return store->m->size(store->self, k, size);
}

zb_status
zb_store_list(zb_store *store, const char *prefix, zb_list_fn fn, void *ctx)
{
    if (!store || !fn) return zb__err(ZB_E_INVALID, "zb_store_list: null argument");
    if (!store->m->list)
        return zb__err(ZB_E_UNSUPPORTED, "%s store cannot list", zb_store_scheme(store));
    NORMALIZE(k, prefix ? prefix : "");
    return store->m->list(store->self, k, fn, ctx);
}

zb_status
zb_store_put(zb_store *store, const char *key, const void *data, uint64_t length)
{
    if (!store || (!data && length)) return zb__err(ZB_E_INVALID, "zb_store_put: null argument");
    if (!store->m->put)
        return zb__err(ZB_E_UNSUPPORTED, "%s store is read-only", zb_store_scheme(store));
    NORMALIZE(k, key);
    if (!k[0]) return zb__err(ZB_E_BADKEY, "zb_store_put: empty key");
    return store->m->put(store->self, k, data, length);
}

zb_status
zb_store_erase(zb_store *store, const char *key)
{
    if (!store) return zb__err(ZB_E_INVALID, "zb_store_erase: null store");
    if (!store->m->erase)
        return zb__err(ZB_E_UNSUPPORTED, "%s store is read-only", zb_store_scheme(store));
    NORMALIZE(k, key);
    if (!k[0]) return zb__err(ZB_E_BADKEY, "zb_store_erase: empty key");
    return store->m->erase(store->self, k);
}

zb_status
zb_store_rename(zb_store *store, const char *from, const char *to)
{
    if (!store) return zb__err(ZB_E_INVALID, "zb_store_rename: null store");
    if (!store->m->rename)
        return zb__err(ZB_E_UNSUPPORTED, "%s store cannot rename", zb_store_scheme(store));
    NORMALIZE(a, from);
    NORMALIZE(b, to);
    if (!a[0] || !b[0]) return zb__err(ZB_E_BADKEY, "zb_store_rename: empty key");
    return store->m->rename(store->self, a, b);
}

/* What zb_store_read_all reads of a remote object before it asks for the size. */
#define READ_ALL_GUESS ((uint64_t)256 << 10)

zb_status
zb_store_read_all(zb_store *store, const char *key, uint8_t **data, uint64_t *length)
{
    if (!data || !length) return zb__err(ZB_E_INVALID, "zb_store_read_all: null argument");
    *data = NULL;
    *length = 0;
    uint64_t size = 0;
    if (store->m->get_ranges) {
        /* a remote store: one GET of up to READ_ALL_GUESS bytes reads most objects whole (a
         * metadata document), without a size query first (a round trip each) */
        uint8_t *buf = malloc(READ_ALL_GUESS + 1);
        if (!buf) return zb__err(ZB_E_NOMEM, "%s: out of memory", key);
        zb_status st = zb_store_get(store, key, 0, READ_ALL_GUESS, buf, &size);
        if (st != ZB_OK || size == READ_ALL_GUESS) free(buf);
        if (st != ZB_OK) return st;
        if (size < READ_ALL_GUESS) { /* short only at the end: the whole object */
            buf[size] = '\0';
            *data = buf;
            *length = size;
            return ZB_OK;
        }
    }
    ZB_TRY(zb_store_size(store, key, &size));
    if (size >= (uint64_t)1 << 34)
        return zb__err(ZB_E_OVERFLOW, "%s: object of %llu bytes is too large to read whole", key,
                       (unsigned long long)size);
    uint8_t *buf = malloc((size_t)size + 1);
    if (!buf)
        return zb__err(ZB_E_NOMEM, "%s: cannot allocate %llu bytes", key, (unsigned long long)size);
    uint64_t got = 0;
    zb_status st = zb_store_get(store, key, 0, size, buf, &got);
    if (st != ZB_OK) {
        free(buf);
        return st;
    }
    if (got != size) {
        free(buf);
        return zb__err(ZB_E_IO, "%s: read %llu of %llu bytes (changed while reading?)", key,
                       (unsigned long long)got, (unsigned long long)size);
    }
    buf[size] = '\0';
    *data = buf;
    *length = size;
    return ZB_OK;
}

/* Normalises the keys of `ranges` into one allocation (keys repeat: a window reads many ranges
 * of few objects, but normalising each is cheap beside the reads) and points a copy of each
 * range at its normalised key. */
static zb_status
normalize_ranges(const zb_range *ranges, size_t n, zb_range **out, char **keys)
{
    *out = NULL;
    *keys = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!ranges[i].key || (!ranges[i].dst && ranges[i].length))
            return zb__err(ZB_E_INVALID, "zb_store_get_ranges: range %zu: null key or buffer", i);
        total += strlen(ranges[i].key) + 2;
    }
    zb_range *r = malloc(n * sizeof *r);
    char *k = malloc(total ? total : 1);
    if (!r || !k) {
        free(r);
        free(k);
        return zb__err(ZB_E_NOMEM, "zb_store_get_ranges: out of memory for %zu ranges", n);
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        /* a normalised key is never longer than the key given; zb_key_normalize wants room
         * for one byte more than it writes */
        size_t cap = strlen(ranges[i].key) + 2;
        zb_status st = zb_key_normalize(ranges[i].key, k + o, cap);
        if (st != ZB_OK) {
            free(r);
            free(k);
            return st;
        }
        r[i] = ranges[i];
        r[i].key = k + o;
        r[i].nread = 0;
        r[i].status = ZB_E_CANCELLED;
        o += cap;
    }
    *out = r;
    *keys = k;
    return ZB_OK;
}

/* The fallback for backends without get_ranges: one get per range, in list order, until done
 * asks to stop. */
static void
get_each(zb_store *store, zb_range *r, size_t n, zb_range_fn done, void *ctx)
{
    for (size_t i = 0; i < n; i++) {
        r[i].nread = 0;
        r[i].status = ZB_OK;
        if (r[i].offset == ZB_RANGE_SUFFIX) { /* the last `length` bytes: a size query first */
            uint64_t size = 0;
            r[i].status = store->m->size(store->self, r[i].key, &size);
            r[i].offset = size > r[i].length ? size - r[i].length : 0;
        }
        if (r[i].status == ZB_OK)
            r[i].status = store->m->get(store->self, r[i].key, r[i].offset, r[i].length, r[i].dst,
                                        &r[i].nread);
        if (done(ctx, i)) return;
    }
}

/* Relays a backend's completions to the caller with the caller's ranges filled in first. A
 * relayed range belongs to the caller from then on (it may hand it to other threads at once),
 * so nothing here writes it again. */
typedef struct {
    zb_range *mine, *theirs;
    uint8_t *relayed; /* [n] 1 once range i was handed over */
    zb_range_fn done;
    void *ctx;
    bool cancelled;
    size_t failed;    /* the lowest failed range so far (n: none) */
    zb_status failst; /* its status and message */
    char msg[512];
} relay;

static int
relay_done(void *arg, size_t i)
{
    relay *rl = arg;
    rl->relayed[i] = 1;
    rl->theirs[i].offset = rl->mine[i].offset; /* where a suffix began */
    rl->theirs[i].nread = rl->mine[i].nread;
    rl->theirs[i].status = rl->mine[i].status;
    zb_status st = rl->mine[i].status;
    if (st != ZB_OK && st != ZB_E_CANCELLED && i < rl->failed) {
        rl->failed = i;
        rl->failst = st;
        snprintf(rl->msg, sizeof rl->msg, "%s", zb_last_error());
    }
    if (rl->done && rl->done(rl->ctx, i)) rl->cancelled = true;
    return rl->cancelled;
}

zb_status
zb_store_get_ranges(zb_store *store, zb_range *ranges, size_t n, zb_range_fn done, void *ctx)
{
    if (!store || (!ranges && n))
        return zb__err(ZB_E_INVALID, "zb_store_get_ranges: null argument");
    if (n == 0) return ZB_OK;
    zb_range *r = NULL;
    char *keys = NULL;
    ZB_TRY(normalize_ranges(ranges, n, &r, &keys));
    uint8_t *relayed = calloc(n, 1);
    if (!relayed) {
        free(r);
        free(keys);
        return zb__err(ZB_E_NOMEM, "zb_store_get_ranges: out of memory for %zu ranges", n);
    }
    relay rl = {
        .mine = r, .theirs = ranges, .relayed = relayed, .done = done, .ctx = ctx, .failed = n};
    zb_status st = ZB_OK;
    bool suffix = false;
    for (size_t i = 0; i < n && !store->m->suffix_ranges; i++)
        suffix = suffix || r[i].offset == ZB_RANGE_SUFFIX;
    if (store->m->get_ranges && !suffix) {
        st = store->m->get_ranges(store->self, r, n, relay_done, &rl);
    } else {
        get_each(store, r, n, relay_done, &rl);
    }
    for (size_t i = 0; i < n; i++) /* the ranges never completed (cancelled) */
        if (!relayed[i]) {
            ranges[i].offset = r[i].offset;
            ranges[i].nread = r[i].nread;
            ranges[i].status = r[i].status;
        }
    free(relayed);
    free(r);
    free(keys);
    if (st != ZB_OK) return st;
    if (rl.failed < n) return zb__err(rl.failst, "%s", rl.msg);
    if (rl.cancelled)
        return zb__err(ZB_E_CANCELLED, "zb_store_get_ranges: cancelled by the caller");
    return ZB_OK;
}
