/* The pipelined loader on a generic-layout dataset in memory: batches come in sampler order and
 * equal read_many of the same ids (views re-based to start at 0, index fields re-based per
 * batch); batches outlive the loader; an injected decode error reaches zb_loader_next with its
 * message; transforms run and their errors propagate; the state after k batches resumes
 * exactly; with more_epochs the loader reads on across epoch ends and each epoch still comes
 * out whole and in order. Under ASan these also prove no leak on early close. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/batch.h"
#include "support/testutil.h"
#include "write/write.h"

#define N 200

static const char *ATTRS =
    "{\"zbatch\": {\"segments\": {\"seg\": \"ptr\"}, \"fields\": {"
    "\"vals\": {\"array\": \"vals\", \"kind\": \"ragged\", \"segment\": \"seg\"}, "
    "\"nbr\": {\"array\": \"nbr\", \"kind\": \"index\", \"segment\": \"seg\", "
    "\"target\": \"seg\"}, "
    "\"lab\": {\"array\": \"lab\", \"kind\": \"per_sample\"}}}}";

/* Sample i has (i % 7) + 1 elements; vals are r*3; nbr (local) is (k + 1) % count. */
static zb_store *
build(void)
{
    int64_t ptr[N + 1];
    ptr[0] = 0;
    for (int i = 0; i < N; i++) ptr[i + 1] = ptr[i] + (i % 7) + 1;
    int64_t total = ptr[N];
    int32_t *vals = malloc((size_t)total * sizeof *vals);
    int64_t *nbr = malloc((size_t)total * sizeof *nbr);
    int64_t lab[N];
    for (int i = 0; i < N; i++) {
        lab[i] = 5 * i;
        int64_t c = ptr[i + 1] - ptr[i];
        for (int64_t k = 0; k < c; k++) {
            vals[ptr[i] + k] = (int32_t)((ptr[i] + k) * 3);
            nbr[ptr[i] + k] = (k + 1) % c;
        }
    }
    zb_store *st = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&st));
    ZB_ASSERT_OK(zb__write_group(st, "", 3, ATTRS));
    zbt_put_rows(st, "ptr", ZB_DT_INT64, ptr, N + 1, 64);
    zbt_put_rows(st, "vals", ZB_DT_INT32, vals, (uint64_t)total, 50);
    zbt_put_rows(st, "nbr", ZB_DT_INT64, nbr, (uint64_t)total, 50);
    zbt_put_rows(st, "lab", ZB_DT_INT64, lab, N, 32);
    free(vals);
    free(nbr);
    return st;
}

static zb_dataset *
open_ds(zb_store *st, int threads)
{
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.num_threads = threads;
    zb_dataset *ds = NULL;
    ZB_ASSERT_OK(zb_dataset_open(st, "", &o, &ds));
    return ds;
}

static zb_sampler *
sampler(const char *kind, uint64_t batch, uint64_t seed)
{
    zb_sampler_opts o = ZB_SAMPLER_OPTS_DEFAULT;
    o.n = N;
    o.batch_size = batch;
    o.seed = seed;
    zb_sampler *s = NULL;
    if (!strcmp(kind, "random"))
        ZB_ASSERT_OK(zb_sampler_new_random(&o, &s));
    else
        ZB_ASSERT_OK(zb_sampler_new_sequential(&o, &s));
    return s;
}

