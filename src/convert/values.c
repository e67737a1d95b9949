/* Numeric types across inputs: numpy's promotion rule (np.result_type) and the conversions it
 * implies. Promotion only ever widens, so every conversion here is exact for integers and for
 * float32 -> float64, and rounds to nearest like numpy's astype otherwise. */
#include <string.h>

#include "convert/convert_int.h"
#include "zarr/meta.h"

static bool
is_signed(zb_dtype t)
{
    return t >= ZB_DT_INT8 && t <= ZB_DT_INT64;
}

static bool
is_unsigned(zb_dtype t)
{
    return t >= ZB_DT_UINT8 && t <= ZB_DT_UINT64;
}

static bool
is_float(zb_dtype t)
{
    return t == ZB_DT_FLOAT16 || t == ZB_DT_FLOAT32 || t == ZB_DT_FLOAT64;
}

static zb_dtype
signed_of_size(size_t bytes)
{
    return bytes <= 1   ? ZB_DT_INT8
           : bytes == 2 ? ZB_DT_INT16
           : bytes == 4 ? ZB_DT_INT32
                        : ZB_DT_INT64;
}

static zb_dtype
float_of_size(size_t bytes)
{
    return bytes <= 2 ? ZB_DT_FLOAT16 : bytes == 4 ? ZB_DT_FLOAT32 : ZB_DT_FLOAT64;
}

zb_dtype
cv_promote(zb_dtype a, zb_dtype b)
{
    if (a == ZB_DT_STRING || b == ZB_DT_STRING || a >= ZB_DT_COUNT_ || b >= ZB_DT_COUNT_)
        return ZB_DT_COUNT_;
    if (a == b) return a;
    if (a == ZB_DT_BOOL) return b;
    if (b == ZB_DT_BOOL) return a;
    size_t sa = zb_dtype_size(a), sb = zb_dtype_size(b);
    if (is_float(a) && is_float(b)) return sa > sb ? a : b;
    if (is_float(a) || is_float(b)) {
        /* an integer of n bytes needs a float of more than n bytes (numpy: int8 + float16 is
         * float16, int16 + float16 is float32, int32 + float32 is float64) */
        zb_dtype f = is_float(a) ? a : b;
        size_t si = is_float(a) ? sb : sa, sf = zb_dtype_size(f);
        size_t need = si * 2;
        if (need > 8) need = 8;
        return float_of_size(sf > need ? sf : need);
    }
    if (is_signed(a) == is_signed(b)) return sa > sb ? a : b;
    /* one signed, one unsigned: a signed type wider than the unsigned one, if any */
    size_t ss = is_signed(a) ? sa : sb, su = is_unsigned(a) ? sa : sb;
    if (ss > su) return signed_of_size(ss);
    if (su < 8) return signed_of_size(su * 2);
    return ZB_DT_FLOAT64; /* uint64 with a signed type */
}

/* One conversion loop per (source, target) pair; the float16 ends go through double. */
#define CV_TYPES(X)                                                                                \
    X(ZB_DT_BOOL, uint8_t)                                                                         \
    X(ZB_DT_INT8, int8_t)                                                                          \
    X(ZB_DT_INT16, int16_t)                                                                        \
    X(ZB_DT_INT32, int32_t)                                                                        \
    X(ZB_DT_INT64, int64_t)                                                                        \
    X(ZB_DT_UINT8, uint8_t)                                                                        \
    X(ZB_DT_UINT16, uint16_t)                                                                      \
    X(ZB_DT_UINT32, uint32_t)                                                                      \
    X(ZB_DT_UINT64, uint64_t)                                                                      \
    X(ZB_DT_FLOAT32, float)                                                                        \
    X(ZB_DT_FLOAT64, double)

static double
load_double(const unsigned char *p, zb_dtype t)
{
    switch (t) {
#define CV_LOAD(code, ctype)                                                                       \
    case code: {                                                                                   \
        ctype v;                                                                                   \
        memcpy(&v, p, sizeof v);                                                                   \
        return (double)v;                                                                          \
    }
        CV_TYPES(CV_LOAD)
#undef CV_LOAD
    case ZB_DT_FLOAT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return zb__half_to_double(v);
    }
    default:
        return 0;
    }
}

#define CV_LOOP(ftype, ttype)                                                                      \
    do {                                                                                           \
        const ftype *s_ = src;                                                                     \
        ttype *d_ = dst;                                                                           \
        for (uint64_t i_ = 0; i_ < n; i_++) d_[i_] = (ttype)s_[i_];                                \
    } while (0)

void
cv_convert_values(void *dst, zb_dtype to, const void *src, zb_dtype from, uint64_t n)
{
    if (to == from) {
        memcpy(dst, src, (size_t)(n * zb_dtype_size(to)));
        return;
    }
    if (from == ZB_DT_FLOAT16 || to == ZB_DT_FLOAT16 || to == ZB_DT_BOOL) {
        size_t fs = zb_dtype_size(from), ts = zb_dtype_size(to);
        const unsigned char *s = src;
        unsigned char *d = dst;
        for (uint64_t i = 0; i < n; i++) {
            double v = load_double(s + i * fs, from);
            if (to == ZB_DT_FLOAT16) {
                uint16_t h = zb__half_from_double(v);
                memcpy(d + i * ts, &h, 2);
            } else if (to == ZB_DT_BOOL) {
                d[i] = v != 0;
            } else {
                cv_convert_values(d + i * ts, to, &v, ZB_DT_FLOAT64, 1);
            }
        }
        return;
    }
#define CV_PAIR(tcode, ttype)                                                                      \
    if (to == tcode) {                                                                             \
        switch (from) {                                                                            \
        case ZB_DT_BOOL:                                                                           \
            CV_LOOP(uint8_t, ttype);                                                               \
            return;                                                                                \
        case ZB_DT_INT8:                                                                           \
            CV_LOOP(int8_t, ttype);                                                                \
            return;                                                                                \
        case ZB_DT_INT16:                                                                          \
            CV_LOOP(int16_t, ttype);                                                               \
            return;                                                                                \
        case ZB_DT_INT32:                                                                          \
            CV_LOOP(int32_t, ttype);                                                               \
            return;                                                                                \
        case ZB_DT_INT64:                                                                          \
            CV_LOOP(int64_t, ttype);                                                               \
            return;                                                                                \
        case ZB_DT_UINT8:                                                                          \
            CV_LOOP(uint8_t, ttype);                                                               \
            return;                                                                                \
        case ZB_DT_UINT16:                                                                         \
            CV_LOOP(uint16_t, ttype);                                                              \
            return;                                                                                \
        case ZB_DT_UINT32:                                                                         \
            CV_LOOP(uint32_t, ttype);                                                              \
            return;                                                                                \
        case ZB_DT_UINT64:                                                                         \
            CV_LOOP(uint64_t, ttype);                                                              \
            return;                                                                                \
        case ZB_DT_FLOAT32:                                                                        \
            CV_LOOP(float, ttype);                                                                 \
            return;                                                                                \
        case ZB_DT_FLOAT64:                                                                        \
            CV_LOOP(double, ttype);                                                                \
            return;                                                                                \
        default:                                                                                   \
            return;                                                                                \
        }                                                                                          \
    }
    CV_TYPES(CV_PAIR)
#undef CV_PAIR
}
