/* The file backend's direct I/O (zb_store_opts.direct_io): objects of every size written
 * directly read back byte-identical with exact file sizes; large objects really bypass the page
 * cache (mincore finds none of their pages cached, where a buffered put leaves all of them);
 * every direct write and read is 4096-aligned; aligned gets read directly; a file system that
 * refuses O_DIRECT at open, at the first write or at a read gets the same bytes buffered; a
 * failing write names the key and leaves nothing behind; puts from several threads at once each
 * use their own bounce buffer, reused rather than made afresh per object.
 *
 * The system calls are observed, and refusals injected, through link-time wrapping of fcntl,
 * pwrite, pread and aligned_alloc (CMake links this test with -Wl,--wrap=...), so the library
 * carries no test hooks. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "support/testutil.h"

/* ---- the wrapped calls ------------------------------------------------------------------- */

int __real_fcntl(int fd, int cmd, ...);
ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __real_pread(int fd, void *buf, size_t n, off_t off);
void *__real_aligned_alloc(size_t align, size_t n);
int __wrap_fcntl(int fd, int cmd, ...);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off);
void *__wrap_aligned_alloc(size_t align, size_t n);

static struct {
    bool refuse_setfl; /* fcntl(F_SETFL, O_DIRECT) fails with EINVAL (tmpfs before Linux 6.6) */
    bool refuse_write; /* a direct pwrite fails with EINVAL */
    int fail_errno;    /* a direct pwrite fails with this errno (0: off) */
    bool refuse_read;  /* a direct pread fails with EINVAL */
    atomic_long direct_writes; /* pwrites on a descriptor with O_DIRECT */
    atomic_long direct_reads;
    atomic_long misaligned; /* direct pwrites or preads whose buffer, offset or length is not
                               aligned */
    atomic_long allocs;     /* aligned_alloc calls */
    _Atomic(const uint8_t *) lo, hi; /* the range of the last direct pwrite's buffer */
} io;

static bool
is_direct(int fd)
{
    int fl = __real_fcntl(fd, F_GETFL);
    return fl >= 0 && (fl & O_DIRECT);
}

static bool
aligned(const void *p, size_t n, off_t off)
{
    return (uintptr_t)p % 4096 == 0 && n % 4096 == 0 && off % 4096 == 0;
}

int
__wrap_fcntl(int fd, int cmd, ...)
{
    if (cmd == F_GETFL || cmd == F_GETFD) return __real_fcntl(fd, cmd);
    va_list ap;
    va_start(ap, cmd);
    int arg = va_arg(ap, int); /* the library passes int arguments only */
    va_end(ap);
    if (cmd == F_SETFL && (arg & O_DIRECT) && io.refuse_setfl) {
        errno = EINVAL;
        return -1;
    }
    return __real_fcntl(fd, cmd, arg);
}

ssize_t
__wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (is_direct(fd)) {
        io.direct_writes++;
        if (!aligned(buf, n, off)) io.misaligned++;
        io.lo = buf;
        io.hi = (const uint8_t *)buf + n;
        if (io.refuse_write || io.fail_errno) {
            errno = io.refuse_write ? EINVAL : io.fail_errno;
            return -1;
        }
    }
    return __real_pwrite(fd, buf, n, off);
}

ssize_t
__wrap_pread(int fd, void *buf, size_t n, off_t off)
{
    if (is_direct(fd)) {
        io.direct_reads++;
        if (!aligned(buf, n, off)) io.misaligned++;
        if (io.refuse_read) {
            errno = EINVAL;
            return -1;
        }
    }
    return __real_pread(fd, buf, n, off);
}

void *
__wrap_aligned_alloc(size_t align, size_t n)
{
    io.allocs++;
    return __real_aligned_alloc(align, n);
}

/* ---- helpers ------------------------------------------------------------------------------ */

static const uint64_t sizes[] = {0,       1,       4095,          4096,
                                 4097,    65535,   65536,         65537,
                                 1 << 20, 3 << 20, (4 << 20) + 1, (9 << 20) + 3 * 4096 + 17};
enum { N_SIZES = sizeof sizes / sizeof *sizes, MAX_SIZE = (9 << 20) + 3 * 4096 + 17 };

static zb_store *
open_direct(const char *dir)
{
    zb_store_opts o = ZB_STORE_OPTS_DEFAULT;
    assert_false(o.direct_io); /* off by default */
    o.direct_io = true;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file_opts(dir, &o, &s));
    return s;
}

