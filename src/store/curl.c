/* The libcurl engine of the remote stores.
 *
 * One call (zb__remote_get_ranges or zb__remote_perform) runs its requests on a libcurl multi
 * handle on the calling thread: up to max_in_flight transfers at once, connections (and DNS)
 * shared by every call of the store through a curl share handle, so threads calling get at the
 * same time and a window's get_ranges all reuse the same warm connections.
 *
 * Ranges: nearby ranges of one object are read by one request (zb__coalesce). Bytes are copied
 * into the caller's buffers as they arrive, and a range is reported complete the moment its
 * last byte is in, not when its request ends. A request that fails part-way is retried from the
 * first byte still missing, so the ranges already delivered stay delivered.
 *
 * Faults: 408, 429, 5xx, timeouts, resets, short bodies (fewer bytes than Content-Range or
 * Content-Length promised) and over-long bodies (more than Content-Range says) are retried with
 * exponential backoff and full jitter, up to max_retries per request; a 404 is ZB_E_NOTFOUND
 * (a missing chunk reads as the fill value), 401/403 ZB_E_DENIED, other 4xx ZB_E_IO, all without
 * retry. Messages name the method, the URL, the byte range and the last HTTP status; URLs never
 * carry credentials (they go through CURLOPT_USERNAME/PASSWORD and a header), and
 * zb__remote_redact scrubs any that a server echoes back. */
#include <curl/curl.h>
#include <math.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "store/remote.h"
#include "util/status.h"

#define POOL_MAX 256
#define ERRBODY_CAP 4096
#define BODY_CAP ((size_t)16 << 20)
#define MAX_REDIRECTS 10

struct zb__remote {
    zb_remote_opts o; /* strings point at the copies below */
    char *key, *secret, *token, *region, *endpoint;
    char sigv4[96];  /* "aws:amz:REGION:s3", "" when unsigned */
    char *token_hdr; /* "X-Amz-Security-Token: ..." */
    bool follow;     /* follow redirects of GETs and HEADs (plain http(s) stores) */
    CURLSH *share;
    pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];
    pthread_mutex_t pool_mu;
    CURL *easy[POOL_MAX];
    size_t neasy;
    _Atomic uint64_t requests, retries, ranges, bytes, max_in_flight, rng;
    _Atomic uint64_t in_flight; /* transfers running now, over every call of the store */
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void
global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void
share_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *ud)
{
    (void)h;
    (void)a;
    zb__remote *r = ud;
    pthread_mutex_lock(&r->share_mu[d]);
}

static void
share_unlock(CURL *h, curl_lock_data d, void *ud)
{
    (void)h;
    zb__remote *r = ud;
    pthread_mutex_unlock(&r->share_mu[d]);
}

static zb_status
dup_opt(const char *s, char **out)
{
    *out = NULL;
    if (!s) return ZB_OK;
    *out = strdup(s);
    return *out ? ZB_OK : zb__err(ZB_E_NOMEM, "remote: out of memory");
}

static void
fill_defaults(zb_remote_opts *o)
{
    zb_remote_opts d = ZB_REMOTE_OPTS_DEFAULT;
    if (o->max_in_flight <= 0) o->max_in_flight = d.max_in_flight;
    if (o->max_request_bytes == 0) o->max_request_bytes = d.max_request_bytes;
    if (o->max_retries < 0) o->max_retries = 0;
    if (!(o->backoff_base_s >= 0)) o->backoff_base_s = d.backoff_base_s;
    if (!(o->backoff_max_s >= 0)) o->backoff_max_s = d.backoff_max_s;
    if (!(o->connect_timeout_s > 0)) o->connect_timeout_s = d.connect_timeout_s;
    if (!(o->stall_timeout_s > 0)) o->stall_timeout_s = d.stall_timeout_s;
    if (o->multipart_threshold == 0) o->multipart_threshold = d.multipart_threshold;
    if (o->part_bytes == 0) o->part_bytes = d.part_bytes;
}

