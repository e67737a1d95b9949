/* Collections whose children disagree (src/dataset/merge.c, columns.c): category tables merged
 * into one with every child's codes remapped, var names compared or remapped, nullable and
 * string columns read across children. The stores are written with the anndata writer into a
 * memory store; the expected values are worked out by hand below each case. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "zbatch.h"

/* A child: n cells over genes `genes` ("g0,g1,g2" order), X rows given as CSR. */
typedef struct child {
    const char *path;
    const char *genes[3];
    uint64_t n;
    int64_t indptr[5];
    int32_t indices[8];
    float data[8];
    const char *cell_type[2]; /* categories */
    int8_t type_codes[4];
    int64_t leiden[2]; /* numeric categories */
    int8_t leiden_codes[4];
    int32_t count[4];
    uint8_t count_missing[4];
    const char *tag[4];
    uint8_t tag_missing[4]; /* all zero: written as a plain string-array */
    bool tag_nullable;
} child;

/* a: genes g0 g1 g2; rows {0:1, 2:2}, {1:3}, {}, {0:4, 1:5, 2:6} */
static const child A = {
    "a",
    {"g0", "g1", "g2"},
    4,
    {0, 2, 3, 3, 6},
    {0, 2, 1, 0, 1, 2},
    {1, 2, 3, 4, 5, 6},
    {"B", "T"},
    {0, 1, -1, 0},
    {3, 7},
    {0, 1, 1, 0},
    {5, 0, 7, 9},
    {0, 1, 0, 0},
    {"x", "", "z", "w"},
    {0, 1, 0, 0},
    true,
};

/* c: the same genes; other categories: cell_type NK/T, leiden 7/9; tag without missing values
 * (a plain string-array) */
static const child C = {
    "c",
    {"g0", "g1", "g2"},
    3,
    {0, 1, 1, 3},
    {1, 0, 2},
    {7, 8, 9},
    {"NK", "T"},
    {1, 0, 1},
    {7, 9},
    {1, 1, 0},
    {11, 12, 13},
    {0, 0, 1},
    {"p", "q", "r"},
    {0, 0, 0},
    false,
};

/* b: a's genes in another order (g2 g0 g1); row 0 holds g2 = 10, g0 = 11 */
static const child B = {
    "b",
    {"g2", "g0", "g1"},
    3,
    {0, 2, 3, 3},
    {0, 1, 2},
    {10, 11, 12},
    {"B", "T"},
    {0, 0, 1},
    {3, 7},
    {0, 0, 0},
    {1, 2, 3},
    {0, 0, 0},
    {"s", "t", "u"},
    {0, 0, 0},
    true,
};

static void
strings_of(const char *const *s, size_t n, char *data, uint64_t *offsets)
{
    offsets[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(s[i]);
        memcpy(data + offsets[i], s[i], len);
        offsets[i + 1] = offsets[i] + len;
    }
}

static void
write_child(zb_store *s, const child *c)
{
    zb_anndata_writer *w = NULL;
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.x_chunk = 2;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, c->path, 3, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w));
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, c->n, c->indptr, c->indices, c->data));
    char data[64];
    uint64_t off[8];
    strings_of(c->genes, 3, data, off);
    ZB_ASSERT_OK(zb_anndata_writer_append_names(w, ZB_ANNDATA_VAR, data, off, 3));
    const char *names[4];
    char name_buf[4][32];
    for (size_t i = 0; i < c->n; i++) {
        snprintf(name_buf[i], sizeof name_buf[i], "%s%zu", c->path, i);
        names[i] = name_buf[i];
    }
    strings_of(names, c->n, data, off);
    ZB_ASSERT_OK(zb_anndata_writer_append_names(w, ZB_ANNDATA_OBS, data, off, c->n));
    strings_of(c->cell_type, 2, data, off);
    ZB_ASSERT_OK(
        zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "cell_type", data, off, 2, false));
    ZB_ASSERT_OK(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "cell_type", ZB_DT_INT8,
                                                c->type_codes, c->n));
    ZB_ASSERT_OK(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, "leiden",
                                                             ZB_DT_INT64, c->leiden, 2, false));
    ZB_ASSERT_OK(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "leiden", ZB_DT_INT8,
                                                c->leiden_codes, c->n));
    ZB_ASSERT_OK(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, "count", ZB_DT_INT32,
                                                          c->count, c->n, c->count_missing, c->n));
    strings_of(c->tag, c->n, data, off);
    if (c->tag_nullable)
        ZB_ASSERT_OK(zb_anndata_writer_append_nullable_string_column(
            w, ZB_ANNDATA_OBS, "tag", data, off, c->n, c->tag_missing, c->n));
    else
        ZB_ASSERT_OK(
            zb_anndata_writer_append_string_column(w, ZB_ANNDATA_OBS, "tag", data, off, c->n));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
}

typedef struct fixture {
    zb_store *store;
    zb_dataset *a, *b, *c;
} fixture;

