/* Remote stores (http, https, s3): the libcurl engine they share and the pure pieces under it
 * (range coalescing, retry arithmetic, Content-Range parsing, URL building, S3 XML), which the C
 * tests exercise without a server. */
#ifndef ZB_STORE_REMOTE_H
#define ZB_STORE_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "zbatch.h"

/* ---- coalescing ---------------------------------------------------------------------------- */

/* One request of a coalesced plan: ranges order[first .. first+count) (sorted by key, then
 * offset) read by one request of bytes [offset, end) of their key. */
typedef struct zb__coalesced {
    size_t first, count;
    uint64_t offset, end;
} zb__coalesced;

/* Plans the requests for `n` ranges: sorts their indices into `order` (by key, then offset) and
 * groups ranges of one key whose gap to the group is at most `gap` bytes while the group spans
 * at most `max_bytes` (a single range longer than that is one request on its own). Zero-length
 * ranges are left out of every group; a suffix range (ZB_RANGE_SUFFIX) is a group of its own. *groups is malloc'd (free with free()); *ngroups counts
 * them. */
zb_status zb__coalesce(const zb_range *ranges, size_t n, uint64_t gap, uint64_t max_bytes,
                       size_t *order, zb__coalesced **groups, size_t *ngroups);

/* ---- retries ------------------------------------------------------------------------------- */

/* The wait before retry `attempt` (1 = the first retry): full jitter, u01 * min(max_s,
 * base_s * 2^(attempt-1)), with u01 uniform in [0, 1). */
double zb__backoff_delay(double base_s, double max_s, int attempt, double u01);

/* Whether an HTTP status is worth retrying (408, 429, 5xx). */
bool zb__http_retryable(long http_status);

/* ---- responses ----------------------------------------------------------------------------- */

/* Parses a Content-Range value, "bytes FIRST-LAST/TOTAL" (TOTAL may be '*': *total = UINT64_MAX)
 * or "bytes * /TOTAL" (the 416 form: *first = *last = UINT64_MAX). Returns false when malformed
 * or LAST < FIRST. */
bool zb__parse_content_range(const char *value, uint64_t *first, uint64_t *last, uint64_t *total);

/* ---- URLs ---------------------------------------------------------------------------------- */

/* Appends `s` percent-encoded as S3 and RFC 3986 want (unreserved A-Z a-z 0-9 - . _ ~ kept;
 * '/' kept when keep_slash). */
zb_status zb__url_encode(zb__buf *out, const char *s, bool keep_slash);

/* The parts of an s3://bucket/prefix URL and the URL base every key is appended to. */
typedef struct zb__s3_target {
    char bucket[64];
    char prefix[1024]; /* "" or "a/b" (normalised, no trailing '/') */
    char base[2048];   /* "https://bucket.s3.us-east-1.amazonaws.com" or "ENDPOINT/bucket" */
    char region[64];
    bool path_style; /* the bucket is the first path segment of base */
} zb__s3_target;

/* Splits `url` (s3://bucket[/prefix]) and builds its base URL from the endpoint (NULL = AWS),
 * the region (NULL = us-east-1) and the addressing (ZB_S3_ADDRESSING_*). */
zb_status zb__s3_target_parse(const char *url, const char *endpoint, const char *region,
                              int addressing, zb__s3_target *out);

/* ---- S3 XML -------------------------------------------------------------------------------- */

/* What a ListObjectsV2 page says: child names relative to the listed prefix, whether each is a
 * "directory" (a CommonPrefix), and the continuation token when truncated. */
typedef struct zb__s3_listing {
    char **names;
    bool *is_dir;
    size_t n, cap;
    char *next_token; /* NULL when the listing is complete */
} zb__s3_listing;

/* Parses one ListObjectsV2 result page for the listed `prefix` ("" or "a/b/"), appending to
 * `out` (which may hold earlier pages). */
zb_status zb__s3_parse_list(const char *xml, size_t len, const char *prefix, zb__s3_listing *out);
void zb__s3_listing_free(zb__s3_listing *l);

/* The text of the first element `name` (e.g. "UploadId", "Code", "Message") in an XML document,
 * malloc'd; NULL when absent or malformed. */
char *zb__xml_text(const char *xml, size_t len, const char *name);

/* ---- the engine ---------------------------------------------------------------------------- */

typedef struct zb__remote zb__remote;

typedef enum zb__http_method {
    ZB_HTTP_GET,
    ZB_HTTP_HEAD,
    ZB_HTTP_PUT,
    ZB_HTTP_POST,
    ZB_HTTP_DELETE
} zb__http_method;

/* One HTTP request run by zb__remote_perform (a coalesced GET fills ranges; others collect their
 * response body in `body`). */
typedef struct zb__http_req {
    zb__http_method method;
    const char *url;       /* no credentials in it: it appears in messages */
    const char *what;      /* the key, for messages */
    const uint8_t *upload; /* PUT/POST body */
    size_t upload_len;
    const char *header; /* one extra request header ("x-amz-copy-source: ..."), or NULL */
    bool want_body;     /* collect the response body (capped at 16 MiB) */
    bool want_etag;
    /* out */
    long http_status;
    uint64_t content_length; /* HEAD: the object's size (UINT64_MAX: not given) */
    zb__buf body;
    char etag[128];
    zb_status status;
} zb__http_req;

/* Makes the engine for one store: options copied (NULL = defaults), a connection cache shared
 * by the store's threads. `sign_region` non-NULL signs requests with SigV4 for S3 in that
 * region when the options hold credentials. */
zb_status zb__remote_new(const zb_remote_opts *opts, const char *sign_region, zb__remote **out);
void zb__remote_free(zb__remote *r);
const zb_remote_opts *zb__remote_options(const zb__remote *r);

/* Reads `n` ranges whose keys map to URLs by url_of(ctx, key, buf) (the URL written into buf),
 * as zb_store_methods.get_ranges describes. */
typedef zb_status (*zb__url_fn)(void *ctx, const char *key, zb__buf *url);
zb_status zb__remote_get_ranges(zb__remote *r, zb__url_fn url_of, void *url_ctx, zb_range *ranges,
                                size_t n, zb_range_fn done, void *ctx);

/* Runs `n` requests concurrently with retries; each gets status (ZB_OK for 2xx), http_status,
 * and its body when asked. Returns the first failure in list order (message set), else ZB_OK. */
zb_status zb__remote_perform(zb__remote *r, zb__http_req *reqs, size_t n);

/* One range through the same engine (pool threads call this concurrently); the store's get. */
zb_status zb__remote_get_one(zb__remote *r, zb__url_fn url_of, void *self, const char *key,
                             uint64_t offset, uint64_t length, void *dst, uint64_t *nread);

/* The size of `key` by a HEAD request; the store's size. */
zb_status zb__remote_head(zb__remote *r, zb__url_fn url_of, void *self, const char *key,
                          uint64_t *size);

void zb__remote_stats(zb__remote *r, zb_store_stats *out);

/* Replaces every credential of the options found in this thread's error message by "***". */
void zb__remote_redact(const zb__remote *r);

/* The coalesce_gap of a remote store's options (http, https, s3); 0 for any other store. */
uint64_t zb__remote_store_gap(const zb_store *s);
uint64_t zb__s3_store_gap(const zb_store *s); /* (the s3 part of it) */

/* Backends. */
zb_status zb__store_open_http(const char *url, const zb_remote_opts *opts, zb_store **out);
zb_status zb__store_open_s3(const char *url, const zb_remote_opts *opts, zb_store **out);

#endif
