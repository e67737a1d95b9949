/* The s3 backend: s3://bucket/prefix over the S3 REST API (AWS or any S3-compatible server),
 * signed with AWS Signature V4 by libcurl (CURLOPT_AWS_SIGV4) when credentials are given.
 *
 * Reads are those of every remote store (store/curl.c). Listing is ListObjectsV2 with '/' as the
 * delimiter, page by page. Writes: an object up to multipart_threshold is one PUT (S3 makes it
 * visible whole or not at all); a larger one (a shard) is a multipart upload whose parts go up
 * concurrently and which is completed only when every part is in, and aborted
 * (AbortMultipartUpload) on any failure, so no reader ever sees part of it. rename is
 * CopyObject + DeleteObject: each object appears whole, but the pair is not atomic
 * (docs/REMOTE.md says what the writers rely on). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/remote.h"
#include "store/store.h"
#include "util/status.h"

typedef struct s3_store {
    zb__remote *r;
    zb__s3_target t;
    char name[1200]; /* "s3://bucket/prefix" */
} s3_store;

/* The object key of a store key: "prefix/key" (or just one of them). */
static zb_status
full_key(const s3_store *s, const char *key, zb__buf *out)
{
    out->len = 0;
    ZB_TRY(zb__buf_append(out, s->t.prefix, strlen(s->t.prefix)));
    if (s->t.prefix[0] && key[0]) ZB_TRY(zb__buf_append(out, "/", 1));
    ZB_TRY(zb__buf_append(out, key, strlen(key)));
    return zb__buf_append(out, "", 1);
}

/* base + "/" + the encoded object key + query (NULL = none). */
static zb_status
object_url(const s3_store *s, const char *key, const char *query, zb__buf *url)
{
    zb__buf k = {0};
    zb_status st = full_key(s, key, &k);
    url->len = 0;
    if (st == ZB_OK) st = zb__buf_append(url, s->t.base, strlen(s->t.base));
    if (st == ZB_OK) st = zb__buf_append(url, "/", 1);
    if (st == ZB_OK) st = zb__url_encode(url, (const char *)k.data, true);
    if (st == ZB_OK && query) st = zb__buf_append(url, "?", 1);
    if (st == ZB_OK && query) st = zb__buf_append(url, query, strlen(query));
    if (st == ZB_OK) st = zb__buf_append(url, "", 1);
    zb__buf_free(&k);
    return st;
}

static zb_status
s3_url(void *self, const char *key, zb__buf *url)
{
    return object_url(self, key, NULL, url);
}

static zb_status
s3_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    s3_store *s = self;
    if (!key[0]) return zb__err(ZB_E_NOTFOUND, "%s: the root is not an object", s->name);
    return zb__remote_get_one(s->r, s3_url, s, key, offset, length, dst, nread);
}

static zb_status
s3_get_ranges(void *self, zb_range *ranges, size_t n, zb_range_fn done, void *ctx)
{
    s3_store *s = self;
    return zb__remote_get_ranges(s->r, s3_url, s, ranges, n, done, ctx);
}

static zb_status
s3_size(void *self, const char *key, uint64_t *size)
{
    s3_store *s = self;
    if (!key[0]) return zb__err(ZB_E_NOTFOUND, "%s: the root is not an object", s->name);
    return zb__remote_head(s->r, s3_url, s, key, size);
}

/* ---- listing ------------------------------------------------------------------------------- */

/* The ListObjectsV2 URL of one page. The query parameters are in the order SigV4's canonical
 * query string wants (sorted by name), each value encoded once, as libcurl signs the URL as
 * given. */
static zb_status
list_url(const s3_store *s, const char *prefix, const char *token, zb__buf *url)
{
    url->len = 0;
    ZB_TRY(zb__buf_append(url, s->t.base, strlen(s->t.base)));
    ZB_TRY(zb__buf_append(url, s->t.path_style ? "?" : "/?", s->t.path_style ? 1 : 2));
    if (token) {
        ZB_TRY(zb__buf_append(url, "continuation-token=", 19));
        ZB_TRY(zb__url_encode(url, token, false));
        ZB_TRY(zb__buf_append(url, "&", 1));
    }
    static const char mid[] = "delimiter=%2F&list-type=2&prefix=";
    ZB_TRY(zb__buf_append(url, mid, sizeof mid - 1));
    ZB_TRY(zb__url_encode(url, prefix, false));
    return zb__buf_append(url, "", 1);
}

