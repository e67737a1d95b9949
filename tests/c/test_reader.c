/* The coalesced reader on a generic-layout dataset (docs/FORMATS-zbatch.md): a ragged field and a
 * per-sample field over one segment, optionally an index field over a second segment. Batches
 * are checked against a hand concatenation of the source rows; plain and sharded arrays, one and
 * four decode threads, and a cached repeat must give the same bytes; the decode counters must
 * equal the number of distinct chunks the request touches, counted here from the chunk sizes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "support/testutil.h"
#include "util/status.h"
#include "write/write.h"

#define N 12
#define VW 3 /* vals row width */

/* atoms per sample: empty samples at 1 and 7, a sample larger than a chunk at 4 */
static const int64_t COUNTS[N] = {3, 0, 5, 2, 7, 1, 4, 0, 6, 2, 3, 5};

enum { VALS_CHUNK = 4, LAB_CHUNK = 5, NBR_CHUNK = 3 };

typedef struct source {
    int64_t ptr[N + 1];
    int64_t eptr[N + 1];
    int32_t *vals; /* [total, VW] */
    int64_t lab[N];
    int64_t *nbr; /* [etotal, 2], store-global */
    int64_t total, etotal;
} source;

static void
source_make(source *s)
{
    s->ptr[0] = 0;
    s->eptr[0] = 0;
    for (int i = 0; i < N; i++) {
        s->ptr[i + 1] = s->ptr[i] + COUNTS[i];
        s->eptr[i + 1] = s->eptr[i] + COUNTS[i]; /* one edge per atom */
        s->lab[i] = 1000 + 7 * i;
    }
    s->total = s->ptr[N];
    s->etotal = s->eptr[N];
    s->vals = malloc((size_t)s->total * VW * sizeof *s->vals);
    s->nbr = malloc((size_t)s->etotal * 2 * sizeof *s->nbr);
    assert_non_null(s->vals);
    assert_non_null(s->nbr);
    for (int64_t r = 0; r < s->total; r++)
        for (int c = 0; c < VW; c++) s->vals[r * VW + c] = (int32_t)(r * 10 + c);
    /* edge k of sample i joins atom k to atom k+1 (mod count), stored store-global */
    for (int i = 0; i < N; i++)
        for (int64_t k = 0; k < COUNTS[i]; k++) {
            int64_t e = s->eptr[i] + k;
            s->nbr[2 * e] = s->ptr[i] + k;
            s->nbr[2 * e + 1] = s->ptr[i] + (k + 1) % COUNTS[i];
        }
}

static void
source_free(source *s)
{
    free(s->vals);
    free(s->nbr);
}

static void
put_array(zb_store *st, const char *path, zb_dtype dt, int ndim, const uint64_t *row_shape,
          const void *rows, uint64_t nrows, uint64_t chunk, uint64_t shard)
{
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.chunk_rows = chunk;
    o.shard_rows = shard;
    o.codec = "zstd:1";
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(st, path, dt, ndim, row_shape, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, rows, nrows));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
}

typedef struct build_opts {
    bool sharded;
    bool with_index;             /* add segment "eseg" and the index field "nbr" */
    const int64_t *ptr_override; /* [N+1] written as "ptr" instead of the true pointers */
    bool nbr_int32;              /* "nbr" stored as int32 instead of int64 */
    bool nbr_local;              /* "nbr" stored sample-local ("global": false) */
    const int64_t *nbr_override; /* [etotal, 2] written as "nbr" (in its convention) */
} build_opts;

static const char *ATTRS_BASIC =
    "{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}, \"fields\": {"
    "\"vals\": {\"array\": \"vals\", \"kind\": \"ragged\", \"segment\": \"seg\"}, "
    "\"lab\": {\"array\": \"lab\", \"kind\": \"per_sample\"}}}}";

static const char *ATTRS_INDEX =
    "{\"zbatch\": {\"segments\": {\"seg\": \"ptr\", \"eseg\": \"eptr\"}, \"fields\": {"
    "\"vals\": {\"array\": \"vals\", \"kind\": \"ragged\", \"segment\": \"seg\"}, "
    "\"lab\": {\"array\": \"lab\", \"kind\": \"per_sample\"}, "
    "\"nbr\": {\"array\": \"nbr\", \"kind\": \"index\", \"segment\": \"eseg\", "
    "\"target\": \"seg\", \"global\": true}}}}";

static const char *ATTRS_INDEX_LOCAL =
    "{\"zbatch\": {\"segments\": {\"seg\": \"ptr\", \"eseg\": \"eptr\"}, \"fields\": {"
    "\"vals\": {\"array\": \"vals\", \"kind\": \"ragged\", \"segment\": \"seg\"}, "
    "\"lab\": {\"array\": \"lab\", \"kind\": \"per_sample\"}, "
    "\"nbr\": {\"array\": \"nbr\", \"kind\": \"index\", \"segment\": \"eseg\", "
    "\"target\": \"seg\", \"global\": false}}}}";

static zb_store *
build(const source *s, const build_opts *bo)
{
    zb_store *st = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&st));
    ZB_ASSERT_OK(zb__write_group(st, "", 3,
                                 !bo->with_index ? ATTRS_BASIC
                                 : bo->nbr_local ? ATTRS_INDEX_LOCAL
                                                 : ATTRS_INDEX));
    const uint64_t vw[1] = {VW}, two[1] = {2};
    put_array(st, "ptr", ZB_DT_INT64, 1, NULL, bo->ptr_override ? bo->ptr_override : s->ptr, N + 1,
              4, bo->sharded ? 8 : 0);
    put_array(st, "vals", ZB_DT_INT32, 2, vw, s->vals, (uint64_t)s->total, VALS_CHUNK,
              bo->sharded ? 2 * VALS_CHUNK : 0);
    put_array(st, "lab", ZB_DT_INT64, 1, NULL, s->lab, N, LAB_CHUNK,
              bo->sharded ? 2 * LAB_CHUNK : 0);
    if (bo->with_index) {
        put_array(st, "eptr", ZB_DT_INT64, 1, NULL, s->eptr, N + 1, 5, 0);
        /* the source's store-global values, or the override, in the asked convention and type */
        size_t ne = (size_t)s->etotal * 2;
        int64_t *v64 = malloc(ne * sizeof *v64);
        int32_t *v32 = malloc(ne * sizeof *v32);
        assert_non_null(v64);
        assert_non_null(v32);
        for (int i = 0; i < N; i++)
            for (int64_t e = 2 * s->eptr[i]; e < 2 * s->eptr[i + 1]; e++) {
                v64[e] = bo->nbr_override ? bo->nbr_override[e]
                         : bo->nbr_local  ? s->nbr[e] - s->ptr[i]
                                          : s->nbr[e];
                v32[e] = (int32_t)v64[e];
            }
        put_array(st, "nbr", bo->nbr_int32 ? ZB_DT_INT32 : ZB_DT_INT64, 2, two,
                  bo->nbr_int32 ? (const void *)v32 : (const void *)v64, (uint64_t)s->etotal,
                  NBR_CHUNK, bo->sharded ? 3 * NBR_CHUNK : 0);
        free(v64);
        free(v32);
    }
    return st;
}

static zb_dataset *
open_ds(zb_store *st, size_t cache_bytes, int threads)
{
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.cache_bytes = cache_bytes;
    o.num_threads = threads;
    zb_dataset *ds = NULL;
    ZB_ASSERT_OK(zb_dataset_open(st, "", &o, &ds));
    return ds;
}

/* Distinct chunks touched by ids: vals (rows of the samples), lab (the samples), nbr (edges). */
static uint64_t
count_units(const source *s, const uint64_t *ids, size_t n, bool with_index)
{
    bool vals_hit[64] = {false}, lab_hit[64] = {false}, nbr_hit[64] = {false};
    uint64_t units = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t id = ids[i];
        for (int64_t r = s->ptr[id]; r < s->ptr[id + 1]; r++)
            if (!vals_hit[r / VALS_CHUNK]) vals_hit[r / VALS_CHUNK] = true, units++;
        if (!lab_hit[id / LAB_CHUNK]) lab_hit[id / LAB_CHUNK] = true, units++;
        for (int64_t e = s->eptr[id]; with_index && e < s->eptr[id + 1]; e++)
            if (!nbr_hit[e / NBR_CHUNK]) nbr_hit[e / NBR_CHUNK] = true, units++;
    }
    return units;
}

