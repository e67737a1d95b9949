/* The file backend against a hostile directory: only regular files are data (a FIFO, a device,
 * a socket at a key is an error naming the key, never a hang nor a missing chunk), and keys that
 * leave the root through a symbolic link are refused unless the store was opened to allow it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "support/testutil.h"

static void
write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void
link_at(const char *target, const char *dir, const char *name)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (symlink(target, path) != 0) fail_msg("symlink %s -> %s", path, target);
}

/* The tree both tests use: root/{data, grp/, fifo, sock, zero -> /dev/zero, null -> /dev/null,
 * in -> data, absin -> ROOT/data, out -> OUTSIDE/secret, sub -> OUTSIDE/}. */
typedef struct tree {
    char root[1024], outside[1024];
    uint8_t bytes[256], secret[64];
} tree;

static void
make_tree(tree *t)
{
    snprintf(t->outside, sizeof t->outside, "%s", zbt_tempdir("store_sec_out"));
    snprintf(t->root, sizeof t->root, "%s", zbt_tempdir("store_sec_root"));
    char path[2048];
    for (int i = 0; i < 256; i++) t->bytes[i] = (uint8_t)(i * 3 + 1);
    for (int i = 0; i < 64; i++) t->secret[i] = (uint8_t)(0xA0 + i);
    snprintf(path, sizeof path, "%s/data", t->root);
    write_file(path, t->bytes, sizeof t->bytes);
    snprintf(path, sizeof path, "%s/secret", t->outside);
    write_file(path, t->secret, sizeof t->secret);
    snprintf(path, sizeof path, "%s/grp", t->root);
    assert_int_equal(mkdir(path, 0777), 0);
    snprintf(path, sizeof path, "%s/fifo", t->root);
    assert_int_equal(mkfifo(path, 0666), 0);

    int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(sfd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sa.sun_path, sizeof sa.sun_path, "%s/sock", t->root);
    if (n > 0 && (size_t)n < sizeof sa.sun_path)
        assert_int_equal(bind(sfd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(sfd); /* the socket file stays */

    link_at("/dev/zero", t->root, "zero");
    link_at("/dev/null", t->root, "null");
    link_at("data", t->root, "in");
    snprintf(path, sizeof path, "%s/data", t->root);
    link_at(path, t->root, "absin");
    snprintf(path, sizeof path, "%s/secret", t->outside);
    link_at(path, t->root, "out");
    link_at(t->outside, t->root, "sub");
}

static void
expect_refused(zb_store *s, const char *key, zb_status want, const char *why)
{
    uint8_t buf[64];
    uint64_t n = 99, size = 0;
    const uint8_t *v = NULL;
    void *tok = NULL;
    ZB_ASSERT_ERR(zb_store_get(s, key, 0, sizeof buf, buf, &n), want, key);
    assert_true(zbt_mentions(why));
    assert_int_equal(n, 0);
    ZB_ASSERT_ERR(zb_store_size(s, key, &size), want, key);
    assert_true(zbt_mentions(why));
    ZB_ASSERT_ERR(zb_store_view(s, key, 0, sizeof buf, &v, &n, &tok), want, key);
    assert_true(zbt_mentions(why));
}

static void
expect_bytes(zb_store *s, const char *key, const uint8_t *want, size_t nwant)
{
    uint8_t buf[512];
    uint64_t n = 0, size = 0;
    ZB_ASSERT_OK(zb_store_get(s, key, 0, sizeof buf, buf, &n));
    assert_int_equal(n, nwant);
    assert_memory_equal(buf, want, nwant);
    ZB_ASSERT_OK(zb_store_size(s, key, &size));
    assert_int_equal(size, nwant);
    const uint8_t *v = NULL;
    void *tok = NULL;
    ZB_ASSERT_OK(zb_store_view(s, key, 0, sizeof buf, &v, &n, &tok));
    assert_int_equal(n, nwant);
    assert_memory_equal(v, want, nwant);
    zb_store_release(s, tok);
}

static int
count_names(void *ctx, const char *name, bool is_dir)
{
    (void)name;
    (void)is_dir;
    (*(uint64_t *)ctx)++;
    return 0;
}

/* The default: regular files inside the root only. */
static void
test_default_refuses(void **state)
{
    (void)state;
    tree t;
    make_tree(&t);
    alarm(20); /* a FIFO opened for reading without O_NONBLOCK would block here forever */
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(t.root, &s));
    expect_bytes(s, "data", t.bytes, sizeof t.bytes);
    expect_bytes(s, "in", t.bytes, sizeof t.bytes);    /* a link that stays inside */
    expect_bytes(s, "absin", t.bytes, sizeof t.bytes); /* absolute, but inside */
    expect_refused(s, "fifo", ZB_E_CORRUPT, "not a regular file");
    expect_refused(s, "sock", ZB_E_CORRUPT, "not a regular file");
    expect_refused(s, "zero", ZB_E_BADKEY, "outside the store root");
    expect_refused(s, "null", ZB_E_BADKEY, "outside the store root");
    expect_refused(s, "out", ZB_E_BADKEY, "outside the store root");
    expect_refused(s, "sub/secret", ZB_E_BADKEY, "outside the store root");
    /* a directory is not an object, as before; a missing key stays missing */
    uint8_t buf[8];
    uint64_t n = 0;
    ZB_ASSERT_ERR(zb_store_get(s, "grp", 0, 8, buf, &n), ZB_E_NOTFOUND, "grp");
    ZB_ASSERT_ERR(zb_store_get(s, "nothing", 0, 8, buf, &n), ZB_E_NOTFOUND, "nothing");
    ZB_ASSERT_ERR(zb_store_get(s, "sub/nothing", 0, 8, buf, &n), ZB_E_BADKEY, "sub/nothing");
    n = 0;
    /* nor are the names behind such a link listed */
    ZB_ASSERT_ERR(zb_store_list(s, "sub", count_names, &n), ZB_E_BADKEY, "outside the store root");
    assert_int_equal(n, 0);
    /* a write through a link out of the root is refused and creates nothing there */
    ZB_ASSERT_ERR(zb_store_put(s, "sub/planted", "x", 1), ZB_E_BADKEY, "outside the store root");
    char path[2048];
    snprintf(path, sizeof path, "%s/planted", t.outside);
    assert_int_not_equal(access(path, F_OK), 0);
    /* absolute keys are made relative by normalisation: "/data" is the root's data */
    ZB_ASSERT_OK(zb_store_get(s, "/data", 0, 8, buf, &n));
    assert_memory_equal(buf, t.bytes, 8);
    zb_store_close(s);
    alarm(0);
}

/* allow_links_outside: links may lead anywhere (a store that is a symlink farm), but what they
 * lead to must still be a regular file. */
static void
test_links_outside_allowed(void **state)
{
    (void)state;
    tree t;
    make_tree(&t);
    alarm(20);
    zb_store_opts o = ZB_STORE_OPTS_DEFAULT;
    assert_false(o.allow_links_outside);
    o.allow_links_outside = true;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file_opts(t.root, &o, &s));
    expect_bytes(s, "out", t.secret, sizeof t.secret);
    expect_bytes(s, "sub/secret", t.secret, sizeof t.secret);
    uint64_t names = 0;
    ZB_ASSERT_OK(zb_store_list(s, "sub", count_names, &names));
    assert_int_equal(names, 1); /* "secret" */
    expect_bytes(s, "absin", t.bytes, sizeof t.bytes);
    expect_refused(s, "zero", ZB_E_CORRUPT, "not a regular file");
    expect_refused(s, "null", ZB_E_CORRUPT, "not a regular file");
    expect_refused(s, "fifo", ZB_E_CORRUPT, "not a regular file");
    ZB_ASSERT_OK(zb_store_put(s, "sub/planted", "x", 1));
    char path[2048];
    snprintf(path, sizeof path, "%s/planted", t.outside);
    assert_int_equal(access(path, F_OK), 0);
    zb_store_close(s);
    /* NULL options are the defaults */
    ZB_ASSERT_OK(zb_store_open_file_opts(t.root, NULL, &s));
    expect_refused(s, "out", ZB_E_BADKEY, "outside the store root");
    zb_store_close(s);
    alarm(0);
}