/* A 4096-aligned buffer of at least n bytes (C11's aligned_alloc wants a multiple of the
 * alignment), not counted as the library's allocation. */
static uint8_t *
aligned_buf(size_t n)
{
    return __real_aligned_alloc(4096, (n + 4095) / 4096 * 4096);
}

/* Deterministic bytes, different for every object. */
static void
fill(uint8_t *p, uint64_t n, unsigned seed)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (uint64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* Reads dir/key with stdio (the oracle: neither the store nor direct I/O) and compares. */
static void
expect_file(const char *dir, const char *key, const uint8_t *want, uint64_t n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, key);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, n);
    uint8_t *got = malloc(n + 1);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(got, 1, n + 1, f), n);
    fclose(f);
    assert_memory_equal(got, want, n);
    free(got);
}

/* Puts every size from `data` (offset by `shift` bytes from a 4096-aligned buffer) and checks
 * each file; returns the direct pwrites made. */
static long
put_sizes(zb_store *s, const char *dir, size_t shift)
{
    uint8_t *base = aligned_buf(MAX_SIZE + 4096);
    uint8_t *data = base + shift;
    long before = io.direct_writes;
    for (int i = 0; i < N_SIZES; i++) {
        char key[64];
        snprintf(key, sizeof key, "d/o%d", i);
        fill(data, sizes[i], (unsigned)i);
        long w = io.direct_writes;
        ZB_ASSERT_OK(zb_store_put(s, key, data, sizes[i]));
        expect_file(dir, key, data, sizes[i]);
        if (sizes[i] < ZB_STORE_DIRECT_MIN_BYTES) assert_int_equal(io.direct_writes, w);
    }
    free(base);
    return io.direct_writes - before;
}

/* Pages of dir/key in the page cache. */
static size_t
cached_pages(const char *dir, const char *key)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, key);
    size_t pages;
    return zbt_cached_pages(path, &pages);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void
test_sizes(void **state)
{
    (void)state;
    memset(&io, 0, sizeof io);
    const char *dir = zbt_tempdir("direct_sizes");
    zb_store *s = open_direct(dir);
    long allocs = io.allocs;
    /* from an aligned buffer: straight from it, no bounce buffer */
    assert_true(put_sizes(s, dir, 0) > 0);
    assert_int_equal(io.allocs, allocs);
    /* from an unaligned one: through one bounce buffer, reused for every object */
    assert_true(put_sizes(s, dir, 1) > 0);
    assert_int_equal(io.allocs, allocs + 1);
    assert_int_equal(io.misaligned, 0);
    /* a replaced object: the new bytes, the exact new size */
    uint8_t *small = malloc(70000);
    fill(small, 70000, 99);
    ZB_ASSERT_OK(zb_store_put(s, "d/o11", small, 70000));
    expect_file(dir, "d/o11", small, 70000);
    free(small);
    /* no temporary file left behind */
    zb_store *plain = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &plain));
    uint64_t n;
    for (int i = 0; i < N_SIZES; i++) {
        char key[64];
        snprintf(key, sizeof key, "d/o%d", i);
        ZB_ASSERT_OK(zb_store_size(plain, key, &n));
    }
    zb_store_close(plain);
    zb_store_close(s);
}

static void
test_straight_from_caller(void **state)
{
    (void)state;
    memset(&io, 0, sizeof io);
    const char *dir = zbt_tempdir("direct_caller");
    zb_store *s = open_direct(dir);
    size_t len = (2 << 20) + 100;
    uint8_t *data = aligned_buf(len);
    fill(data, len, 7);
    ZB_ASSERT_OK(zb_store_put(s, "x", data, len));
    /* the last direct write came from the caller's own memory */
    assert_true(io.lo >= data && io.hi <= data + len);
    expect_file(dir, "x", data, len);
    /* unaligned: from a bounce buffer, not the caller's memory */
    ZB_ASSERT_OK(zb_store_put(s, "y", data + 8, len - 8));
    assert_true(io.hi <= data || io.lo >= data + len);
    expect_file(dir, "y", data + 8, len - 8);
    free(data);
    zb_store_close(s);
}