zb_status
zb__remote_new(const zb_remote_opts *opts, const char *sign_region, zb__remote **out)
{
    *out = NULL;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return zb__err(ZB_E_IO, "libcurl: global init failed: %s", curl_easy_strerror(global_rc));
    zb__remote *r = calloc(1, sizeof *r);
    if (!r) return zb__err(ZB_E_NOMEM, "remote: out of memory");
    zb_remote_opts d = ZB_REMOTE_OPTS_DEFAULT;
    r->o = opts ? *opts : d;
    fill_defaults(&r->o);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&r->share_mu[i], NULL);
    pthread_mutex_init(&r->pool_mu, NULL);
    zb_status st = dup_opt(r->o.access_key_id, &r->key);
    if (st == ZB_OK) st = dup_opt(r->o.secret_access_key, &r->secret);
    if (st == ZB_OK) st = dup_opt(r->o.session_token, &r->token);
    if (st == ZB_OK) st = dup_opt(r->o.region, &r->region);
    if (st == ZB_OK) st = dup_opt(r->o.endpoint_url, &r->endpoint);
    r->o.access_key_id = r->key;
    r->o.secret_access_key = r->secret;
    r->o.session_token = r->token;
    r->o.region = r->region;
    r->o.endpoint_url = r->endpoint;
    /* S3 (sign_region set) never follows: a signature is made for one URL, and S3 answers a
     * wrong region or endpoint with an error body naming the right one */
    r->follow = sign_region == NULL;
    if (st == ZB_OK && sign_region && !r->o.anonymous && r->key && *r->key) {
        if (!r->secret)
            st = zb__err(ZB_E_INVALID, "s3: an access key id without a secret access key");
        snprintf(r->sigv4, sizeof r->sigv4, "aws:amz:%s:s3", sign_region);
        if (st == ZB_OK && r->token && *r->token) {
            size_t n = strlen(r->token) + 32;
            r->token_hdr = malloc(n);
            if (!r->token_hdr)
                st = zb__err(ZB_E_NOMEM, "remote: out of memory");
            else
                snprintf(r->token_hdr, n, "X-Amz-Security-Token: %s", r->token);
        }
    }
    if (st == ZB_OK) {
        r->share = curl_share_init();
        if (!r->share) st = zb__err(ZB_E_NOMEM, "libcurl: no share handle");
    }
    if (st == ZB_OK) {
        curl_share_setopt(r->share, CURLSHOPT_LOCKFUNC, share_lock);
        curl_share_setopt(r->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
        curl_share_setopt(r->share, CURLSHOPT_USERDATA, r);
        curl_share_setopt(r->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
        curl_share_setopt(r->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
        curl_share_setopt(r->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    }
    r->rng = (uint64_t)(uintptr_t)r ^ (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
    if (st != ZB_OK) {
        zb__remote_free(r);
        return st;
    }
    *out = r;
    return ZB_OK;
}

void
zb__remote_free(zb__remote *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->neasy; i++) curl_easy_cleanup(r->easy[i]);
    if (r->share) curl_share_cleanup(r->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_destroy(&r->share_mu[i]);
    pthread_mutex_destroy(&r->pool_mu);
    if (r->secret) memset(r->secret, 0, strlen(r->secret));
    if (r->token_hdr) memset(r->token_hdr, 0, strlen(r->token_hdr));
    free(r->key);
    free(r->secret);
    free(r->token);
    free(r->region);
    free(r->endpoint);
    free(r->token_hdr);
    free(r);
}

const zb_remote_opts *
zb__remote_options(const zb__remote *r)
{
    return &r->o;
}

void
zb__remote_stats(zb__remote *r, zb_store_stats *out)
{
    out->requests = atomic_load(&r->requests);
    out->retries = atomic_load(&r->retries);
    out->ranges = atomic_load(&r->ranges);
    out->bytes = atomic_load(&r->bytes);
    out->max_in_flight = atomic_load(&r->max_in_flight);
}

static void
redact_one(char *msg, const char *secret)
{
    if (!secret || strlen(secret) < 4) return;
    size_t n = strlen(secret);
    for (char *p = strstr(msg, secret); p; p = strstr(p, secret)) {
        memmove(p + 3, p + n, strlen(p + n) + 1);
        memcpy(p, "***", 3);
    }
}

void
zb__remote_redact(const zb__remote *r)
{
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", zb_last_error());
    if (!strstr(msg, r->secret ? r->secret : "\x01") && !strstr(msg, r->token ? r->token : "\x01"))
        return;
    redact_one(msg, r->secret);
    redact_one(msg, r->token);
    /* keep the status: the caller returns it; only the text changes */
    zb__err(ZB_E_IO, "%s", msg);
}

static CURL *
easy_take(zb__remote *r)
{
    CURL *e = NULL;
    pthread_mutex_lock(&r->pool_mu);
    if (r->neasy) e = r->easy[--r->neasy];
    pthread_mutex_unlock(&r->pool_mu);
    if (e)
        curl_easy_reset(e);
    else
        e = curl_easy_init();
    return e;
}

static void
easy_give(zb__remote *r, CURL *e)
{
    if (!e) return;
    pthread_mutex_lock(&r->pool_mu);
    if (r->neasy < POOL_MAX) {
        r->easy[r->neasy++] = e;
        e = NULL;
    }
    pthread_mutex_unlock(&r->pool_mu);
    if (e) curl_easy_cleanup(e);
}

static double
now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double
rand01(zb__remote *r)
{
    uint64_t x = atomic_fetch_add(&r->rng, 0x9E3779B97F4A7C15ull);
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (double)(x >> 11) * 0x1p-53;
}

/* ---- transfers ----------------------------------------------------------------------------- */

/* A completed range waiting to be reported to the caller (after curl_multi_perform returns, so
 * the caller's callback never runs inside libcurl). */
typedef struct done_item {
    size_t i;
    const char *msg; /* the failure message (NULL on success) */
} done_item;

typedef struct call_state {
    zb__remote *r;
    zb_range *ranges;
    done_item *q;
    size_t qn;
} call_state;

enum { ABORT_NONE, ABORT_OVERLONG, ABORT_ALL_DONE, ABORT_BAD_RANGE, ABORT_BODY_CAP };

typedef struct xfer {
    call_state *cs;
    CURL *easy;
    struct curl_slist *hdrs;
    zb__buf url;
    /* a range group: ranges sub[0..count), sorted by offset; lo = first not yet complete */
    const size_t *sub;
    size_t count, lo;
    uint64_t end; /* the group's last byte + 1 */
    bool suffix;  /* a suffix range (ZB_RANGE_SUFFIX) whose start the answer has not told yet */
    /* or a plain request */
    zb__http_req *req;
    /* this attempt's response */
    bool started, have_cr;
    long status;
    uint64_t cr_first, cr_last, cr_total, pos, req_off;
    int abort;
    zb__buf err;
    /* retries */
    int attempts;
    double ready_at;
    bool finished;
    char sha_hdr[96]; /* "x-amz-content-sha256: HEX" (signed requests) */
    char msg[2048];
} xfer;

static zb_range *
sub_range(xfer *x, size_t k)
{
    return &x->cs->ranges[x->sub[k]];
}

static void
range_complete(xfer *x, size_t k, zb_status st, const char *msg)
{
    zb_range *rg = sub_range(x, k);
    rg->status = st;
    x->cs->q[x->cs->qn++] = (done_item){x->sub[k], st == ZB_OK ? NULL : msg};
}

static void
advance_lo(xfer *x)
{
    while (x->lo < x->count && sub_range(x, x->lo)->status != ZB_E_CANCELLED) x->lo++;
}

static size_t
on_header(char *p, size_t sz, size_t nm, void *ud)
{
    xfer *x = ud;
    size_t n = sz * nm;
    if (n >= 5 && !strncmp(p, "HTTP/", 5)) { /* a new response (after 100-continue, ...) */
        x->have_cr = false;
        return n;
    }
    char line[512];
    size_t m = n < sizeof line - 1 ? n : sizeof line - 1;
    memcpy(line, p, m);
    line[m] = '\0';
    if (!strncasecmp(line, "content-range:", 14)) {
        x->have_cr = zb__parse_content_range(line + 14, &x->cr_first, &x->cr_last, &x->cr_total);
        if (!x->have_cr) x->abort = ABORT_BAD_RANGE;
    } else if (x->req && x->req->want_etag && !strncasecmp(line, "etag:", 5)) {
        const char *v = line + 5;
        while (*v == ' ') v++;
        size_t vl = strcspn(v, "\r\n");
        if (vl >= sizeof x->req->etag) vl = sizeof x->req->etag - 1;
        memcpy(x->req->etag, v, vl);
        x->req->etag[vl] = '\0';
    }
    return n;
}

/* A suffix range's object holds `size` bytes: the range starts `length` bytes before its end
 * (at 0 when the object is shorter), and the request ends there. */
static void
suffix_at(xfer *x, uint64_t size)
{
    zb_range *rg = sub_range(x, 0);
    rg->offset = size > rg->length ? size - rg->length : 0;
    x->end = size;
    x->suffix = false;
}

/* Called at the first body byte (or at the end of a body-less response). */
static void
body_start(xfer *x)
{
    x->started = true;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->req || x->status != 206) {
        x->pos = 0; /* a 200 to a range request is the whole object */
        if (x->status == 200 && !x->req) {
            curl_off_t cl = -1;
            curl_easy_getinfo(x->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
            x->cr_total = cl >= 0 ? (uint64_t)cl : UINT64_MAX;
            x->cr_first = 0;
            x->cr_last = cl > 0 ? (uint64_t)cl - 1 : 0;
            x->have_cr = cl >= 0;
            /* a suffix of a whole object: its last `length` bytes */
            if (x->suffix && !x->have_cr) x->abort = ABORT_BAD_RANGE;
            if (x->suffix && x->have_cr) suffix_at(x, x->cr_total);
        }
        return;
    }
    if (x->suffix && x->have_cr && x->cr_first != UINT64_MAX && x->cr_total != UINT64_MAX &&
        x->cr_last + 1 == x->cr_total && x->cr_total - x->cr_first <= sub_range(x, 0)->length) {
        suffix_at(x, x->cr_total);
        x->req_off = x->cr_first;
    }
    if (!x->have_cr || x->cr_first == UINT64_MAX || x->cr_first != x->req_off || x->suffix) {
        x->abort = ABORT_BAD_RANGE;
        return;
    }
    x->pos = x->cr_first;
}

static size_t
on_range_body(char *p, size_t sz, size_t nm, void *ud)
{
    xfer *x = ud;
    size_t n = sz * nm;
    if (!x->started) body_start(x);
    if (x->abort) return 0;
    atomic_fetch_add(&x->cs->r->bytes, n);
    if (x->status != 200 && x->status != 206) {
        size_t room = ERRBODY_CAP - x->err.len;
        if (room) zb__buf_append(&x->err, p, n < room ? n : room);
        return n;
    }
    uint64_t pos = x->pos, end = pos + n;
    if (x->have_cr && end > x->cr_last + 1) {
        x->abort = ABORT_OVERLONG;
        return 0;
    }
    for (size_t k = x->lo; k < x->count; k++) {
        zb_range *rg = sub_range(x, k);
        if (rg->offset >= end) break;
        if (rg->status != ZB_E_CANCELLED) continue;
        uint64_t have = rg->offset + rg->nread, rend = rg->offset + rg->length;
        if (have >= pos && have < end) {
            uint64_t stop = rend < end ? rend : end;
            memcpy((uint8_t *)rg->dst + rg->nread, p + (have - pos), (size_t)(stop - have));
            rg->nread += stop - have;
        }
        if (rg->nread == rg->length) range_complete(x, k, ZB_OK, NULL);
    }
    advance_lo(x);
    x->pos = end;
    /* everything wanted is in while the server sends more (a 200 with the whole object) */
    if (x->lo == x->count && (!x->have_cr || end < x->cr_last + 1)) {
        x->abort = ABORT_ALL_DONE;
        return 0;
    }
    return n;
}

static size_t
on_req_body(char *p, size_t sz, size_t nm, void *ud)
{
    xfer *x = ud;
    size_t n = sz * nm;
    if (!x->started) body_start(x);
    atomic_fetch_add(&x->cs->r->bytes, n);
    if (x->status < 200 || x->status > 299) {
        size_t room = ERRBODY_CAP - x->err.len;
        if (room) zb__buf_append(&x->err, p, n < room ? n : room);
        return n;
    }
    if (!x->req->want_body) return n;
    if (x->req->body.len + n > BODY_CAP) {
        x->abort = ABORT_BODY_CAP;
        return 0;
    }
    return zb__buf_append(&x->req->body, p, n) == ZB_OK ? n : 0;
}

static const char *
method_name(zb__http_method m)
{
    static const char *names[] = {"GET", "HEAD", "PUT", "POST", "DELETE"};
    return names[m];
}

static void
payload_hash_header(xfer *x)
{
    unsigned char md[SHA256_DIGEST_LENGTH];
    const uint8_t *body = x->req && x->req->upload ? x->req->upload : (const uint8_t *)"";
    size_t n = x->req ? x->req->upload_len : 0;
    SHA256(body, n, md);
    int o = snprintf(x->sha_hdr, sizeof x->sha_hdr, "x-amz-content-sha256: ");
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        o += snprintf(x->sha_hdr + o, sizeof x->sha_hdr - (size_t)o, "%02x", md[i]);
}

static zb_status
xfer_setup(xfer *x)
{
    zb__remote *r = x->cs->r;
    if (!x->easy && !(x->easy = easy_take(r)))
        return zb__err(ZB_E_NOMEM, "libcurl: no easy handle");
    CURL *e = x->easy;
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
    x->started = x->have_cr = false;
    x->status = 0;
    x->abort = ABORT_NONE;
    x->err.len = 0;
    curl_easy_reset(e);
    curl_easy_setopt(e, CURLOPT_URL, (const char *)x->url.data);
    curl_easy_setopt(e, CURLOPT_SHARE, r->share);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(r->o.connect_timeout_s * 1000));
    /* a stall: less than one byte per second for stall_timeout_s */
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)ceil(r->o.stall_timeout_s));
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    if (r->follow && (!x->req || x->req->method == ZB_HTTP_GET || x->req->method == ZB_HTTP_HEAD)) {
        /* 301, 302, 303, 307, 308 from a web server (a moved store, a CDN): followed to http(s)
         * only, at most MAX_REDIRECTS deep; the Range header goes along, no credential exists */
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_MAXREDIRS, (long)MAX_REDIRECTS);
        curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    }
    if (r->o.insecure) {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    struct curl_slist *h = NULL;
    if (r->sigv4[0]) {
        curl_easy_setopt(e, CURLOPT_AWS_SIGV4, r->sigv4);
        curl_easy_setopt(e, CURLOPT_USERNAME, r->key);
        curl_easy_setopt(e, CURLOPT_PASSWORD, r->secret);
        /* libcurl 7.88 signs this header's value as the payload hash; the body's real hash
         * is accepted everywhere (UNSIGNED-PAYLOAD is not, over plain http) */
        if (!x->sha_hdr[0]) payload_hash_header(x);
        h = curl_slist_append(h, x->sha_hdr);
        if (r->token_hdr) h = curl_slist_append(h, r->token_hdr);
    }
    if (!x->req) {
        char range[64];
        if (x->suffix)
            snprintf(range, sizeof range, "Range: bytes=-%llu",
                     (unsigned long long)sub_range(x, 0)->length);
        else
            snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)x->req_off,
                     (unsigned long long)(x->end - 1));
        h = curl_slist_append(h, range);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_range_body);
    } else {
        zb__http_req *q = x->req;
        q->body.len = 0;
        q->etag[0] = '\0';
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_req_body);
        if (q->method == ZB_HTTP_HEAD) curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        if (q->method == ZB_HTTP_DELETE) curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
        if (q->method == ZB_HTTP_PUT || q->method == ZB_HTTP_POST) {
            curl_easy_setopt(e, CURLOPT_POST, 1L);
            curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->upload ? (const char *)q->upload : "");
            curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->upload_len);
            if (q->method == ZB_HTTP_PUT) curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "PUT");
            /* no "Expect:" header to turn 100-continue off: libcurl 7.88 would sign it
             * although it sends none, and S3 refuses the signature; a short wait instead */
            curl_easy_setopt(e, CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);
            h = curl_slist_append(h, "Content-Type: application/octet-stream");
        }
        if (q->header) h = curl_slist_append(h, q->header);
    }
    x->hdrs = h;
    if (h) curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    return ZB_OK;
}