/* Checks batch b against the hand concatenation of samples ids. */
static void
check_batch(const source *s, const zb_batch *b, const uint64_t *ids, size_t n, bool with_index)
{
    assert_int_equal(zb_batch_size(b), n);
    const uint64_t *index = zb_batch_index(b);
    for (size_t i = 0; i < n; i++) assert_int_equal(index[i], ids[i]);
    assert_null(zb_batch_dataset(b));

    int64_t want_ptr[64];
    want_ptr[0] = 0;
    for (size_t i = 0; i < n; i++) want_ptr[i + 1] = want_ptr[i] + COUNTS[ids[i]];
    const int64_t *ptr = zb_batch_segment(b, "seg");
    assert_non_null(ptr);
    assert_memory_equal(ptr, want_ptr, (n + 1) * sizeof *ptr);

    zb_batch_view v;
    ZB_ASSERT_OK(zb_batch_find(b, "vals", &v));
    assert_int_equal(v.kind, ZB_FIELD_RAGGED);
    assert_int_equal(v.dtype, ZB_DT_INT32);
    assert_int_equal(v.nrows, (uint64_t)want_ptr[n]);
    assert_int_equal(v.ndim, 1);
    assert_int_equal(v.row_shape[0], VW);
    assert_ptr_equal(v.ptr, ptr);
    const int32_t *vals = v.data;
    for (size_t i = 0; i < n; i++)
        for (int64_t k = 0; k < COUNTS[ids[i]]; k++)
            for (int c = 0; c < VW; c++)
                assert_int_equal(vals[(want_ptr[i] + k) * VW + c],
                                 s->vals[(s->ptr[ids[i]] + k) * VW + c]);

    ZB_ASSERT_OK(zb_batch_find(b, "lab", &v));
    assert_int_equal(v.kind, ZB_FIELD_PER_SAMPLE);
    assert_int_equal(v.dtype, ZB_DT_INT64);
    assert_int_equal(v.nrows, n);
    assert_int_equal(v.ndim, 0);
    assert_null(v.ptr);
    for (size_t i = 0; i < n; i++) assert_int_equal(((const int64_t *)v.data)[i], s->lab[ids[i]]);

    if (!with_index) {
        assert_int_equal(zb_batch_nfields(b), 2);
        return;
    }
    /* nbr: local atom k -> (k+1) % count, re-based by the sample's atom offset in the batch */
    const int64_t *eptr = zb_batch_segment(b, "eseg");
    assert_non_null(eptr);
    ZB_ASSERT_OK(zb_batch_find(b, "nbr", &v));
    assert_int_equal(v.kind, ZB_FIELD_INDEX);
    assert_ptr_equal(v.ptr, eptr);
    const int64_t *nbr = v.data;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(eptr[i + 1] - eptr[i], COUNTS[ids[i]]);
        for (int64_t k = 0; k < COUNTS[ids[i]]; k++) {
            int64_t e = eptr[i] + k;
            assert_int_equal(nbr[2 * e], want_ptr[i] + k);
            assert_int_equal(nbr[2 * e + 1], want_ptr[i] + (k + 1) % COUNTS[ids[i]]);
        }
    }
}

/* Every byte of two batches' fields and segments. */
static void
assert_batches_equal(const zb_batch *a, const zb_batch *b)
{
    assert_int_equal(zb_batch_size(a), zb_batch_size(b));
    assert_int_equal(zb_batch_nfields(a), zb_batch_nfields(b));
    for (size_t i = 0; i < zb_batch_nfields(a); i++) {
        zb_batch_view va, vb;
        ZB_ASSERT_OK(zb_batch_field(a, i, &va));
        ZB_ASSERT_OK(zb_batch_field(b, i, &vb));
        assert_string_equal(va.name, vb.name);
        assert_int_equal(va.dtype, vb.dtype);
        assert_int_equal(va.nrows, vb.nrows);
        uint64_t elems = va.nrows;
        for (int d = 0; d < va.ndim; d++) elems *= va.row_shape[d];
        assert_memory_equal(va.data, vb.data, (size_t)elems * zb_dtype_size(va.dtype));
    }
    assert_int_equal(zb_batch_nsegments(a), zb_batch_nsegments(b));
    for (size_t i = 0; i < zb_batch_nsegments(a); i++) {
        const int64_t *pa = NULL, *pb = NULL;
        assert_string_equal(zb_batch_segment_at(a, i, &pa), zb_batch_segment_at(b, i, &pb));
        assert_memory_equal(pa, pb, (zb_batch_size(a) + 1) * sizeof *pa);
    }
}

/* ---- tests ---------------------------------------------------------------------------------- */

static const uint64_t IDS[] = {7, 2, 2, 0, 11, 4, 9, 1, 4, 5};
#define NIDS (sizeof IDS / sizeof IDS[0])

static void
test_open_and_fields(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    build_opts bo = {.with_index = true};
    zb_store *st = build(&s, &bo);
    zb_dataset *ds = open_ds(st, 0, 1);
    assert_string_equal(zb_dataset_layout(ds), "generic");
    uint64_t n = 0;
    ZB_ASSERT_OK(zb_dataset_len(ds, &n));
    assert_int_equal(n, N);
    assert_int_equal(zb_dataset_nfields(ds), 3);
    assert_int_equal(zb_dataset_nchildren(ds), 1);
    size_t i;
    zb_field_info fi;
    ZB_ASSERT_OK(zb_dataset_find_field(ds, "vals", &i));
    ZB_ASSERT_OK(zb_dataset_field(ds, i, &fi));
    assert_int_equal(fi.kind, ZB_FIELD_RAGGED);
    assert_int_equal(fi.dtype, ZB_DT_INT32);
    assert_int_equal(fi.ndim, 1);
    assert_int_equal(fi.row_shape[0], VW);
    assert_string_equal(fi.segment, "seg");
    assert_null(fi.target);
    ZB_ASSERT_OK(zb_dataset_find_field(ds, "lab", &i));
    ZB_ASSERT_OK(zb_dataset_field(ds, i, &fi));
    assert_int_equal(fi.kind, ZB_FIELD_PER_SAMPLE);
    assert_int_equal(fi.ndim, 0);
    assert_null(fi.segment);
    ZB_ASSERT_OK(zb_dataset_find_field(ds, "nbr", &i));
    ZB_ASSERT_OK(zb_dataset_field(ds, i, &fi));
    assert_int_equal(fi.kind, ZB_FIELD_INDEX);
    assert_string_equal(fi.segment, "eseg");
    assert_string_equal(fi.target, "seg");
    ZB_ASSERT_ERR(zb_dataset_find_field(ds, "nope", &i), ZB_E_NOTFOUND, "nope");
    zb_dataset_close(ds);
    zb_store_close(st);
    source_free(&s);
}

/* The index field "nbr" of a batch of samples ids: edge k of each sample joins its local atom k
 * to (k+1) % count, plus the sample's first atom row in the batch. */
static void
check_nbr(const zb_batch *b, const uint64_t *ids, size_t n, bool i32)
{
    zb_batch_view v;
    ZB_ASSERT_OK(zb_batch_find(b, "nbr", &v));
    assert_int_equal(v.dtype, i32 ? ZB_DT_INT32 : ZB_DT_INT64);
    const int64_t *eptr = zb_batch_segment(b, "eseg");
    int64_t row0 = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t c = COUNTS[ids[i]];
        assert_int_equal(eptr[i + 1] - eptr[i], c);
        for (int64_t k = 0; k < c; k++)
            for (int j = 0; j < 2; j++) {
                size_t at = (size_t)(2 * (eptr[i] + k) + j);
                int64_t got = i32 ? ((const int32_t *)v.data)[at] : ((const int64_t *)v.data)[at];
                assert_int_equal(got, row0 + (k + j) % c);
            }
        row0 += c;
    }
}

