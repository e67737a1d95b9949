/* bench_common.h — what the files of `zbatch bench` share: option values (bench_args.c), the
 * run's environment and its JSON record (bench_report.c), shuffle quality (bench_shuffle.c) and
 * the write mode (bench_write.c). The read mode and the dispatch live in bench.c. */
#ifndef ZB_CLI_BENCH_COMMON_H
#define ZB_CLI_BENCH_COMMON_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

/* ---- option values (bench_args.c) -----------------------------------------------------------
 * Each prints "zbatch bench: FLAG: ..." to stderr and returns -1 on a bad value, else 0. */
int zb__bench_parse_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
int zb__bench_parse_double(const char *flag, const char *s, double lo, double hi, double *out);

/* Splits argv[*i] into a flag and its value: "--flag=value", or "--flag" with the next word
 * (advancing *i). `known` lists the flags that take a value (NULL-terminated). Returns -1 (with
 * a message) for a flag not in `known` or a missing value. */
int zb__bench_flag_value(int argc, char **argv, int *i, const char *const *known, char *flag,
                         size_t cap, const char **val);

/* ---- the record (bench_report.c) ------------------------------------------------------------ */

/* Adds `key` to `obj` with a value (json-c takes ownership of it); doubles that are not finite
 * and NULL strings become null. */
void zb__bench_put(json_object *obj, const char *key, json_object *val);
void zb__bench_put_u64(json_object *obj, const char *key, uint64_t v);
void zb__bench_put_double(json_object *obj, const char *key, double v);
void zb__bench_put_str(json_object *obj, const char *key, const char *s);

/* A new record with what every run reports: schema, mode, UTC time, zbatch version, git
 * commit of the current directory, library versions and the machine. `stamp` receives the
 * compact UTC time used in file names (YYYYMMDDTHHMMSSZ). */
json_object *zb__bench_record_new(const char *mode, char *stamp, size_t cap);

/* Writes `rec` as DIR/bench-<stamp>-<suffix>.json (DIR created when missing; "-2", "-3", ...
 * appended when the name is taken). *path receives the file's path. 0 ok, -1 with a message. */
int zb__bench_record_write(json_object *rec, const char *dir, const char *stamp, const char *suffix,
                           char *path, size_t cap);

/* mkdir -p. 0 ok, -1 with errno set. */
int zb__bench_make_dirs(const char *path);

/* Human-readable sizes for the table ("12.3 MiB"). */
void zb__bench_human_bytes(double n, char *buf, size_t cap);

/* ---- shuffle quality (bench_shuffle.c) --------------------------------------------------- */

/* The codes of a per-sample integer column for every logical sample, as dense values
 * 0..ncodes-1 (the column's minimum maps to 0; negative codes, "missing", get their own value).
 * Read once, outside any timed loop. */
typedef struct zb__bench_codes {
    uint32_t *code; /* [n] */
    uint64_t n;
    uint32_t ncodes;
} zb__bench_codes;

/* Reads field `field` (a per-sample scalar integer field) of `ds`. ZB_E_TYPE when it is not. */
zb_status zb__bench_codes_read(zb_dataset *ds, const char *field, zb__bench_codes *out);
void zb__bench_codes_free(zb__bench_codes *c);

/* Shuffle figures over a sequence of batches (ids[off[b] .. off[b+1]) for b < nbatches):
 * the mean Shannon entropy (bits) of each batch's codes (codes may be NULL: no entropy) and the
 * index-gap score, the mean |id[i+1] - id[i]| within a batch divided by n/3 (the mean gap of a
 * random permutation of n). The reference figures come from batches of the same sizes whose
 * ids are drawn uniformly from [0, n) with splitmix64 keyed by `seed` (at most `max_ref`
 * batches, cycling through the sizes). */
typedef struct zb__bench_shuffle {
    double entropy, random_entropy;     /* bits; NAN without codes */
    double gap_score, random_gap_score; /* NAN when no batch has two samples */
    uint64_t batches, random_batches;
} zb__bench_shuffle;

zb_status zb__bench_shuffle_measure(const uint64_t *ids, const size_t *off, size_t nbatches,
                                    uint64_t n, const zb__bench_codes *codes, uint64_t seed,
                                    size_t max_ref, zb__bench_shuffle *out);

/* ---- write mode (bench_write.c) ----------------------------------------------------------- */

/* `zbatch bench --write ...`: argv as given to zb__cli_bench. Returns the exit code. */
int zb__bench_write_main(int argc, char **argv);

#endif