/* "GET URL bytes=A-B" for messages. */
static void
describe(const xfer *x, char *out, size_t cap)
{
    if (x->req)
        snprintf(out, cap, "%s %s", method_name(x->req->method), (const char *)x->url.data);
    else if (x->suffix)
        snprintf(out, cap, "GET %s bytes=-%llu", (const char *)x->url.data,
                 (unsigned long long)x->cs->ranges[x->sub[0]].length);
    else
        snprintf(out, cap, "GET %s bytes=%llu-%llu", (const char *)x->url.data,
                 (unsigned long long)x->req_off, (unsigned long long)(x->end - 1));
}

/* The S3 error code and message of an error body ("" when it has none). */
static void
error_detail(const xfer *x, char *out, size_t cap)
{
    out[0] = '\0';
    if (!x->err.len) return;
    char *code = zb__xml_text((const char *)x->err.data, x->err.len, "Code");
    char *msg = code ? zb__xml_text((const char *)x->err.data, x->err.len, "Message") : NULL;
    if (code) snprintf(out, cap, " (%s%s%.300s)", code, msg ? ": " : "", msg ? msg : "");
    free(code);
    free(msg);
}

static bool
curl_retryable(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
        return true;
    default:
        return false;
    }
}

/* Ends the transfer with `st` for whatever it had left. */
static void
xfer_fail(xfer *x, zb_status st)
{
    x->finished = true;
    if (x->req) {
        x->req->status = st;
        x->req->http_status = x->status;
        return;
    }
    for (size_t k = x->lo; k < x->count; k++)
        if (sub_range(x, k)->status == ZB_E_CANCELLED) range_complete(x, k, st, x->msg);
    x->lo = x->count;
}

