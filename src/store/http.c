/* The http(s) backend: a read-only store over a web server that answers range GETs (nginx,
 * a CDN, an S3 website endpoint). Keys become URLs below the store's URL; sizes come from HEAD.
 * A server cannot list, so stores opened over HTTP need consolidated metadata (the v2
 * .zmetadata or v3 consolidated_metadata every zbatch writer produces). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/remote.h"
#include "store/store.h"
#include "util/status.h"

typedef struct http_store {
    zb__remote *r;
    char *base; /* the URL without its trailing '/' (also the store's name) */
} http_store;

static zb_status
http_url(void *self, const char *key, zb__buf *url)
{
    http_store *hs = self;
    url->len = 0;
    ZB_TRY(zb__buf_append(url, hs->base, strlen(hs->base)));
    ZB_TRY(zb__buf_append(url, "/", 1));
    ZB_TRY(zb__url_encode(url, key, true));
    return zb__buf_append(url, "", 1);
}

static zb_status
http_get_ranges(void *self, zb_range *ranges, size_t n, zb_range_fn done, void *ctx)
{
    http_store *hs = self;
    return zb__remote_get_ranges(hs->r, http_url, hs, ranges, n, done, ctx);
}

zb_status
zb__remote_get_one(zb__remote *r, zb__url_fn url_of, void *self, const char *key, uint64_t offset,
                   uint64_t length, void *dst, uint64_t *nread)
{
    zb_range rg = {.key = key, .offset = offset, .length = length, .dst = dst};
    ZB_TRY(zb__remote_get_ranges(r, url_of, self, &rg, 1, NULL, NULL));
    *nread = rg.nread;
    return rg.status; /* its message was set when it completed */
}

static zb_status
http_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    http_store *hs = self;
    if (!key[0]) return zb__err(ZB_E_NOTFOUND, "%s: the root is not an object", hs->base);
    return zb__remote_get_one(hs->r, http_url, hs, key, offset, length, dst, nread);
}

zb_status
zb__remote_head(zb__remote *r, zb__url_fn url_of, void *self, const char *key, uint64_t *size)
{
    zb__buf url = {0};
    zb_status st = url_of(self, key, &url);
    zb__http_req q = {.method = ZB_HTTP_HEAD, .url = (const char *)url.data, .what = key};
    if (st == ZB_OK) st = zb__remote_perform(r, &q, 1);
    if (st == ZB_OK && q.content_length == UINT64_MAX)
        st = zb__err(ZB_E_IO, "HEAD %s: the answer has no Content-Length", q.url);
    if (st == ZB_OK) *size = q.content_length;
    zb__buf_free(&q.body);
    zb__buf_free(&url);
    return st;
}

static zb_status
http_size(void *self, const char *key, uint64_t *size)
{
    http_store *hs = self;
    if (!key[0]) return zb__err(ZB_E_NOTFOUND, "%s: the root is not an object", hs->base);
    return zb__remote_head(hs->r, http_url, hs, key, size);
}

static zb_status
http_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    (void)fn;
    (void)ctx;
    http_store *hs = self;
    return zb__err(ZB_E_UNSUPPORTED,
                   "%s: an HTTP server cannot list keys (listing \"%s\"); open a store with "
                   "consolidated metadata (zarr.consolidate_metadata, or any zbatch writer)",
                   hs->base, prefix);
}

static void
http_stats(void *self, zb_store_stats *out)
{
    zb__remote_stats(((http_store *)self)->r, out);
}

static void
http_close(void *self)
{
    http_store *hs = self;
    if (!hs) return;
    zb__remote_free(hs->r);
    free(hs->base);
    free(hs);
}

static const zb_store_methods http_methods = {
    .scheme = "http",
    .get = http_get,
    .size = http_size,
    .list = http_list,
    .close = http_close,
    .get_ranges = http_get_ranges,
    .suffix_ranges = true,
    .stats = http_stats,
};

uint64_t
zb__remote_store_gap(const zb_store *s)
{
    if (s->m == &http_methods) return zb__remote_options(((http_store *)s->self)->r)->coalesce_gap;
    return zb__s3_store_gap(s);
}

zb_status
zb__store_open_http(const char *url, const zb_remote_opts *opts, zb_store **out)
{
    *out = NULL;
    const char *host = strstr(url, "://");
    if (!host || !host[3] || host[3] == '/')
        return zb__err(ZB_E_INVALID, "%s: not an http(s)://HOST/PATH URL", url);
    const char *at = strchr(host + 3, '@'), *slash = strchr(host + 3, '/');
    if (at && (!slash || at < slash))
        return zb__err(ZB_E_INVALID, "http store: credentials in the URL are not accepted; "
                                     "the URL appears in messages");
    if (strpbrk(url, "?#"))
        return zb__err(ZB_E_INVALID, "%s: a store URL takes no query or fragment", url);
    http_store *hs = calloc(1, sizeof *hs);
    if (!hs) return zb__err(ZB_E_NOMEM, "http store: out of memory");
    zb_status st = (hs->base = strdup(url)) ? ZB_OK : zb__err(ZB_E_NOMEM, "out of memory");
    if (st == ZB_OK) {
        size_t n = strlen(hs->base);
        while (n && hs->base[n - 1] == '/') hs->base[--n] = '\0';
        st = zb__remote_new(opts, NULL, &hs->r);
    }
    if (st == ZB_OK) st = zb_store_new(&http_methods, hs, out);
    if (st != ZB_OK) {
        http_close(hs);
        return st;
    }
    (*out)->name = hs->base;
    return ZB_OK;
}
