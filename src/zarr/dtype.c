/* Data types: names, sizes, the v2 typestr and v3 name parsers, and fill values.
 * Format facts: shared FORMATS.md §1.2/§1.3 (v2) and §3.2 (v3). */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util/json.h"
#include "util/status.h"
#include "zarr/meta.h"

typedef struct dtype_row {
    const char *name;    /* v3 data_type */
    const char *typestr; /* NumPy typestr of the in-memory (little-endian) form */
    size_t size;
} dtype_row;

/* Indexed by zb_dtype. */
static const dtype_row dtypes[ZB_DT_COUNT_] = {
    [ZB_DT_BOOL] = {"bool", "|b1", 1},       [ZB_DT_INT8] = {"int8", "|i1", 1},
    [ZB_DT_INT16] = {"int16", "<i2", 2},     [ZB_DT_INT32] = {"int32", "<i4", 4},
    [ZB_DT_INT64] = {"int64", "<i8", 8},     [ZB_DT_UINT8] = {"uint8", "|u1", 1},
    [ZB_DT_UINT16] = {"uint16", "<u2", 2},   [ZB_DT_UINT32] = {"uint32", "<u4", 4},
    [ZB_DT_UINT64] = {"uint64", "<u8", 8},   [ZB_DT_FLOAT16] = {"float16", "<f2", 2},
    [ZB_DT_FLOAT32] = {"float32", "<f4", 4}, [ZB_DT_FLOAT64] = {"float64", "<f8", 8},
    [ZB_DT_STRING] = {"string", "|O", 0},
};

static bool
dtype_valid(zb_dtype dtype)
{
    return (int)dtype >= 0 && dtype < ZB_DT_COUNT_;
}

size_t
zb_dtype_size(zb_dtype dtype)
{
    return dtype_valid(dtype) ? dtypes[dtype].size : 0;
}

const char *
zb_dtype_name(zb_dtype dtype)
{
    return dtype_valid(dtype) ? dtypes[dtype].name : "unknown";
}

const char *
zb_dtype_typestr(zb_dtype dtype)
{
    return dtype_valid(dtype) ? dtypes[dtype].typestr : "unknown";
}

zb_status
zb__dtype_parse_v2(const char *typestr, const char *where, zb_dtype *dtype, bool *big_endian)
{
    *dtype = ZB_DT_UINT8;
    *big_endian = false;
    size_t n = strlen(typestr);
    if (n < 2 || (typestr[0] != '<' && typestr[0] != '>' && typestr[0] != '|'))
        return zb__err(ZB_E_METADATA, "%s: dtype \"%.40s\" is not a NumPy typestr", where, typestr);
    char order = typestr[0];
    char kind = typestr[1];
    const char *size = typestr + 2;
    if (kind == 'O' && !*size) {
        *dtype = ZB_DT_STRING;
        return ZB_OK;
    }
    static const struct {
        char kind;
        const char *size;
        zb_dtype dtype;
    } rows[] = {
        {'b', "1", ZB_DT_BOOL},    {'i', "1", ZB_DT_INT8},    {'i', "2", ZB_DT_INT16},
        {'i', "4", ZB_DT_INT32},   {'i', "8", ZB_DT_INT64},   {'u', "1", ZB_DT_UINT8},
        {'u', "2", ZB_DT_UINT16},  {'u', "4", ZB_DT_UINT32},  {'u', "8", ZB_DT_UINT64},
        {'f', "2", ZB_DT_FLOAT16}, {'f', "4", ZB_DT_FLOAT32}, {'f', "8", ZB_DT_FLOAT64},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].kind != kind || strcmp(rows[i].size, size) != 0) continue;
        size_t itemsize = dtypes[rows[i].dtype].size;
        /* NumPy writes '|' only where byte order does not apply; "|f4" is not a typestr it
         * produces, and guessing its order would risk silently swapped values. */
        if (itemsize > 1 && order == '|')
            return zb__err(ZB_E_METADATA, "%s: dtype \"%s\" has no byte order ('<' or '>')", where,
                           typestr);
        *dtype = rows[i].dtype;
        *big_endian = itemsize > 1 && order == '>';
        return ZB_OK;
    }
    if (strchr("biuf", kind))
        return zb__err(ZB_E_UNSUPPORTED, "%s: dtype \"%.40s\" has an unsupported item size", where,
                       typestr);
    return zb__err(ZB_E_UNSUPPORTED, "%s: dtype \"%.40s\" is not supported", where, typestr);
}

