/* zbatch convert SRC DST — re-encode a Zarr store (v2 or v3, any codec) into a new store with
 * the given format, codec and chunk size; groups and attributes are kept, so anndata and atomic
 * layouts stay what they were. Arrays zbatch cannot read are skipped (and named). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "zbatch.h"

static void
usage(FILE *f)
{
    fprintf(f, "usage: zbatch convert SRC DST [--codec CODEC] [--format v2|v3] "
               "[--chunk-bytes N] [--threads T]\n"
               "  CODEC: none, zstd:L, lz4, gzip:L, zlib:L, blosc:CNAME:CLEVEL:SHUFFLE\n");
}

int
zb_cli_convert(int argc, char **argv)
{
    const char *src = NULL, *dst = NULL;
    zb_copy_opts o = ZB_COPY_OPTS_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--codec") && i + 1 < argc) {
            o.codec = argv[++i];
        } else if (!strcmp(a, "--format") && i + 1 < argc) {
            const char *f = argv[++i];
            if (strcmp(f, "v2") && strcmp(f, "v3") && strcmp(f, "2") && strcmp(f, "3")) {
                fprintf(stderr, "zbatch convert: --format is v2 or v3, not '%s'\n", f);
                return 2;
            }
            o.zarr_format = strchr(f, '2') ? 2 : 3;
        } else if (!strcmp(a, "--chunk-bytes") && i + 1 < argc) {
            char *end;
            o.chunk_bytes = strtoull(argv[++i], &end, 10);
            if (*end || o.chunk_bytes == 0) {
                fprintf(stderr, "zbatch convert: --chunk-bytes needs a positive integer\n");
                return 2;
            }
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            o.num_threads = atoi(argv[++i]);
        } else if (a[0] == '-') {
            fprintf(stderr, "zbatch convert: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!src) {
            src = a;
        } else if (!dst) {
            dst = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!src || !dst) {
        usage(stderr);
        return 2;
    }
    struct stat sb;
    if (stat(dst, &sb) == 0) {
        fprintf(stderr, "zbatch convert: %s exists; give a new path\n", dst);
        return 1;
    }
    if (mkdir(dst, 0777) != 0) {
        fprintf(stderr, "zbatch convert: cannot create %s: %s\n", dst, strerror(errno));
        return 1;
    }
    zb_store *in = NULL, *out = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    zb_status st = zb_store_open(src, &in);
    if (st == ZB_OK) st = zb_store_open(dst, &out);
    if (st == ZB_OK) st = zb_store_copy(in, "", out, "", &o);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    zb_store_close(in);
    zb_store_close(out);
    if (st != ZB_OK) {
        fprintf(stderr, "zbatch convert: %s: %s\n", zb_strerror(st), zb_last_error());
        return 1;
    }
    printf("converted %s -> %s in %.2f s\n", src, dst,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    return 0;
}