static int
setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    ZB_ASSERT_OK(zb_store_open_memory(&f->store));
    write_child(f->store, &A);
    write_child(f->store, &B);
    write_child(f->store, &C);
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    ZB_ASSERT_OK(zb_dataset_open(f->store, "a", &o, &f->a));
    ZB_ASSERT_OK(zb_dataset_open(f->store, "b", &o, &f->b));
    ZB_ASSERT_OK(zb_dataset_open(f->store, "c", &o, &f->c));
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    fixture *f = *state;
    zb_dataset_close(f->a);
    zb_dataset_close(f->b);
    zb_dataset_close(f->c);
    zb_store_close(f->store);
    free(f);
    return 0;
}

static int64_t
code_at(const zb_batch_view *v, size_t i)
{
    switch (v->dtype) {
    case ZB_DT_INT8:
        return ((const int8_t *)v->data)[i];
    case ZB_DT_INT16:
        return ((const int16_t *)v->data)[i];
    case ZB_DT_INT32:
        return ((const int32_t *)v->data)[i];
    default:
        fail_msg("codes of dtype %d", (int)v->dtype);
    }
    return 0;
}

/* a + c: cell_type's tables B/T and NK/T become B/NK/T (the sorted union, as anndata.concat
 * builds it), leiden's 3/7 and 7/9 become 3/7/9; every code in a batch indexes that table. */
static void
test_codes_mean_one_label(void **state)
{
    fixture *f = *state;
    zb_dataset *kids[2] = {f->a, f->c};
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ds = NULL;
    ZB_ASSERT_OK(zb_dataset_concat(kids, 2, &o, &ds));
    uint64_t n = 0;
    ZB_ASSERT_OK(zb_dataset_len(ds, &n));
    assert_int_equal(n, 7);

    zb_category_table t;
    ZB_ASSERT_OK(zb_dataset_category_table(ds, "obs/cell_type", &t));
    assert_int_equal(t.dtype, ZB_DT_STRING);
    assert_int_equal(t.n, 3);
    const char *want_types[3] = {"B", "NK", "T"};
    for (uint64_t k = 0; k < 3; k++) {
        assert_int_equal(t.strings->offsets[k + 1] - t.strings->offsets[k], strlen(want_types[k]));
        assert_memory_equal(t.strings->data + t.strings->offsets[k], want_types[k],
                            strlen(want_types[k]));
    }
    ZB_ASSERT_OK(zb_dataset_category_table(ds, "obs/leiden", &t));
    assert_int_equal(t.dtype, ZB_DT_INT64);
    assert_int_equal(t.n, 3);
    const int64_t want_leiden[3] = {3, 7, 9};
    assert_memory_equal(t.values, want_leiden, sizeof want_leiden);
    const zb_strings *labels = NULL;
    ZB_ASSERT_ERR(zb_dataset_categories(ds, "obs/leiden", &labels), ZB_E_TYPE, "int64");

    /* c0 (T), a0 (B), c2 (T), a1 (T), a2 (missing), c1 (NK) */
    const uint64_t ids[6] = {4, 0, 6, 1, 2, 5};
    zb_batch *b = NULL;
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, 6, &b));
    zb_batch_view v;
    ZB_ASSERT_OK(zb_batch_find(b, "obs/cell_type", &v));
    const int64_t want_codes[6] = {2, 0, 2, 2, -1, 1};
    for (size_t i = 0; i < 6; i++) assert_int_equal(code_at(&v, i), want_codes[i]);
    /* leiden: c0 -> 9, a0 -> 3, c2 -> 7, a1 -> 7, a2 -> 7, c1 -> 9 */
    ZB_ASSERT_OK(zb_batch_find(b, "obs/leiden", &v));
    const int64_t want_leiden_codes[6] = {2, 0, 1, 1, 1, 2};
    for (size_t i = 0; i < 6; i++) assert_int_equal(code_at(&v, i), want_leiden_codes[i]);
    zb_batch_free(b);

    /* whole columns read as batches carry them */
    size_t fi;
    ZB_ASSERT_OK(zb_dataset_find_field(ds, "obs/cell_type", &fi));
    zb_field_info info;
    ZB_ASSERT_OK(zb_dataset_field(ds, fi, &info));
    assert_int_equal(info.dtype, ZB_DT_INT8);
    int8_t col[7];
    ZB_ASSERT_OK(zb_dataset_read_field(ds, "obs/cell_type", 0, 7, col, sizeof col));
    const int8_t want_col[7] = {0, 2, -1, 0, 2, 1, 2};
    assert_memory_equal(col, want_col, sizeof col);
    ZB_ASSERT_ERR(zb_dataset_read_field(ds, "obs/cell_type", 0, 7, col, 6), ZB_E_INVALID, NULL);
    zb_dataset_close(ds);
}

/* Nullable values come with their mask; string columns are read across children with their
 * missing flags, and a column nullable in one child only is nullable in the collection. */