static zb_status
s3_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    s3_store *s = self;
    zb__buf p = {0}, url = {0};
    zb__s3_listing l = {0};
    zb_status st = full_key(s, prefix, &p);
    if (st == ZB_OK && p.len > 1) { /* list below "a/b/", not names starting with "a/b" */
        p.data[p.len - 1] = '/';
        st = zb__buf_append(&p, "", 1);
    }
    const char *pre = (const char *)p.data;
    for (int page = 0; st == ZB_OK; page++) {
        st = list_url(s, pre, l.next_token, &url);
        zb__http_req q = {.method = ZB_HTTP_GET,
                          .url = (const char *)url.data,
                          .what = prefix,
                          .want_body = true};
        if (st == ZB_OK) st = zb__remote_perform(s->r, &q, 1);
        if (st == ZB_OK) st = zb__s3_parse_list((const char *)q.body.data, q.body.len, pre, &l);
        if (st != ZB_OK)
            st = zb__err_context(st, "%s: listing \"%s\" (page %d)", s->name, pre, page);
        zb__buf_free(&q.body);
        if (st != ZB_OK || !l.next_token) break;
    }
    /* names are collected first: the callback may call the store */
    for (size_t i = 0; i < l.n && st == ZB_OK; i++)
        if (fn(ctx, l.names[i], l.is_dir[i])) break;
    zb__s3_listing_free(&l);
    zb__buf_free(&url);
    zb__buf_free(&p);
    return st;
}

/* ---- writes -------------------------------------------------------------------------------- */

/* A 200 that carries an <Error> (CompleteMultipartUpload and CopyObject may answer so). */
static zb_status
check_body_error(const s3_store *s, const char *what, const zb__buf *body)
{
    if (!body->len || !memmem(body->data, body->len, "<Error>", 7)) return ZB_OK;
    char *code = zb__xml_text((const char *)body->data, body->len, "Code");
    char *msg = zb__xml_text((const char *)body->data, body->len, "Message");
    zb_status st = zb__err(ZB_E_IO, "%s: %s failed: %s: %.300s", s->name, what,
                           code ? code : "error", msg ? msg : "");
    free(code);
    free(msg);
    return st;
}

static zb_status
put_single(s3_store *s, const char *key, const void *data, uint64_t length)
{
    zb__buf url = {0};
    zb_status st = object_url(s, key, NULL, &url);
    zb__http_req q = {.method = ZB_HTTP_PUT,
                      .url = (const char *)url.data,
                      .what = key,
                      .upload = data,
                      .upload_len = (size_t)length};
    if (st == ZB_OK) st = zb__remote_perform(s->r, &q, 1);
    zb__buf_free(&q.body);
    zb__buf_free(&url);
    return st;
}

/* The query of one upload request: "uploadId=ID" or "partNumber=K&uploadId=ID" (sorted). */
static zb_status
upload_query(zb__buf *q, unsigned part, const char *upload_id)
{
    q->len = 0;
    if (part) {
        char pn[32];
        int w = snprintf(pn, sizeof pn, "partNumber=%u&", part);
        ZB_TRY(zb__buf_append(q, pn, (size_t)w));
    }
    ZB_TRY(zb__buf_append(q, "uploadId=", 9));
    ZB_TRY(zb__url_encode(q, upload_id, false));
    return zb__buf_append(q, "", 1);
}

static void
abort_upload(s3_store *s, const char *key, const char *upload_id)
{
    zb__buf qs = {0}, url = {0};
    zb__http_req q = {.method = ZB_HTTP_DELETE, .what = key};
    if (upload_query(&qs, 0, upload_id) == ZB_OK &&
        object_url(s, key, (const char *)qs.data, &url) == ZB_OK) {
        q.url = (const char *)url.data;
        zb__remote_perform(s->r, &q, 1); /* best effort: the error reported is the first one */
    }
    zb__buf_free(&q.body);
    zb__buf_free(&qs);
    zb__buf_free(&url);
}

