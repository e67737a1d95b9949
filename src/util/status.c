/* Status codes, their descriptions, and the per-thread detail message. */
#include "util/status.h"

#include "util/utf8.h"

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

/* Makes the detail message well-formed UTF-8: a byte that is not part of a well-formed
 * sequence (a name or string from a damaged file, or a sequence the cap cut) is written \xNN, so
 * the message prints, and decodes wherever text is expected (a terminal, Python). */
static void
detail_utf8(void)
{
    size_t bad;
    if (zb__utf8_valid(detail, &bad)) return;
    char fixed[ZB_DETAIL_CAP];
    const uint8_t *s = (const uint8_t *)detail;
    size_t i = 0, o = 0;
    while (s[i]) {
        size_t n = zb__utf8_seq(s + i), need = n ? n : 4;
        if (o + need >= sizeof fixed) break; /* what no longer fits is left out whole */
        if (n)
            memcpy(fixed + o, s + i, n);
        else
            snprintf(fixed + o, sizeof fixed - o, "\\x%02x", s[i]);
        o += need;
        i += n ? n : 1;
    }
    fixed[o] = '\0';
    memcpy(detail, fixed, o + 1);
}

zb_status
zb__err(zb_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    detail_utf8();
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
    detail_utf8();
    return status;
}