static void
test_nullable_and_strings_across_children(void **state)
{
    fixture *f = *state;
    zb_dataset *kids[2] = {f->c, f->a}; /* the first child's tag has no mask */
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ds = NULL;
    ZB_ASSERT_OK(zb_dataset_concat(kids, 2, &o, &ds));
    bool found = false;
    for (size_t i = 0; i < zb_dataset_ncolumns(ds); i++) {
        zb_column_info ci;
        ZB_ASSERT_OK(zb_dataset_column(ds, i, &ci));
        if (!strcmp(ci.name, "obs/tag")) {
            assert_int_equal(ci.kind, ZB_COLUMN_NULLABLE_STRINGS);
            found = true;
        }
        if (!strcmp(ci.name, "obs/count")) assert_int_equal(ci.kind, ZB_COLUMN_NULLABLE);
    }
    assert_true(found);

    zb_strings s;
    uint8_t missing[7];
    ZB_ASSERT_OK(zb_dataset_read_strings(ds, "obs/tag", 1, 7, &s, missing));
    const char *want[6] = {"q", "r", "x", "", "z", "w"};
    const uint8_t want_missing[6] = {0, 0, 0, 1, 0, 0};
    assert_int_equal(s.n, 6);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(s.offsets[i + 1] - s.offsets[i], strlen(want[i]));
        assert_memory_equal(s.data + s.offsets[i], want[i], strlen(want[i]));
    }
    assert_memory_equal(missing, want_missing, 6);
    zb_strings_free(&s);
    ZB_ASSERT_OK(zb_dataset_read_strings(ds, "obs_names", 2, 4, &s, NULL));
    assert_int_equal(s.n, 2);
    assert_memory_equal(s.data, "c2a0", 4);
    zb_strings_free(&s);

    const uint64_t ids[4] = {2, 4, 0, 6};
    zb_batch *b = NULL;
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, 4, &b));
    zb_batch_view v, m;
    ZB_ASSERT_OK(zb_batch_find(b, "obs/count", &v));
    ZB_ASSERT_OK(zb_batch_find(b, "obs/count/mask", &m));
    assert_int_equal(v.dtype, ZB_DT_INT32);
    const int32_t want_count[4] = {13, 0, 11, 9}; /* c2, a1 (missing), c0, a3 */
    const uint8_t want_mask[4] = {1, 1, 0, 0};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(((const uint8_t *)m.data)[i], want_mask[i]);
        if (!want_mask[i]) assert_int_equal(((const int32_t *)v.data)[i], want_count[i]);
    }
    zb_batch_free(b);
    zb_dataset_close(ds);
}

/* b's genes are a's in another order: refused naming both children and the first differing
 * position, or with reorder_vars delivered in a's order (CSR ids mapped, rows re-sorted). */
static void
test_var_order(void **state)
{
    fixture *f = *state;
    zb_dataset *kids[2] = {f->a, f->b};
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ds = NULL;
    ZB_ASSERT_ERR(zb_dataset_concat(kids, 2, &o, &ds), ZB_E_INVALID, "position 0 ('g0' and 'g2')");
    assert_true(zbt_mentions(zb_dataset_name(f->a)) && zbt_mentions(zb_dataset_name(f->b)));
    assert_null(ds);

    o.reorder_vars = true;
    ZB_ASSERT_OK(zb_dataset_concat(kids, 2, &o, &ds));
    const zb_strings *vars = NULL;
    ZB_ASSERT_OK(zb_dataset_var_names(ds, &vars));
    assert_int_equal(vars->n, 3);
    assert_memory_equal(vars->data, "g0g1g2", 6);
    /* b0 = {g2: 10, g0: 11} -> {0: 11, 2: 10}; b1 = {g1: 12} -> {1: 12}; a3 as stored */
    const uint64_t ids[3] = {4, 5, 3};
    zb_batch *b = NULL;
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, 3, &b));
    zb_batch_view d, x;
    ZB_ASSERT_OK(zb_batch_find(b, "X/data", &d));
    ZB_ASSERT_OK(zb_batch_find(b, "X/indices", &x));
    const int64_t want_ptr[4] = {0, 2, 3, 6};
    assert_memory_equal(d.ptr, want_ptr, sizeof want_ptr);
    const float want_data[6] = {11, 10, 12, 4, 5, 6};
    const int64_t want_ids[6] = {0, 2, 1, 0, 1, 2};
    assert_memory_equal(d.data, want_data, sizeof want_data);
    for (size_t i = 0; i < 6; i++) {
        int64_t id =
            x.dtype == ZB_DT_INT32 ? ((const int32_t *)x.data)[i] : ((const int64_t *)x.data)[i];
        assert_int_equal(id, want_ids[i]);
    }
    zb_batch_free(b);
    zb_dataset_close(ds);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes_mean_one_label),
        cmocka_unit_test(test_nullable_and_strings_across_children),
        cmocka_unit_test(test_var_order),
    };
    return ZBT_RUN_GROUP(tests, setup, teardown);
}