/* A retryable fault: try again after a backoff, or fail once the budget is spent. */
static void
xfer_fault(xfer *x, const char *why)
{
    zb__remote *r = x->cs->r;
    char d[1400];
    describe(x, d, sizeof d);
    if (x->attempts > r->o.max_retries) {
        snprintf(x->msg, sizeof x->msg, "%.900s: %s; gave up after %d attempts (max_retries %d)", d,
                 why, x->attempts, r->o.max_retries);
        xfer_fail(x, ZB_E_IO);
        return;
    }
    atomic_fetch_add(&r->retries, 1);
    if (!x->req && !x->suffix) /* from the first byte missing (a suffix: all again) */
        x->req_off = sub_range(x, x->lo)->offset + sub_range(x, x->lo)->nread;
    x->ready_at = now_s() + zb__backoff_delay(r->o.backoff_base_s, r->o.backoff_max_s, x->attempts,
                                              rand01(r));
}

static void
range_finish_ok(xfer *x, const char *d)
{
    if (x->have_cr && x->pos != x->cr_last + 1) {
        char why[160];
        snprintf(why, sizeof why, "short body: %llu of %llu bytes (HTTP %ld)",
                 (unsigned long long)(x->pos - x->cr_first),
                 (unsigned long long)(x->cr_last + 1 - x->cr_first), x->status);
        xfer_fault(x, why);
        return;
    }
    bool object_end = x->status == 200 ||
                      (x->have_cr && x->cr_total != UINT64_MAX && x->cr_last + 1 == x->cr_total);
    if (x->lo < x->count && !object_end) {
        char why[200];
        snprintf(why, sizeof why, "the server sent bytes %llu-%llu of %llu (HTTP %ld)",
                 (unsigned long long)x->cr_first, (unsigned long long)x->cr_last,
                 (unsigned long long)x->cr_total, x->status);
        xfer_fault(x, why);
        return;
    }
    (void)d;
    for (size_t k = x->lo; k < x->count; k++) /* past the end of the object: a short read */
        if (sub_range(x, k)->status == ZB_E_CANCELLED) range_complete(x, k, ZB_OK, NULL);
    x->lo = x->count;
    x->finished = true;
}