/* A chunk key that is a link to /dev/zero or a FIFO fails the read of the array naming the
 * key; before, it read as a missing chunk (fill values). */
static void
test_array_chunk_not_regular(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("store_sec_array");
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    zbt_put_str(s, "a/.zarray",
                "{\"zarr_format\":2,\"shape\":[8],\"chunks\":[4],\"dtype\":\"<i4\","
                "\"compressor\":null,\"fill_value\":7,\"order\":\"C\",\"filters\":null}");
    int32_t vals[4] = {1, 2, 3, 4};
    ZB_ASSERT_OK(zb_store_put(s, "a/0", vals, sizeof vals));
    char path[2048];
    snprintf(path, sizeof path, "%s/a/1", dir);
    assert_int_equal(symlink("/dev/zero", path), 0);
    alarm(20);
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "a", &a));
    int32_t out[8];
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 8, out, sizeof out, NULL), ZB_E_BADKEY, "a/1");
    unlink(path);
    assert_int_equal(mkfifo(path, 0666), 0);
    ZB_ASSERT_ERR(zb_array_read_rows(a, 0, 8, out, sizeof out, NULL), ZB_E_CORRUPT, "a/1");
    unlink(path);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, 8, out, sizeof out, NULL)); /* missing: fill values */
    int32_t want[8] = {1, 2, 3, 4, 7, 7, 7, 7};
    assert_memory_equal(out, want, sizeof want);
    alarm(0);
    zb_array_close(a);
    zb_store_close(s);
}

int
main(void)
{
    signal(SIGALRM, SIG_DFL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_refuses),
        cmocka_unit_test(test_links_outside_allowed),
        cmocka_unit_test(test_array_chunk_not_regular),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
