/* Widening a field's values as they land in a batch (issue 19): a store may hold counts as
 * uint8/uint16 and gene ids as uint16, half the bytes to fetch and decode of float32/int32,
 * and the reader delivers them in the dtype the dataset was opened for (zb_dataset_opts.x_dtype
 * and index_dtype). The conversion runs inside the copy the reader does anyway (reader.c,
 * zb__values_convert), so it must cost no more than that copy: one tight loop per (stored,
 * delivered) pair, which the compiler vectorises (ZB_VECTOR_LOOP). Only exact widenings are
 * offered: every stored value has one delivered value equal to it. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "dataset/dataset.h"
#include "util/vecloop.h"

/* Loads go through memcpy: a raw unit mapped from a file need not be aligned to its item
 * size, and memcpy of a fixed size compiles to a plain (vectorised) load. A float destination
 * returns UINT64_MAX (its values are not range-checked); an integer one the largest
 * (unsigned)(d + add) of the values written, the range check of zb__values_convert in the
 * same pass (one unsigned max per vector, no second read of the values). */
#define ZB_WIDEN_FLOAT(S, D)                                                                       \
    ZB_VECTOR_LOOP static uint64_t widen_##S##_##D(void *restrict dst, const void *restrict src,   \
                                                   uint64_t n, uint64_t add)                       \
    {                                                                                              \
        (void)add;                                                                                 \
        const uint8_t *s = src;                                                                    \
        D *d = dst;                                                                                \
        for (uint64_t i = 0; i < n; i++) {                                                         \
            S v;                                                                                   \
            memcpy(&v, s + i * sizeof v, sizeof v);                                                \
            d[i] = (D)v;                                                                           \
        }                                                                                          \
        return UINT64_MAX;                                                                         \
    }
#define ZB_WIDEN_INT(S, D, UD)                                                                     \
    ZB_VECTOR_LOOP static uint64_t widen_##S##_##D(void *restrict dst, const void *restrict src,   \
                                                   uint64_t n, uint64_t add)                       \
    {                                                                                              \
        const uint8_t *s = src;                                                                    \
        D *d = dst;                                                                                \
        UD m = 0;                                                                                  \
        for (uint64_t i = 0; i < n; i++) {                                                         \
            S v;                                                                                   \
            memcpy(&v, s + i * sizeof v, sizeof v);                                                \
            d[i] = (D)v;                                                                           \
            UD x = (UD)d[i] + (UD)add;                                                             \
            m = x > m ? x : m;                                                                     \
        }                                                                                          \
        return m;                                                                                  \
    }
/* An unsigned source holds no value below lo (0 or -1): its plain maximum, kept in the source's
 * own lanes (twice or four times as many per vector), says the same. */
#define ZB_WIDEN_UINT(S, D)                                                                        \
    ZB_VECTOR_LOOP static uint64_t widen_##S##_##D(void *restrict dst, const void *restrict src,   \
                                                   uint64_t n, uint64_t add)                       \
    {                                                                                              \
        const uint8_t *s = src;                                                                    \
        D *d = dst;                                                                                \
        S m = 0;                                                                                   \
        for (uint64_t i = 0; i < n; i++) {                                                         \
            S v;                                                                                   \
            memcpy(&v, s + i * sizeof v, sizeof v);                                                \
            d[i] = (D)v;                                                                           \
            m = v > m ? v : m;                                                                     \
        }                                                                                          \
        return (uint64_t)m + add;                                                                  \
    }
typedef float float32;
typedef double float64;
ZB_WIDEN_FLOAT(uint8_t, float32)
ZB_WIDEN_FLOAT(int8_t, float32)
ZB_WIDEN_FLOAT(uint16_t, float32)
ZB_WIDEN_FLOAT(int16_t, float32)
ZB_WIDEN_FLOAT(uint8_t, float64)
ZB_WIDEN_FLOAT(int8_t, float64)
ZB_WIDEN_FLOAT(uint16_t, float64)
ZB_WIDEN_FLOAT(int16_t, float64)
ZB_WIDEN_FLOAT(uint32_t, float64)
ZB_WIDEN_FLOAT(int32_t, float64)
ZB_WIDEN_FLOAT(float32, float64)
ZB_WIDEN_UINT(uint8_t, int32_t)
ZB_WIDEN_INT(int8_t, int32_t, uint32_t)
ZB_WIDEN_UINT(uint16_t, int32_t)
ZB_WIDEN_INT(int16_t, int32_t, uint32_t)
ZB_WIDEN_UINT(uint8_t, int64_t)
ZB_WIDEN_INT(int8_t, int64_t, uint64_t)
ZB_WIDEN_UINT(uint16_t, int64_t)
ZB_WIDEN_INT(int16_t, int64_t, uint64_t)
ZB_WIDEN_UINT(uint32_t, int64_t)
ZB_WIDEN_INT(int32_t, int64_t, uint64_t)
#undef ZB_WIDEN_FLOAT
#undef ZB_WIDEN_INT
#undef ZB_WIDEN_UINT

