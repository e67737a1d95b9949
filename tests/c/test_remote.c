/* The pure pieces of the remote stores (store/remote.h): range coalescing, retry arithmetic,
 * Content-Range parsing, URL building, S3 XML listing; and the engine's behaviour against a
 * port nobody listens on (bounded retries, a message naming URL and range). Servers are in
 * tests/python/test_remote*.py. */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/remote.h"
#include "support/testutil.h"
#include "util/buf.h"

static void
test_coalesce(void **state)
{
    (void)state;
    /* two objects; ranges given out of order; one zero-length range */
    zb_range r[] = {
        {.key = "b", .offset = 0, .length = 10},    /* 0 */
        {.key = "a", .offset = 200, .length = 50},  /* 1: gap 100 after #3 -> joins (gap 100) */
        {.key = "a", .offset = 0, .length = 100},   /* 2 */
        {.key = "a", .offset = 90, .length = 10},   /* 3: overlaps #2 */
        {.key = "a", .offset = 1000, .length = 10}, /* 4: gap 750 -> new request */
        {.key = "a", .offset = 5, .length = 0},     /* 5: empty: in no request */
        {.key = "b", .offset = 30, .length = 10},   /* 6: gap 20 -> joins #0 */
    };
    size_t order[7];
    zb__coalesced *g = NULL;
    size_t ng = 0;
    ZB_ASSERT_OK(zb__coalesce(r, 7, 100, 1 << 20, order, &g, &ng));
    assert_int_equal(ng, 3);
    /* a: [0,250) from #2 #3 #1; a: [1000,1010); b: [0,40) */
    assert_int_equal(g[0].count, 3);
    assert_int_equal(g[0].offset, 0);
    assert_int_equal(g[0].end, 250);
    assert_int_equal(order[g[0].first], 2);
    assert_int_equal(order[g[0].first + 1], 3);
    assert_int_equal(order[g[0].first + 2], 1);
    assert_int_equal(g[1].count, 1);
    assert_int_equal(g[1].offset, 1000);
    assert_int_equal(g[1].end, 1010);
    assert_int_equal(g[2].count, 2);
    assert_int_equal(g[2].end, 40);
    assert_int_equal(order[g[2].first], 0);
    free(g);

    /* gap 0 keeps touching ranges together but not ones a byte apart; the size cap splits */
    zb_range t[] = {{.key = "k", .offset = 0, .length = 10},
                    {.key = "k", .offset = 10, .length = 10},
                    {.key = "k", .offset = 21, .length = 10},
                    {.key = "k", .offset = 31, .length = 100}};
    ZB_ASSERT_OK(zb__coalesce(t, 4, 0, 1 << 20, order, &g, &ng));
    assert_int_equal(ng, 2);
    assert_int_equal(g[0].end, 20);
    assert_int_equal(g[1].offset, 21);
    assert_int_equal(g[1].end, 131);
    free(g);
    ZB_ASSERT_OK(zb__coalesce(t, 4, 1000, 40, order, &g, &ng));
    assert_int_equal(ng, 2); /* [0,31) then [31,131) (a range longer than the cap stands alone) */
    assert_int_equal(g[0].end, 31);
    assert_int_equal(g[1].offset, 31);
    free(g);

    /* a suffix range (a shard's index) is a request of its own, even next to ranges of its
     * object and another suffix of it */
    zb_range u[] = {{.key = "k", .offset = 0, .length = 10},
                    {.key = "k", .offset = ZB_RANGE_SUFFIX, .length = 20},
                    {.key = "k", .offset = 10, .length = 10},
                    {.key = "k", .offset = ZB_RANGE_SUFFIX, .length = 5}};
    ZB_ASSERT_OK(zb__coalesce(u, 4, 1 << 20, 1 << 20, order, &g, &ng));
    assert_int_equal(ng, 3);
    assert_int_equal(g[0].count, 2);
    assert_int_equal(g[0].end, 20);
    assert_int_equal(g[1].count, 1);
    assert_int_equal(g[1].offset, ZB_RANGE_SUFFIX);
    assert_int_equal(g[2].count, 1);
    assert_int_equal(g[2].offset, ZB_RANGE_SUFFIX);
    assert_true(u[order[g[1].first]].length + u[order[g[2].first]].length == 25);
    free(g);
}

static void
test_backoff(void **state)
{
    (void)state;
    /* full jitter: u * min(max, base * 2^(attempt-1)) */
    assert_true(zb__backoff_delay(0.1, 5, 1, 0.5) == 0.05);
    assert_true(zb__backoff_delay(0.1, 5, 3, 1.0) == 0.4);
    assert_true(zb__backoff_delay(0.1, 5, 10, 1.0) == 5.0);   /* capped */
    assert_true(zb__backoff_delay(0.1, 5, 1000, 0.5) == 2.5); /* no overflow */
    assert_true(zb__backoff_delay(0.1, 5, 4, 0.0) == 0.0);
    assert_true(zb__http_retryable(500) && zb__http_retryable(503) && zb__http_retryable(429) &&
                zb__http_retryable(408));
    assert_false(zb__http_retryable(404) || zb__http_retryable(403) || zb__http_retryable(416) ||
                 zb__http_retryable(200));
}

