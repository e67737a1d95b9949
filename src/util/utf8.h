/* UTF-8 validation of names from storage (node keys), and an ASCII-safe copy for messages. */
#ifndef ZB_UTIL_UTF8_H
#define ZB_UTIL_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong forms, no
 * surrogates, at most U+10FFFF): 1 to 4, or 0 where none starts (s[0] is NUL or a byte that
 * cannot start one, or the sequence is cut short). */
static inline size_t
zb__utf8_seq(const uint8_t *s)
{
    uint8_t c = s[0];
    if (c < 0x80) return c ? 1 : 0;
    size_t n = c >= 0xC2 && c <= 0xDF ? 1 : (c & 0xF0) == 0xE0 ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
    if (!n) return 0;
    uint8_t lo = 0x80, hi = 0xBF; /* the second byte's range (RFC 3629 §4) */
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    for (size_t k = 1; k <= n; k++) {
        uint8_t b = s[k];
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    }
    return n + 1;
}

/* Whether s is well-formed UTF-8; *bad is the offset of the first byte that is not. */
static inline bool
zb__utf8_valid(const char *str, size_t *bad)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0, n = 1;
    while (n) {
        while (s[i] - 1u < 0x7Fu) i++; /* ASCII other than NUL, the common case, byte by byte */
        n = zb__utf8_seq(s + i);
        i += n;
    }
    *bad = i;
    return s[i] == '\0';
}

/* s with every byte outside printable ASCII (and the backslash) as \xNN, cut to fit cap. */
static inline const char *
zb__escape_bytes(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        uint8_t c = (uint8_t)*s;
        if (c >= 0x20 && c < 0x7F && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

#endif
