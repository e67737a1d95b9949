/* The decoded-unit cache (util/cache.h): copies out and pins in place, LRU eviction within the
 * byte bound, pinned entries that outlive their eviction or replacement with their bytes intact
 * until the last unpin (run under ASan/TSan, a use after free or a race fails here), and the
 * memory of evicted entries reused for the next ones, within the bound. */
#include <pthread.h>
#include <stdbool.h>
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

/* An evicted entry's memory holds the next entry of its size: the cache does not go back to
 * malloc (fresh pages) once it is full. */
static void
test_evicted_blocks_hold_the_next_entries(void **state)
{
    (void)state;
    zb__cache *c = NULL;
    ZB_ASSERT_OK(zb__cache_new(4 * UNIT, &c));
    const void *old[4];
    for (uint64_t u = 0; u < 4; u++) {
        put(c, u, 0);
        void *pin = NULL;
        old[u] = zb__cache_pin(c, &OWNER, u, UNIT, &pin);
        zb__cache_unpin(c, pin);
    }
    size_t blocks = zb__cache_blocks(c);
    assert_true(blocks >= 4 * UNIT && blocks <= 4 * UNIT + 4 * UNIT / 8 + 4 * 64);
    for (int round = 1; round <= 50; round++)
        for (uint64_t u = 0; u < 4; u++) {
            uint64_t unit = 4 * (uint64_t)round + u; /* evicts the oldest */
            put(c, unit, round);
            void *pin = NULL;
            const uint8_t *a = zb__cache_pin(c, &OWNER, unit, UNIT, &pin);
            assert_non_null(a);
            assert_holds(a, unit, round);
            bool reused = false;
            for (int k = 0; k < 4; k++) reused = reused || a == old[k];
            assert_true(reused);
            zb__cache_unpin(c, pin);
        }
    assert_int_equal(zb__cache_blocks(c), blocks);
    assert_int_equal(zb__cache_held(c), 4 * UNIT);
    zb__cache_free(c);
}

/* A pinned entry's memory is not reused while pinned, however much is put after its eviction;
 * at the unpin it is. */
static void
test_pinned_block_not_reused_until_unpinned(void **state)
{
    (void)state;
    zb__cache *c = NULL;
    ZB_ASSERT_OK(zb__cache_new(2 * UNIT, &c));
    put(c, 0, 0);
    void *pin = NULL;
    const uint8_t *a = zb__cache_pin(c, &OWNER, 0, UNIT, &pin);
    for (uint64_t u = 1; u <= 200; u++) {
        put(c, u, 1); /* the same size class: evicts 0 first, then each other */
        void *p2 = NULL;
        const uint8_t *b = zb__cache_pin(c, &OWNER, u, UNIT, &p2);
        assert_ptr_not_equal(b, a);
        zb__cache_unpin(c, p2);
    }
    assert_holds(a, 0, 0);
    /* the pinned block counts beyond the budget: the two held and it */
    size_t blocks = zb__cache_blocks(c);
    zb__cache_unpin(c, pin);
    put(c, 201, 2); /* takes a free block: no new memory */
    assert_int_equal(zb__cache_blocks(c), blocks);
    zb__cache_free(c);
}

/* Entries of many sizes (each its own pattern) churned through a cache a fraction of their
 * total: every hit reads the bytes put; held bytes never pass the budget, and the memory kept,
 * in use or free, never passes the budget and an eighth (the free blocks are given back to
 * malloc beyond it) but by the rounding and headers of the entries in use. */
static void
test_mixed_sizes_stay_within_the_bound(void **state)
{
    (void)state;
    enum { MAX = 64 * 1024, N = 3000, BIG = 9000 };
    zb__cache *c = NULL;
    ZB_ASSERT_OK(zb__cache_new(MAX, &c));
    static uint8_t b[BIG];
    unsigned seed = 7;
    size_t most = 0;
    for (uint64_t u = 0; u < N; u++) {
        size_t len = 1 + (size_t)rand_r(&seed) % BIG;
        for (size_t i = 0; i < len; i++) b[i] = (uint8_t)(u * 13 + i * 5 + len);
        zb__cache_put(c, &OWNER, u, b, len);
        assert_true(zb__cache_held(c) <= MAX);
        size_t blocks = zb__cache_blocks(c);
        if (blocks > most) most = blocks;
        assert_true(blocks <= MAX + MAX / 8 + 1024); /* ~15 entries held: 1 KiB of headers */
        /* the entry just put, and one put a little before (if still held) */
        for (uint64_t v = u >= 3 ? u - 3 : 0; v <= u; v += 3) {
            size_t got_len;
            if (!zb__cache_length(c, &OWNER, v, &got_len)) continue;
            void *pin = NULL;
            const uint8_t *a = zb__cache_pin(c, &OWNER, v, got_len, &pin);
            assert_non_null(a);
            for (size_t i = 0; i < got_len; i++)
                assert_int_equal(a[i], (uint8_t)(v * 13 + i * 5 + got_len));
            zb__cache_unpin(c, pin);
        }
    }
    assert_true(most >= MAX); /* full, and free blocks kept for the next entries */
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
        cmocka_unit_test(test_evicted_blocks_hold_the_next_entries),
        cmocka_unit_test(test_pinned_block_not_reused_until_unpinned),
        cmocka_unit_test(test_mixed_sizes_stay_within_the_bound),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
