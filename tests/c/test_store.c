/* The store layer: key normalisation, the file backend (pread, list, atomic put, refusal of
 * escaping keys, mapped views) and the memory backend. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/testutil.h"

static void
test_key_normalize(void **state)
{
    (void)state;
    char out[64];
    ZB_ASSERT_OK(zb_key_normalize("//a\\b///c/", out, sizeof out));
    assert_string_equal(out, "a/b/c");
    ZB_ASSERT_OK(zb_key_normalize("", out, sizeof out));
    assert_string_equal(out, "");
    ZB_ASSERT_OK(zb_key_normalize("a/.zarray", out, sizeof out));
    assert_string_equal(out, "a/.zarray");
    ZB_ASSERT_OK(zb_key_normalize("a/..b/c", out, sizeof out));
    assert_string_equal(out, "a/..b/c");
    ZB_ASSERT_ERR(zb_key_normalize("a/../b", out, sizeof out), ZB_E_BADKEY, "..");
    ZB_ASSERT_ERR(zb_key_normalize("..", out, sizeof out), ZB_E_BADKEY, "..");
    ZB_ASSERT_ERR(zb_key_normalize("a/./b", out, sizeof out), ZB_E_BADKEY, "a/./b");
    ZB_ASSERT_ERR(zb_key_normalize("a\\..\\..\\etc", out, sizeof out), ZB_E_BADKEY, NULL);
    char small[4];
    ZB_ASSERT_ERR(zb_key_normalize("abcdef", small, sizeof small), ZB_E_INVALID, NULL);
}

static void
write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static int
collect(void *ctx, const char *name, bool is_dir)
{
    char *acc = ctx;
    strcat(acc, name);
    strcat(acc, is_dir ? "/," : ",");
    return 0;
}

static void
test_file_backend(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("store_file");
    char sub[2048];
    snprintf(sub, sizeof sub, "%s/grp", dir);
    mkdir(sub, 0777);
    uint8_t bytes[1000];
    for (int i = 0; i < 1000; i++) bytes[i] = (uint8_t)(i * 7);
    write_file(dir, "grp/blob", bytes, sizeof bytes);

    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open(dir, &s));
    assert_string_equal(zb_store_scheme(s), "file");
    uint64_t size = 0;
    ZB_ASSERT_OK(zb_store_size(s, "grp/blob", &size));
    assert_int_equal(size, 1000);

    /* a range read, and a short read at the end */
    uint8_t got[300];
    uint64_t n = 0;
    ZB_ASSERT_OK(zb_store_get(s, "/grp//blob", 100, 300, got, &n));
    assert_int_equal(n, 300);
    assert_memory_equal(got, bytes + 100, 300);
    ZB_ASSERT_OK(zb_store_get(s, "grp/blob", 900, 300, got, &n));
    assert_int_equal(n, 100);
    assert_memory_equal(got, bytes + 900, 100);

    ZB_ASSERT_ERR(zb_store_get(s, "grp/missing", 0, 10, got, &n), ZB_E_NOTFOUND, "grp/missing");
    ZB_ASSERT_ERR(zb_store_size(s, "grp", &size), ZB_E_NOTFOUND, NULL);
    /* keys that would escape the root never reach the file system */
    ZB_ASSERT_ERR(zb_store_get(s, "../etc/passwd", 0, 10, got, &n), ZB_E_BADKEY, "..");
    ZB_ASSERT_ERR(zb_store_size(s, "grp/../../x", &size), ZB_E_BADKEY, "..");

    /* put is atomic (temp + rename) and creates parents; list shows children */
    ZB_ASSERT_OK(zb_store_put(s, "grp/new/deep/k", "hello", 5));
    uint8_t *all = NULL;
    uint64_t len = 0;
    ZB_ASSERT_OK(zb_store_read_all(s, "grp/new/deep/k", &all, &len));
    assert_int_equal(len, 5);
    assert_string_equal((char *)all, "hello");
    free(all);
    char names[256] = "";
    ZB_ASSERT_OK(zb_store_list(s, "grp", collect, names));
    assert_non_null(strstr(names, "blob,"));
    assert_non_null(strstr(names, "new/,"));
    assert_null(strstr(names, "zbtmp"));
    ZB_ASSERT_OK(zb_store_rename(s, "grp/new/deep/k", "grp/k2"));
    ZB_ASSERT_ERR(zb_store_size(s, "grp/new/deep/k", &size), ZB_E_NOTFOUND, NULL);
    ZB_ASSERT_OK(zb_store_size(s, "grp/k2", &size));
    assert_int_equal(size, 5);
    ZB_ASSERT_OK(zb_store_erase(s, "grp/k2"));
    ZB_ASSERT_ERR(zb_store_size(s, "grp/k2", &size), ZB_E_NOTFOUND, NULL);
    /* an emptied directory can be erased; a non-empty one cannot */
    ZB_ASSERT_OK(zb_store_erase(s, "grp/new/deep"));
    names[0] = '\0';
    ZB_ASSERT_OK(zb_store_list(s, "grp/new", collect, names));
    assert_string_equal(names, "");
    ZB_ASSERT_ERR(zb_store_erase(s, "grp"), ZB_E_IO, "grp");
    zb_store_close(s);
    zb_store_close(NULL);

    ZB_ASSERT_ERR(zb_store_open("/nonexistent/zbatch/store", &s), ZB_E_NOTFOUND, "nonexistent");
    assert_null(s);
    /* remote URLs open their backends (no request is made at open) */
    ZB_ASSERT_OK(zb_store_open("s3://bucket/x//y/", &s));
    assert_string_equal(zb_store_scheme(s), "s3");
    assert_string_equal(zb_store_name(s), "s3://bucket/x/y");
    zb_store_close(s);
    ZB_ASSERT_OK(zb_store_open("https://example.org/a/store.zarr/", &s));
    assert_string_equal(zb_store_scheme(s), "http");
    assert_string_equal(zb_store_name(s), "https://example.org/a/store.zarr");
    zb_store_close(s);
    ZB_ASSERT_ERR(zb_store_open("s3://x/y", &s), ZB_E_INVALID, "bucket name");
    assert_null(s);
}