typedef uint64_t (*widen_fn)(void *restrict, const void *restrict, uint64_t, uint64_t);

/* The loop for (from, to), NULL when `to` does not hold every value of `from` exactly. */
static widen_fn
widen_for(zb_dtype from, zb_dtype to)
{
#define ZB_PAIR(F, T, S, D)                                                                        \
    if (from == F && to == T) return widen_##S##_##D
    ZB_PAIR(ZB_DT_UINT8, ZB_DT_FLOAT32, uint8_t, float32);
    ZB_PAIR(ZB_DT_INT8, ZB_DT_FLOAT32, int8_t, float32);
    ZB_PAIR(ZB_DT_UINT16, ZB_DT_FLOAT32, uint16_t, float32);
    ZB_PAIR(ZB_DT_INT16, ZB_DT_FLOAT32, int16_t, float32);
    ZB_PAIR(ZB_DT_UINT8, ZB_DT_FLOAT64, uint8_t, float64);
    ZB_PAIR(ZB_DT_INT8, ZB_DT_FLOAT64, int8_t, float64);
    ZB_PAIR(ZB_DT_UINT16, ZB_DT_FLOAT64, uint16_t, float64);
    ZB_PAIR(ZB_DT_INT16, ZB_DT_FLOAT64, int16_t, float64);
    ZB_PAIR(ZB_DT_UINT32, ZB_DT_FLOAT64, uint32_t, float64);
    ZB_PAIR(ZB_DT_INT32, ZB_DT_FLOAT64, int32_t, float64);
    ZB_PAIR(ZB_DT_FLOAT32, ZB_DT_FLOAT64, float32, float64);
    ZB_PAIR(ZB_DT_UINT8, ZB_DT_INT32, uint8_t, int32_t);
    ZB_PAIR(ZB_DT_INT8, ZB_DT_INT32, int8_t, int32_t);
    ZB_PAIR(ZB_DT_UINT16, ZB_DT_INT32, uint16_t, int32_t);
    ZB_PAIR(ZB_DT_INT16, ZB_DT_INT32, int16_t, int32_t);
    ZB_PAIR(ZB_DT_UINT8, ZB_DT_INT64, uint8_t, int64_t);
    ZB_PAIR(ZB_DT_INT8, ZB_DT_INT64, int8_t, int64_t);
    ZB_PAIR(ZB_DT_UINT16, ZB_DT_INT64, uint16_t, int64_t);
    ZB_PAIR(ZB_DT_INT16, ZB_DT_INT64, int16_t, int64_t);
    ZB_PAIR(ZB_DT_UINT32, ZB_DT_INT64, uint32_t, int64_t);
    ZB_PAIR(ZB_DT_INT32, ZB_DT_INT64, int32_t, int64_t);
#undef ZB_PAIR
    return NULL;
}

bool
zb__widen_exact(zb_dtype from, zb_dtype to)
{
    return from == to || widen_for(from, to) != NULL;
}

bool
zb__values_widen(void *dst, zb_dtype to, const void *src, zb_dtype from, uint64_t n)
{
    widen_fn fn = widen_for(from, to);
    if (!fn) return false;
    fn(dst, src, n, 0);
    return true;
}

zb_status
zb__values_convert(void *dst, zb_dtype to, const void *src, zb_dtype from, uint64_t n,
                   const int64_t *lut, uint64_t nlut, const char *what, int64_t lo, uint64_t *span)
{
    widen_fn fn = lut ? NULL : widen_for(from, to);
    if (span) *span = UINT64_MAX;
    if (fn) {
        uint64_t m = fn(dst, src, n, (uint64_t)-lo);
        if (span) *span = n ? m : 0;
        return ZB_OK;
    }
    return zb__codes_convert(dst, to, src, from, n, lut, nlut, what);
}