/* Index values in all four conventions (int64 / int32, store-global / sample-local) come out as
 * batch rows, and a value outside its sample (one atom past its end, one before its start) is
 * an error naming the field, the sample and the value, only when that sample is read. */
static void
test_index_conventions_and_bad_values(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    const uint64_t ids[] = {11, 4, 0, 4, 9, 2};
    const size_t n = sizeof ids / sizeof *ids;
    int64_t *bad = malloc((size_t)s.etotal * 2 * sizeof *bad);
    assert_non_null(bad);
    for (int conv = 0; conv < 4; conv++) {
        bool i32 = conv & 1, local = conv & 2;
        build_opts bo = {.with_index = true, .nbr_int32 = i32, .nbr_local = local};
        zb_store *st = build(&s, &bo);
        zb_dataset *ds = open_ds(st, 0, 2);
        zb_batch *b = NULL;
        ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, n, &b));
        check_nbr(b, ids, n, i32);
        zb_batch_free(b);
        zb_dataset_close(ds);
        zb_store_close(st);

        /* sample 4 (7 atoms, rows 10..16 of the store): its second edge's target one past its
         * last atom, then its fourth edge's source one before its first */
        for (int which = 0; which < 2; which++) {
            for (int i = 0; i < N; i++)
                for (int64_t e = 2 * s.eptr[i]; e < 2 * s.eptr[i + 1]; e++)
                    bad[e] = local ? s.nbr[e] - s.ptr[i] : s.nbr[e];
            int64_t at = which ? 2 * (s.eptr[4] + 3) : 2 * (s.eptr[4] + 1) + 1;
            int64_t wrong = which ? (local ? -1 : s.ptr[4] - 1) : (local ? 7 : s.ptr[5]);
            bad[at] = wrong;
            build_opts bb = {
                .with_index = true, .nbr_int32 = i32, .nbr_local = local, .nbr_override = bad};
            st = build(&s, &bb);
            ds = open_ds(st, 0, 2);
            char want[128];
            snprintf(want, sizeof want,
                     "sample 4 (row 1 of the request): field nbr: value %d is outside its 7 atoms",
                     which ? -1 : 7);
            ZB_ASSERT_ERR(zb_dataset_read_many(ds, ids, n, &b), ZB_E_CORRUPT, want);
            assert_null(b);
            const uint64_t fine[] = {3, 5, 2}; /* the others read as before */
            ZB_ASSERT_OK(zb_dataset_read_many(ds, fine, 3, &b));
            check_nbr(b, fine, 3, i32);
            zb_batch_free(b);
            zb_dataset_close(ds);
            zb_store_close(st);
        }
    }
    free(bad);
    source_free(&s);
}

/* Duplicates, unsorted ids and empty samples equal the hand concatenation; each touched chunk is
 * decoded exactly once. */
static void
test_read_many_matches_hand(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    for (int with_index = 0; with_index < 2; with_index++) {
        build_opts bo = {.with_index = with_index};
        zb_store *st = build(&s, &bo);
        zb_dataset *ds = open_ds(st, 0, 1);
        zb_batch *b = NULL;
        ZB_ASSERT_OK(zb_dataset_read_many(ds, IDS, NIDS, &b));
        check_batch(&s, b, IDS, NIDS, with_index);
        zb_read_stats rs;
        zb_batch_stats(b, &rs);
        assert_int_equal(rs.chunks_decoded, count_units(&s, IDS, NIDS, with_index));
        assert_int_equal(rs.chunks_cached, 0);
        assert_int_equal(rs.chunks_filled, 0);
        assert_true(rs.bytes_fetched > 0);
        assert_true(rs.range_reads >= rs.chunks_decoded);
        zb_batch_free(b);

        /* one id, every id in order, and an empty request */
        uint64_t one[1] = {4}, all[N];
        for (uint64_t k = 0; k < N; k++) all[k] = k;
        ZB_ASSERT_OK(zb_dataset_read_many(ds, one, 1, &b));
        check_batch(&s, b, one, 1, with_index);
        zb_batch_free(b);
        ZB_ASSERT_OK(zb_dataset_read_many(ds, all, N, &b));
        check_batch(&s, b, all, N, with_index);
        zb_batch_stats(b, &rs);
        assert_int_equal(rs.chunks_decoded, count_units(&s, all, N, with_index));
        zb_batch_free(b);
        ZB_ASSERT_OK(zb_dataset_read_many(ds, NULL, 0, &b));
        assert_int_equal(zb_batch_size(b), 0);
        assert_int_equal(zb_batch_segment(b, "seg")[0], 0);
        zb_batch_stats(b, &rs);
        assert_int_equal(rs.chunks_decoded, 0);
        zb_batch_free(b);

        zb_dataset_close(ds);
        zb_store_close(st);
    }
    source_free(&s);
}

static void
test_plain_and_sharded_identical(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    build_opts plain = {.with_index = true}, sharded = {.with_index = true, .sharded = true};
    zb_store *sp = build(&s, &plain), *ss = build(&s, &sharded);
    zb_dataset *dp = open_ds(sp, 0, 1), *dsh = open_ds(ss, 0, 1);
    zb_batch *bp = NULL, *bs = NULL;
    ZB_ASSERT_OK(zb_dataset_read_many(dp, IDS, NIDS, &bp));
    ZB_ASSERT_OK(zb_dataset_read_many(dsh, IDS, NIDS, &bs));
    check_batch(&s, bs, IDS, NIDS, true);
    assert_batches_equal(bp, bs);
    /* inner chunks are the units of a sharded array: the same count as the plain chunks */
    zb_read_stats a, b;
    zb_batch_stats(bp, &a);
    zb_batch_stats(bs, &b);
    assert_int_equal(b.chunks_decoded, count_units(&s, IDS, NIDS, true));
    assert_int_equal(a.chunks_decoded, b.chunks_decoded);
    assert_int_equal(a.bytes_delivered, b.bytes_delivered);
    zb_batch_free(bp);
    zb_batch_free(bs);
    zb_dataset_close(dp);
    zb_dataset_close(dsh);
    zb_store_close(sp);
    zb_store_close(ss);
    source_free(&s);
}

/* A pointer array that goes backwards is corruption, named by the array's path. */
static void
test_corrupt_pointers(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    int64_t bad[N + 1];
    memcpy(bad, s.ptr, sizeof bad);
    bad[3] = bad[2] - 1; /* sample 2 ends before it starts; the total stays right */
    build_opts bo = {.ptr_override = bad};
    zb_store *st = build(&s, &bo);
    zb_dataset *ds = open_ds(st, 0, 1);
    zb_batch *b = (zb_batch *)&bo; /* must come back NULL */
    uint64_t id2[1] = {2};
    ZB_ASSERT_ERR(zb_dataset_read_many(ds, id2, 1, &b), ZB_E_CORRUPT, "ptr");
    assert_null(b);
    /* samples whose own pointers are fine still read */
    uint64_t ok[2] = {0, 5};
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ok, 2, &b));
    check_batch(&s, b, ok, 2, false);
    zb_batch_free(b);
    zb_dataset_close(ds);
    zb_store_close(st);

    /* a pointer past the end of the values (monotone up to there) is corruption too, not a read
     * beyond the array */
    memcpy(bad, s.ptr, sizeof bad);
    bad[2] = s.total + 4;
    bo.ptr_override = bad;
    st = build(&s, &bo);
    ds = open_ds(st, 0, 1);
    uint64_t id1[1] = {1};
    ZB_ASSERT_ERR(zb_dataset_read_many(ds, id1, 1, &b), ZB_E_CORRUPT, "ptr");
    assert_null(b);
    zb_dataset_close(ds);
    zb_store_close(st);

    /* two samples each claiming 3 * 2^61 values: each is past the values, and their lengths
     * summed for the batch's pointers pass int64 (the fuzz target `pointers` found the signed
     * overflow, UBSan; crash-caa420eba92db48d02a38d459b3ed30722d66587): an error, no overflow */
    memcpy(bad, s.ptr, sizeof bad);
    bad[0] = 0;
    bad[1] = INT64_C(3) << 61;
    bad[2] = 0;
    bad[3] = INT64_C(3) << 61;
    for (int i = 4; i <= N; i++) bad[i] = s.total; /* the samples after are not read */
    bo.ptr_override = bad;
    st = build(&s, &bo);
    ds = open_ds(st, 0, 1);
    uint64_t far[2] = {0, 2};
    ZB_ASSERT_ERR(zb_dataset_read_many(ds, far, 2, &b), ZB_E_CORRUPT, "past 2^63 elements");
    assert_null(b);
    zb_dataset_close(ds);
    zb_store_close(st);

    /* a pointer of INT64_MIN before a positive one: the segment lengths (the samplers' sizes)
     * are an error naming the row, with no signed overflow computing a length past it (the
     * damage campaign found `a1 - a0` evaluated after the error: UBSan) */
    memcpy(bad, s.ptr, sizeof bad);
    bad[4] = INT64_MIN;
    bo.ptr_override = bad;
    st = build(&s, &bo);
    ds = open_ds(st, 0, 1);
    uint64_t lens[N];
    ZB_ASSERT_ERR(zb_dataset_segment_lengths(ds, "seg", lens), ZB_E_CORRUPT, "row 3");
    zb_dataset_close(ds);
    zb_store_close(st);

    /* a pointer array whose end disagrees with the values is refused on open */
    memcpy(bad, s.ptr, sizeof bad);
    bad[N] = s.total - 1;
    st = build(&s, &bo);
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *none = (zb_dataset *)&o;
    ZB_ASSERT_ERR(zb_dataset_open(st, "", &o, &none), ZB_E_CORRUPT, "vals");
    assert_null(none);
    zb_store_close(st);
    source_free(&s);
}

