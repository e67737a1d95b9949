/* Streamed copies (util/stream.h): byte-for-byte memcpy at every destination and source offset
 * modulo 64 and every length through several lines, never a byte outside the destination. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "util/stream.h"

#define GUARD 128
#define MAXLEN 1100

static void
test_stream_copy_equals_memcpy(void **state)
{
    (void)state;
    uint8_t *src = malloc(MAXLEN + 128), *got = malloc(MAXLEN + 2 * GUARD + 64);
    uint8_t *want = malloc(MAXLEN + 2 * GUARD + 64);
    assert_non_null(src);
    assert_non_null(got);
    assert_non_null(want);
    for (size_t i = 0; i < MAXLEN + 128; i++) src[i] = (uint8_t)(i * 131 + 7);
    /* lengths: every one up to 700 (the plain/streamed threshold and a few lines), then a
     * stride through the rest */
    for (size_t n = 0; n <= MAXLEN; n += n < 700 ? 1 : 37) {
        for (size_t doff = 0; doff < 64; doff++) {
            size_t soff = (doff * 7 + n) % 64;
            /* got and want have the same alignment, so doff is the offset modulo 64 */
            uint8_t *g = (uint8_t *)(((uintptr_t)got + 63) & ~(uintptr_t)63);
            uint8_t *w = (uint8_t *)(((uintptr_t)want + 63) & ~(uintptr_t)63);
            memset(g, 0xA5, MAXLEN + 2 * GUARD);
            memset(w, 0xA5, MAXLEN + 2 * GUARD);
            zb__stream_copy(g + GUARD + doff, src + soff, n);
            zb__stream_fence();
            memcpy(w + GUARD + doff, src + soff, n);
            if (memcmp(g, w, MAXLEN + 2 * GUARD) != 0)
                fail_msg("n %zu, destination offset %zu, source offset %zu", n, doff, soff);
        }
    }
    free(src);
    free(got);
    free(want);
}

/* A copy larger than the cache: whole lines streamed, the edges plain. */
static void
test_stream_copy_large(void **state)
{
    (void)state;
    size_t n = ((size_t)40 << 20) + 13;
    uint8_t *src = malloc(n), *dst = malloc(n + 64);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < n; i++) src[i] = (uint8_t)((i >> 12) ^ i);
    dst[0] = 0x5A;
    dst[n + 1] = 0x5A;
    zb__stream_copy(dst + 1, src, n);
    zb__stream_fence();
    assert_int_equal(dst[0], 0x5A);
    assert_int_equal(dst[n + 1], 0x5A);
    assert_memory_equal(dst + 1, src, n);
    free(src);
    free(dst);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_copy_equals_memcpy),
        cmocka_unit_test(test_stream_copy_large),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
