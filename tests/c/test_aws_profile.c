/* zb_aws_profile_load: the AWS shared credentials and config files (src/store/aws_profile.c).
 * The expected values are those the AWS CLI / botocore read from the same files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"

static char cred_path[4200], conf_path[4200];

static void
write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void
files(const char *cred, const char *conf)
{
    const char *dir = zbt_tempdir("aws_profile");
    snprintf(cred_path, sizeof cred_path, "%s/credentials", dir);
    snprintf(conf_path, sizeof conf_path, "%s/config", dir);
    if (cred) write_text(cred_path, cred);
    if (conf) write_text(conf_path, conf);
}

static const char CRED[] = "# written by aws configure\n"
                           "[default]\n"
                           "aws_access_key_id = AKIDDEFAULT\n"
                           "aws_secret_access_key = secretDEFAULT/abc+def\n"
                           "\n"
                           "[work]\n"
                           "AWS_Access_Key_ID=AKIDWORK\n"
                           "aws_secret_access_key=secretWORK\n"
                           "aws_session_token = tok==\n"
                           "; a comment\n"
                           "[empty]\n";

static const char CONF[] = "[default]\n"
                           "region = eu-west-1\n"
                           "[profile work]\n"
                           "region=us-west-2\n"
                           "endpoint_url = http://127.0.0.1:9000\n"
                           "s3 =\n"
                           "    max_concurrent_requests = 20\n"
                           "    addressing_style = path\n"
                           "output = json\n"
                           "[profile   spaced]\n"
                           "aws_access_key_id = AKIDCONF\n"
                           "aws_secret_access_key = secretCONF\n"
                           "region = ap-south-1\n"
                           "[work]\n"
                           "region = not-this-one\n";

static void
test_profiles_as_botocore_reads_them(void **state)
{
    (void)state;
    files(CRED, CONF);
    zb_aws_profile p;
    ZB_ASSERT_OK(zb_aws_profile_load(cred_path, conf_path, NULL, &p));
    assert_true(p.found);
    assert_string_equal(p.access_key_id, "AKIDDEFAULT");
    assert_string_equal(p.secret_access_key, "secretDEFAULT/abc+def");
    assert_null(p.session_token);
    assert_string_equal(p.region, "eu-west-1");
    assert_null(p.endpoint_url);
    zb_aws_profile_free(&p);

    ZB_ASSERT_OK(zb_aws_profile_load(cred_path, conf_path, "work", &p));
    assert_true(p.found);
    assert_string_equal(p.access_key_id, "AKIDWORK");
    assert_string_equal(p.secret_access_key, "secretWORK");
    assert_string_equal(p.session_token, "tok==");
    assert_string_equal(p.region, "us-west-2"); /* [profile work], not [work], in config */
    assert_string_equal(p.endpoint_url, "http://127.0.0.1:9000");
    zb_aws_profile_free(&p);

    /* credentials in the config file, "profile" followed by several blanks */
    ZB_ASSERT_OK(zb_aws_profile_load(cred_path, conf_path, "spaced", &p));
    assert_true(p.found);
    assert_string_equal(p.access_key_id, "AKIDCONF");
    assert_string_equal(p.region, "ap-south-1");
    zb_aws_profile_free(&p);

    /* a section without settings is found and says nothing */
    ZB_ASSERT_OK(zb_aws_profile_load(cred_path, conf_path, "empty", &p));
    assert_true(p.found);
    assert_null(p.access_key_id);
    assert_null(p.region);
    zb_aws_profile_free(&p);

    /* an absent profile, and absent files, are not errors: the caller decides */
    ZB_ASSERT_OK(zb_aws_profile_load(cred_path, conf_path, "nosuch", &p));
    assert_false(p.found);
    assert_null(p.access_key_id);
    ZB_ASSERT_OK(zb_aws_profile_load("/nonexistent/credentials", NULL, NULL, &p));
    assert_false(p.found);
}

static void
test_bad_lines_name_file_and_line_never_a_value(void **state)
{
    (void)state;
    zb_aws_profile p;
    char want[4300];
    files("[default]\naws_access_key_id = AKID\nthis line has no delimiter\n", NULL);
    snprintf(want, sizeof want, "%s:3:", cred_path);
    ZB_ASSERT_ERR(zb_aws_profile_load(cred_path, conf_path, NULL, &p), ZB_E_INVALID, want);
    assert_null(strstr(zb_last_error(), "AKID"));
    assert_null(p.access_key_id);

    files("aws_secret_access_key = TOPSECRET\n[default]\n", NULL);
    snprintf(want, sizeof want, "%s:1: a setting before any [section]", cred_path);
    ZB_ASSERT_ERR(zb_aws_profile_load(cred_path, NULL, NULL, &p), ZB_E_INVALID, want);
    assert_null(strstr(zb_last_error(), "TOPSECRET"));

    files(NULL, "[profile x\nregion = r\n");
    snprintf(want, sizeof want, "%s:1: a section header needs its closing ']'", conf_path);
    ZB_ASSERT_ERR(zb_aws_profile_load(NULL, conf_path, "x", &p), ZB_E_INVALID, want);

    files("[a]\naws_access_key_id = K1\n[a]\naws_access_key_id = K2\n", NULL);
    snprintf(want, sizeof want, "%s:3: profile 'a' has a second section (the first is at line 1)",
             cred_path);
    ZB_ASSERT_ERR(zb_aws_profile_load(cred_path, NULL, "a", &p), ZB_E_INVALID, want);
    assert_false(p.found);
    /* another profile's duplicate section is not this profile's problem */
    ZB_ASSERT_OK(zb_aws_profile_load(cred_path, NULL, "b", &p));
    assert_false(p.found);

    files("[default]\n= value\n", NULL);
    ZB_ASSERT_ERR(zb_aws_profile_load(cred_path, NULL, NULL, &p), ZB_E_INVALID,
                  "a setting without a name");

    /* a directory where a file should be is an I/O error naming it */
    const char *dir = zbt_tempdir("aws_profile_dir");
    ZB_ASSERT_ERR(zb_aws_profile_load(dir, NULL, NULL, &p), ZB_E_IO, dir);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profiles_as_botocore_reads_them),
        cmocka_unit_test(test_bad_lines_name_file_and_line_never_a_value),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