static zb_status
put_parts(s3_store *s, const char *key, const uint8_t *data, uint64_t length, const char *upload_id,
          zb__buf *complete)
{
    uint64_t part = s->r ? zb__remote_options(s->r)->part_bytes : 0;
    size_t np = (size_t)((length + part - 1) / part);
    if (np > 10000)
        return zb__err(ZB_E_INVALID, "%s/%s: %llu bytes need %zu parts of %llu (S3 allows 10000)",
                       s->name, key, (unsigned long long)length, np, (unsigned long long)part);
    zb__http_req *q = calloc(np, sizeof *q);
    zb__buf *urls = calloc(np, sizeof *urls);
    zb__buf qs = {0};
    zb_status st = (!q || !urls) ? zb__err(ZB_E_NOMEM, "s3: out of memory") : ZB_OK;
    for (size_t i = 0; i < np && st == ZB_OK; i++) {
        uint64_t off = (uint64_t)i * part, n = length - off < part ? length - off : part;
        st = upload_query(&qs, (unsigned)i + 1, upload_id);
        if (st == ZB_OK) st = object_url(s, key, (const char *)qs.data, &urls[i]);
        q[i] = (zb__http_req){.method = ZB_HTTP_PUT,
                              .url = (const char *)urls[i].data,
                              .what = key,
                              .upload = data + off,
                              .upload_len = (size_t)n,
                              .want_etag = true};
    }
    if (st == ZB_OK) st = zb__remote_perform(s->r, q, np);
    static const char head[] = "<CompleteMultipartUpload>";
    if (st == ZB_OK) st = zb__buf_append(complete, head, sizeof head - 1);
    for (size_t i = 0; i < np && st == ZB_OK; i++) {
        char part_xml[256];
        if (!q[i].etag[0]) {
            st =
                zb__err(ZB_E_IO, "%s/%s: part %zu was stored without an ETag", s->name, key, i + 1);
            break;
        }
        int w =
            snprintf(part_xml, sizeof part_xml,
                     "<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag></Part>", i + 1, q[i].etag);
        st = zb__buf_append(complete, part_xml, (size_t)w);
    }
    static const char tail[] = "</CompleteMultipartUpload>";
    if (st == ZB_OK) st = zb__buf_append(complete, tail, sizeof tail - 1);
    for (size_t i = 0; q && i < np; i++) zb__buf_free(&q[i].body);
    for (size_t i = 0; urls && i < np; i++) zb__buf_free(&urls[i]);
    free(q);
    free(urls);
    zb__buf_free(&qs);
    return st;
}

static zb_status
put_multipart(s3_store *s, const char *key, const uint8_t *data, uint64_t length)
{
    zb__buf url = {0}, qs = {0}, complete = {0};
    char *upload_id = NULL;
    zb__http_req init = {.method = ZB_HTTP_POST, .what = key, .want_body = true};
    zb_status st = object_url(s, key, "uploads=", &url);
    if (st == ZB_OK) {
        init.url = (const char *)url.data;
        st = zb__remote_perform(s->r, &init, 1);
    }
    if (st == ZB_OK) {
        upload_id = zb__xml_text((const char *)init.body.data, init.body.len, "UploadId");
        if (!upload_id || !*upload_id)
            st = zb__err(ZB_E_IO, "%s/%s: CreateMultipartUpload answered without an UploadId",
                         s->name, key);
    }
    bool started = st == ZB_OK;
    if (st == ZB_OK) st = put_parts(s, key, data, length, upload_id, &complete);
    zb__http_req fin = {.method = ZB_HTTP_POST,
                        .what = key,
                        .want_body = true,
                        .upload = complete.data,
                        .upload_len = complete.len};
    if (st == ZB_OK) st = upload_query(&qs, 0, upload_id);
    if (st == ZB_OK) st = object_url(s, key, (const char *)qs.data, &url);
    if (st == ZB_OK) {
        fin.url = (const char *)url.data;
        st = zb__remote_perform(s->r, &fin, 1);
    }
    if (st == ZB_OK) st = check_body_error(s, "CompleteMultipartUpload", &fin.body);
    if (st != ZB_OK && started) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", zb_last_error());
        abort_upload(s, key, upload_id);
        st = zb__err(st, "%s (the multipart upload was aborted)", msg);
    }
    free(upload_id);
    zb__buf_free(&init.body);
    zb__buf_free(&fin.body);
    zb__buf_free(&complete);
    zb__buf_free(&qs);
    zb__buf_free(&url);
    return st;
}

static zb_status
s3_put(void *self, const char *key, const void *data, uint64_t length)
{
    s3_store *s = self;
    if (length > zb__remote_options(s->r)->multipart_threshold)
        return put_multipart(s, key, data, length);
    return put_single(s, key, data, length);
}

