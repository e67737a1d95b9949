/* The store layer: key normalisation, the file backend (pread, list, atomic put, refusal of
 * escaping keys) and the memory backend. */
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
    ZB_ASSERT_ERR(zb_store_open("s3://bucket/x", &s), ZB_E_UNSUPPORTED, "s3://");
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
        cmocka_unit_test(test_key_normalize),   cmocka_unit_test(test_file_backend),
        cmocka_unit_test(test_file_threads),    cmocka_unit_test(test_memory_backend),
        cmocka_unit_test(test_status_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
