/* JSON rules of FORMATS.md §5 (checklist rows 1-4): bare non-finite tokens, exact 64-bit
 * integers, no clamping, no trailing bytes, surrogate pairs, duplicate keys. */
#include <math.h>
#include <string.h>

#include "support/testutil.h"
#include "util/json.h"

static json_object *
parse_ok(const char *text)
{
    json_object *o = NULL;
    zb_status st = zb__json_parse(text, strlen(text), "test", &o);
    if (st != ZB_OK) fail_msg("parse of %s failed: %s", text, zb_last_error());
    assert_non_null(o);
    return o;
}

static zb_status
parse_st(const char *text)
{
    json_object *o = (json_object *)1;
    zb_status st = zb__json_parse(text, strlen(text), "doc", &o);
    if (st == ZB_OK)
        json_object_put(o);
    else
        assert_null(o);
    return st;
}

static void
test_nonfinite_tokens(void **state)
{
    (void)state;
    json_object *o = parse_ok("{\"m\": NaN, \"p\": Infinity, \"n\": -Infinity}");
    assert_true(isnan(json_object_get_double(zb__json_get(o, "m"))));
    double p = json_object_get_double(zb__json_get(o, "p"));
    double n = json_object_get_double(zb__json_get(o, "n"));
    assert_true(isinf(p) && p > 0);
    assert_true(isinf(n) && n < 0);
    json_object_put(o);
}

static void
test_exact_64bit_integers(void **state)
{
    (void)state;
    json_object *o = parse_ok("[18446744073709551615, -9223372036854775808, 9223372036854775808,"
                              " 9223372036854775807, 0, -0]");
    uint64_t u;
    int64_t s;
    assert_int_equal(zb__json_u64(json_object_array_get_idx(o, 0), "a", &u), ZB_OK);
    assert_true(u == UINT64_MAX);
    assert_true(zb__json_is_big_uint(json_object_array_get_idx(o, 0)));
    /* does not fit int64: refused rather than saturated */
    assert_int_equal(zb__json_i64(json_object_array_get_idx(o, 0), "a", &s), ZB_E_METADATA);
    assert_int_equal(zb__json_i64(json_object_array_get_idx(o, 1), "b", &s), ZB_OK);
    assert_true(s == INT64_MIN);
    assert_int_equal(zb__json_u64(json_object_array_get_idx(o, 1), "b", &u), ZB_E_METADATA);
    assert_int_equal(zb__json_u64(json_object_array_get_idx(o, 2), "c", &u), ZB_OK);
    assert_true(u == 9223372036854775808u);
    assert_true(zb__json_is_big_uint(json_object_array_get_idx(o, 2)));
    assert_false(zb__json_is_big_uint(json_object_array_get_idx(o, 3)));
    assert_int_equal(zb__json_i64(json_object_array_get_idx(o, 3), "d", &s), ZB_OK);
    assert_true(s == INT64_MAX);
    assert_int_equal(zb__json_u64(json_object_array_get_idx(o, 5), "f", &u), ZB_OK);
    assert_true(u == 0);
    json_object_put(o);
}

static void
test_out_of_range_integers_are_errors(void **state)
{
    (void)state;
    assert_int_equal(parse_st("18446744073709551616"), ZB_E_JSON);
    assert_int_equal(parse_st("[1, 18446744073709551616]"), ZB_E_JSON);
    assert_int_equal(parse_st("{\"shape\": [-9223372036854775809]}"), ZB_E_JSON);
    assert_int_equal(parse_st("[99999999999999999999999999]"), ZB_E_JSON);
    assert_non_null(strstr(zb_last_error(), "byte 1"));
    /* doubles and digits inside strings are not integers */
    assert_int_equal(parse_st("[99999999999999999999.0, 1e400, 18446744073709551616e0]"), ZB_OK);
    assert_int_equal(parse_st("{\"k\": \"18446744073709551616\"}"), ZB_OK);
    assert_int_equal(parse_st("{\"k\\\" 18446744073709551616\": 1}"), ZB_OK);
}

