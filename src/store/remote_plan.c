/* The pure pieces of the remote stores: which requests serve a list of ranges, how long to wait
 * before a retry, what a Content-Range says, and how keys become URLs. No I/O here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "store/remote.h"
#include "util/status.h"

/* ---- coalescing ---------------------------------------------------------------------------- */

static int
by_key_offset(const void *a, const void *b, void *arg)
{
    const zb_range *all = arg;
    const zb_range *x = &all[*(const size_t *)a], *y = &all[*(const size_t *)b];
    int c = strcmp(x->key, y->key);
    if (c) return c;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

zb_status
zb__coalesce(const zb_range *ranges, size_t n, uint64_t gap, uint64_t max_bytes, size_t *order,
             zb__coalesced **groups, size_t *ngroups)
{
    *groups = NULL;
    *ngroups = 0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (ranges[i].length) order[m++] = i;
    if (m == 0) return ZB_OK;
    qsort_r(order, m, sizeof *order, by_key_offset, (void *)ranges);
    zb__coalesced *g = malloc(m * sizeof *g);
    if (!g) return zb__err(ZB_E_NOMEM, "remote: out of memory planning %zu ranges", n);
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {
        const zb_range *r = &ranges[order[i]];
        uint64_t end = r->offset + r->length;
        if (end < r->offset) end = UINT64_MAX;
        if (k > 0 && r->offset != ZB_RANGE_SUFFIX) { /* a suffix is a request of its own */
            zb__coalesced *c = &g[k - 1];
            const zb_range *head = &ranges[order[c->first]];
            uint64_t new_end = end > c->end ? end : c->end;
            if (!strcmp(head->key, r->key) && head->offset != ZB_RANGE_SUFFIX &&
                r->offset <= c->end + gap && new_end - c->offset <= max_bytes) {
                c->count++;
                c->end = new_end;
                continue;
            }
        }
        g[k++] = (zb__coalesced){i, 1, r->offset, end};
    }
    *groups = g;
    *ngroups = k;
    return ZB_OK;
}

/* ---- retries ------------------------------------------------------------------------------- */

double
zb__backoff_delay(double base_s, double max_s, int attempt, double u01)
{
    if (attempt < 1) attempt = 1;
    double cap = base_s * ldexp(1.0, attempt > 60 ? 60 : attempt - 1);
    if (cap > max_s) cap = max_s;
    return u01 * cap;
}

bool
zb__http_retryable(long s)
{
    return s == 408 || s == 429 || (s >= 500 && s <= 599);
}

/* ---- responses ----------------------------------------------------------------------------- */

static bool
parse_u64(const char **p, uint64_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    if (*s < '0' || *s > '9') return false;
    while (*s >= '0' && *s <= '9') {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
        s++;
    }
    *p = s;
    *out = v;
    return true;
}

bool
zb__parse_content_range(const char *value, uint64_t *first, uint64_t *last, uint64_t *total)
{
    const char *p = value;
    while (*p == ' ' || *p == '\t') p++;
    if (strncasecmp(p, "bytes", 5) != 0) return false;
    p += 5;
    while (*p == ' ') p++;
    if (*p == '*') {
        *first = *last = UINT64_MAX;
        p++;
    } else {
        if (!parse_u64(&p, first) || *p++ != '-' || !parse_u64(&p, last) || *last < *first)
            return false;
    }
    if (*p++ != '/') return false;
    if (*p == '*') {
        if (*first == UINT64_MAX) return false;
        *total = UINT64_MAX;
        p++;
    } else if (!parse_u64(&p, total) || (*first != UINT64_MAX && *last >= *total)) {
        return false;
    }
    while (*p == ' ' || *p == '\r' || *p == '\n') p++;
    return *p == '\0';
}

/* ---- URLs ---------------------------------------------------------------------------------- */

zb_status
zb__url_encode(zb__buf *out, const char *s, bool keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
        if (plain) {
            ZB_TRY(zb__buf_append(out, p, 1));
        } else {
            char e[3] = {'%', hex[c >> 4], hex[c & 15]};
            ZB_TRY(zb__buf_append(out, e, 3));
        }
    }
    return ZB_OK;
}

/* S3 bucket names: 3-63 of [a-z0-9.-]; dotted names cannot be virtual-hosted over TLS. */
static bool
bucket_ok(const char *b, size_t n)
{
    if (n < 3 || n > 63) return false;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-'))
            return false;
    }
    return true;
}

zb_status
zb__s3_target_parse(const char *url, const char *endpoint, const char *region, int addressing,
                    zb__s3_target *out)
{
    memset(out, 0, sizeof *out);
    if (strncmp(url, "s3://", 5) != 0) return zb__err(ZB_E_INVALID, "%s: not an s3:// URL", url);
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t bn = slash ? (size_t)(slash - b) : strlen(b);
    if (!bucket_ok(b, bn))
        return zb__err(ZB_E_INVALID,
                       "%s: \"%.*s\" is not a bucket name (3-63 of a-z, 0-9, '.', '-')", url,
                       (int)(bn > 80 ? 80 : bn), b);
    memcpy(out->bucket, b, bn);
    if (slash) {
        zb_status st = zb_key_normalize(slash + 1, out->prefix, sizeof out->prefix);
        if (st != ZB_OK) return zb__err_context(st, "%s", url);
    }
    snprintf(out->region, sizeof out->region, "%s", region && *region ? region : "us-east-1");
    bool path = addressing == ZB_S3_ADDRESSING_PATH ||
                (addressing == ZB_S3_ADDRESSING_AUTO && (endpoint || strchr(out->bucket, '.')));
    out->path_style = path;
    int w;
    if (endpoint && *endpoint) {
        size_t el = strlen(endpoint);
        while (el && endpoint[el - 1] == '/') el--;
        const char *sep = strstr(endpoint, "://");
        if (!sep || (size_t)(sep - endpoint) + 3 >= el)
            return zb__err(ZB_E_INVALID, "endpoint_url \"%.200s\" is not SCHEME://HOST[:PORT]",
                           endpoint);
        if (path) {
            w = snprintf(out->base, sizeof out->base, "%.*s/%s", (int)el, endpoint, out->bucket);
        } else {
            size_t sl = (size_t)(sep - endpoint) + 3;
            w = snprintf(out->base, sizeof out->base, "%.*s%s.%.*s", (int)sl, endpoint, out->bucket,
                         (int)(el - sl), endpoint + sl);
        }
    } else if (path) {
        w = snprintf(out->base, sizeof out->base, "https://s3.%s.amazonaws.com/%s", out->region,
                     out->bucket);
    } else {
        w = snprintf(out->base, sizeof out->base, "https://%s.s3.%s.amazonaws.com", out->bucket,
                     out->region);
    }
    if (w < 0 || (size_t)w >= sizeof out->base)
        return zb__err(ZB_E_INVALID, "%s: endpoint URL too long", url);
    return ZB_OK;
}