/* Decides what a finished attempt means: done, failed, or to be retried. */
static void
xfer_done(xfer *x, CURLcode code)
{
    x->attempts++;
    atomic_fetch_add(&x->cs->r->requests, 1);
    if (!x->started && code == CURLE_OK) body_start(x);
    if (x->status == 0) curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
    char d[1400], why[600], det[400];
    describe(x, d, sizeof d);
    error_detail(x, det, sizeof det);
    if (x->abort == ABORT_ALL_DONE) {
        x->lo = x->count;
        x->finished = true;
        return;
    }
    if (x->abort == ABORT_OVERLONG) {
        snprintf(why, sizeof why,
                 "over-long body: more than the %llu bytes of Content-Range "
                 "(HTTP %ld)",
                 (unsigned long long)(x->cr_last + 1 - x->cr_first), x->status);
        xfer_fault(x, why);
        return;
    }
    if (x->abort == ABORT_BAD_RANGE) {
        snprintf(why, sizeof why, "a Content-Range that does not match the request (HTTP %ld)",
                 x->status);
        xfer_fault(x, why);
        return;
    }
    if (x->abort == ABORT_BODY_CAP) {
        snprintf(x->msg, sizeof x->msg, "%.900s: response body over %zu bytes", d, BODY_CAP);
        xfer_fail(x, ZB_E_OVERFLOW);
        return;
    }
    if (code != CURLE_OK) {
        snprintf(why, sizeof why, "%s (last HTTP status %ld)", curl_easy_strerror(code), x->status);
        if (curl_retryable(code)) {
            xfer_fault(x, why);
        } else {
            snprintf(x->msg, sizeof x->msg, "%.900s: %s", d, why);
            xfer_fail(x, ZB_E_IO);
        }
        return;
    }
    long s = x->status;
    if (s >= 200 && s <= 299) {
        if (x->req) {
            x->finished = true;
            x->req->status = ZB_OK;
            x->req->http_status = s;
            curl_off_t cl = -1;
            curl_easy_getinfo(x->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
            x->req->content_length = cl >= 0 ? (uint64_t)cl : UINT64_MAX;
            return;
        }
        range_finish_ok(x, d);
        return;
    }
    if (s == 416 && !x->req) { /* every range left starts at or past the end of the object */
        if (x->suffix) suffix_at(x, 0); /* (a suffix of an empty object) */
        x->have_cr = false;
        x->status = 200;
        range_finish_ok(x, d);
        return;
    }
    if (zb__http_retryable(s)) {
        snprintf(why, sizeof why, "HTTP %ld%s", s, det);
        xfer_fault(x, why);
        return;
    }
    zb_status st = ZB_E_IO;
    const char *what = "";
    if (s == 404) {
        st = ZB_E_NOTFOUND;
        what = ": not found";
    } else if (s == 401 || s == 403) {
        st = ZB_E_DENIED;
        what = ": access denied; check the credentials (key, secret, token) and region";
    }
    snprintf(x->msg, sizeof x->msg, "%.900s: HTTP %ld%s%s", d, s, det, what);
    xfer_fail(x, st);
}

/* ---- the multi loop ------------------------------------------------------------------------ */

typedef struct loop {
    zb__remote *r;
    CURLM *multi;
    xfer *x;
    size_t n, next; /* transfers; the first never started */
    size_t active;
} loop;

/* A multi handle for one call. Its connection limit is what libcurl checks the shared cache
 * against each time a transfer hands its connection back, and by default it is four per
 * transfer in this call's multi at that moment: as a call's last transfers finish, that falls to
 * a few while the cache holds the connections of every thread's calls, so libcurl closed them
 * (thousands of new connections per epoch). The limit is sixteen calls' worth of transfers, so
 * the connections of threads reading at once stay open for the next windows. */
static CURLM *
multi_new(const zb__remote *r)
{
    CURLM *m = curl_multi_init();
    long cap = 16L * r->o.max_in_flight;
    if (m) curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, cap);
    return m;
}

