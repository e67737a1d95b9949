/* JSON on top of json-c 0.16 with the rules of shared FORMATS.md §5.
 *
 * json-c already accepts the bare NaN/Infinity/-Infinity tokens that zarr-python writes, keeps
 * uint64 values up to 2^64-1 exact and decodes \uXXXX surrogate pairs. What it gets wrong for
 * us is handled here: it ignores bytes after the first value (we require the document to end
 * there), and it silently clamps out-of-range integers to INT64_MIN / UINT64_MAX, so the raw
 * text is scanned for integer lexemes and anything outside int64 ∪ uint64 is refused. */
#include "util/json.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "util/status.h"

/* Deeper than any real attributes document; json-c's default of 32 is too shallow for nested
 * anndata `uns` dictionaries inside consolidated metadata. json-c frees objects recursively,
 * so the bound also keeps json_object_put's recursion small. */
#define JSON_MAX_DEPTH 512

static bool
is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* True if the decimal digits d[0..n) (no sign) denote a value <= the decimal `limit`. */
static bool
digits_le(const char *d, size_t n, const char *limit)
{
    while (n > 1 && d[0] == '0') {
        d++;
        n--;
    }
    size_t ln = strlen(limit);
    if (n != ln) return n < ln;
    return memcmp(d, limit, n) <= 0;
}

/* Scans text that json-c has already accepted for integer lexemes (number tokens without '.',
 * 'e' or 'E') and refuses any outside int64 ∪ uint64. Strings (either quote, since json-c
 * accepts single-quoted strings even in strict mode) are skipped with their escapes. */
static zb_status
check_integer_ranges(const char *text, size_t len, const char *where)
{
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (c == '"' || c == '\'') {
            i++;
            while (i < len && text[i] != c) i += text[i] == '\\' ? 2 : 1;
            i++;
            continue;
        }
        if (c != '-' && (c < '0' || c > '9')) {
            i++;
            continue;
        }
        size_t start = i;
        bool neg = c == '-';
        if (neg) i++;
        size_t dstart = i;
        while (i < len && text[i] >= '0' && text[i] <= '9') i++;
        size_t ndig = i - dstart;
        bool integral = !(i < len && (text[i] == '.' || text[i] == 'e' || text[i] == 'E'));
        while (i < len && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.' || text[i] == 'e' ||
                           text[i] == 'E' || text[i] == '+' || text[i] == '-'))
            i++;
        if (!integral || ndig == 0) continue; /* a double, or "-Infinity" */
        const char *limit = neg ? "9223372036854775808" : "18446744073709551615";
        if (!digits_le(text + dstart, ndig, limit)) {
            int shown = (int)((i - start) > 40 ? 40 : (i - start));
            return zb__err(ZB_E_JSON,
                           "%s: integer %.*s%s at byte %zu is outside the int64 and uint64 "
                           "ranges",
                           where, shown, text + start, (i - start) > 40 ? "..." : "", start);
        }
    }
    return ZB_OK;
}

zb_status
zb__json_parse(const char *text, size_t len, const char *where, json_object **out)
{
    *out = NULL;
    if (!where) where = "JSON document";
    if (!text) return zb__err(ZB_E_INVALID, "%s: no text", where);
    if (len > (size_t)INT_MAX - 1)
        return zb__err(ZB_E_JSON, "%s: document of %zu bytes is too large", where, len);
    /* json-c stops at a NUL byte as if the text ended there; say what really happened. */
    const char *nul = memchr(text, '\0', len);
    if (nul) return zb__err(ZB_E_JSON, "%s: NUL byte at byte %zu", where, (size_t)(nul - text));

    struct json_tokener *tok = json_tokener_new_ex(JSON_MAX_DEPTH);
    if (!tok) return zb__err(ZB_E_NOMEM, "%s: cannot allocate a JSON tokener", where);
    /* Strict mode refuses comments, trailing commas and lower-case nan, none of which a Zarr
     * writer produces; NaN/Infinity tokens are still accepted. JSON text is UTF-8 (RFC 8259
     * §8.1): other bytes in a string are refused here rather than passed on to JSON output and
     * Python strings. */
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    zb_status st = ZB_OK;
    json_object *obj = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    if (!obj && jerr == json_tokener_continue) {
        /* A top-level number or literal is only complete once the tokener sees the end. */
        obj = json_tokener_parse_ex(tok, "", 1);
        jerr = json_tokener_get_error(tok);
        end = len;
    }
    if (!obj) {
        if (jerr == json_tokener_success || jerr == json_tokener_continue)
            jerr = json_tokener_error_parse_eof;
        st = zb__err(ZB_E_JSON, "%s: malformed JSON at byte %zu: %s", where, end,
                     json_tokener_error_desc(jerr));
        goto fail;
    }
    for (size_t i = end; i < len; i++) {
        if (!is_ws(text[i])) {
            st = zb__err(ZB_E_JSON, "%s: trailing bytes after the JSON document at byte %zu", where,
                         i);
            goto fail;
        }
    }
    st = check_integer_ranges(text, len, where);
    if (st != ZB_OK) goto fail;
    json_tokener_free(tok);
    *out = obj;
    return ZB_OK;

fail:
    json_object_put(obj);
    json_tokener_free(tok);
    return st;
}

bool
zb__json_is_big_uint(json_object *v)
{
    if (!json_object_is_type(v, json_type_int)) return false;
    /* json_object_get_int64 saturates a uint64 above INT64_MAX; get_uint64 is exact there
     * (and returns 0 for negative values). */
    return json_object_get_uint64(v) > (uint64_t)INT64_MAX;
}

/* Refuses anything that is not an integer token, naming `what` and showing the value. */
static zb_status
require_int(json_object *v, const char *what)
{
    if (json_object_is_type(v, json_type_int)) return ZB_OK;
    if (!v) return zb__err(ZB_E_METADATA, "%s is missing or null", what);
    const char *text = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
    int shown = (int)strnlen(text, 40);
    return zb__err(ZB_E_METADATA, "%s is %.*s%s, not an integer", what, shown, text,
                   text[shown] ? "..." : "");
}

zb_status
zb__json_u64(json_object *v, const char *what, uint64_t *out)
{
    *out = 0;
    ZB_TRY(require_int(v, what));
    if (zb__json_is_big_uint(v)) {
        *out = json_object_get_uint64(v);
        return ZB_OK;
    }
    int64_t s = json_object_get_int64(v);
    if (s < 0)
        return zb__err(ZB_E_METADATA, "%s is %lld, must not be negative", what, (long long)s);
    *out = (uint64_t)s;
    return ZB_OK;
}

zb_status
zb__json_i64(json_object *v, const char *what, int64_t *out)
{
    *out = 0;
    ZB_TRY(require_int(v, what));
    if (zb__json_is_big_uint(v))
        return zb__err(ZB_E_METADATA, "%s is %llu, outside the int64 range", what,
                       (unsigned long long)json_object_get_uint64(v));
    *out = json_object_get_int64(v);
    return ZB_OK;
}

json_object *
zb__json_get(json_object *obj, const char *key)
{
    json_object *v = NULL;
    if (!json_object_is_type(obj, json_type_object)) return NULL;
    if (!json_object_object_get_ex(obj, key, &v)) return NULL;
    return v;
}

const char *
zb__json_string(json_object *obj, const char *key)
{
    json_object *v = zb__json_get(obj, key);
    return json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

const char *
zb__json_text(json_object *obj)
{
    return json_object_to_json_string_ext(obj,
                                          JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
}
