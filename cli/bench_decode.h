/* bench_decode.h — read accounting and the decode-only limit for `zbatch bench` (DESIGN.md §6).
 *
 * A request (the sample ids of one loader window, or of one read_many) touches a set of read
 * units: chunks, or inner chunks of sharded arrays. The reader decodes each distinct unit of a
 * request once. This file takes that set from the reader's own plan (zb__dataset_plan_units:
 * every unit row the request touches, with every unit of its other axes), locates, fetches (one
 * zb_store_get_ranges call per store) and decodes it through the zarr unit API, which gives
 *   - the bytes the request decodes (the decoded size of every unit that exists) and delivers
 *     (the rows it copies into the batch), i.e. its read amplification; and
 *   - the decode-only limit: the same units' encoded bytes fetched into memory beforehand, then
 *     decoded in a tight loop with zb__array_decode_unit on a zb__pool of the same thread count,
 *     each unit into a buffer of its task that stays in cache; and
 *   - the decode + write limit: the same loop, each decoded unit then followed by a store of its
 *     share of the request's delivered bytes to its own place in a request-sized buffer, with
 *     the stores the reader uses for a batch (streamed past the cache from
 *     ZB_STREAM_MIN_BATCH_BYTES on, util/stream.h): the request writes as many bytes as the
 *     reader delivers. A loader must leave its output in memory; for a request larger than the
 *     cache that costs memory bandwidth, which the decode-only loop never spends.
 *
 * Arrays the reader does not serve by unit (whole-shard bytes->bytes codecs, shards split along
 * other axes: it reads row bands of them instead) are counted by unit as an estimate and left
 * out of the decode-only loop; zb__bench_units.skipped counts their units.
 *
 * Not thread-safe: one thread drives a unit set and a decoder. */
#ifndef ZB_CLI_BENCH_DECODE_H
#define ZB_CLI_BENCH_DECODE_H

#include <stdbool.h>
#include <stdint.h>

#include "zbatch.h"

typedef struct zb__bench_unit {
    const zb_array *arr;
    uint64_t g0;    /* unit index along axis 0 */
    uint64_t other; /* C-order number of the unit over the grid of axes 1.. (0 for 1-d) */
    uint64_t off;   /* encoded bytes: [off, off + len) of the unit's object */
    uint64_t len;
    bool missing; /* no object / empty shard entry: served as fill, not decoded */
    bool skip;    /* an array the reader reads by row bands (see above) */
    uint8_t *enc; /* after zb__bench_units_fetch: the encoded bytes (malloc'd) */
} zb__bench_unit;

/* The distinct units of one request. Zero-initialise ({0}) before first use. */
typedef struct zb__bench_units {
    zb__bench_unit *u;
    size_t n, cap;
    uint64_t bytes_delivered; /* rows the request copies x row bytes, over every field */
    uint64_t bytes_decoded;   /* after resolve: decoded bytes of the units that exist */
    uint64_t bytes_encoded;   /* after resolve: their encoded bytes */
    size_t ndecoded;          /* after resolve: units that exist and go through the loop */
    size_t skipped;           /* units of arrays left out of the decode-only loop */
} zb__bench_units;

/* Adds the units `n` logical ids touch, in every field of `ds` (collections included), and the
 * bytes they deliver. Ids must be < zb_dataset_len. `ctx` serves the pointer reads. */
zb_status zb__bench_units_add(zb_dataset *ds, const uint64_t *ids, size_t n, zb_ctx *ctx,
                              zb__bench_units *s);

/* Sorts and deduplicates the units, then finds each one's encoded byte range (a size query
 * per chunk object, one index read per shard) and fills bytes_decoded / bytes_encoded. */
zb_status zb__bench_units_resolve(zb__bench_units *s, zb_ctx *ctx);

/* Reads the encoded bytes of every resolved unit that is decoded (not missing, not skipped). */
zb_status zb__bench_units_fetch(zb__bench_units *s);

/* Empties the set (frees fetched bytes, keeps the allocation for the next request). */
void zb__bench_units_clear(zb__bench_units *s);

/* Frees everything; the set can be reused after as if zero-initialised. */
void zb__bench_units_free(zb__bench_units *s);

/* A decode-only loop: a pool of `threads` workers and per-task output buffers sized for the
 * largest unit of `ds`, allocated once (and for decode + write, an arena grown to the largest
 * request, allocated and touched before the loop is timed). */
typedef struct zb__bench_decoder zb__bench_decoder;

zb_status zb__bench_decoder_new(zb_dataset *ds, int threads, zb__bench_decoder **out);

/* What one run of the loop measured. */
typedef struct zb__bench_decode_result {
    double seconds;         /* wall time of the loop alone (CLOCK_MONOTONIC) */
    uint64_t bytes_decoded; /* decoded bytes */
    uint64_t bytes_written; /* decode + write: bytes stored into the arena */
    bool streamed;          /* decode + write: with streamed stores */
} zb__bench_decode_result;

/* Decodes every fetched unit of `s` once, spread over the pool; with `write` (decode + write),
 * also stores each unit's share of the request's delivered bytes (bytes_delivered /
 * bytes_decoded of its decoded bytes, so that the request writes what the reader would) to its
 * own place in the arena. */
zb_status zb__bench_decoder_run(zb__bench_decoder *d, const zb__bench_units *s, bool write,
                                zb__bench_decode_result *res);

void zb__bench_decoder_free(zb__bench_decoder *d);

/* CLOCK_MONOTONIC in seconds. */
double zb__bench_now(void);

#endif