static void
test_content_range(void **state)
{
    (void)state;
    uint64_t a, b, t;
    assert_true(zb__parse_content_range(" bytes 0-99/1000\r\n", &a, &b, &t));
    assert_true(a == 0 && b == 99 && t == 1000);
    assert_true(zb__parse_content_range("bytes 5-5/*", &a, &b, &t));
    assert_true(a == 5 && b == 5 && t == UINT64_MAX);
    assert_true(zb__parse_content_range("bytes */1000", &a, &b, &t));
    assert_true(a == UINT64_MAX && t == 1000);
    assert_false(zb__parse_content_range("bytes 10-5/100", &a, &b, &t));  /* last < first */
    assert_false(zb__parse_content_range("bytes 0-100/100", &a, &b, &t)); /* past the total */
    assert_false(zb__parse_content_range("bytes 0-99", &a, &b, &t));
    assert_false(zb__parse_content_range("items 0-9/10", &a, &b, &t));
    assert_false(zb__parse_content_range("bytes 0-99999999999999999999999/1", &a, &b, &t));
    assert_false(zb__parse_content_range("bytes */*", &a, &b, &t));
}

static void
test_urls(void **state)
{
    (void)state;
    zb__buf b = {0};
    ZB_ASSERT_OK(zb__url_encode(&b, "a b/c+d~é", true));
    ZB_ASSERT_OK(zb__buf_append(&b, "", 1));
    assert_string_equal((char *)b.data, "a%20b/c%2Bd~%C3%A9");
    b.len = 0;
    ZB_ASSERT_OK(zb__url_encode(&b, "x/y=", false));
    ZB_ASSERT_OK(zb__buf_append(&b, "", 1));
    assert_string_equal((char *)b.data, "x%2Fy%3D");
    zb__buf_free(&b);

    zb__s3_target t;
    ZB_ASSERT_OK(zb__s3_target_parse("s3://my-bucket/a//b/", NULL, NULL, 0, &t));
    assert_string_equal(t.bucket, "my-bucket");
    assert_string_equal(t.prefix, "a/b");
    assert_string_equal(t.region, "us-east-1");
    assert_string_equal(t.base, "https://my-bucket.s3.us-east-1.amazonaws.com");
    assert_false(t.path_style);
    ZB_ASSERT_OK(
        zb__s3_target_parse("s3://my-bucket", NULL, "eu-west-1", ZB_S3_ADDRESSING_PATH, &t));
    assert_string_equal(t.base, "https://s3.eu-west-1.amazonaws.com/my-bucket");
    assert_string_equal(t.prefix, "");
    ZB_ASSERT_OK(zb__s3_target_parse("s3://bkt/p", "http://127.0.0.1:9000/", NULL, 0, &t));
    assert_string_equal(t.base, "http://127.0.0.1:9000/bkt");
    assert_true(t.path_style);
    ZB_ASSERT_OK(zb__s3_target_parse("s3://bkt/p", "http://minio.local:9000", NULL,
                                     ZB_S3_ADDRESSING_VIRTUAL, &t));
    assert_string_equal(t.base, "http://bkt.minio.local:9000");
    /* a dotted bucket is path-style on AWS (TLS names cannot hold the dots) */
    ZB_ASSERT_OK(zb__s3_target_parse("s3://a.b.c/x", NULL, NULL, 0, &t));
    assert_string_equal(t.base, "https://s3.us-east-1.amazonaws.com/a.b.c");
    ZB_ASSERT_ERR(zb__s3_target_parse("s3://Bad_Bucket/x", NULL, NULL, 0, &t), ZB_E_INVALID,
                  "Bad_Bucket");
    ZB_ASSERT_ERR(zb__s3_target_parse("s3://ok-bucket/a/../b", NULL, NULL, 0, &t), ZB_E_BADKEY,
                  "..");
    ZB_ASSERT_ERR(zb__s3_target_parse("s3://bkt", "localhost:9000", NULL, 0, &t), ZB_E_INVALID,
                  "endpoint_url");
}