/* Checks one loader batch against the samples' known contents. */
static void
check_batch(const zb_batch *b)
{
    size_t B = zb_batch_size(b);
    const uint64_t *ids = zb_batch_index(b);
    zb_batch_view vals, nbr, lab;
    ZB_ASSERT_OK(zb_batch_find(b, "vals", &vals));
    ZB_ASSERT_OK(zb_batch_find(b, "nbr", &nbr));
    ZB_ASSERT_OK(zb_batch_find(b, "lab", &lab));
    const int64_t *p = zb_batch_segment(b, "seg");
    assert_non_null(p);
    assert_int_equal(p[0], 0);
    assert_int_equal((uint64_t)p[B], vals.nrows);
    for (size_t i = 0; i < B; i++) {
        uint64_t id = ids[i];
        int64_t c = (int64_t)(id % 7) + 1;
        int64_t start = 0;
        for (uint64_t j = 0; j < id; j++) start += (int64_t)(j % 7) + 1;
        assert_int_equal(p[i + 1] - p[i], c);
        assert_int_equal(((const int64_t *)lab.data)[i], (int64_t)(5 * id));
        for (int64_t k = 0; k < c; k++) {
            assert_int_equal(((const int32_t *)vals.data)[p[i] + k], (int32_t)((start + k) * 3));
            /* local (k+1)%c re-based by the sample's offset inside this batch */
            assert_int_equal(((const int64_t *)nbr.data)[p[i] + k], p[i] + (k + 1) % c);
        }
    }
}

/* Takes one epoch from the loader and checks it against `ref` (already at that epoch):
 * the same batches, then the NULL that ends the epoch, with the state at the epoch's end
 * (its 13th batch). */
static void
check_epoch(zb_loader *ld, zb_sampler *ref, uint64_t epoch, size_t nbatches)
{
    uint64_t want[64];
    for (size_t k = 0;; k++) {
        zb_batch *b = NULL;
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        size_t n = 0;
        ZB_ASSERT_OK(zb_sampler_next(ref, want, 64, &n));
        if (!b) {
            assert_int_equal(n, 0);
            assert_int_equal(k, nbatches);
            break;
        }
        assert_int_equal(zb_batch_size(b), n);
        assert_memory_equal(zb_batch_index(b), want, n * sizeof *want);
        check_batch(b);
        zb_batch_free(b);
    }
    zb_sampler_state ss;
    zb_loader_state(ld, &ss);
    assert_int_equal(ss.epoch, epoch);
    assert_int_equal(ss.position, 13);
}

static void
test_order_and_values(void **state)
{
    (void)state;
    zb_store *st = build();
    zb_dataset *ds = open_ds(st, 2);
    zb_sampler *s = sampler("random", 16, 5), *ref = sampler("random", 16, 5);
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.prefetch_factor = 3;
    lo.depth = 2;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
    check_epoch(ld, ref, 0, 13); /* 13 batches: all N samples, as the sampler orders them */
    zb_batch *b = (zb_batch *)1;
    ZB_ASSERT_OK(zb_loader_next(ld, &b)); /* past the end stays at the end */
    assert_null(b);
    zb_loader_close(ld);
    zb_sampler_free(s);
    zb_sampler_free(ref);
    zb_dataset_close(ds);
    zb_store_close(st);
}

static void
test_batches_outlive_the_loader_and_early_close(void **state)
{
    (void)state;
    zb_store *st = build();
    zb_dataset *ds = open_ds(st, 1);
    zb_sampler *s = sampler("sequential", 10, 0);
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.prefetch_factor = 4;
    lo.depth = 3;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
    zb_batch *held[3];
    for (int i = 0; i < 3; i++) ZB_ASSERT_OK(zb_loader_next(ld, &held[i]));
    zb_loader_close(ld); /* windows in flight are freed; held batches stay valid */
    for (int i = 0; i < 3; i++) {
        check_batch(held[i]);
        assert_int_equal(zb_batch_index(held[i])[0], (uint64_t)(10 * i));
        zb_batch_free(held[i]);
    }
    zb_loader_close(NULL);
    zb_sampler_free(s);
    zb_dataset_close(ds);
    zb_store_close(st);
}