static void
test_ids_out_of_range(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    build_opts bo = {0};
    zb_store *st = build(&s, &bo);
    zb_dataset *ds = open_ds(st, 0, 1);
    zb_batch *b = NULL;
    uint64_t ids[3] = {0, N, 1};
    ZB_ASSERT_ERR(zb_dataset_read_many(ds, ids, 3, &b), ZB_E_RANGE, "12");
    assert_null(b);
    uint64_t huge[1] = {UINT64_MAX};
    ZB_ASSERT_ERR(zb_dataset_read_many(ds, huge, 1, &b), ZB_E_RANGE, "18446744073709551615");
    assert_null(b);
    ZB_ASSERT_ERR(zb_dataset_read_many(ds, NULL, 2, &b), ZB_E_INVALID, NULL);
    zb_dataset_close(ds);
    zb_store_close(st);
    source_free(&s);
}

/* A repeated request is served from the decoded-chunk cache: nothing decoded, nothing fetched. */
static void
test_cache_serves_repeat(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    for (int sharded = 0; sharded < 2; sharded++) {
        build_opts bo = {.with_index = true, .sharded = sharded};
        zb_store *st = build(&s, &bo);
        zb_dataset *ds = open_ds(st, 1 << 20, 1);
        uint64_t units = count_units(&s, IDS, NIDS, true);
        zb_batch *b1 = NULL, *b2 = NULL;
        ZB_ASSERT_OK(zb_dataset_read_many(ds, IDS, NIDS, &b1));
        zb_read_stats r1, r2;
        zb_batch_stats(b1, &r1);
        assert_int_equal(r1.chunks_decoded, units);
        assert_int_equal(r1.chunks_cached, 0);
        ZB_ASSERT_OK(zb_dataset_read_many(ds, IDS, NIDS, &b2));
        zb_batch_stats(b2, &r2);
        assert_int_equal(r2.chunks_decoded, 0);
        assert_int_equal(r2.chunks_cached, units);
        assert_int_equal(r2.bytes_fetched, 0);
        assert_int_equal(r2.range_reads, 0);
        assert_int_equal(r2.bytes_delivered, r1.bytes_delivered);
        check_batch(&s, b2, IDS, NIDS, true);
        assert_batches_equal(b1, b2);
        zb_batch_free(b1);
        zb_batch_free(b2);
        zb_dataset_close(ds);
        zb_store_close(st);
    }
    source_free(&s);
}

/* A cache too small to hold the request's units still gives correct batches. */
static void
test_tiny_cache(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    build_opts bo = {.with_index = true, .sharded = true};
    zb_store *st = build(&s, &bo);
    zb_dataset *ds = open_ds(st, 100, 1); /* about two vals chunks */
    for (int k = 0; k < 3; k++) {
        zb_batch *b = NULL;
        ZB_ASSERT_OK(zb_dataset_read_many(ds, IDS, NIDS, &b));
        check_batch(&s, b, IDS, NIDS, true);
        zb_read_stats rs;
        zb_batch_stats(b, &rs);
        assert_int_equal(rs.chunks_decoded + rs.chunks_cached, count_units(&s, IDS, NIDS, true));
        zb_batch_free(b);
    }
    zb_dataset_close(ds);
    zb_store_close(st);
    source_free(&s);
}

static void
test_four_threads_same_bytes(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    for (int sharded = 0; sharded < 2; sharded++) {
        build_opts bo = {.with_index = true, .sharded = sharded};
        zb_store *st = build(&s, &bo);
        /* d4 sends even this small request to its four threads (inline_work_bytes 0); d4i
         * reads it on the calling thread, as the default does for little work */
        zb_dataset *d1 = open_ds(st, 0, 1), *d4 = NULL, *d4i = open_ds(st, 0, 4);
        zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
        o.num_threads = 4;
        o.inline_work_bytes = 0;
        ZB_ASSERT_OK(zb_dataset_open(st, "", &o, &d4));
        uint64_t ids[40];
        for (size_t i = 0; i < 40; i++) ids[i] = (i * 7 + 3) % N;
        for (int rep = 0; rep < 5; rep++) {
            zb_batch *b1 = NULL, *b4 = NULL, *b4i = NULL;
            ZB_ASSERT_OK(zb_dataset_read_many(d1, ids, 40, &b1));
            ZB_ASSERT_OK(zb_dataset_read_many(d4, ids, 40, &b4));
            ZB_ASSERT_OK(zb_dataset_read_many(d4i, ids, 40, &b4i));
            check_batch(&s, b4, ids, 40, true);
            assert_batches_equal(b1, b4);
            assert_batches_equal(b1, b4i);
            zb_read_stats r1, r4;
            zb_batch_stats(b1, &r1);
            zb_batch_stats(b4, &r4);
            assert_int_equal(r1.chunks_decoded, r4.chunks_decoded);
            assert_int_equal(r1.bytes_delivered, r4.bytes_delivered);
            zb_batch_free(b1);
            zb_batch_free(b4);
            zb_batch_free(b4i);
        }
        zb_dataset_close(d1);
        zb_dataset_close(d4);
        zb_dataset_close(d4i);
        zb_store_close(st);
    }
    source_free(&s);
}

/* Pointer arrays are cached in blocks of at least 65,536 entries: samples whose two pointers lie
 * in different blocks, and samples in later blocks, read right. */
