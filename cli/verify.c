/* zbatch verify PATH: checks a store (zb_verify, include/zbatch_verify.h) and prints one line
 * per problem, then a summary. Exit status: 0 clean, 1 problems found, 2 bad usage. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "zbatch.h"
#include "zbatch_verify.h"

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: zbatch verify PATH [options]\n"
            "\n"
            "Checks the Zarr store at PATH (v2 or v3) and says what is wrong with it: node\n"
            "metadata (and consolidated metadata against it), every chunk and shard decoded,\n"
            "anndata sparse pointers and indices and dataframe lengths, AtomicData pointers,\n"
            "masks, array lengths and edge indices, and stores whose write never committed.\n"
            "Prints one line per problem ('KEY: message'), then a summary line.\n"
            "Exit status: 0 clean, 1 problems found, 2 bad usage.\n"
            "\n"
            "  --max-problems N  problems listed (default %d; all are counted)\n"
            "  --metadata-only   check metadata and lengths only; decode no chunk\n"
            "  --notes           also list notes (uncommitted tails, arrays not checked)\n"
            "  -q, --quiet       print the summary line only\n"
            "  -h, --help        this text\n",
            ZB_VERIFY_MAX_PROBLEMS_DEFAULT);
}

static const char *
plural(uint64_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

int
zb_cli_verify(int argc, char **argv)
{
    const char *path = NULL;
    bool quiet = false, notes = false;
    zb_verify_report report = ZB_VERIFY_REPORT_INIT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (!strcmp(a, "--notes")) {
            notes = true;
        } else if (!strcmp(a, "--metadata-only")) {
            report.metadata_only = true;
        } else if (!strcmp(a, "--max-problems")) {
            char *end;
            if (i + 1 >= argc) {
                fprintf(stderr, "zbatch verify: --max-problems needs a value\n");
                return 2;
            }
            const char *val = argv[++i];
            errno = 0;
            unsigned long long n = strtoull(val, &end, 10);
            if (!*val || *end || errno || val[0] == '-' || n == 0 || n > 1000000) {
                fprintf(stderr, "zbatch verify: --max-problems: '%s' is not in 1..1000000\n", val);
                return 2;
            }
            report.max_problems = (size_t)n;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "zbatch verify: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "zbatch verify: more than one PATH\n\n");
            usage(stderr);
            return 2;
        } else {
            path = a;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }

    zb_store *store = NULL;
    zb_status st = zb_cli_store_open(path, &store);
    if (st != ZB_OK) {
        /* a path that is not a store is the first thing wrong with it */
        printf("%s: %s: %s\n", path, zb_strerror(st), zb_last_error());
        printf("0 arrays, 0 chunks checked, 1 problem\n");
        return 1;
    }
    st = zb_verify(store, "", &report);
    zb_store_close(store);
    if (st != ZB_OK) {
        fprintf(stderr, "zbatch verify: %s: %s\n", zb_strerror(st), zb_last_error());
        zb_verify_report_free(&report);
        return 1;
    }
    uint64_t listed_problems = 0;
    for (size_t i = 0; i < report.n_kept && !quiet; i++) {
        const zb_verify_problem *p = &report.problems[i];
        if (p->severity == ZB_VERIFY_NOTE) {
            if (notes) printf("note: %s: %s\n", p->key, p->message);
            continue;
        }
        listed_problems++;
        printf("%s: %s\n", p->key, p->message);
    }
    if (!quiet && listed_problems < report.n_problems)
        printf("... and %" PRIu64 " more %s (--max-problems)\n",
               report.n_problems - listed_problems,
               plural(report.n_problems - listed_problems, "problem", "problems"));
    printf("%" PRIu64 " %s, %" PRIu64 " %s checked, %" PRIu64 " %s", report.n_arrays,
           plural(report.n_arrays, "array", "arrays"), report.n_chunks,
           plural(report.n_chunks, "chunk", "chunks"), report.n_problems,
           plural(report.n_problems, "problem", "problems"));
    if (report.incomplete) printf(" (incomplete: a write was not committed)");
    if (report.n_notes)
        printf(" (%" PRIu64 " %s%s)", report.n_notes, plural(report.n_notes, "note", "notes"),
               notes ? "" : "; --notes lists them");
    printf("\n");
    int rc = report.n_problems ? 1 : 0;
    zb_verify_report_free(&report);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "zbatch verify: cannot write output\n");
        rc = 1;
    }
    return rc;
}