zb_status
zb__dtype_parse_v3(const char *name, const char *where, zb_dtype *dtype)
{
    *dtype = ZB_DT_UINT8;
    for (int i = 0; i < ZB_DT_COUNT_; i++) {
        if (!strcmp(dtypes[i].name, name)) {
            *dtype = (zb_dtype)i;
            return ZB_OK;
        }
    }
    return zb__err(ZB_E_UNSUPPORTED, "%s: data_type \"%.60s\" is not supported", where, name);
}

/* ---- fill values ---------------------------------------------------------------------- */

static void
put_le(uint8_t *dst, uint64_t bits, size_t size)
{
    for (size_t i = 0; i < size; i++) dst[i] = (uint8_t)(bits >> (8 * i));
}

/* Round-to-nearest-even double -> IEEE half, directly from the double so no intermediate
 * float rounding can double-round. NaN becomes NumPy's canonical 0x7e00. */
uint16_t
zb__half_from_double(double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (isnan(x)) return 0x7e00;
    double a = fabs(x);
    if (isinf(a)) return (uint16_t)(sign | 0x7c00);
    if (a == 0.0) return sign;
    int e;
    (void)frexp(a, &e); /* a = m * 2^e, m in [0.5, 1): unbiased exponent e-1 */
    int exp = e - 1;
    if (exp < -14) {
        /* subnormal: a multiple of 2^-24; a result of 1024 is the smallest normal, whose bit
         * pattern 0x0400 the same expression yields */
        double r = nearbyint(ldexp(a, 24));
        return (uint16_t)(sign | (uint16_t)r);
    }
    double r = nearbyint(ldexp(a, 10 - exp)); /* in [1024, 2048] */
    uint32_t mant = (uint32_t)r;
    if (mant == 2048) {
        mant = 1024;
        exp++;
    }
    if (exp > 15) return (uint16_t)(sign | 0x7c00);
    return (uint16_t)(sign | (uint32_t)(exp + 15) << 10 | (mant - 1024));
}

double
zb__half_to_double(uint16_t bits)
{
    double sign = (bits & 0x8000) ? -1.0 : 1.0;
    int exp = (bits >> 10) & 0x1f;
    int mant = bits & 0x3ff;
    if (exp == 0x1f) return mant ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexp(mant, -24);
    return sign * ldexp(mant + 1024, exp - 25);
}

static uint64_t
f32_bits(double x)
{
    if (isnan(x)) return 0x7fc00000u;
    float f;
    /* Converting a double beyond the float range is undefined in C; round it ourselves:
     * at or above FLT_MAX + half an ulp (0x1.ffffffp127) it rounds to infinity. */
    if (fabs(x) >= 0x1.ffffffp127)
        f = signbit(x) ? -INFINITY : INFINITY;
    else
        f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint64_t
f64_bits(double x)
{
    if (isnan(x)) return 0x7ff8000000000000u;
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static int
hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The v3 "0x..." form: the exact IEEE bits, big-endian hex, 2*itemsize digits. */
static zb_status
parse_hex_bits(const char *s, size_t itemsize, const char *where, uint64_t *bits)
{
    size_t n = strlen(s + 2);
    if (n != 2 * itemsize)
        return zb__err(ZB_E_METADATA, "%s: fill_value \"%.40s\" needs %zu hex digits", where, s,
                       2 * itemsize);
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        int d = hex_digit(s[2 + i]);
        if (d < 0)
            return zb__err(ZB_E_METADATA, "%s: fill_value \"%.40s\" is not hexadecimal", where, s);
        v = v << 4 | (uint64_t)d;
    }
    *bits = v;
    return ZB_OK;
}

static zb_status
float_fill(json_object *v, zb_dtype dtype, int zarr_format, const char *where, uint8_t *fill)
{
    size_t size = dtypes[dtype].size;
    double x;
    switch (json_object_get_type(v)) {
    case json_type_int:
        x = zb__json_is_big_uint(v) ? (double)json_object_get_uint64(v)
                                    : (double)json_object_get_int64(v);
        break;
    case json_type_double: /* bare NaN/Infinity tokens arrive here too (FORMATS.md §5) */
        x = json_object_get_double(v);
        break;
    case json_type_string: {
        const char *s = json_object_get_string(v);
        if (!strcmp(s, "NaN")) {
            x = NAN;
        } else if (!strcmp(s, "Infinity")) {
            x = INFINITY;
        } else if (!strcmp(s, "-Infinity")) {
            x = -INFINITY;
        } else if (zarr_format == 3 && (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))) {
            uint64_t bits = 0;
            ZB_TRY(parse_hex_bits(s, size, where, &bits));
            put_le(fill, bits, size);
            return ZB_OK;
        } else {
            return zb__err(ZB_E_METADATA, "%s: fill_value \"%.40s\" is not a %s", where, s,
                           dtypes[dtype].name);
        }
        break;
    }
    default:
        return zb__err(ZB_E_METADATA, "%s: fill_value %.40s is not a %s", where, zb__json_text(v),
                       dtypes[dtype].name);
    }
    uint64_t bits = dtype == ZB_DT_FLOAT16   ? zb__half_from_double(x)
                    : dtype == ZB_DT_FLOAT32 ? f32_bits(x)
                                             : f64_bits(x);
    put_le(fill, bits, size);
    return ZB_OK;
}

