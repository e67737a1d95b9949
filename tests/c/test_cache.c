/* The decoded-unit cache (util/cache.h): copies out and pins in place, LRU eviction within the
 * byte bound, and pinned entries that outlive their eviction or replacement with their bytes
 * intact until the last unpin (run under ASan/TSan, a use after free or a race fails here). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "util/cache.h"

#define UNIT 1000 /* bytes per entry */

static const int OWNER = 0; /* the owner key (an array's address in the reader) */

/* Entry `unit`'s bytes, version v: a pattern that tells units and versions apart. */
static void
fill(uint8_t *p, uint64_t unit, int v)
{
    for (size_t i = 0; i < UNIT; i++) p[i] = (uint8_t)(unit * 31 + i * 7 + (size_t)v * 101);
}

static void
put(zb__cache *c, uint64_t unit, int v)
{
    uint8_t b[UNIT];
    fill(b, unit, v);
    zb__cache_put(c, &OWNER, unit, b, UNIT);
}

static void
assert_holds(const uint8_t *got, uint64_t unit, int v)
{
    uint8_t want[UNIT];
    fill(want, unit, v);
    assert_memory_equal(got, want, UNIT);
}

static void
test_pin_reads_in_place(void **state)
{
    (void)state;
    zb__cache *c = NULL;
    ZB_ASSERT_OK(zb__cache_new(4 * UNIT, &c));
    void *pin = (void *)1;
    assert_null(zb__cache_pin(c, &OWNER, 7, UNIT, &pin)); /* a miss */
    assert_null(pin);
    put(c, 7, 0);
    assert_null(zb__cache_pin(c, &OWNER, 7, UNIT - 1, &pin)); /* another length: a miss */
    assert_null(zb__cache_pin(c, &OWNER + 1, 7, UNIT, &pin)); /* another owner */
    const uint8_t *a = zb__cache_pin(c, &OWNER, 7, UNIT, &pin);
    assert_non_null(a);
    assert_non_null(pin);
    assert_holds(a, 7, 0);
    /* a second pin of the same entry reads the same bytes (no copy) */
    void *pin2 = NULL;
    assert_ptr_equal(zb__cache_pin(c, &OWNER, 7, UNIT, &pin2), a);
    zb__cache_unpin(c, pin2);
    zb__cache_unpin(c, pin);
    zb__cache_unpin(c, NULL); /* nothing */
    uint8_t got[UNIT];
    assert_true(zb__cache_get_part(c, &OWNER, 7, UNIT, 0, got, UNIT));
    assert_holds(got, 7, 0);
    assert_int_equal(zb__cache_held(c), UNIT);
    zb__cache_free(c);
    assert_null(zb__cache_pin(NULL, &OWNER, 7, UNIT, &pin));
    zb__cache_unpin(NULL, NULL);
}

/* An entry evicted while pinned leaves the cache and its count at once; its bytes stay. */
static void
test_pinned_entry_outlives_eviction(void **state)
{
    (void)state;
    zb__cache *c = NULL;
    ZB_ASSERT_OK(zb__cache_new(3 * UNIT, &c));
    put(c, 0, 0);
    void *pin = NULL;
    const uint8_t *a = zb__cache_pin(c, &OWNER, 0, UNIT, &pin);
    assert_non_null(a);
    for (uint64_t u = 1; u <= 3; u++) put(c, u, 0); /* unit 0 is the oldest: evicted */
    assert_false(zb__cache_contains(c, &OWNER, 0));
    assert_int_equal(zb__cache_held(c), 3 * UNIT);
    for (uint64_t u = 1; u <= 3; u++) assert_true(zb__cache_contains(c, &OWNER, u));
    assert_holds(a, 0, 0);
    zb__cache_unpin(c, pin); /* frees it (ASan: a leak otherwise, a use after free before) */
    /* a pin moves its entry to the front: the unpinned oldest goes first */
    const uint8_t *b = zb__cache_pin(c, &OWNER, 1, UNIT, &pin);
    assert_non_null(b);
    zb__cache_unpin(c, pin);
    put(c, 4, 0);
    assert_true(zb__cache_contains(c, &OWNER, 1));
    assert_false(zb__cache_contains(c, &OWNER, 2));
    zb__cache_free(c);
}

/* A put of a key already held replaces it; a pin of the old entry keeps the old bytes. */
static void
test_pinned_entry_outlives_replacement(void **state)
{
    (void)state;
    zb__cache *c = NULL;
    ZB_ASSERT_OK(zb__cache_new(8 * UNIT, &c));
    put(c, 5, 0);
    void *old = NULL, *now = NULL;
    const uint8_t *a = zb__cache_pin(c, &OWNER, 5, UNIT, &old);
    put(c, 5, 1);
    assert_int_equal(zb__cache_held(c), UNIT);
    const uint8_t *b = zb__cache_pin(c, &OWNER, 5, UNIT, &now);
    assert_ptr_not_equal(a, b);
    assert_holds(a, 5, 0);
    assert_holds(b, 5, 1);
    zb__cache_unpin(c, old);
    zb__cache_unpin(c, now);
    zb__cache_free(c);
}

typedef struct racer {
    zb__cache *c;
    unsigned seed;
    int bad;
} racer;

/* Pins and reads entries while putting others that evict them. */
static void *
race(void *arg)
{
    racer *r = arg;
    uint8_t want[UNIT];
    for (int k = 0; k < 4000; k++) {
        uint64_t u = (uint64_t)(rand_r(&r->seed) % 24);
        void *pin = NULL;
        const uint8_t *a = zb__cache_pin(r->c, &OWNER, u, UNIT, &pin);
        if (a) {
            fill(want, u, 0);
            put(r->c, (u + 7) % 24, 0); /* may evict the pinned entry */
            if (memcmp(a, want, UNIT) != 0) r->bad++;
            zb__cache_unpin(r->c, pin);
        } else {
            put(r->c, u, 0);
        }
    }
    return NULL;
}

static void
test_pins_race_with_evictions(void **state)
{
    (void)state;
    zb__cache *c = NULL;
    ZB_ASSERT_OK(zb__cache_new(6 * UNIT, &c)); /* a quarter of the 24 units */
    pthread_t th[4];
    racer rs[4];
    for (int i = 0; i < 4; i++) {
        rs[i] = (racer){c, (unsigned)(i + 1), 0};
        assert_int_equal(pthread_create(&th[i], NULL, race, &rs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(rs[i].bad, 0);
    }
    assert_true(zb__cache_held(c) <= 6 * UNIT);
    zb__cache_free(c);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pin_reads_in_place),
        cmocka_unit_test(test_pinned_entry_outlives_eviction),
        cmocka_unit_test(test_pinned_entry_outlives_replacement),
        cmocka_unit_test(test_pins_race_with_evictions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
