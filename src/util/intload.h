/* One integer element of any integer dtype, read from unaligned memory. */
#ifndef ZB_UTIL_INTLOAD_H
#define ZB_UTIL_INTLOAD_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "zbatch.h"

/* Reads the element of dtype `dt` at `p` into *v. False, with *v = 0, for a dtype that is not
 * an integer (bool counts as uint8); false, with *v = INT64_MAX, for a uint64 above INT64_MAX.
 * Callers choose what either means (an error, a saturated value). */
static inline bool
zb__load_int(const void *p, zb_dtype dt, int64_t *v)
{
    switch (dt) {
    case ZB_DT_BOOL:
    case ZB_DT_UINT8:
        *v = *(const uint8_t *)p;
        return true;
    case ZB_DT_INT8:
        *v = *(const int8_t *)p;
        return true;
    case ZB_DT_INT16: {
        int16_t t;
        memcpy(&t, p, 2);
        *v = t;
        return true;
    }
    case ZB_DT_UINT16: {
        uint16_t t;
        memcpy(&t, p, 2);
        *v = t;
        return true;
    }
    case ZB_DT_INT32: {
        int32_t t;
        memcpy(&t, p, 4);
        *v = t;
        return true;
    }
    case ZB_DT_UINT32: {
        uint32_t t;
        memcpy(&t, p, 4);
        *v = t;
        return true;
    }
    case ZB_DT_INT64:
        memcpy(v, p, 8);
        return true;
    case ZB_DT_UINT64: {
        uint64_t t;
        memcpy(&t, p, 8);
        *v = t > INT64_MAX ? INT64_MAX : (int64_t)t;
        return t <= INT64_MAX;
    }
    default:
        *v = 0;
        return false;
    }
}

#endif
