/* Non-temporal copies (stream.h). */
#include "util/stream.h"

#include <stdint.h>
#include <string.h>

/* Below this a copy is mostly its partial first and last lines: plain memcpy. */
#define STREAM_MIN_COPY 256

#if ZB_HAVE_STREAM
#include <emmintrin.h>

void
zb__stream_copy(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (n < STREAM_MIN_COPY) {
        memcpy(d, s, n);
        return;
    }
    /* the partial first line with plain stores, then whole lines (four 16-byte stores each,
     * which the write-combining buffer merges into one line write), then the partial last */
    size_t head = (size_t)(-(uintptr_t)d & 63);
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
}

void
zb__stream_fence(void)
{
    _mm_sfence();
}

#else

void
zb__stream_copy(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

void
zb__stream_fence(void)
{
}

#endif