static void
test_pointer_blocks(void **state)
{
    (void)state;
    enum { NB = 140000 };
    int64_t *ptr = malloc((NB + 1) * sizeof *ptr);
    int32_t *lab = malloc(NB * sizeof *lab);
    assert_non_null(ptr);
    assert_non_null(lab);
    ptr[0] = 0;
    for (int64_t i = 0; i < NB; i++) {
        ptr[i + 1] = ptr[i] + i % 3;
        lab[i] = (int32_t)(3 * i);
    }
    int64_t total = ptr[NB];
    int32_t *vals = malloc((size_t)total * sizeof *vals);
    assert_non_null(vals);
    for (int64_t r = 0; r < total; r++) vals[r] = (int32_t)(r ^ 0x5a5a);
    zb_store *st = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&st));
    ZB_ASSERT_OK(zb__write_group(st, "", 3,
                                 "{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}, \"fields\": {"
                                 "\"vals\": {\"array\": \"vals\", \"kind\": \"ragged\", "
                                 "\"segment\": \"seg\"}, \"lab\": {\"array\": \"lab\", "
                                 "\"kind\": \"per_sample\"}}}}"));
    put_array(st, "ptr", ZB_DT_INT64, 1, NULL, ptr, NB + 1, 1000, 0);
    put_array(st, "vals", ZB_DT_INT32, 1, NULL, vals, (uint64_t)total, 777, 0);
    put_array(st, "lab", ZB_DT_INT32, 1, NULL, lab, NB, 5000, 0);
    zb_dataset *ds = open_ds(st, 0, 2);
    uint64_t n = 0;
    ZB_ASSERT_OK(zb_dataset_len(ds, &n));
    assert_int_equal(n, NB);
    const uint64_t ids[] = {65535, 65536, 65534, 131071, 131072, 139999, 0, 70000, 65536, 2};
    const size_t nids = sizeof ids / sizeof ids[0];
    zb_batch *b = NULL;
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, nids, &b));
    const int64_t *bp = zb_batch_segment(b, "seg");
    zb_batch_view v, l;
    ZB_ASSERT_OK(zb_batch_find(b, "vals", &v));
    ZB_ASSERT_OK(zb_batch_find(b, "lab", &l));
    int64_t at = 0;
    for (size_t i = 0; i < nids; i++) {
        assert_int_equal(bp[i], at);
        assert_int_equal(bp[i + 1] - bp[i], (int64_t)(ids[i] % 3));
        for (int64_t k = 0; k < (int64_t)(ids[i] % 3); k++)
            assert_int_equal(((const int32_t *)v.data)[at + k], vals[ptr[ids[i]] + k]);
        at += (int64_t)(ids[i] % 3);
        assert_int_equal(((const int32_t *)l.data)[i], 3 * (int64_t)ids[i]);
    }
    assert_int_equal(v.nrows, (uint64_t)at);
    zb_batch_free(b);
    zb_dataset_close(ds);
    zb_store_close(st);
    free(ptr);
    free(lab);
    free(vals);
}

/* Declarations the generic layout must refuse. */
static void
test_generic_schema_errors(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    static const struct {
        const char *attrs;
        zb_status want;
        const char *needle;
    } cases[] = {
        {"{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}}}", ZB_E_METADATA, "fields"},
        {"{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}, \"fields\": {\"vals\": {\"array\": "
         "\"vals\", \"kind\": \"ragged\", \"segment\": \"other\"}}}}",
         ZB_E_METADATA, "vals"},
        {"{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}, \"fields\": {\"vals\": {\"array\": "
         "\"vals\", \"kind\": \"jagged\", \"segment\": \"seg\"}}}}",
         ZB_E_METADATA, "jagged"},
        {"{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}, \"fields\": {\"lab\": {\"kind\": "
         "\"per_sample\"}}}}",
         ZB_E_METADATA, "lab"},
        {"{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}, \"fields\": {\"x\": {\"array\": "
         "\"missing\", \"kind\": \"per_sample\"}}}}",
         ZB_E_NOTFOUND, "missing"},
        {"{\"zbatch\": {\"segments\": {\"a_segment_name_longer_than_31_bytes\": \"ptr\"}, "
         "\"fields\": {}}}",
         ZB_E_UNSUPPORTED, "a_segment_name_longer_than_31_bytes"},
        {"{\"zbatch\": {\"segments\": {\"seg\": \"empty\"}, \"fields\": {}}}", ZB_E_CORRUPT,
         "empty"},
        {"{\"zbatch\": {\"segments\": {\"seg\": \"vals\"}, \"fields\": {}}}", ZB_E_CORRUPT, "vals"},
        {"{\"something\": 1}", ZB_E_UNSUPPORTED, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        zb_store *st = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&st));
        ZB_ASSERT_OK(zb__write_group(st, "", 3, cases[k].attrs));
        put_array(st, "ptr", ZB_DT_INT64, 1, NULL, s.ptr, N + 1, 4, 0);
        const uint64_t vw[1] = {VW};
        put_array(st, "vals", ZB_DT_INT32, 2, vw, s.vals, (uint64_t)s.total, VALS_CHUNK, 0);
        put_array(st, "lab", ZB_DT_INT64, 1, NULL, s.lab, N, LAB_CHUNK, 0);
        put_array(st, "empty", ZB_DT_INT64, 1, NULL, s.lab, 0, LAB_CHUNK, 0);
        zb_dataset *ds = NULL;
        ZB_ASSERT_ERR(zb_dataset_open(st, "", NULL, &ds), cases[k].want, cases[k].needle);
        assert_null(ds);
        zb_store_close(st);
    }
    source_free(&s);
}