static bool
can_start(const xfer *x, double now)
{
    return !x->finished && !x->easy && x->ready_at <= now;
}

static zb_status
start_ready(loop *l, double now, double *wake)
{
    for (size_t i = 0; i < l->n && l->active < (size_t)l->r->o.max_in_flight; i++) {
        xfer *x = &l->x[i];
        if (x->finished || x->easy) continue;
        if (!can_start(x, now)) {
            if (x->ready_at < *wake) *wake = x->ready_at;
            continue;
        }
        ZB_TRY(xfer_setup(x));
        if (curl_multi_add_handle(l->multi, x->easy) != CURLM_OK)
            return zb__err(ZB_E_IO, "libcurl: cannot add a transfer");
        l->active++;
        uint64_t a = atomic_fetch_add(&l->r->in_flight, 1) + 1;
        uint64_t m = atomic_load(&l->r->max_in_flight);
        while (a > m && !atomic_compare_exchange_weak(&l->r->max_in_flight, &m, a)) {}
    }
    return ZB_OK;
}

static void
reap(loop *l)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(l->multi, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        xfer *x = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        CURLcode code = msg->data.result;
        curl_multi_remove_handle(l->multi, x->easy);
        l->active--;
        atomic_fetch_sub(&l->r->in_flight, 1);
        xfer_done(x, code);
        /* the handle goes back to the pool between attempts (a retry may wait seconds) */
        easy_give(l->r, x->easy);
        x->easy = NULL;
    }
}