/* Views of the file backend: the same bytes as get, short at the end, refreshed by this
 * store's writes, and by another writer's replacement once the recheck interval has passed;
 * a view taken before a replacement keeps the old bytes until released; a spent budget or a
 * zero budget declines with ZB_E_UNSUPPORTED (get still works). */
static void
test_file_views(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("store_views");
    uint8_t bytes[20000];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)(i * 13 + 1);
    write_file(dir, "blob", bytes, sizeof bytes);
    write_file(dir, "empty", "", 0);

    /* the library reads no environment variable: the budget is zb_store_opts.mmap_bytes */
    setenv("ZBATCH_MMAP_BYTES", "0", 1);
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open(dir, &s));
    unsetenv("ZBATCH_MMAP_BYTES");
    const uint8_t *v = NULL;
    uint64_t n = 0;
    void *tok = NULL;
    ZB_ASSERT_OK(zb_store_view(s, "/blob", 5000, 4000, &v, &n, &tok));
    assert_int_equal(n, 4000);
    assert_memory_equal(v, bytes + 5000, 4000);
    /* a second view of the same file shares the mapping */
    const uint8_t *v2 = NULL;
    void *tok2 = NULL;
    ZB_ASSERT_OK(zb_store_view(s, "blob", 19000, 5000, &v2, &n, &tok2));
    assert_int_equal(n, 1000);
    assert_memory_equal(v2, bytes + 19000, 1000);
    assert_ptr_equal(tok, tok2);
    zb_store_release(s, tok2);
    ZB_ASSERT_OK(zb_store_view(s, "blob", 30000, 10, &v2, &n, &tok2));
    assert_int_equal(n, 0);
    zb_store_release(s, tok2);
    ZB_ASSERT_OK(zb_store_view(s, "empty", 0, 10, &v2, &n, &tok2));
    assert_int_equal(n, 0);
    zb_store_release(s, tok2);
    ZB_ASSERT_ERR(zb_store_view(s, "missing", 0, 10, &v2, &n, &tok2), ZB_E_NOTFOUND, "missing");
    ZB_ASSERT_ERR(zb_store_view(s, "../x", 0, 10, &v2, &n, &tok2), ZB_E_BADKEY, "..");

    /* this store's put replaces the file: the old view keeps the old bytes, a new one sees the
     * new bytes at once */
    uint8_t fresh[20000];
    for (size_t i = 0; i < sizeof fresh; i++) fresh[i] = (uint8_t)(i * 5 + 3);
    ZB_ASSERT_OK(zb_store_put(s, "blob", fresh, sizeof fresh));
    assert_memory_equal(v, bytes + 5000, 4000);
    ZB_ASSERT_OK(zb_store_view(s, "blob", 5000, 4000, &v2, &n, &tok2));
    assert_memory_equal(v2, fresh + 5000, 4000);
    zb_store_release(s, tok);
    zb_store_release(s, tok2);

    /* another writer replaces the file (temp + rename): noticed after the recheck interval */
    write_file(dir, "blob.tmp", bytes, sizeof bytes);
    char a[2048], b[2048];
    snprintf(a, sizeof a, "%s/blob.tmp", dir);
    snprintf(b, sizeof b, "%s/blob", dir);
    assert_int_equal(rename(a, b), 0);
    usleep(1200 * 1000);
    ZB_ASSERT_OK(zb_store_view(s, "blob", 0, 100, &v2, &n, &tok2));
    assert_int_equal(n, 100);
    assert_memory_equal(v2, bytes, 100);
    zb_store_release(s, tok2);
    /* erase drops the mapping too */
    ZB_ASSERT_OK(zb_store_erase(s, "blob"));
    ZB_ASSERT_ERR(zb_store_view(s, "blob", 0, 10, &v2, &n, &tok2), ZB_E_NOTFOUND, "blob");
    zb_store_close(s);

    /* budgets: 0 turns views off, a small one maps only what fits */
    write_file(dir, "blob", bytes, sizeof bytes);
    write_file(dir, "small", bytes, 100);
    zb_store_opts opts = ZB_STORE_OPTS_DEFAULT;
    assert_int_equal(opts.mmap_bytes, (uint64_t)1 << 30);
    opts.mmap_bytes = 0;
    ZB_ASSERT_OK(zb_store_open_opts(dir, &opts, &s));
    ZB_ASSERT_ERR(zb_store_view(s, "blob", 0, 10, &v2, &n, &tok2), ZB_E_UNSUPPORTED, "off");
    uint8_t got[10];
    ZB_ASSERT_OK(zb_store_get(s, "blob", 0, 10, got, &n));
    assert_memory_equal(got, bytes, 10);
    zb_store_close(s);
    opts.mmap_bytes = 1000;
    char url[2100];
    snprintf(url, sizeof url, "file://%s", dir);
    ZB_ASSERT_OK(zb_store_open_opts(url, &opts, &s)); /* the options reach the file backend */
    ZB_ASSERT_ERR(zb_store_view(s, "blob", 0, 10, &v2, &n, &tok2), ZB_E_UNSUPPORTED, "budget");
    ZB_ASSERT_OK(zb_store_view(s, "small", 10, 50, &v2, &n, &tok2));
    assert_int_equal(n, 50);
    assert_memory_equal(v2, bytes + 10, 50);
    zb_store_release(s, tok2);
    zb_store_close(s);
    ZB_ASSERT_OK(zb_store_open_file_opts(dir, &opts, &s));
    ZB_ASSERT_ERR(zb_store_view(s, "blob", 0, 10, &v2, &n, &tok2), ZB_E_UNSUPPORTED, "budget");
    zb_store_close(s);

    /* a backend without views declines */
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    ZB_ASSERT_ERR(zb_store_view(s, "k", 0, 1, &v2, &n, &tok2), ZB_E_UNSUPPORTED, "memory");
    zb_store_close(s);
}