static void
test_resume_from_loader_state(void **state)
{
    (void)state;
    zb_store *st = build();
    zb_dataset *ds = open_ds(st, 2);
    zb_sampler *s = sampler("random", 12, 9);
    zb_loader *ld = NULL;
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
    for (int i = 0; i < 5; i++) {
        zb_batch *b = NULL;
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        zb_batch_free(b);
    }
    zb_sampler_state ss;
    zb_loader_state(ld, &ss);
    assert_int_equal(ss.position, 5); /* prefetched batches do not count */
    zb_loader_close(ld);
    zb_sampler *r = sampler("random", 12, 9), *ref = sampler("random", 12, 9);
    ZB_ASSERT_OK(zb_sampler_restore(r, &ss));
    uint64_t want[16];
    size_t n;
    for (int i = 0; i < 5; i++) ZB_ASSERT_OK(zb_sampler_next(ref, want, 16, &n));
    ZB_ASSERT_OK(zb_loader_open(ds, r, &lo, &ld));
    zb_batch *b = NULL;
    ZB_ASSERT_OK(zb_loader_next(ld, &b));
    ZB_ASSERT_OK(zb_sampler_next(ref, want, 16, &n));
    assert_memory_equal(zb_batch_index(b), want, n * sizeof *want);
    zb_batch_free(b);
    zb_loader_close(ld);
    zb_sampler_free(s);
    zb_sampler_free(r);
    zb_sampler_free(ref);
    zb_dataset_close(ds);
    zb_store_close(st);
}

static void
test_decode_error_reaches_next(void **state)
{
    (void)state;
    zb_store *st = build();
    char key[64];
    snprintf(key, sizeof key, "vals/c/3");
    ZB_ASSERT_OK(zb_store_put(st, key, "\x01\x02\x03", 3));
    zb_dataset *ds = open_ds(st, 2);
    zb_sampler *s = sampler("sequential", 20, 0);
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.prefetch_factor = 2;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
    zb_status st_last = ZB_OK;
    for (int i = 0; i < 20; i++) {
        zb_batch *b = NULL;
        st_last = zb_loader_next(ld, &b);
        if (st_last != ZB_OK || !b) break;
        zb_batch_free(b);
    }
    assert_true(st_last == ZB_E_CORRUPT || st_last == ZB_E_TRUNCATED);
    assert_true(zbt_mentions("vals/c/3"));
    zb_loader_close(ld);
    zb_sampler_free(s);
    zb_dataset_close(ds);
    zb_store_close(st);
}

static zb_status
sum_lab(zb_batch *b, void *user)
{
    zb_batch_view lab;
    zb_status fs = zb_batch_find(b, "lab", &lab);
    if (fs != ZB_OK) return fs;
    int64_t sum = 0; /* the loader's window threads call transforms at once */
    for (size_t i = 0; i < zb_batch_size(b); i++) sum += ((const int64_t *)lab.data)[i];
    atomic_fetch_add((_Atomic int64_t *)user, sum);
    /* add a derived field the consumer sees */
    int64_t *twice = malloc(zb_batch_size(b) * sizeof *twice + 1);
    for (size_t i = 0; i < zb_batch_size(b); i++) twice[i] = 2 * ((const int64_t *)lab.data)[i];
    zb_status st = zb_batch_add_field(b, "lab2", ZB_DT_INT64, 0, NULL, zb_batch_size(b), twice);
    if (st != ZB_OK) free(twice);
    return st;
}

static zb_status
fail_third(zb_batch *b, void *user)
{
    (void)b;
    if (atomic_fetch_add((atomic_int *)user, 1) + 1 == 3) return ZB_E_INVALID;
    return ZB_OK;
}

