/* How the command opens stores: with the options the environment gives (the library reads no
 * environment variable itself). Local paths take ZBATCH_MMAP_BYTES; http(s):// and s3:// URLs
 * take the standard AWS variables. */
#include <errno.h>
#include <stdlib.h>

#include "cli.h"
#include "util/status.h"

static const char *
env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

void
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
    if (!r->access_key_id || !r->secret_access_key) r->anonymous = true;
}

zb_status
zb__cli_store_open(const char *url, zb_store **out)
{
    *out = NULL;
    zb_store_opts opts = ZB_STORE_OPTS_DEFAULT;
    const char *e = env("ZBATCH_MMAP_BYTES");
    if (e) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(e, &end, 10);
        if (*e == '-' || errno || *end)
            return zb__err(ZB_E_INVALID, "ZBATCH_MMAP_BYTES='%s': not a number of bytes", e);
        opts.mmap_bytes = (uint64_t)v;
    }
    zb_remote_opts r;
    zb__cli_remote_opts(&r);
    opts.remote = &r;
    return zb_store_open_opts(url, &opts, out);
}
