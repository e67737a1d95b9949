#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *
temp_base(void)
{
    const char *base = getenv("ZB_TEST_TMP");
    return base && *base ? base : "/tmp";
}

const char *
zbt_tempdir(const char *name)
{
    static char path[1024];
    const char *base = temp_base();
    mkdir(base, 0777);
    snprintf(path, sizeof path, "%s/%s.%ld", base, name, (long)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fail_msg("cannot clear %s", path);
    if (mkdir(path, 0777) != 0) fail_msg("cannot create %s", path);
    return path;
}

int
zbt_finish(int failures)
{
    if (failures == 0) {
        /* every directory zbt_tempdir made here ends in this process's id (or has it before a
         * suffix of the test's own: "<name>.<pid>.work") */
        char cmd[1200];
        long pid = (long)getpid();
        snprintf(cmd, sizeof cmd, "rm -rf '%s'/*.%ld '%s'/*.%ld.*", temp_base(), pid, temp_base(),
                 pid);
        if (system(cmd) != 0) fprintf(stderr, "could not remove this test's directories\n");
    }
    return failures;
}

void
zbt_put_str(zb_store *s, const char *key, const char *text)
{
    zb_status st = zb_store_put(s, key, text, strlen(text));
    if (st != ZB_OK) fail_msg("put %s: %s", key, zb_last_error());
}

void
zbt_put_rows(zb_store *st, const char *path, zb_dtype dt, const void *rows, uint64_t n,
             uint64_t chunk)
{
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.chunk_rows = chunk;
    o.codec = "lz4";
    zb_array_writer *w = NULL;
    zb_status st_ = zb_array_writer_open(st, path, dt, 1, NULL, &o, &w);
    if (st_ == ZB_OK) st_ = zb_array_writer_append(w, rows, n);
    if (st_ == ZB_OK) st_ = zb_array_writer_commit(w);
    zb_array_writer_close(w);
    if (st_ != ZB_OK) fail_msg("write %s: %s", path, zb_last_error());
}

int
zbt_mentions(const char *needle)
{
    return !needle || strstr(zb_last_error(), needle) != NULL;
}

size_t
zbt_cached_pages(const char *path, size_t *pages)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (size_t)sb.st_size;
    *pages = (len + page - 1) / page;
    size_t in = 0;
    if (len) {
        void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
        assert_true(m != MAP_FAILED);
        unsigned char *vec = malloc(*pages);
        assert_non_null(vec);
        assert_int_equal(mincore(m, len, vec), 0);
        for (size_t i = 0; i < *pages; i++) in += vec[i] & 1;
        free(vec);
        munmap(m, len);
    }
    close(fd);
    return in;
}