static void
test_transforms(void **state)
{
    (void)state;
    zb_store *st = build();
    zb_dataset *ds = open_ds(st, 1);
    zb_sampler *s = sampler("sequential", 50, 0);
    _Atomic int64_t acc = 0;
    zb_transform t[2] = {
        {.kind = ZB_TRANSFORM_CALLBACK, .fn = sum_lab, .user = &acc},
        {.kind = ZB_TRANSFORM_CAST, .field = "lab", .dtype = ZB_DT_FLOAT64, .target_sum = 0.0}};
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.transforms = t;
    lo.ntransforms = 2;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
    for (;;) {
        zb_batch *b = NULL;
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        if (!b) break;
        zb_batch_view l2, lab;
        ZB_ASSERT_OK(zb_batch_find(b, "lab2", &l2));
        ZB_ASSERT_OK(zb_batch_find(b, "lab", &lab));
        assert_int_equal(lab.dtype, ZB_DT_FLOAT64);
        for (size_t i = 0; i < zb_batch_size(b); i++) {
            assert_int_equal(((const int64_t *)l2.data)[i], 10 * (int64_t)zb_batch_index(b)[i]);
            assert_true(((const double *)lab.data)[i] == 5.0 * (double)zb_batch_index(b)[i]);
        }
        zb_batch_free(b);
    }
    assert_int_equal(acc, 5 * (N - 1) * N / 2);
    zb_loader_close(ld);

    atomic_int count = 0;
    zb_transform f = {.kind = ZB_TRANSFORM_CALLBACK, .fn = fail_third, .user = &count};
    lo.transforms = &f;
    lo.ntransforms = 1;
    lo.prefetch_factor = 1;
    ZB_ASSERT_OK(zb_sampler_set_epoch(s, 1));
    ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
    zb_status last = ZB_OK;
    for (int i = 0; i < 5 && last == ZB_OK; i++) {
        zb_batch *b = NULL;
        last = zb_loader_next(ld, &b);
        zb_batch_free(b);
    }
    assert_int_equal(last, ZB_E_INVALID);
    zb_loader_close(ld);
    zb_sampler_free(s);
    zb_dataset_close(ds);
    zb_store_close(st);
}

/* Slices of a read_batches result (index fields re-based per batch, the loader's windows)
 * and of a read_many result, on and off the batch boundaries: every view numbers its index
 * values from its own first sample (check_batch), however the whole was re-based. */
static void
test_views_of_batches(void **state)
{
    (void)state;
    zb_store *st = build();
    zb_dataset *ds = open_ds(st, 2);
    uint64_t ids[16] = {7, 150, 3, 3, 99, 0, 199, 42, 43, 44, 120, 8, 61, 17, 180, 5};
    size_t sizes[3] = {5, 7, 4};
    size_t cuts[][2] = {{0, 5}, {5, 12}, {12, 16}, {2, 9}, {9, 16}, {0, 16}, {3, 4}};
    for (int whole_kind = 0; whole_kind < 2; whole_kind++)
        for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
            zb_batch *whole = NULL, *v = NULL;
            if (whole_kind == 0)
                ZB_ASSERT_OK(zb__dataset_read_batches(ds, ids, 16, sizes, 3, &whole));
            else
                ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, 16, &whole));
            ZB_ASSERT_OK(zb__batch_slice(whole, cuts[c][0], cuts[c][1], &v));
            assert_int_equal(zb_batch_size(v), cuts[c][1] - cuts[c][0]);
            assert_memory_equal(zb_batch_index(v), ids + cuts[c][0],
                                zb_batch_size(v) * sizeof *ids);
            check_batch(v);
            zb_batch_free(v);
            zb_batch_free(whole);
        }
    /* every batch of one window, as the loader cuts it */
    zb_batch *whole = NULL;
    ZB_ASSERT_OK(zb__dataset_read_batches(ds, ids, 16, sizes, 3, &whole));
    for (size_t k = 0, b0 = 0; k < 3; b0 += sizes[k++]) {
        zb_batch *v = NULL;
        ZB_ASSERT_OK(zb__batch_slice(whole, b0, b0 + sizes[k], &v));
        check_batch(v);
        zb_batch_free(v);
    }
    zb_batch_free(whole);
    size_t bad[2] = {5, 7};
    ZB_ASSERT_ERR(zb__dataset_read_batches(ds, ids, 16, bad, 2, &whole), ZB_E_INVALID,
                  "add up to 12, not 16");
    assert_null(whole);
    zb_dataset_close(ds);
    zb_store_close(st);
}