static zb_status
s3_erase(void *self, const char *key)
{
    s3_store *s = self;
    zb__buf url = {0};
    zb_status st = object_url(s, key, NULL, &url);
    zb__http_req q = {.method = ZB_HTTP_DELETE, .url = (const char *)url.data, .what = key};
    if (st == ZB_OK) st = zb__remote_perform(s->r, &q, 1);
    if (st == ZB_E_NOTFOUND) st = ZB_OK; /* erasing what is absent is done */
    zb__buf_free(&q.body);
    zb__buf_free(&url);
    return st;
}

/* CopyObject then DeleteObject (S3 has no rename). */
static zb_status
s3_rename(void *self, const char *from, const char *to)
{
    s3_store *s = self;
    zb__buf src = {0}, hdr = {0}, url = {0};
    zb_status st = full_key(s, from, &src);
    static const char h[] = "x-amz-copy-source: /";
    if (st == ZB_OK) st = zb__buf_append(&hdr, h, sizeof h - 1);
    if (st == ZB_OK) st = zb__buf_append(&hdr, s->t.bucket, strlen(s->t.bucket));
    if (st == ZB_OK) st = zb__buf_append(&hdr, "/", 1);
    if (st == ZB_OK) st = zb__url_encode(&hdr, (const char *)src.data, true);
    if (st == ZB_OK) st = zb__buf_append(&hdr, "", 1);
    if (st == ZB_OK) st = object_url(s, to, NULL, &url);
    zb__http_req q = {.method = ZB_HTTP_PUT,
                      .url = (const char *)url.data,
                      .what = to,
                      .header = (const char *)hdr.data,
                      .want_body = true};
    if (st == ZB_OK) st = zb__remote_perform(s->r, &q, 1);
    if (st == ZB_OK) st = check_body_error(s, "CopyObject", &q.body);
    if (st == ZB_OK) st = s3_erase(s, from);
    zb__buf_free(&q.body);
    zb__buf_free(&src);
    zb__buf_free(&hdr);
    zb__buf_free(&url);
    return st;
}

static void
s3_stats(void *self, zb_store_stats *out)
{
    zb__remote_stats(((s3_store *)self)->r, out);
}

static void
s3_close(void *self)
{
    s3_store *s = self;
    if (!s) return;
    zb__remote_free(s->r);
    free(s);
}

static const zb_store_methods s3_methods = {
    .scheme = "s3",
    .get = s3_get,
    .size = s3_size,
    .list = s3_list,
    .put = s3_put,
    .erase = s3_erase,
    .rename = s3_rename,
    .close = s3_close,
    .get_ranges = s3_get_ranges,
    .suffix_ranges = true,
    .stats = s3_stats,
};

uint64_t
zb__s3_store_gap(const zb_store *s)
{
    return s->m == &s3_methods ? zb__remote_options(((s3_store *)s->self)->r)->coalesce_gap : 0;
}

zb_status
zb__store_open_s3(const char *url, const zb_remote_opts *opts, zb_store **out)
{
    *out = NULL;
    zb_remote_opts d = ZB_REMOTE_OPTS_DEFAULT;
    if (!opts) opts = &d;
    s3_store *s = calloc(1, sizeof *s);
    if (!s) return zb__err(ZB_E_NOMEM, "s3 store: out of memory");
    zb_status st =
        zb__s3_target_parse(url, opts->endpoint_url, opts->region, opts->addressing, &s->t);
    if (st == ZB_OK && opts->part_bytes && opts->part_bytes < ((uint64_t)5 << 20) &&
        opts->endpoint_url == NULL)
        st = zb__err(ZB_E_INVALID, "%s: part_bytes %llu is below S3's 5 MiB minimum", url,
                     (unsigned long long)opts->part_bytes);
    if (st == ZB_OK) st = zb__remote_new(opts, s->t.region, &s->r);
    if (st == ZB_OK) {
        snprintf(s->name, sizeof s->name, "s3://%s%s%s", s->t.bucket, s->t.prefix[0] ? "/" : "",
                 s->t.prefix);
        st = zb_store_new(&s3_methods, s, out);
    }
    if (st != ZB_OK) {
        s3_close(s);
        return st;
    }
    (*out)->name = s->name;
    return ZB_OK;
}