/* Reads element i of a buffer of dtype t as a double (every value of the types below is exact). */
static double
value_at(const uint8_t *p, zb_dtype t, size_t i)
{
    switch (t) {
    case ZB_DT_UINT8:
        return p[i];
    case ZB_DT_INT8: {
        int8_t v;
        memcpy(&v, p + i, 1);
        return v;
    }
    case ZB_DT_UINT16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case ZB_DT_INT16: {
        int16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case ZB_DT_UINT32: {
        uint32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case ZB_DT_INT32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case ZB_DT_INT64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return (double)v;
    }
    case ZB_DT_FLOAT32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case ZB_DT_FLOAT64: {
        double v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    default:
        fail_msg("dtype %d", (int)t);
    }
    return 0;
}

/* Every widening the reader offers (widen.c) keeps every value, the extremes of the stored type
 * included, from a source at any alignment and over lengths that end inside a vector; pairs
 * that would round or wrap are not offered. */
static void
test_widen_every_pair(void **state)
{
    (void)state;
    static const zb_dtype from[] = {ZB_DT_UINT8,  ZB_DT_INT8,  ZB_DT_UINT16, ZB_DT_INT16,
                                    ZB_DT_UINT32, ZB_DT_INT32, ZB_DT_FLOAT32};
    static const zb_dtype to[] = {ZB_DT_INT32, ZB_DT_INT64, ZB_DT_FLOAT32, ZB_DT_FLOAT64};
    enum { NW = 77 };
    uint8_t src[NW * 8 + 8], dst[NW * 8];
    int offered = 0;
    for (size_t a = 0; a < sizeof from / sizeof *from; a++) {
        size_t isz = zb_dtype_size(from[a]);
        for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 37 + 11);
        /* the stored type's extremes (all bits set, the sign bit alone) at the start */
        memset(src + 1, 0xff, isz);
        memset(src + 1 + isz, 0, isz);
        src[1 + 2 * isz - 1] = 0x80;
        if (from[a] == ZB_DT_FLOAT32) /* keep the float values finite: 1.5e38 and -0.5 */
            for (size_t i = 0; i < NW; i++) {
                float v = i % 2 ? 1.5e38f : -0.5f * (float)i;
                memcpy(src + 1 + 4 * i, &v, 4);
            }
        for (size_t b = 0; b < sizeof to / sizeof *to; b++) {
            bool exact = zb__widen_exact(from[a], to[b]);
            assert_int_equal(zb__values_widen(dst, to[b], src + 1, from[a], NW),
                             exact && from[a] != to[b]);
            if (!exact || from[a] == to[b]) continue;
            offered++;
            for (size_t i = 0; i < NW; i++)
                assert_true(value_at(dst, to[b], i) == value_at(src + 1, from[a], i));
        }
    }
    assert_int_equal(offered, 21);
    assert_false(zb__widen_exact(ZB_DT_FLOAT64, ZB_DT_FLOAT32));
    assert_false(zb__widen_exact(ZB_DT_INT32, ZB_DT_FLOAT32));
    assert_false(zb__widen_exact(ZB_DT_UINT32, ZB_DT_INT32));
    assert_false(zb__widen_exact(ZB_DT_INT64, ZB_DT_FLOAT64));
    assert_false(zb__widen_exact(ZB_DT_FLOAT16, ZB_DT_FLOAT32));
    assert_true(zb__widen_exact(ZB_DT_UINT16, ZB_DT_UINT16));
}

/* zb__values_convert's range check in the copy (the reader's check of CSR column ids and codes
 * as they land): for every integer widening, *span is the largest value - lo of the values
 * written, computed here from the source; float destinations and tables say they cannot tell
 * (UINT64_MAX), and no value is 0. */
static void
test_convert_reports_span(void **state)
{
    (void)state;
    static const zb_dtype from[] = {ZB_DT_UINT8, ZB_DT_INT8,   ZB_DT_UINT16,
                                    ZB_DT_INT16, ZB_DT_UINT32, ZB_DT_INT32};
    static const zb_dtype to[] = {ZB_DT_INT32, ZB_DT_INT64, ZB_DT_FLOAT64};
    enum { NW = 45 };
    uint8_t src[NW * 4 + 1], dst[NW * 8];
    int checked = 0;
    for (size_t a = 0; a < sizeof from / sizeof *from; a++)
        for (size_t b = 0; b < sizeof to / sizeof *to; b++)
            for (int64_t lo = -1; lo <= 0; lo++)
                for (int round = 0; round < 3; round++) {
                    if (!zb__widen_exact(from[a], to[b]) || from[a] == to[b]) continue;
                    for (size_t i = 0; i < sizeof src; i++)
                        src[i] = (uint8_t)(i * 29 + 7 * (size_t)round + 3);
                    if (round == 2) memset(src + 1, 0xff, sizeof src - 1); /* all -1 or max */
                    uint64_t span = 7, want = 0;
                    assert_int_equal(zb__values_convert(dst, to[b], src + 1, from[a], NW, NULL, 0,
                                                        "x", lo, &span),
                                     ZB_OK);
                    for (size_t i = 0; i < NW; i++) {
                        double v = value_at(src + 1, from[a], i);
                        assert_true(value_at(dst, to[b], i) == v);
                        /* v - lo as an unsigned 64-bit number (a value below lo wraps) */
                        uint64_t d = (uint64_t)(int64_t)v - (uint64_t)lo;
                        if (d > want) want = d;
                    }
                    if (to[b] == ZB_DT_FLOAT64) {
                        assert_true(span == UINT64_MAX);
                        continue;
                    }
                    if (to[b] == ZB_DT_INT32 && want > UINT32_MAX) /* wrapped in 32 bits */
                        want = (uint32_t)want;
                    assert_true(span == want);
                    checked++;
                }
    assert_int_equal(checked, 2 * 3 * (4 + 6)); /* 4 pairs into int32, 6 into int64 */
    uint64_t span = 7;
    int64_t lut[2] = {1, 0};
    int8_t codes[3] = {0, 1, -1};
    assert_int_equal(
        zb__values_convert(dst, ZB_DT_INT16, codes, ZB_DT_INT8, 3, lut, 2, "x", -1, &span), ZB_OK);
    assert_true(span == UINT64_MAX);
    assert_int_equal(
        zb__values_convert(dst, ZB_DT_INT32, src, ZB_DT_UINT16, 0, NULL, 0, "x", 0, &span), ZB_OK);
    assert_true(span == 0);
}

/* ---- the listed path: a store that reads lists itself ---------------------------------------- */

/* A remote-style backend over an inner store: get_ranges completes the ranges on a thread of its
 * own, in a scrambled order, a little apart, and hands each completion to the calling thread
 * (the contract of zb_store_methods.get_ranges). It holds back the last range of a call until
 * the reader has decoded something (its dataset's decoded-chunk cache grows), so a reader that
 * waited for every range before decoding would stall (then `stalled` is set after 5 s). */
typedef struct scrambled {
    zb_store *inner;
    zb_dataset *watch; /* whose cache must grow before a call's last range (NULL: no wait) */
    unsigned seed;
    int calls;      /* get_ranges calls */
    size_t nranges; /* ranges asked, over all calls */
    bool scrambled; /* some call completed its ranges out of list order */
    bool stalled;
    const char *fail_key; /* a range of this key fails with ZB_E_IO */
    /* one call's completion queue */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t *queue, nq, taken;
    bool cancel;
    zb_range *r;
    size_t n;
} scrambled;

static zb_status
sc_get(void *self, const char *key, uint64_t off, uint64_t len, void *dst, uint64_t *nread)
{
    return zb_store_get(((scrambled *)self)->inner, key, off, len, dst, nread);
}

static zb_status
sc_size(void *self, const char *key, uint64_t *size)
{
    return zb_store_size(((scrambled *)self)->inner, key, size);
}

static zb_status
sc_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    return zb_store_list(((scrambled *)self)->inner, prefix, fn, ctx);
}

static void
sc_close(void *self)
{
    (void)self;
}

static void *
sc_worker(void *arg)
{
    scrambled *sc = arg;
    size_t n = sc->n, *perm = malloc((n + 1) * sizeof *perm);
    for (size_t i = 0; i < n; i++) perm[i] = i;
    for (size_t i = n; i > 1; i--) { /* Fisher-Yates with the test's own generator */
        sc->seed = sc->seed * 1103515245u + 12345u;
        size_t j = (sc->seed >> 8) % i, t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    size_t held = sc->watch ? zb__cache_held(sc->watch->cache) : 0;
    for (size_t k = 0; k < n; k++) {
        pthread_mutex_lock(&sc->mu);
        bool stop = sc->cancel;
        pthread_mutex_unlock(&sc->mu);
        if (stop) break;
        if (k + 1 == n && n > 2 && sc->watch) {
            int waited = 0;
            while (zb__cache_held(sc->watch->cache) == held && waited < 5000) {
                usleep(1000);
                waited++;
            }
            if (waited >= 5000) sc->stalled = true;
        }
        zb_range *r = &sc->r[perm[k]];
        if (sc->fail_key && strstr(r->key, sc->fail_key)) {
            r->status = ZB_E_IO;
        } else {
            r->status = zb_store_get(sc->inner, r->key, r->offset, r->length, r->dst, &r->nread);
        }
        if (k && perm[k] < perm[k - 1]) sc->scrambled = true;
        usleep(200);
        pthread_mutex_lock(&sc->mu);
        sc->queue[sc->nq++] = perm[k];
        pthread_cond_signal(&sc->cv);
        pthread_mutex_unlock(&sc->mu);
    }
    free(perm);
    return NULL;
}

static zb_status
sc_get_ranges(void *self, zb_range *r, size_t n, zb_range_fn done, void *ctx)
{
    scrambled *sc = self;
    sc->calls++;
    sc->nranges += n;
    sc->r = r;
    sc->n = n;
    sc->nq = sc->taken = 0;
    sc->cancel = false;
    sc->queue = malloc((n + 1) * sizeof *sc->queue);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sc_worker, sc), 0);
    bool cancelled = false;
    for (size_t k = 0; k < n; k++) {
        pthread_mutex_lock(&sc->mu);
        while (sc->taken == sc->nq && !cancelled) pthread_cond_wait(&sc->cv, &sc->mu);
        size_t i = sc->queue[sc->taken++];
        pthread_mutex_unlock(&sc->mu);
        if (r[i].status == ZB_E_IO) zb__err(ZB_E_IO, "%s: injected failure", r[i].key);
        if (done(ctx, i)) {
            pthread_mutex_lock(&sc->mu);
            sc->cancel = cancelled = true;
            pthread_mutex_unlock(&sc->mu);
            break;
        }
    }
    pthread_join(th, NULL);
    free(sc->queue);
    return ZB_OK;
}

static const zb_store_methods SCRAMBLED = {.scheme = "scrambled",
                                           .get = sc_get,
                                           .size = sc_size,
                                           .list = sc_list,
                                           .close = sc_close,
                                           .get_ranges = sc_get_ranges};

/* Copies every object under `prefix` of src into dst, byte for byte. */
typedef struct copy_walk {
    zb_store *src, *dst;
    char prefix[256];
} copy_walk;

