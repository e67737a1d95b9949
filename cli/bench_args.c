/* Option values of `zbatch bench` (see bench_common.h). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

int
zb__bench_parse_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *s == '-' || *s == '+' || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "zbatch bench: %s: '%s' is not an integer in [%llu, %llu]\n", flag, s,
                (unsigned long long)lo, (unsigned long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int
zb__bench_parse_double(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "zbatch bench: %s: '%s' is not a number in [%g, %g]\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int
zb__bench_flag_value(int argc, char **argv, int *i, const char *const *known, char *flag,
                     size_t cap, const char **val)
{
    const char *a = argv[*i];
    const char *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
    if (eq)
        snprintf(flag, cap, "%.*s", (int)(eq - a), a);
    else
        snprintf(flag, cap, "%s", a);
    bool ok = false;
    for (size_t k = 0; known[k] && !ok; k++) ok = !strcmp(flag, known[k]);
    if (!ok) {
        fprintf(stderr, "zbatch bench: unknown option '%s' (see --help)\n", flag);
        return -1;
    }
    if (eq) {
        *val = eq + 1;
        return 0;
    }
    if (*i + 1 >= argc) {
        fprintf(stderr, "zbatch bench: %s needs a value\n", a);
        return -1;
    }
    *val = argv[++*i];
    return 0;
}
