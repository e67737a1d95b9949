/* How the command opens stores: with the options the environment gives (the library reads no
 * environment variable itself). */
#include <errno.h>
#include <stdlib.h>

#include "cli.h"
#include "util/status.h"

zb_status
zb__cli_store_open(const char *url, zb_store **out)
{
    *out = NULL;
    zb_store_opts opts = ZB_STORE_OPTS_DEFAULT;
    const char *e = getenv("ZBATCH_MMAP_BYTES");
    if (e && *e) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(e, &end, 10);
        if (*e == '-' || errno || *end)
            return zb__err(ZB_E_INVALID, "ZBATCH_MMAP_BYTES='%s': not a number of bytes", e);
        opts.mmap_bytes = (uint64_t)v;
    }
    return zb_store_open_opts(url, &opts, out);
}