static int
copy_child(void *ctx, const char *name, bool is_dir)
{
    copy_walk *w = ctx, sub = *w;
    int np =
        snprintf(sub.prefix, sizeof sub.prefix, "%s%s%s", w->prefix, w->prefix[0] ? "/" : "", name);
    assert_true(np > 0 && (size_t)np < sizeof sub.prefix);
    if (is_dir) {
        ZB_ASSERT_OK(zb_store_list(w->src, sub.prefix, copy_child, &sub));
        return 0;
    }
    uint8_t *data = NULL;
    uint64_t len = 0;
    ZB_ASSERT_OK(zb_store_read_all(w->src, sub.prefix, &data, &len));
    ZB_ASSERT_OK(zb_store_put(w->dst, sub.prefix, data, len));
    free(data);
    return 0;
}

/* The listed path gives the file store's batches, with one list read per request, ranges
 * completing out of order, and decoding under way before the last range arrives; plain and
 * sharded arrays, one and four threads, decoding inline and on the pool. */
static void
test_listed_path_matches_file_store(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    uint64_t ids[40];
    for (size_t i = 0; i < 40; i++) ids[i] = (i * 7 + 3) % N;
    for (int sharded = 0; sharded < 2; sharded++) {
        build_opts bo = {.with_index = true, .sharded = sharded};
        zb_store *mem = build(&s, &bo), *file = NULL, *remote = NULL;
        ZB_ASSERT_OK(zb_store_open_file(zbt_tempdir("listed"), &file));
        copy_walk w = {.src = mem, .dst = file};
        ZB_ASSERT_OK(zb_store_list(mem, "", copy_child, &w));
        scrambled sc = {.inner = file, .seed = 7u + (unsigned)sharded};
        pthread_mutex_init(&sc.mu, NULL);
        pthread_cond_init(&sc.cv, NULL);
        ZB_ASSERT_OK(zb_store_new(&SCRAMBLED, &sc, &remote));
        for (int threads = 1; threads <= 4; threads += 3) {
            zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
            o.num_threads = threads;
            if (threads > 1) o.inline_work_bytes = 0; /* decode on the pool */
            o.cache_bytes = (size_t)1 << 20;          /* how the backend sees decoding under way */
            zb_dataset *df = open_ds(file, 0, threads);
            const uint64_t *req[2] = {IDS, ids};
            size_t nreq[2] = {NIDS, 40};
            for (int k = 0; k < 2; k++) {
                zb_dataset *dr = NULL; /* a fresh cache: every unit is fetched */
                ZB_ASSERT_OK(zb_dataset_open(remote, "", &o, &dr));
                sc.watch = dr;
                zb_batch *bf = NULL, *br = NULL;
                int calls = sc.calls;
                ZB_ASSERT_OK(zb_dataset_read_many(df, req[k], nreq[k], &bf));
                ZB_ASSERT_OK(zb_dataset_read_many(dr, req[k], nreq[k], &br));
                assert_int_equal(sc.calls, calls + 1); /* the whole request, one list read */
                check_batch(&s, br, req[k], nreq[k], true);
                assert_batches_equal(bf, br);
                zb_read_stats a, b;
                zb_batch_stats(bf, &a);
                zb_batch_stats(br, &b);
                assert_int_equal(a.chunks_decoded, b.chunks_decoded);
                assert_int_equal(a.bytes_delivered, b.bytes_delivered);
                zb_batch_free(bf);
                zb_batch_free(br);
                sc.watch = NULL;
                zb_dataset_close(dr);
            }
            assert_true(sc.scrambled);
            assert_false(sc.stalled);
            zb_dataset_close(df);
        }
        /* zb_array_read_rows of a sharded array: each shard's merged reads in one list read */
        zb_array *arr = NULL;
        ZB_ASSERT_OK(zb_array_open(remote, "vals", &arr));
        size_t bytes = (size_t)s.total * VW * sizeof(int32_t);
        int32_t *rows = malloc(bytes);
        assert_non_null(rows);
        int calls = sc.calls;
        ZB_ASSERT_OK(zb_array_read_rows(arr, 0, (uint64_t)s.total, rows, bytes, NULL));
        assert_memory_equal(rows, s.vals, bytes);
        uint64_t shards = ((uint64_t)s.total + 2 * VALS_CHUNK - 1) / (2 * VALS_CHUNK);
        assert_int_equal(sc.calls - calls, sharded ? (int)shards : 0);
        free(rows);
        zb_array_close(arr);
        zb_store_close(remote);
        pthread_mutex_destroy(&sc.mu);
        pthread_cond_destroy(&sc.cv);
        zb_store_close(file);
        zb_store_close(mem);
    }
    source_free(&s);
}

/* A list-reading backend that any number of threads may call at once: each call completes its
 * ranges on the calling thread, last first, with a pause between (so two calls interleave). */
static zb_status
cc_get(void *self, const char *key, uint64_t off, uint64_t len, void *dst, uint64_t *nread)
{
    return zb_store_get(self, key, off, len, dst, nread);
}

static zb_status
cc_size(void *self, const char *key, uint64_t *size)
{
    return zb_store_size(self, key, size);
}

static zb_status
cc_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    return zb_store_list(self, prefix, fn, ctx);
}

static void
cc_close(void *self)
{
    (void)self; /* the inner store is the test's */
}

static zb_status
cc_get_ranges(void *self, zb_range *r, size_t n, zb_range_fn done, void *ctx)
{
    for (size_t k = n; k-- > 0;) {
        r[k].status = zb_store_get(self, r[k].key, r[k].offset, r[k].length, r[k].dst, &r[k].nread);
        usleep(50);
        if (done(ctx, k)) break;
    }
    return ZB_OK;
}

static const zb_store_methods CONCURRENT = {.scheme = "concurrent",
                                            .get = cc_get,
                                            .size = cc_size,
                                            .list = cc_list,
                                            .close = cc_close,
                                            .get_ranges = cc_get_ranges};

typedef struct two_reads {
    zb_dataset *ds;
    const uint64_t *ids;
    size_t n;
    zb_batch *b;
    zb_status st;
} two_reads;

static void *
read_thread(void *arg)
{
    two_reads *t = arg;
    t->st = zb_dataset_read_many(t->ds, t->ids, t->n, &t->b);
    return NULL;
}

/* Two reads of one dataset at once over a list-reading store, as the loader's two windows
 * make them: while one drives the decode pool the other's ranges arrive and wait for it
 * (exec.c take_pool), and units found in the fetch cache stay pinned until decoded. Both
 * batches are the file store's; the TSan tier runs this. */
static void
test_listed_path_two_reads_at_once(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    uint64_t a[60], b[60];
    for (size_t i = 0; i < 60; i++) {
        a[i] = (i * 7 + 3) % N;
        b[i] = (i * 11 + 5) % N;
    }
    for (int sharded = 0; sharded < 2; sharded++) {
        build_opts bo = {.with_index = true, .sharded = sharded};
        zb_store *mem = build(&s, &bo), *remote = NULL;
        ZB_ASSERT_OK(zb_store_new(&CONCURRENT, mem, &remote));
        zb_dataset *dm = open_ds(mem, 0, 1);
        for (int round = 0; round < 3; round++) {
            zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
            o.num_threads = 2;
            o.inline_work_bytes = 0;                            /* decode on the pool */
            o.fetch_cache_bytes = round == 2 ? 4096 : 1u << 20; /* small: evictions */
            zb_dataset *dr = NULL;
            ZB_ASSERT_OK(zb_dataset_open(remote, "", &o, &dr));
            for (int again = 0; again < 2; again++) { /* the second pair finds units cached */
                two_reads t[2] = {{dr, a, 60, NULL, ZB_OK}, {dr, b, 60, NULL, ZB_OK}};
                pthread_t th[2];
                for (int k = 0; k < 2; k++)
                    assert_int_equal(pthread_create(&th[k], NULL, read_thread, &t[k]), 0);
                for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
                for (int k = 0; k < 2; k++) {
                    ZB_ASSERT_OK(t[k].st);
                    zb_batch *want = NULL;
                    ZB_ASSERT_OK(zb_dataset_read_many(dm, t[k].ids, t[k].n, &want));
                    check_batch(&s, t[k].b, t[k].ids, t[k].n, true);
                    assert_batches_equal(want, t[k].b);
                    zb_batch_free(want);
                    zb_batch_free(t[k].b);
                }
            }
            zb_dataset_close(dr);
        }
        zb_dataset_close(dm);
        zb_store_close(remote);
        zb_store_close(mem);
    }
    source_free(&s);
}