static void
test_trailing_garbage(void **state)
{
    (void)state;
    assert_int_equal(parse_st("{\"a\": 1} x"), ZB_E_JSON);
    assert_non_null(strstr(zb_last_error(), "byte 9"));
    assert_int_equal(parse_st("[1] [2]"), ZB_E_JSON);
    assert_int_equal(parse_st("{\"a\": 1}  \n\t"), ZB_OK);
    assert_int_equal(parse_st("42"), ZB_OK);
    assert_int_equal(parse_st(""), ZB_E_JSON);
    assert_int_equal(parse_st("   "), ZB_E_JSON);
    assert_int_equal(parse_st("{\"a\": [1, 2"), ZB_E_JSON);
    assert_int_equal(parse_st("[1,]"), ZB_E_JSON);
    assert_int_equal(parse_st("/* c */ [1]"), ZB_E_JSON);

    json_object *o = (json_object *)1;
    assert_int_equal(zb__json_parse("[1]\0[2]", 7, "doc", &o), ZB_E_JSON);
    assert_null(o);
    assert_non_null(strstr(zb_last_error(), "NUL byte at byte 3"));
}

static void
test_surrogate_pairs_and_duplicates(void **state)
{
    (void)state;
    json_object *o = parse_ok("{\"s\": \"\\ud83d\\ude00 \\u00e9\", \"d\": 1, \"d\": 2}");
    const char *s = json_object_get_string(zb__json_get(o, "s"));
    assert_string_equal(s, "\xf0\x9f\x98\x80 \xc3\xa9");
    /* duplicate keys: the last value wins (json-c's rule, documented in util/json.h) */
    int64_t d;
    assert_int_equal(zb__json_i64(zb__json_get(o, "d"), "d", &d), ZB_OK);
    assert_int_equal(d, 2);
    json_object_put(o);
}

static void
test_integer_accessors_refuse_non_integers(void **state)
{
    (void)state;
    json_object *o = parse_ok("[10.0, true, \"10\", null, -1, 1e3]");
    uint64_t u;
    int64_t s;
    assert_int_equal(zb__json_u64(json_object_array_get_idx(o, 0), "shape[0]", &u), ZB_E_METADATA);
    assert_string_equal(zb_last_error(), "shape[0] is 10.0, not an integer");
    assert_int_equal(zb__json_u64(json_object_array_get_idx(o, 1), "x", &u), ZB_E_METADATA);
    assert_int_equal(zb__json_i64(json_object_array_get_idx(o, 2), "x", &s), ZB_E_METADATA);
    assert_int_equal(zb__json_i64(json_object_array_get_idx(o, 3), "x", &s), ZB_E_METADATA);
    assert_int_equal(zb__json_u64(json_object_array_get_idx(o, 4), "x", &u), ZB_E_METADATA);
    assert_int_equal(zb__json_i64(json_object_array_get_idx(o, 4), "x", &s), ZB_OK);
    assert_int_equal(s, -1);
    assert_int_equal(zb__json_u64(json_object_array_get_idx(o, 5), "x", &u), ZB_E_METADATA);
    json_object_put(o);
}

static void
test_text_is_compact(void **state)
{
    (void)state;
    json_object *o = parse_ok("{ \"a/b\" : [ 1 , 2.5 ],\n \"c\": NaN }");
    assert_string_equal(zb__json_text(o), "{\"a/b\":[1,2.5],\"c\":NaN}");
    assert_null(zb__json_get(o, "missing"));
    assert_null(zb__json_get(json_object_array_get_idx(zb__json_get(o, "a/b"), 0), "x"));
    json_object_put(o);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonfinite_tokens),
        cmocka_unit_test(test_exact_64bit_integers),
        cmocka_unit_test(test_out_of_range_integers_are_errors),
        cmocka_unit_test(test_trailing_garbage),
        cmocka_unit_test(test_surrogate_pairs_and_duplicates),
        cmocka_unit_test(test_integer_accessors_refuse_non_integers),
        cmocka_unit_test(test_text_is_compact),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