typedef struct reader_arg {
    zb_store *s;
    const uint8_t *expect;
    int bad;
} reader_arg;

static void *
reader(void *p)
{
    reader_arg *a = p;
    uint8_t buf[64];
    for (int i = 0; i < 2000; i++) {
        uint64_t off = (uint64_t)(i * 37) % 900, n = 0;
        if (zb_store_get(a->s, "data", off, 64, buf, &n) != ZB_OK || n != 64 ||
            memcmp(buf, a->expect + off, 64) != 0)
            a->bad++;
    }
    return NULL;
}

static void
test_file_threads(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("store_threads");
    uint8_t bytes[1000];
    for (int i = 0; i < 1000; i++) bytes[i] = (uint8_t)(i ^ 0x5a);
    write_file(dir, "data", bytes, sizeof bytes);
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    pthread_t t[4];
    reader_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (reader_arg){s, bytes, 0};
        pthread_create(&t[i], NULL, reader, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    zb_store_close(s);
}

static void
test_memory_backend(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zbt_put_str(s, "a/b/c", "xyz");
    zbt_put_str(s, "a/d", "12345");
    zbt_put_str(s, "e", "");
    uint64_t size = 9;
    ZB_ASSERT_OK(zb_store_size(s, "e", &size));
    assert_int_equal(size, 0);
    uint8_t got[8];
    uint64_t n = 0;
    ZB_ASSERT_OK(zb_store_get(s, "a/d", 1, 3, got, &n));
    assert_int_equal(n, 3);
    assert_memory_equal(got, "234", 3);
    ZB_ASSERT_OK(zb_store_get(s, "a/d", 10, 3, got, &n));
    assert_int_equal(n, 0);
    char names[128] = "";
    ZB_ASSERT_OK(zb_store_list(s, "a", collect, names));
    assert_string_equal(names, "b/,d,");
    names[0] = '\0';
    ZB_ASSERT_OK(zb_store_list(s, "", collect, names));
    assert_string_equal(names, "a/,e,");
    zbt_put_str(s, "a/d", "overwritten");
    ZB_ASSERT_OK(zb_store_size(s, "a/d", &size));
    assert_int_equal(size, 11);
    ZB_ASSERT_OK(zb_store_rename(s, "a/d", "e"));
    ZB_ASSERT_OK(zb_store_size(s, "e", &size));
    assert_int_equal(size, 11);
    ZB_ASSERT_ERR(zb_store_size(s, "a/d", &size), ZB_E_NOTFOUND, "a/d");
    ZB_ASSERT_ERR(zb_store_put(s, "x/../y", "1", 1), ZB_E_BADKEY, "..");
    zb_store_close(s);
}

/* Counts completions and cancels after `stop_after` of them (0: never). */
typedef struct {
    size_t seen[8];
    size_t n, stop_after;
} completions;

static int
count_done(void *ctx, size_t i)
{
    completions *c = ctx;
    c->seen[c->n++] = i;
    return c->stop_after && c->n >= c->stop_after;
}

/* zb_store_get_ranges through the store layer's fallback (a backend without get_ranges): every
 * range filled in list order, a short read at the end of an object, a missing key reported on
 * its range and as the call's status with its key and range, keys normalised, and cancellation. */
static void
test_get_ranges(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    ZB_ASSERT_OK(zb_store_put(s, "a/c0", "0123456789", 10));
    ZB_ASSERT_OK(zb_store_put(s, "a/c1", "abcdefghij", 10));
    char b0[4], b1[6], b2[8], b3[3];
    zb_range r[4] = {
        {.key = "a/c0", .offset = 2, .length = 4, .dst = b0},
        {.key = "//a\\c1/", .offset = 4, .length = 6, .dst = b1},
        {.key = "a/c0", .offset = 6, .length = 8, .dst = b2}, /* 4 bytes left: short */
        {.key = "a/c1", .offset = 0, .length = 3, .dst = b3},
    };
    completions c = {0};
    ZB_ASSERT_OK(zb_store_get_ranges(s, r, 4, count_done, &c));
    assert_int_equal(c.n, 4);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(c.seen[i], i);
        assert_int_equal(r[i].status, ZB_OK);
    }
    assert_memory_equal(b0, "2345", 4);
    assert_memory_equal(b1, "efghij", 6);
    assert_int_equal(r[2].nread, 4);
    assert_memory_equal(b2, "6789", 4);
    assert_memory_equal(b3, "abc", 3);
    assert_string_equal(r[1].key, "//a\\c1/"); /* the caller's list is not rewritten */

    /* a missing key: its range fails, the others are read, the call names the key and range */
    r[1].key = "a/nope";
    memset(&c, 0, sizeof c);
    ZB_ASSERT_ERR(zb_store_get_ranges(s, r, 4, count_done, &c), ZB_E_NOTFOUND, "a/nope");
    assert_int_equal(c.n, 4);
    assert_int_equal(r[0].status, ZB_OK);
    assert_int_equal(r[1].status, ZB_E_NOTFOUND);
    assert_int_equal(r[3].status, ZB_OK);

    /* cancellation after two completions: the rest are never read */
    r[1].key = "a/c1";
    memset(&c, 0, sizeof c);
    c.stop_after = 2;
    ZB_ASSERT_ERR(zb_store_get_ranges(s, r, 4, count_done, &c), ZB_E_CANCELLED, "cancelled");
    assert_int_equal(c.n, 2);
    assert_int_equal(r[1].status, ZB_OK);
    assert_int_equal(r[2].status, ZB_E_CANCELLED);
    assert_int_equal(r[3].status, ZB_E_CANCELLED);

    /* a key of one segment (a store's top-level object) */
    ZB_ASSERT_OK(zb_store_put(s, "top", "XYZ", 3));
    char bt[3];
    zb_range one = {.key = "top", .offset = 0, .length = 3, .dst = bt};
    ZB_ASSERT_OK(zb_store_get_ranges(s, &one, 1, NULL, NULL));
    assert_int_equal(one.nread, 3);
    assert_memory_equal(bt, "XYZ", 3);

    /* suffix ranges: the last bytes (all of a shorter object), where they began given back;
     * a missing object is ZB_E_NOTFOUND */
    char s0[3], s1[20], s2[2];
    zb_range sfx[3] = {
        {.key = "a/c0", .offset = ZB_RANGE_SUFFIX, .length = 3, .dst = s0},
        {.key = "a/c1", .offset = ZB_RANGE_SUFFIX, .length = 20, .dst = s1},
        {.key = "a/none", .offset = ZB_RANGE_SUFFIX, .length = 2, .dst = s2},
    };
    ZB_ASSERT_ERR(zb_store_get_ranges(s, sfx, 3, NULL, NULL), ZB_E_NOTFOUND, "a/none");
    assert_int_equal(sfx[0].status, ZB_OK);
    assert_int_equal(sfx[0].offset, 7);
    assert_int_equal(sfx[0].nread, 3);
    assert_memory_equal(s0, "789", 3);
    assert_int_equal(sfx[1].status, ZB_OK);
    assert_int_equal(sfx[1].offset, 0);
    assert_int_equal(sfx[1].nread, 10);
    assert_memory_equal(s1, "abcdefghij", 10);
    assert_int_equal(sfx[2].status, ZB_E_NOTFOUND);

    /* a key escaping the root is refused before any read; an empty list is a no-op */
    r[0].key = "a/../b";
    ZB_ASSERT_ERR(zb_store_get_ranges(s, r, 4, NULL, NULL), ZB_E_BADKEY, "..");
    ZB_ASSERT_OK(zb_store_get_ranges(s, NULL, 0, NULL, NULL));
    zb_store_close(s);
}

static void
test_status_strings(void **state)
{
    (void)state;
    assert_string_equal(zb_status_name(ZB_E_CORRUPT), "ZB_E_CORRUPT");
    assert_string_equal(zb_strerror(ZB_OK), "success");
    assert_non_null(zb_strerror((zb_status)-999));
    assert_string_equal(zb_status_name((zb_status)-999), "ZB_E_UNKNOWN");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_normalize),  cmocka_unit_test(test_file_backend),
        cmocka_unit_test(test_file_views),     cmocka_unit_test(test_file_threads),
        cmocka_unit_test(test_memory_backend), cmocka_unit_test(test_get_ranges),
        cmocka_unit_test(test_status_strings),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