/* A range that fails fails the read with the store's message; a chunk object that does not
 * exist reads as fill, as from the file store. */
static void
test_listed_path_errors_and_missing(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    build_opts bo = {.with_index = true};
    zb_store *mem = build(&s, &bo), *remote = NULL;
    scrambled sc = {.inner = mem, .seed = 3u, .fail_key = "vals/c/1"};
    pthread_mutex_init(&sc.mu, NULL);
    pthread_cond_init(&sc.cv, NULL);
    ZB_ASSERT_OK(zb_store_new(&SCRAMBLED, &sc, &remote));
    /* no fetch cache: it would keep lab/c/1 from the first read, erased below */
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.num_threads = 4;
    o.fetch_cache_bytes = 0;
    zb_dataset *dr = NULL, *dm = open_ds(mem, 0, 1);
    ZB_ASSERT_OK(zb_dataset_open(remote, "", &o, &dr));
    zb_batch *b = NULL;
    ZB_ASSERT_ERR(zb_dataset_read_many(dr, IDS, NIDS, &b), ZB_E_IO, "vals/c/1");
    assert_null(b);
    sc.fail_key = NULL;
    ZB_ASSERT_OK(zb_store_erase(mem, "lab/c/1")); /* samples 5..9 of lab: fill (0) */
    zb_batch *bm = NULL;
    ZB_ASSERT_OK(zb_dataset_read_many(dr, IDS, NIDS, &b));
    ZB_ASSERT_OK(zb_dataset_read_many(dm, IDS, NIDS, &bm));
    assert_batches_equal(bm, b);
    zb_batch_view v;
    ZB_ASSERT_OK(zb_batch_find(b, "lab", &v));
    for (size_t i = 0; i < NIDS; i++)
        assert_int_equal(((const int64_t *)v.data)[i], IDS[i] / LAB_CHUNK == 1 ? 0 : s.lab[IDS[i]]);
    zb_batch_free(b);
    zb_batch_free(bm);
    zb_dataset_close(dr);
    zb_dataset_close(dm);
    zb_store_close(remote);
    pthread_mutex_destroy(&sc.mu);
    pthread_cond_destroy(&sc.cv);
    zb_store_close(mem);
    source_free(&s);
}

/* The fetch cache (zb_dataset_opts.fetch_cache_bytes) of a store that reads lists: a request
 * read again is served without a list read, with the same bytes; a cache too small for one
 * unit keeps nothing, so every read lists its units again; plain and sharded arrays. */
static void
test_listed_path_fetch_cache(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    for (int sharded = 0; sharded < 2; sharded++) {
        build_opts bo = {.with_index = true, .sharded = sharded};
        zb_store *mem = build(&s, &bo), *remote = NULL;
        scrambled sc = {.inner = mem, .seed = 5u};
        pthread_mutex_init(&sc.mu, NULL);
        pthread_cond_init(&sc.cv, NULL);
        ZB_ASSERT_OK(zb_store_new(&SCRAMBLED, &sc, &remote));
        for (size_t budget = 0; budget < 2; budget++) {
            zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
            o.num_threads = 2;
            if (budget == 0) o.fetch_cache_bytes = 1; /* smaller than any unit */
            zb_dataset *dr = NULL;
            ZB_ASSERT_OK(zb_dataset_open(remote, "", &o, &dr));
            zb_batch *b1 = NULL, *b2 = NULL;
            ZB_ASSERT_OK(zb_dataset_read_many(dr, IDS, NIDS, &b1));
            int calls = sc.calls;
            size_t nranges = sc.nranges;
            ZB_ASSERT_OK(zb_dataset_read_many(dr, IDS, NIDS, &b2));
            check_batch(&s, b2, IDS, NIDS, true);
            assert_batches_equal(b1, b2);
            zb_read_stats st;
            zb_batch_stats(b2, &st);
            if (budget == 0) {
                /* the units again (the first read also listed pointer chunks, kept since) */
                assert_int_equal(sc.calls, calls + 1);
                assert_true(sc.nranges > nranges);
                assert_int_equal(st.range_reads, sc.nranges - nranges);
                assert_true(st.bytes_fetched > 0);
            } else {
                assert_int_equal(sc.calls, calls);
                assert_int_equal(sc.nranges, nranges);
                assert_int_equal(st.bytes_fetched, 0);
                assert_int_equal(st.range_reads, 0);
            }
            zb_batch_free(b1);
            zb_batch_free(b2);
            zb_dataset_close(dr);
            sc.nranges = 0;
        }
        zb_store_close(remote);
        pthread_mutex_destroy(&sc.mu);
        pthread_cond_destroy(&sc.cv);
        zb_store_close(mem);
    }
    source_free(&s);
}

/* A pointer claiming 2^40 rows is refused before any allocation, naming the sample; with
 * on_invalid = skip the sample is left out and counted; a request over max_request_bytes is
 * refused naming the cap (docs/ERRORS.md "Invalid data"). */
static void
test_invalid_samples_error_skip_and_cap(void **state)
{
    (void)state;
    source s;
    source_make(&s);
    int64_t bad[N + 1];
    memcpy(bad, s.ptr, sizeof bad);
    bad[3] = (int64_t)1 << 40; /* sample 2 claims 2^40 rows; sample 3 then goes backwards */
    build_opts bo = {.ptr_override = bad};
    zb_store *st = build(&s, &bo);
    zb_dataset *ds = open_ds(st, 0, 1);
    zb_batch *b = NULL;
    uint64_t ids[3] = {1, 2, 5}, good[2] = {1, 5};
    ZB_ASSERT_ERR(zb_dataset_read_many(ds, ids, 3, &b), ZB_E_CORRUPT, "sample 2");
    assert_null(b);
    zb_dataset_close(ds);

    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.on_invalid = ZB_ON_INVALID_SKIP;
    ZB_ASSERT_OK(zb_dataset_open(st, "", &o, &ds));
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, 3, &b));
    check_batch(&s, b, good, 2, false);
    zb_read_stats rs;
    zb_batch_stats(b, &rs);
    assert_int_equal(rs.samples_skipped, 1);
    zb_batch_free(b);
    /* a clean request skips nothing */
    ZB_ASSERT_OK(zb_dataset_read_many(ds, good, 2, &b));
    zb_batch_stats(b, &rs);
    assert_int_equal(rs.samples_skipped, 0);
    zb_batch_free(b);
    zb_dataset_close(ds);

    o = (zb_dataset_opts)ZB_DATASET_OPTS_DEFAULT;
    o.max_request_bytes = 64;
    ZB_ASSERT_OK(zb_dataset_open(st, "", &o, &ds));
    ZB_ASSERT_ERR(zb_dataset_read_many(ds, good, 2, &b), ZB_E_INVALID, "64-byte cap");
    assert_null(b);
    zb_dataset_close(ds);
    zb_store_close(st);
    source_free(&s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_and_fields),
        cmocka_unit_test(test_read_many_matches_hand),
        cmocka_unit_test(test_plain_and_sharded_identical),
        cmocka_unit_test(test_corrupt_pointers),
        cmocka_unit_test(test_ids_out_of_range),
        cmocka_unit_test(test_cache_serves_repeat),
        cmocka_unit_test(test_tiny_cache),
        cmocka_unit_test(test_four_threads_same_bytes),
        cmocka_unit_test(test_pointer_blocks),
        cmocka_unit_test(test_generic_schema_errors),
        cmocka_unit_test(test_index_conventions_and_bad_values),
        cmocka_unit_test(test_widen_every_pair),
        cmocka_unit_test(test_convert_reports_span),
        cmocka_unit_test(test_listed_path_matches_file_store),
        cmocka_unit_test(test_listed_path_errors_and_missing),
        cmocka_unit_test(test_listed_path_fetch_cache),
        cmocka_unit_test(test_listed_path_two_reads_at_once),
        cmocka_unit_test(test_invalid_samples_error_skip_and_cap),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
