/* Internal error reporting: set this thread's detail message and return the status. */
#ifndef ZB_UTIL_STATUS_H
#define ZB_UTIL_STATUS_H

#include "zbatch.h"

#if defined(__GNUC__)
#define ZB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ZB_PRINTF(a, b)
#endif

/* Records "fmt ..." as this thread's detail message and returns `status`. Use as
 * `return zb__err(ZB_E_CORRUPT, "%s: blosc header cbytes %u != %zu", key, a, b);` */
zb_status zb__err(zb_status status, const char *fmt, ...) ZB_PRINTF(2, 3);

/* Prepends "prefix: " to this thread's current detail message (adds context on the way up);
 * returns `status` unchanged. */
zb_status zb__err_context(zb_status status, const char *fmt, ...) ZB_PRINTF(2, 3);

#define ZB_TRY(expr)                                                                               \
    do {                                                                                           \
        zb_status zb_try_st_ = (expr);                                                             \
        if (zb_try_st_ != ZB_OK) return zb_try_st_;                                                \
    } while (0)

#endif