static void
test_page_cache(void **state)
{
    (void)state;
    memset(&io, 0, sizeof io);
    const char *dir = zbt_tempdir("direct_cache");
    struct statfs sf;
    assert_int_equal(statfs(dir, &sf), 0);
    if (sf.f_type == 0x01021994 /* TMPFS_MAGIC: everything is in the page cache there */) skip();
    size_t len = (8 << 20) + 1000; /* 2049 pages, the last partial */
    uint8_t *data = malloc(len);
    fill(data, len, 3);
    zb_store *s = open_direct(dir), *plain = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &plain));
    ZB_ASSERT_OK(zb_store_put(plain, "buffered", data, len));
    ZB_ASSERT_OK(zb_store_put(s, "direct", data, len));
    size_t buffered = cached_pages(dir, "buffered"), direct = cached_pages(dir, "direct");
    print_message("pages cached: buffered %zu, direct %zu of %zu\n", buffered, direct,
                  (len + 4095) / 4096);
    assert_true(buffered > 2000); /* the oracle: a buffered put leaves them all */
    assert_true(direct <= 1);     /* at most the partial last block, written buffered */
    /* a whole-file direct read (aligned buffer and blocks) leaves them uncached too, and
     * reads the short end of the file */
    size_t cap = len + 4096 - len % 4096;
    uint8_t *buf = aligned_buf(cap);
    uint64_t n = 0;
    long reads = io.direct_reads;
    ZB_ASSERT_OK(zb_store_get(s, "direct", 0, cap, buf, &n));
    assert_int_equal(n, len);
    assert_memory_equal(buf, data, len);
    assert_true(io.direct_reads > reads);
    assert_true(cached_pages(dir, "direct") <= 1);
    /* a block in the middle */
    ZB_ASSERT_OK(zb_store_get(s, "direct", 1 << 20, 1 << 20, buf, &n));
    assert_int_equal(n, 1 << 20);
    assert_memory_equal(buf, data + (1 << 20), 1 << 20);
    /* unaligned reads are buffered and right */
    reads = io.direct_reads;
    ZB_ASSERT_OK(zb_store_get(s, "direct", 5, 100000, buf + 3, &n));
    assert_int_equal(n, 100000);
    assert_memory_equal(buf + 3, data + 5, 100000);
    assert_int_equal(io.direct_reads, reads);
    /* a file system that refuses the direct read itself: read buffered, and from then on */
    io.refuse_read = true;
    reads = io.direct_reads;
    ZB_ASSERT_OK(zb_store_get(s, "direct", 0, cap, buf, &n));
    assert_int_equal(n, len);
    assert_memory_equal(buf, data, len);
    assert_int_equal(io.direct_reads, reads + 1);
    ZB_ASSERT_OK(zb_store_get(s, "direct", 0, 1 << 20, buf, &n));
    assert_int_equal(io.direct_reads, reads + 1);
    io.refuse_read = false;
    /* a store without direct_io reads through the cache, as always */
    ZB_ASSERT_OK(zb_store_get(plain, "direct", 0, 1 << 20, buf, &n));
    assert_memory_equal(buf, data, 1 << 20);
    assert_int_equal(io.direct_reads, reads + 1);
    assert_int_equal(io.misaligned, 0);
    free(buf);
    free(data);
    zb_store_close(plain);
    zb_store_close(s);
}

/* A file system that refuses O_DIRECT at open (fcntl) or at the first write: buffered, the same
 * bytes, and the store stops trying. */
static void
test_fallback(void **state)
{
    (void)state;
    for (int at_write = 0; at_write < 2; at_write++) {
        memset(&io, 0, sizeof io);
        const char *dir = zbt_tempdir(at_write ? "direct_refuse_write" : "direct_refuse_open");
        zb_store *s = open_direct(dir);
        if (at_write)
            io.refuse_write = true;
        else
            io.refuse_setfl = true;
        put_sizes(s, dir, 1);
        put_sizes(s, dir, 0);
        assert_int_equal(io.direct_writes, at_write ? 1 : 0); /* one refused, then no more */
        io.refuse_setfl = io.refuse_write = false;
        long w = io.direct_writes;
        put_sizes(s, dir, 0); /* the store stays buffered */
        assert_int_equal(io.direct_writes, w);
        uint8_t *buf = aligned_buf(1 << 20), *want = malloc(1 << 20);
        uint64_t n;
        fill(want, 1 << 20, 8);
        ZB_ASSERT_OK(zb_store_get(s, "d/o8", 0, 1 << 20, buf, &n));
        assert_int_equal(n, 1 << 20);
        assert_memory_equal(buf, want, 1 << 20);
        assert_int_equal(io.direct_reads, 0);
        free(buf);
        free(want);
        zb_store_close(s);
    }
}