static void
cancel_all(loop *l)
{
    for (size_t i = 0; i < l->n; i++) {
        xfer *x = &l->x[i];
        if (x->easy) {
            curl_multi_remove_handle(l->multi, x->easy);
            atomic_fetch_sub(&l->r->in_flight, 1);
            easy_give(l->r, x->easy);
            x->easy = NULL;
        }
        x->finished = true;
    }
    l->active = 0;
}

/* Delivers queued completions; returns true when the caller cancelled. */
static bool
deliver(call_state *cs, zb_range_fn done, void *ctx)
{
    bool cancel = false;
    for (size_t k = 0; k < cs->qn && !cancel; k++) {
        done_item *d = &cs->q[k];
        if (d->msg) {
            zb__err(cs->ranges[d->i].status, "%s", d->msg);
            zb__remote_redact(cs->r);
        }
        if (done && done(ctx, d->i)) cancel = true;
    }
    cs->qn = 0;
    return cancel;
}

/* The earliest time a transfer waiting out its backoff may start (at most `limit`). */
static double
next_wake(const loop *l, double limit)
{
    for (size_t i = 0; i < l->n; i++) {
        const xfer *x = &l->x[i];
        if (!x->finished && !x->easy && x->ready_at < limit) limit = x->ready_at;
    }
    return limit;
}

static bool
all_finished(const loop *l)
{
    for (size_t i = 0; i < l->n; i++)
        if (!l->x[i].finished) return false;
    return true;
}

