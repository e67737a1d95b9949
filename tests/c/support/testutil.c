#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *
zbt_tempdir(const char *name)
{
    static char path[1024];
    const char *base = getenv("ZB_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    mkdir(base, 0777);
    snprintf(path, sizeof path, "%s/%s.%ld", base, name, (long)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fail_msg("cannot clear %s", path);
    if (mkdir(path, 0777) != 0) fail_msg("cannot create %s", path);
    return path;
}

void
zbt_put_str(zb_store *s, const char *key, const char *text)
{
    zb_status st = zb_store_put(s, key, text, strlen(text));
    if (st != ZB_OK) fail_msg("put %s: %s", key, zb_last_error());
}

int
zbt_mentions(const char *needle)
{
    return !needle || strstr(zb_last_error(), needle) != NULL;
}