/* tmpfs: whatever the kernel does with O_DIRECT there (refused before Linux 6.6, accepted
 * since), the bytes are the same. */
static void
test_tmpfs(void **state)
{
    (void)state;
    char dir[] = "/dev/shm/zbatch_direct_XXXXXX";
    if (!mkdtemp(dir)) skip();
    memset(&io, 0, sizeof io);
    zb_store *s = open_direct(dir);
    put_sizes(s, dir, 1);
    put_sizes(s, dir, 0);
    zb_store_close(s);
    for (int i = 0; i < N_SIZES; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/d/o%d", dir, i);
        assert_int_equal(unlink(path), 0);
    }
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/d", dir);
    assert_int_equal(rmdir(sub), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* A failing direct write (a full disk) names the store and key, and leaves no file. */
static void
test_write_error(void **state)
{
    (void)state;
    memset(&io, 0, sizeof io);
    const char *dir = zbt_tempdir("direct_full");
    zb_store *s = open_direct(dir);
    uint8_t *data = malloc(1 << 20);
    fill(data, 1 << 20, 1);
    io.fail_errno = ENOSPC;
    ZB_ASSERT_ERR(zb_store_put(s, "a/shard", data, 1 << 20), ZB_E_IO, "a/shard");
    assert_true(zbt_mentions(dir));
    assert_true(zbt_mentions(strerror(ENOSPC)));
    io.fail_errno = 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/a", dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    assert_int_equal(entries, 0); /* the temporary file went */
    /* the store still writes directly afterwards */
    long w = io.direct_writes;
    ZB_ASSERT_OK(zb_store_put(s, "a/shard", data, 1 << 20));
    assert_true(io.direct_writes > w);
    expect_file(dir, "a/shard", data, 1 << 20);
    free(data);
    zb_store_close(s);
}

/* Puts from several threads at once: each takes its own bounce buffer, and no more are made
 * than there are puts in flight. */
enum { THREADS = 4, PUTS = 6 };

typedef struct putter {
    zb_store *s;
    const char *dir;
    int id;
} putter;

static void *
put_many(void *arg)
{
    putter *p = arg;
    size_t len = (1 << 20) + 4096 * (size_t)p->id + 7;
    uint8_t *base = malloc(len + 1), *data = base + 1;
    for (int i = 0; i < PUTS; i++) {
        char key[64];
        snprintf(key, sizeof key, "t%d/o%d", p->id, i);
        fill(data, len, (unsigned)(100 * p->id + i));
        if (zb_store_put(p->s, key, data, len) != ZB_OK) {
            free(base);
            return (void *)1;
        }
    }
    free(base);
    return NULL;
}

static void
test_threads(void **state)
{
    (void)state;
    memset(&io, 0, sizeof io);
    const char *dir = zbt_tempdir("direct_threads");
    zb_store *s = open_direct(dir);
    pthread_t t[THREADS];
    putter p[THREADS];
    long before = io.allocs;
    for (int i = 0; i < THREADS; i++) {
        p[i] = (putter){s, dir, i};
        assert_int_equal(pthread_create(&t[i], NULL, put_many, &p[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        void *r;
        assert_int_equal(pthread_join(t[i], &r), 0);
        assert_null(r);
    }
    long made = io.allocs - before;
    assert_true(made >= 1 && made <= THREADS);
    for (int id = 0; id < THREADS; id++) {
        size_t len = (1 << 20) + 4096 * (size_t)id + 7;
        uint8_t *want = malloc(len);
        for (int i = 0; i < PUTS; i++) {
            char key[64];
            snprintf(key, sizeof key, "t%d/o%d", id, i);
            fill(want, len, (unsigned)(100 * id + i));
            expect_file(dir, key, want, len);
        }
        free(want);
    }
    zb_store_close(s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),      cmocka_unit_test(test_straight_from_caller),
        cmocka_unit_test(test_page_cache), cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_tmpfs),      cmocka_unit_test(test_write_error),
        cmocka_unit_test(test_threads),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