/* more_epochs: the workers roll the sampler over at each epoch's end and read on; the
 * consumer still sees every epoch's batches in order and one NULL between epochs, whatever
 * the window size (1: many windows; 13: the epoch is one window; 20: one window, short). */
static void
test_reads_on_across_epochs(void **state)
{
    (void)state;
    zb_store *st = build();
    zb_dataset *ds = open_ds(st, 2);
    size_t prefetch[] = {1, 3, 13, 20};
    for (size_t k = 0; k < sizeof prefetch / sizeof *prefetch; k++) {
        zb_sampler *s = sampler("random", 16, 5), *ref = sampler("random", 16, 5);
        zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
        lo.prefetch_factor = prefetch[k];
        lo.more_epochs = 2;
        zb_loader *ld = NULL;
        ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
        for (uint64_t e = 0; e < 3; e++) {
            ZB_ASSERT_OK(zb_sampler_set_epoch(ref, e));
            check_epoch(ld, ref, e, 13);
        }
        zb_batch *b = (zb_batch *)1;
        ZB_ASSERT_OK(zb_loader_next(ld, &b)); /* no epoch left */
        assert_null(b);
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        assert_null(b);
        zb_loader_close(ld);

        /* same_epoch: the epoch again (a loop without set_epoch), from the sampler's start
         * state after a restore to the middle of epoch 4 */
        zb_sampler_state mid = {5, 4, 6};
        ZB_ASSERT_OK(zb_sampler_restore(s, &mid));
        lo.more_epochs = 1;
        lo.same_epoch = true;
        ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
        ZB_ASSERT_OK(zb_sampler_restore(ref, &mid));
        check_epoch(ld, ref, 4, 13 - 6);
        ZB_ASSERT_OK(zb_sampler_set_epoch(ref, 4));
        check_epoch(ld, ref, 4, 13);
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        assert_null(b);
        zb_loader_close(ld);

        /* no end: closed in the middle of the eighth epoch, windows in flight (ASan: no leak) */
        ZB_ASSERT_OK(zb_sampler_set_epoch(s, 0));
        lo.more_epochs = SIZE_MAX;
        lo.same_epoch = false;
        ZB_ASSERT_OK(zb_loader_open(ds, s, &lo, &ld));
        for (uint64_t e = 0; e < 7; e++) {
            ZB_ASSERT_OK(zb_sampler_set_epoch(ref, e));
            check_epoch(ld, ref, e, 13);
        }
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        assert_non_null(b);
        zb_batch_free(b);
        zb_loader_close(ld);
        zb_sampler_free(s);
        zb_sampler_free(ref);
    }
    /* a sampler whose epochs are empty: NULL, and the loader is over */
    zb_sampler_opts so = ZB_SAMPLER_OPTS_DEFAULT;
    so.n = N;
    so.batch_size = N + 1;
    so.drop_last = true;
    zb_sampler *empty = NULL;
    ZB_ASSERT_OK(zb_sampler_new_sequential(&so, &empty));
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.more_epochs = SIZE_MAX;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(ds, empty, &lo, &ld));
    for (int i = 0; i < 3; i++) {
        zb_batch *b = (zb_batch *)1;
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        assert_null(b);
    }
    zb_loader_close(ld);
    zb_sampler_free(empty);
    zb_dataset_close(ds);
    zb_store_close(st);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_values),
        cmocka_unit_test(test_batches_outlive_the_loader_and_early_close),
        cmocka_unit_test(test_resume_from_loader_state),
        cmocka_unit_test(test_decode_error_reaches_next),
        cmocka_unit_test(test_transforms),
        cmocka_unit_test(test_reads_on_across_epochs),
        cmocka_unit_test(test_views_of_batches),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
