/* JSON on top of json-c, with the rules of shared FORMATS.md §5: bare NaN/Infinity tokens
 * accepted, integer lexemes kept exact (int64 or uint64 by sign and range; anything outside
 * both is an error, never a clamp), trailing garbage after the document is an error. With
 * duplicate keys the last value wins (json-c's rule). */
#ifndef ZB_UTIL_JSON_H
#define ZB_UTIL_JSON_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>

#include "zbatch.h"

/* Parses `len` bytes of `text` into *out (release with json_object_put). `where` names the
 * document (e.g. the key) in error messages, which give the byte offset. ZB_E_JSON on any
 * syntax error, trailing bytes, or an integer outside int64 ∪ uint64. */
zb_status zb__json_parse(const char *text, size_t len, const char *where, json_object **out);

/* Integer accessors that refuse doubles (1.0), booleans and strings: ZB_E_METADATA naming
 * `what`. */
zb_status zb__json_u64(json_object *v, const char *what, uint64_t *out);
zb_status zb__json_i64(json_object *v, const char *what, int64_t *out);
/* True if v is an int token whose value is >= 0 and does not fit int64. */
bool zb__json_is_big_uint(json_object *v);

/* A member by key, or NULL. */
json_object *zb__json_get(json_object *obj, const char *key);

/* The string member `key` of obj (an attribute such as "encoding-type"), or NULL when it is
 * absent or not a string. The string lives as long as obj. */
const char *zb__json_string(json_object *obj, const char *key);

/* Compact text of `obj` (json-c key order); the string lives as long as `obj`. */
const char *zb__json_text(json_object *obj);

#endif