static void
test_s3_list_xml(void **state)
{
    (void)state;
    const char *page1 =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
        "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<Name>bkt</Name><Prefix>st/</Prefix><KeyCount>3</KeyCount>"
        "<IsTruncated>true</IsTruncated><NextContinuationToken>tok/+=1</NextContinuationToken>"
        "<Contents><Key>st/zarr.json</Key><Size>10</Size></Contents>"
        "<Contents><Key>st/a&amp;b</Key><Size>1</Size></Contents>"
        "<CommonPrefixes><Prefix>st/X/</Prefix></CommonPrefixes>"
        "</ListBucketResult>";
    const char *page2 = "<ListBucketResult><IsTruncated>false</IsTruncated>"
                        "<CommonPrefixes><Prefix>st/obs/</Prefix></CommonPrefixes>"
                        "<Contents><Key>st/</Key></Contents>"
                        "</ListBucketResult>";
    zb__s3_listing l = {0};
    ZB_ASSERT_OK(zb__s3_parse_list(page1, strlen(page1), "st/", &l));
    assert_int_equal(l.n, 3);
    assert_string_equal(l.names[0], "zarr.json");
    assert_false(l.is_dir[0]);
    assert_string_equal(l.names[1], "a&b");
    assert_string_equal(l.names[2], "X");
    assert_true(l.is_dir[2]);
    assert_string_equal(l.next_token, "tok/+=1");
    ZB_ASSERT_OK(zb__s3_parse_list(page2, strlen(page2), "st/", &l));
    assert_int_equal(l.n, 4); /* the "st/" marker object is not a child */
    assert_string_equal(l.names[3], "obs");
    assert_null(l.next_token);
    zb__s3_listing_free(&l);

    /* hostile pages: a key outside the prefix, a nested key, truncated without a token, junk */
    const char *out = "<ListBucketResult><Contents><Key>other/x</Key></Contents>"
                      "</ListBucketResult>";
    ZB_ASSERT_ERR(zb__s3_parse_list(out, strlen(out), "st/", &l), ZB_E_CORRUPT, "other/x");
    zb__s3_listing_free(&l);
    const char *deep = "<ListBucketResult><Contents><Key>st/a/b</Key></Contents>"
                       "</ListBucketResult>";
    ZB_ASSERT_ERR(zb__s3_parse_list(deep, strlen(deep), "st/", &l), ZB_E_CORRUPT, "immediate");
    zb__s3_listing_free(&l);
    const char *notok = "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";
    ZB_ASSERT_ERR(zb__s3_parse_list(notok, strlen(notok), "", &l), ZB_E_CORRUPT, "Continuation");
    zb__s3_listing_free(&l);
    const char *junk = "<ListBucketResult><Contents>";
    ZB_ASSERT_ERR(zb__s3_parse_list(junk, strlen(junk), "", &l), ZB_E_CORRUPT, "XML");
    zb__s3_listing_free(&l);

    const char *err = "<Error><Code>SignatureDoesNotMatch</Code><Message>no</Message></Error>";
    char *code = zb__xml_text(err, strlen(err), "Code");
    assert_string_equal(code, "SignatureDoesNotMatch");
    free(code);
    assert_null(zb__xml_text(err, strlen(err), "UploadId"));
    assert_null(zb__xml_text("<a>", 3, "a"));
}

/* A port on loopback that refuses connections (bound, never listened on, then closed). */
static int
dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t n = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &n);
    close(fd);
    return ntohs(a.sin_port);
}

static int
no_names(void *ctx, const char *name, bool is_dir)
{
    (void)ctx;
    (void)is_dir;
    fail_msg("an http store listed \"%s\"", name);
    return 1;
}

static void
test_unreachable_bounded(void **state)
{
    (void)state;
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/store", dead_port());
    zb_remote_opts o = ZB_REMOTE_OPTS_DEFAULT;
    o.max_retries = 3;
    o.backoff_base_s = 0.01;
    o.backoff_max_s = 0.02;
    zb_store *s = NULL;
    zb_store_opts so = ZB_STORE_OPTS_DEFAULT;
    so.remote = &o;
    ZB_ASSERT_OK(zb_store_open_opts(url, &so, &s));
    assert_string_equal(zb_store_scheme(s), "http");
    uint8_t buf[16];
    uint64_t got = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ZB_ASSERT_ERR(zb_store_get(s, "X/c/0", 100, 16, buf, &got), ZB_E_IO, "bytes=100-115");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(zbt_mentions("/store/X/c/0") && zbt_mentions("4 attempts"));
    assert_true((double)(t1.tv_sec - t0.tv_sec) < 5.0);
    zb_store_stats st;
    zb_store_get_stats(s, &st);
    assert_int_equal(st.retries, 3);
    assert_int_equal(st.requests, 4);
    /* listing is refused with a pointer to consolidated metadata; writes are refused */
    ZB_ASSERT_ERR(zb_store_list(s, "", no_names, NULL), ZB_E_UNSUPPORTED, "consolidated");
    ZB_ASSERT_ERR(zb_store_put(s, "k", "x", 1), ZB_E_UNSUPPORTED, "read-only");
    zb_store_close(s);

    /* credentials in an http URL would end up in messages: refused */
    ZB_ASSERT_ERR(zb_store_open("http://user:pw@127.0.0.1/x", &s), ZB_E_INVALID, "credentials");
    assert_null(s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coalesce),      cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_content_range), cmocka_unit_test(test_urls),
        cmocka_unit_test(test_s3_list_xml),   cmocka_unit_test(test_unreachable_bounded),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
