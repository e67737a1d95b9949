/* Status codes, their descriptions, and the per-thread detail message. */
#include "util/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ZB_DETAIL_CAP 1024

static _Thread_local char detail[ZB_DETAIL_CAP];

const char *
zb_strerror(zb_status status)
{
    switch (status) {
#define ZB_STATUS_TEXT_(name, value, text)                                                         \
    case name:                                                                                     \
        return text;
        ZB_STATUS_LIST(ZB_STATUS_TEXT_)
#undef ZB_STATUS_TEXT_
    }
    return "unknown status";
}

const char *
zb_status_name(zb_status status)
{
    switch (status) {
#define ZB_STATUS_NAME_(name, value, text)                                                         \
    case name:                                                                                     \
        return #name;
        ZB_STATUS_LIST(ZB_STATUS_NAME_)
#undef ZB_STATUS_NAME_
    }
    return "ZB_E_UNKNOWN";
}

const char *
zb_last_error(void)
{
    return detail;
}

void
zb_clear_error(void)
{
    detail[0] = '\0';
}

zb_status
zb__err(zb_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return status;
}

zb_status
zb__err_context(zb_status status, const char *fmt, ...)
{
    char prefix[512];
    char old[ZB_DETAIL_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, detail, sizeof old);
    const char *rest = old[0] ? old : zb_strerror(status);
    size_t n = strlen(prefix);
    memcpy(detail, prefix, n + 1);
    if (n + 2 < sizeof detail) {
        memcpy(detail + n, ": ", 3);
        n += 2;
        size_t m = strlen(rest);
        if (m > sizeof detail - 1 - n) m = sizeof detail - 1 - n;
        memcpy(detail + n, rest, m);
        detail[n + m] = '\0';
    }
    return status;
}
