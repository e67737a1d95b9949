/* Store URLs on the command line: local paths as they are; http(s):// and s3:// with options
 * from the standard AWS environment variables (the library itself reads none). */
#include <stdlib.h>

#include "cli.h"
#include "zbatch.h"

static const char *
env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

zb_status
zb_cli_store_open(const char *url, zb_store **out)
{
    zb_remote_opts o = ZB_REMOTE_OPTS_DEFAULT;
    o.access_key_id = env("AWS_ACCESS_KEY_ID");
    o.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    o.session_token = env("AWS_SESSION_TOKEN");
    o.region = env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
    o.endpoint_url =
        env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
    if (!o.access_key_id || !o.secret_access_key) o.anonymous = true;
    return zb_store_open_opts(url, &o, out);
}