static zb_status
int_fill(json_object *v, zb_dtype dtype, const char *where, uint8_t *fill)
{
    size_t size = dtypes[dtype].size;
    bool is_signed = dtype >= ZB_DT_INT8 && dtype <= ZB_DT_INT64;
    bool neg = false;
    uint64_t mag = 0; /* the value if !neg, else its two's complement bits */
    if (json_object_is_type(v, json_type_int)) {
        if (zb__json_is_big_uint(v)) {
            mag = json_object_get_uint64(v);
        } else {
            int64_t s = json_object_get_int64(v);
            neg = s < 0;
            mag = (uint64_t)s;
        }
    } else if (json_object_is_type(v, json_type_double)) {
        /* Not a form zarr writes, but 0.0 for an integer array is unambiguous; anything that
         * is not an exactly representable integer is refused. */
        double d = json_object_get_double(v);
        if (!(d == floor(d) && fabs(d) <= 9007199254740992.0))
            return zb__err(ZB_E_METADATA, "%s: fill_value %.40s is not an integer for %s", where,
                           zb__json_text(v), dtypes[dtype].name);
        int64_t s = (int64_t)d;
        neg = s < 0;
        mag = (uint64_t)s;
    } else {
        return zb__err(ZB_E_METADATA, "%s: fill_value %.40s is not an integer for %s", where,
                       zb__json_text(v), dtypes[dtype].name);
    }
    unsigned bitsn = (unsigned)(8 * size);
    bool ok;
    if (is_signed) {
        int64_t s = (int64_t)mag;
        int64_t lo = bitsn == 64 ? INT64_MIN : -((int64_t)1 << (bitsn - 1));
        int64_t hi = bitsn == 64 ? INT64_MAX : ((int64_t)1 << (bitsn - 1)) - 1;
        ok = neg ? s >= lo : (mag <= (uint64_t)hi);
    } else {
        uint64_t hi = bitsn == 64 ? UINT64_MAX : ((uint64_t)1 << bitsn) - 1;
        ok = !neg && mag <= hi;
    }
    if (!ok)
        return zb__err(ZB_E_METADATA, "%s: fill_value %.40s is out of range for %s", where,
                       zb__json_text(v), dtypes[dtype].name);
    put_le(fill, mag, size);
    return ZB_OK;
}

static zb_status
bool_fill(json_object *v, int zarr_format, const char *where, uint8_t *fill)
{
    if (json_object_is_type(v, json_type_boolean)) {
        fill[0] = json_object_get_boolean(v) ? 1 : 0;
        return ZB_OK;
    }
    /* NumPy's bool(0)/bool(1) in old v2 writers */
    if (zarr_format == 2 && json_object_is_type(v, json_type_int) && !zb__json_is_big_uint(v)) {
        int64_t s = json_object_get_int64(v);
        if (s == 0 || s == 1) {
            fill[0] = (uint8_t)s;
            return ZB_OK;
        }
    }
    return zb__err(ZB_E_METADATA, "%s: fill_value %.40s is not a bool", where, zb__json_text(v));
}

zb_status
zb__fill_parse(json_object *v, zb_dtype dtype, int zarr_format, const char *where, uint8_t fill[16],
               bool *fill_null)
{
    memset(fill, 0, 16);
    *fill_null = false;
    if (!dtype_valid(dtype)) return zb__err(ZB_E_INVALID, "%s: bad dtype", where);
    /* Strings have no fixed-size fill: a missing chunk reads as empty strings. anndata 0.8
     * writes 0 for |O, zarr-python 3 writes "" for string. */
    if (dtype == ZB_DT_STRING) return ZB_OK;
    if (!v) {
        *fill_null = true;
        return ZB_OK;
    }
    switch (dtype) {
    case ZB_DT_BOOL:
        return bool_fill(v, zarr_format, where, fill);
    case ZB_DT_FLOAT16:
    case ZB_DT_FLOAT32:
    case ZB_DT_FLOAT64:
        return float_fill(v, dtype, zarr_format, where, fill);
    default:
        return int_fill(v, dtype, where, fill);
    }
}
