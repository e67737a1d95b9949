/* How the command opens stores: with the options the environment gives (the library reads no
 * environment variable itself). Local paths take ZBATCH_MMAP_BYTES; http(s):// and s3:// URLs
 * take the standard AWS variables, then the AWS shared files (~/.aws/credentials and
 * ~/.aws/config, or AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE) for the profile
 * AWS_PROFILE names, or `default`, as the AWS CLI does. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "util/status.h"

static const char *
env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* `name`'s value, or HOME/`fallback`. */
static void
file_path(char *buf, size_t cap, const char *name, const char *fallback)
{
    if (env(name))
        snprintf(buf, cap, "%s", env(name));
    else
        snprintf(buf, cap, "%s/%s", env("HOME") ? env("HOME") : "", fallback);
}

/* The profile of the shared files, read once; its strings live as long as the process. */
static zb_aws_profile profile;
static bool profile_read;

static zb_status
read_profile(void)
{
    if (profile_read) return ZB_OK;
    const char *named = env("AWS_PROFILE") ? env("AWS_PROFILE") : env("AWS_DEFAULT_PROFILE");
    char cred[PATH_MAX], conf[PATH_MAX];
    file_path(cred, sizeof cred, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    file_path(conf, sizeof conf, "AWS_CONFIG_FILE", ".aws/config");
    ZB_TRY(zb_aws_profile_load(cred, conf, named, &profile));
    if (named && !profile.found)
        return zb__err(ZB_E_NOTFOUND, "AWS profile '%s' (AWS_PROFILE) is in neither %s nor %s",
                       named, cred, conf);
    profile_read = true;
    return ZB_OK;
}

zb_status
zb__cli_remote_opts(zb_remote_opts *r)
{
    zb_remote_opts d = ZB_REMOTE_OPTS_DEFAULT;
    *r = d;
    r->access_key_id = env("AWS_ACCESS_KEY_ID");
    r->secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    r->session_token = env("AWS_SESSION_TOKEN");
    r->region = env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
    r->endpoint_url =
        env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
    bool have_keys = r->access_key_id && r->secret_access_key;
    if (!have_keys || !r->region || !r->endpoint_url) {
        ZB_TRY(read_profile());
        if (!have_keys) {
            r->access_key_id = profile.access_key_id;
            r->secret_access_key = profile.secret_access_key;
            r->session_token = r->session_token ? r->session_token : profile.session_token;
        }
        if (!r->region) r->region = profile.region;
        if (!r->endpoint_url) r->endpoint_url = profile.endpoint_url;
    }
    if (!r->access_key_id || !r->secret_access_key) r->anonymous = true;
    return ZB_OK;
}

zb_status
zb__cli_mmap_bytes(uint64_t *bytes)
{
    const char *e = env("ZBATCH_MMAP_BYTES");
    if (!e) return ZB_OK;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(e, &end, 10);
    if (*e == '-' || errno || *end)
        return zb__err(ZB_E_INVALID, "ZBATCH_MMAP_BYTES='%s': not a number of bytes", e);
    *bytes = (uint64_t)v;
    return ZB_OK;
}

zb_status
zb__cli_store_open(const char *url, zb_store **out)
{
    *out = NULL;
    zb_store_opts opts = ZB_STORE_OPTS_DEFAULT;
    ZB_TRY(zb__cli_mmap_bytes(&opts.mmap_bytes));
    zb_remote_opts r;
    bool s3 = !strncmp(url, "s3://", 5); /* credentials are S3's only */
    if (s3) ZB_TRY(zb__cli_remote_opts(&r));
    opts.remote = s3 ? &r : NULL;
    return zb_store_open_opts(url, &opts, out);
}