/* Runs every transfer of `l` to its end; *cancelled when done() asked to stop. */
static zb_status
run_loop(loop *l, call_state *cs, zb_range_fn done, void *ctx, bool *cancelled)
{
    *cancelled = false;
    zb_status st = ZB_OK;
    while (!all_finished(l)) {
        double now = now_s(), wake = now + 1.0;
        st = start_ready(l, now, &wake);
        if (st != ZB_OK) break;
        int running = 0;
        if (curl_multi_perform(l->multi, &running) != CURLM_OK) {
            st = zb__err(ZB_E_IO, "libcurl: multi perform failed");
            break;
        }
        reap(l);
        if (cs->qn && deliver(cs, done, ctx)) {
            *cancelled = true;
            break;
        }
        if (all_finished(l)) break;
        wake = next_wake(l, now_s() + 1.0); /* retries scheduled by reap count too */
        int ms = (int)ceil((wake - now_s()) * 1000);
        if (ms < 0) ms = 0;
        if (l->active) {
            if (ms > 100) ms = 100;
            curl_multi_poll(l->multi, NULL, 0, ms, NULL);
        } else if (ms > 0) { /* only retries waiting out their backoff */
            struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    cancel_all(l);
    return st;
}

static void
xfers_free(xfer *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        curl_slist_free_all(x[i].hdrs);
        zb__buf_free(&x[i].url);
        zb__buf_free(&x[i].err);
    }
    free(x);
}

zb_status
zb__remote_get_ranges(zb__remote *r, zb__url_fn url_of, void *url_ctx, zb_range *ranges, size_t n,
                      zb_range_fn done, void *ctx)
{
    atomic_fetch_add(&r->ranges, n);
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    done_item *q = malloc((n ? n : 1) * sizeof *q);
    zb__coalesced *g = NULL;
    size_t ng = 0;
    xfer *x = NULL;
    CURLM *multi = NULL;
    call_state cs = {r, ranges, q, 0};
    zb_status st = (!order || !q) ? zb__err(ZB_E_NOMEM, "remote: out of memory") : ZB_OK;
    for (size_t i = 0; i < n; i++) {
        ranges[i].nread = 0;
        ranges[i].status = ZB_E_CANCELLED; /* not complete yet */
    }
    if (st == ZB_OK)
        st = zb__coalesce(ranges, n, r->o.coalesce_gap, r->o.max_request_bytes, order, &g, &ng);
    if (st == ZB_OK && !(x = calloc(ng ? ng : 1, sizeof *x)))
        st = zb__err(ZB_E_NOMEM, "remote: out of memory");
    if (st == ZB_OK && !(multi = multi_new(r)))
        st = zb__err(ZB_E_NOMEM, "libcurl: no multi handle");
    for (size_t i = 0; i < ng && st == ZB_OK; i++) {
        x[i] = (xfer){.cs = &cs,
                      .sub = order + g[i].first,
                      .count = g[i].count,
                      .end = g[i].end,
                      .req_off = g[i].offset,
                      .suffix = g[i].offset == ZB_RANGE_SUFFIX};
        st = url_of(url_ctx, ranges[order[g[i].first]].key, &x[i].url);
    }
    if (st == ZB_OK) { /* zero-length ranges are complete at once */
        for (size_t i = 0; i < n; i++)
            if (!ranges[i].length) {
                ranges[i].status = ZB_OK;
                q[cs.qn++] = (done_item){i, NULL};
            }
        bool cancelled = false;
        if (cs.qn && deliver(&cs, done, ctx)) cancelled = true;
        if (!cancelled) {
            /* No CURLMOPT_MAX_HOST_CONNECTIONS: start_ready bounds this call's transfers, and
             * the connections it counts are the shared cache's, so transfers of this call would
             * wait as pending for connections other calls (threads) hold, and libcurl 7.88 does
             * not wake them when those are returned: a window read next to another one hung. */
            loop l = {r, multi, x, ng, 0, 0};
            st = run_loop(&l, &cs, done, ctx, &cancelled);
        }
        (void)cancelled; /* ranges not complete keep status ZB_E_CANCELLED */
    }
    if (multi) curl_multi_cleanup(multi);
    xfers_free(x, ng);
    free(g);
    free(order);
    free(q);
    return st;
}

zb_status
zb__remote_perform(zb__remote *r, zb__http_req *reqs, size_t n)
{
    xfer *x = calloc(n ? n : 1, sizeof *x);
    CURLM *multi = multi_new(r);
    call_state cs = {r, NULL, NULL, 0};
    zb_status st = (!x || !multi) ? zb__err(ZB_E_NOMEM, "remote: out of memory") : ZB_OK;
    for (size_t i = 0; i < n && st == ZB_OK; i++) {
        x[i] = (xfer){.cs = &cs, .req = &reqs[i]};
        reqs[i].status = ZB_E_CANCELLED;
        reqs[i].http_status = 0;
        st = zb__buf_append(&x[i].url, reqs[i].url, strlen(reqs[i].url) + 1);
    }
    if (st == ZB_OK) {
        loop l = {r, multi, x, n, 0, 0};
        bool cancelled;
        st = run_loop(&l, &cs, NULL, NULL, &cancelled);
    }
    for (size_t i = 0; i < n && st == ZB_OK; i++)
        if (reqs[i].status != ZB_OK) {
            st = zb__err(reqs[i].status, "%s", x[i].msg);
            zb__remote_redact(r);
        }
    if (multi) curl_multi_cleanup(multi);
    if (x) xfers_free(x, n);
    return st;
}
