/* Helpers shared by the C tests. */
#ifndef ZB_TESTUTIL_H
#define ZB_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "zbatch.h"

/* Asserts that `expr` returns ZB_OK, printing the status and detail message otherwise. */
#define ZB_ASSERT_OK(expr)                                                                         \
    do {                                                                                           \
        zb_status st_ = (expr);                                                                    \
        if (st_ != ZB_OK) fail_msg("%s -> %s: %s", #expr, zb_status_name(st_), zb_last_error());   \
    } while (0)

/* Asserts that `expr` returns `want`, and that the detail message contains `needle`. */
#define ZB_ASSERT_ERR(expr, want, needle)                                                          \
    do {                                                                                           \
        zb_status st_ = (expr);                                                                    \
        if (st_ != (want))                                                                         \
            fail_msg("%s -> %s (%s), expected %s", #expr, zb_status_name(st_), zb_last_error(),    \
                     zb_status_name(want));                                                        \
        if (!zbt_mentions(needle))                                                                 \
            fail_msg("%s: message '%s' does not mention '%s'", #expr, zb_last_error(), (needle));  \
    } while (0)

/* True if needle is NULL or occurs in this thread's detail message. */
int zbt_mentions(const char *needle);

/* Makes a fresh empty directory under ZB_TEST_TMP (or /tmp) and returns its path (static
 * storage, valid until the next call). */
const char *zbt_tempdir(const char *name);

/* Runs a cmocka group; when every test passed, removes the directories zbt_tempdir made in this
 * process (a failed run keeps them to be looked at). Returns the number of failures. */
#define ZBT_RUN_GROUP(tests, setup, teardown)                                                      \
    zbt_finish(cmocka_run_group_tests(tests, setup, teardown))
int zbt_finish(int failures);

/* Puts a NUL-terminated string under key. */
void zbt_put_str(zb_store *s, const char *key, const char *text);

/* Writes n rows of a 1-D array of dtype dt at path, lz4-compressed in chunks of `chunk` rows. */
void zbt_put_rows(zb_store *st, const char *path, zb_dtype dt, const void *rows, uint64_t n,
                  uint64_t chunk);

/* How many of the file's pages are in the page cache (mincore over a mapping of it); its page
 * count in *pages. */
size_t zbt_cached_pages(const char *path, size_t *pages);

#endif
