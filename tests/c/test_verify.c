/* zb_verify (include/zbatch_verify.h) over memory stores built by zbatch's writers and then
 * damaged on purpose, and the write marker refusing opens (zb__tree_load and everything on it).
 * Each damaged store is checked for the exact problem: its key, its kind and its numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "write/write.h"
#include "zarr/tree.h"
#include "zbatch.h"
#include "zbatch_verify.h"

static zb_store *
memstore(void)
{
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    return s;
}

/* Writes a 1-d (row_len 0) or 2-d array of `rows` rows at `path`. */
static void
put_array(zb_store *s, const char *path, zb_dtype dt, uint64_t row_len, const void *data,
          uint64_t rows, uint64_t chunk_rows, uint64_t shard_rows)
{
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.chunk_rows = chunk_rows;
    o.shard_rows = shard_rows;
    zb_array_writer *w = NULL;
    uint64_t row_shape[1] = {row_len};
    ZB_ASSERT_OK(
        zb_array_writer_open(s, path, dt, row_len ? 2 : 1, row_len ? row_shape : NULL, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, data, rows));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
}

static void
put_i64(zb_store *s, const char *path, const int64_t *v, uint64_t n, uint64_t chunk_rows)
{
    put_array(s, path, ZB_DT_INT64, 0, v, n, chunk_rows, 0);
}

static void
put_bool(zb_store *s, const char *path, uint64_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    memset(b, 1, n);
    put_array(s, path, ZB_DT_BOOL, 0, b, n, 0, 0);
    free(b);
}

/* Replaces an array: its document goes, the writer puts a new one and new chunks. */
static void
drop_doc(zb_store *s, const char *path)
{
    char key[512];
    snprintf(key, sizeof key, "%s/zarr.json", path);
    ZB_ASSERT_OK(zb_store_erase(s, key));
}

static void
verify(zb_store *s, const char *path, zb_verify_report *r)
{
    ZB_ASSERT_OK(zb_verify(s, path, r));
}

/* The kept problem (not note) with this key, or fail. */
static const zb_verify_problem *
problem_at(const zb_verify_report *r, const char *key)
{
    for (size_t i = 0; i < r->n_kept; i++)
        if (r->problems[i].severity == ZB_VERIFY_PROBLEM && !strcmp(r->problems[i].key, key))
            return &r->problems[i];
    for (size_t i = 0; i < r->n_kept; i++)
        print_message("found: [%d] %s: %s\n", r->problems[i].severity, r->problems[i].key,
                      r->problems[i].message);
    fail_msg("no problem reported at '%s'", key);
    return NULL;
}

static void
assert_clean(const zb_verify_report *r)
{
    if (r->n_problems == 0) return;
    for (size_t i = 0; i < r->n_kept; i++)
        print_message("problem: %s: %s\n", r->problems[i].key, r->problems[i].message);
    fail_msg("%llu problems in a clean store", (unsigned long long)r->n_problems);
}

static void
assert_mentions(const zb_verify_problem *p, const char *needle)
{
    if (!strstr(p->message, needle))
        fail_msg("'%s: %s' does not mention '%s'", p->key, p->message, needle);
}

/* ---- the marker on open --------------------------------------------------------------- */

static void
test_marker_refuses_open(void **state)
{
    (void)state;
    zb_store *s = memstore();
    ZB_ASSERT_OK(zb__write_group(s, "", 3, NULL));
    int64_t v[4] = {1, 2, 3, 4};
    put_i64(s, "x", v, 4, 2);
    ZB_ASSERT_OK(zb__write_group(s, "d", 3, NULL));
    put_i64(s, "d/y", v, 4, 2);

    zbt_put_str(s, ZB_INCOMPLETE_MARKER, "{}");
    zb__tree *t = NULL;
    ZB_ASSERT_ERR(zb__tree_load(s, "", true, &t), ZB_E_INCOMPLETE, "a write was not committed");
    assert_null(t);
    ZB_ASSERT_ERR(zb__tree_load(s, "", false, &t), ZB_E_INCOMPLETE, ZB_INCOMPLETE_MARKER);
    char *json = NULL;
    ZB_ASSERT_ERR(zb_info_json(s, "", &json), ZB_E_INCOMPLETE, "incomplete");
    assert_null(json);
    zb_dataset *ds = NULL;
    ZB_ASSERT_ERR(zb_dataset_open(s, "", NULL, &ds), ZB_E_INCOMPLETE, "not committed");
    assert_null(ds);

    /* committed: the same store opens */
    ZB_ASSERT_OK(zb_store_erase(s, ZB_INCOMPLETE_MARKER));
    ZB_ASSERT_OK(zb__tree_load(s, "", true, &t));
    assert_int_equal(t->n, 4); /* "", "d", "d/y", "x" */
    zb__tree_free(t);

    /* the marker belongs to the path it sits at: a nested one refuses that path only */
    zbt_put_str(s, "d/" ZB_INCOMPLETE_MARKER, "{}");
    ZB_ASSERT_ERR(zb__tree_load(s, "d", true, &t), ZB_E_INCOMPLETE, "\"d\"");
    ZB_ASSERT_ERR(zb_info_json(s, "/d/", &json), ZB_E_INCOMPLETE, "d/" ZB_INCOMPLETE_MARKER);
    ZB_ASSERT_OK(zb__tree_load(s, "", true, &t));
    zb__tree_free(t);
    zb_store_close(s);
}

/* ---- verify: the marker --------------------------------------------------------------- */

static void
test_verify_incomplete(void **state)
{
    (void)state;
    zb_store *s = memstore();
    ZB_ASSERT_OK(zb__write_group(s, "", 3, NULL));
    int64_t v[3] = {0, 1, 2};
    put_i64(s, "x", v, 3, 0);
    zbt_put_str(s, ZB_INCOMPLETE_MARKER,
                "{\"writer\": \"zbatch 0.1.0\", \"layout\": \"anndata\", \"state\": \"writing\"}");
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    assert_true(r.incomplete);
    assert_int_equal(r.n_problems, 1);
    assert_int_equal(r.n_arrays, 0); /* nothing else is looked at */
    assert_int_equal(r.n_chunks, 0);
    const zb_verify_problem *p = problem_at(&r, ZB_INCOMPLETE_MARKER);
    assert_int_equal(p->status, ZB_E_INCOMPLETE);
    assert_mentions(p, "incomplete: a write was not committed (zbatch 0.1.0 anndata writer)");
    zb_verify_report_free(&r);
    assert_int_equal(r.n_kept, 0);
    assert_null(r.problems);
    assert_int_equal(r.max_problems, ZB_VERIFY_MAX_PROBLEMS_DEFAULT); /* options survive */

    /* a nested marker is one problem; the rest is still checked */
    ZB_ASSERT_OK(zb_store_erase(s, ZB_INCOMPLETE_MARKER));
    ZB_ASSERT_OK(zb__write_group(s, "sub", 3, NULL));
    zbt_put_str(s, "sub/" ZB_INCOMPLETE_MARKER, "not json");
    verify(s, "", &r);
    assert_false(r.incomplete);
    assert_int_equal(r.n_problems, 1);
    assert_int_equal(r.n_arrays, 1);
    assert_int_equal(r.n_chunks, 1);
    p = problem_at(&r, "sub/" ZB_INCOMPLETE_MARKER);
    assert_int_equal(p->status, ZB_E_INCOMPLETE);
    zb_verify_report_free(&r);
    zb_store_close(s);
}

/* ---- verify: metadata and chunks ------------------------------------------------------ */

static void
test_verify_clean_counts(void **state)
{
    (void)state;
    zb_store *s = memstore();
    ZB_ASSERT_OK(zb__write_group(s, "", 3, NULL));
    float f[10][3];
    for (int i = 0; i < 10; i++)
        for (int j = 0; j < 3; j++) f[i][j] = (float)(i * 3 + j);
    put_array(s, "a", ZB_DT_FLOAT32, 3, f, 10, 4, 0); /* 3 chunks */
    put_array(s, "b", ZB_DT_FLOAT32, 3, f, 10, 2, 4); /* 5 inner chunks in 3 shards */
    ZB_ASSERT_OK(zb__write_group(s, "g", 2, "{\"k\": 1}"));
    int64_t v[5] = {5, 4, 3, 2, 1};
    /* a v2 group inside a v3 store is not a node of it (FORMATS.md §1.1): nothing below it
     * is part of the tree */
    put_i64(s, "g/c", v, 5, 2);
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    assert_clean(&r);
    assert_int_equal(r.n_arrays, 2);
    assert_int_equal(r.n_chunks, 8);
    assert_int_equal(r.n_missing, 0); /* the last shard's empty entry lies past row 10 */
    zb_verify_report_free(&r);

    /* a deleted chunk reads as fill: not a problem, but counted */
    ZB_ASSERT_OK(zb_store_erase(s, "a/c/1/0"));
    verify(s, "", &r);
    assert_clean(&r);
    assert_int_equal(r.n_chunks, 7);
    assert_int_equal(r.n_missing, 1);
    zb_verify_report_free(&r);

    /* an elided all-fill inner chunk inside the array is an empty entry: fill, counted */
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.chunk_rows = 2;
    o.shard_rows = 4;
    o.write_empty_chunks = false;
    zb_array_writer *w = NULL;
    int64_t z[8] = {1, 2, 0, 0, 3, 4, 5, 6};
    ZB_ASSERT_OK(zb_array_writer_open(s, "z", ZB_DT_INT64, 1, NULL, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, z, 8));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    verify(s, "", &r);
    assert_clean(&r);
    assert_int_equal(r.n_arrays, 3);
    assert_int_equal(r.n_chunks, 7 + 3);
    assert_int_equal(r.n_missing, 2);
    zb_verify_report_free(&r);

    /* --metadata-only decodes nothing */
    r.metadata_only = true;
    verify(s, "", &r);
    assert_clean(&r);
    assert_int_equal(r.n_arrays, 3);
    assert_int_equal(r.n_chunks, 0);
    zb_verify_report_free(&r);
    zb_store_close(s);
}

static void
test_verify_corrupt_chunk(void **state)
{
    (void)state;
    zb_store *s = memstore();
    ZB_ASSERT_OK(zb__write_group(s, "", 3, NULL));
    int64_t v[12];
    for (int i = 0; i < 12; i++) v[i] = i * 7;
    put_i64(s, "x", v, 12, 4);
    /* garbage where the zstd frame of chunk 1 was */
    zbt_put_str(s, "x/c/1", "this is not a zstd frame");
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    assert_int_equal(r.n_chunks, 3); /* the chunks after it are still checked */
    const zb_verify_problem *p = problem_at(&r, "x/c/1");
    assert_int_equal(p->status, ZB_E_CORRUPT);
    assert_null(strstr(p->message, "x/c/1: ")); /* the key is not repeated in the message */
    zb_verify_report_free(&r);

    /* two broken chunks, a cap of one: one kept, both counted */
    zbt_put_str(s, "x/c/2", "neither is this");
    r.max_problems = 1;
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 2);
    assert_int_equal(r.n_kept, 1);
    assert_string_equal(r.problems[0].key, "x/c/1");
    zb_verify_report_free(&r);

    /* a malformed array document is a problem naming it; the tree still loads */
    r.max_problems = 0;
    zbt_put_str(s, "x/zarr.json",
                "{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [-1]}");
    verify(s, "", &r);
    p = problem_at(&r, "x/zarr.json");
    assert_int_equal(p->status, ZB_E_METADATA);
    assert_int_equal(r.n_arrays, 1);
    assert_int_equal(r.n_chunks, 0);
    zb_verify_report_free(&r);

    /* JSON that does not parse stops the tree: one problem naming the document */
    zbt_put_str(s, "x/zarr.json", "{\"zarr_format\": 3,");
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    p = problem_at(&r, "x/zarr.json");
    assert_int_equal(p->status, ZB_E_JSON);
    assert_mentions(p, "malformed JSON at byte");
    zb_verify_report_free(&r);

    /* nothing at the path */
    verify(s, "nowhere", &r);
    assert_int_equal(r.n_problems, 1);
    assert_int_equal(r.problems[0].status, ZB_E_NOTFOUND);
    assert_string_equal(r.problems[0].key, "nowhere");
    zb_verify_report_free(&r);
    zb_store_close(s);
}

static void
test_verify_truncated_shard(void **state)
{
    (void)state;
    zb_store *s = memstore();
    ZB_ASSERT_OK(zb__write_group(s, "", 3, NULL));
    int64_t v[40];
    for (int i = 0; i < 40; i++) v[i] = 1000 - i;
    put_array(s, "x", ZB_DT_INT64, 0, v, 40, 5, 20); /* 2 shards of 4 inner chunks */
    uint8_t *data = NULL;
    uint64_t len = 0;
    ZB_ASSERT_OK(zb_store_read_all(s, "x/c/1", &data, &len));
    assert_true(len > 30);
    /* a shard cut short, as a killed copy leaves it: the index is no longer at the end */
    ZB_ASSERT_OK(zb_store_put(s, "x/c/1", data, len - 30));
    free(data);
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    const zb_verify_problem *p = problem_at(&r, "x/c/1");
    assert_int_equal(p->status, ZB_E_CHECKSUM);
    assert_mentions(p, "shard index");
    assert_int_equal(r.n_chunks, 4); /* shard 0's inner chunks */
    zb_verify_report_free(&r);

    /* shorter than its index */
    ZB_ASSERT_OK(zb_store_put(s, "x/c/1", "abc", 3));
    verify(s, "", &r);
    p = problem_at(&r, "x/c/1");
    assert_int_equal(p->status, ZB_E_TRUNCATED);
    zb_verify_report_free(&r);
    zb_store_close(s);
}

/* ---- verify: anndata CSR -------------------------------------------------------------- */

#define N_OBS 5
#define N_VARS 4
static const int64_t INDPTR[N_OBS + 1] = {0, 2, 2, 5, 6, 8};
static const int32_t INDICES[8] = {0, 3, 1, 2, 3, 0, 1, 2};
static const float DATA[8] = {1, 2, 3, 4, 5, 6, 7, 8};

static zb_store *
anndata_store(int zarr_format)
{
    zb_store *s = memstore();
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.zarr_format = zarr_format;
    o.x_chunk = 3;
    o.column_chunk = 4;
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "", N_VARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w));
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, N_OBS, INDPTR, INDICES, DATA));
    int32_t n_genes[N_OBS] = {2, 0, 3, 1, 2};
    ZB_ASSERT_OK(
        zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "n_genes", ZB_DT_INT32, n_genes, N_OBS));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
    return s;
}

static void
test_verify_anndata_clean(void **state)
{
    (void)state;
    for (int fmt = 2; fmt <= 3; fmt++) {
        zb_store *s = anndata_store(fmt);
        zb_verify_report r = ZB_VERIFY_REPORT_INIT;
        verify(s, "", &r);
        assert_clean(&r);
        /* X/data, X/indices, X/indptr, obs/_index, obs/n_genes, var/_index */
        assert_int_equal(r.n_arrays, 6);
        assert_int_equal(r.n_chunks, 3 + 3 + 2 + 2 + 2 + 1);
        zb_verify_report_free(&r);
        zb_store_close(s);
    }
}

static void
test_verify_csr_pointers(void **state)
{
    (void)state;
    zb_store *s = anndata_store(3);
    /* indptr rewritten with the same shape and chunks (the consolidated snapshot still
     * matches), but row 2 ends before it starts */
    int64_t bad[N_OBS + 1] = {0, 2, 6, 5, 6, 8};
    drop_doc(s, "X/indptr");
    put_i64(s, "X/indptr", bad, N_OBS + 1, 4);
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    const zb_verify_problem *p = problem_at(&r, "X/indptr");
    assert_int_equal(p->status, ZB_E_CORRUPT);
    assert_mentions(p, "not monotone: decreases at 1 position, first at row 2: [2] = 6 > [3] = 5");
    zb_verify_report_free(&r);

    /* an indptr that starts at 1 and ends past data, and a column id >= n_vars */
    int64_t off[N_OBS + 1] = {1, 2, 2, 5, 6, 9};
    drop_doc(s, "X/indptr");
    put_i64(s, "X/indptr", off, N_OBS + 1, 4);
    int32_t idx[8] = {0, 3, 1, 2, 3, 0, 4, 2};
    drop_doc(s, "X/indices");
    put_array(s, "X/indices", ZB_DT_INT32, 0, idx, 8, 3, 0);
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 3);
    bool start = false, end = false;
    for (size_t i = 0; i < r.n_kept; i++) {
        if (strcmp(r.problems[i].key, "X/indptr")) continue;
        start = start || strstr(r.problems[i].message, "starts at 1, not 0");
        end = end || strstr(r.problems[i].message, "ends at 9, but X/data has 8 elements");
    }
    assert_true(start && end);
    p = problem_at(&r, "X/indices");
    assert_mentions(p, "1 column ids outside [0, 4) (n_vars), first at element 6: 4");
    zb_verify_report_free(&r);

    /* an indptr one entry short: a length problem (and a stale snapshot, since the
     * consolidated metadata still says 6 entries) */
    drop_doc(s, "X/indptr");
    put_i64(s, "X/indptr", INDPTR, N_OBS, 4);
    verify(s, "", &r);
    p = problem_at(&r, "X/indptr");
    assert_mentions(p, "5 entries, but shape [5, 4] needs 6 (n_obs + 1)");
    p = problem_at(&r, "X/indptr/zarr.json");
    assert_mentions(p, "shape [5], but the consolidated metadata says [6]");
    zb_verify_report_free(&r);
    zb_store_close(s);
}

static void
test_verify_dataframe_lengths(void **state)
{
    (void)state;
    zb_store *s = anndata_store(2);
    int32_t six[6] = {1, 2, 3, 4, 5, 6};
    ZB_ASSERT_OK(zb_store_erase(s, "obs/n_genes/.zarray"));
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.zarr_format = 2;
    o.chunk_rows = 4;
    zb_array_writer *w = NULL;
    ZB_ASSERT_OK(zb_array_writer_open(s, "obs/n_genes", ZB_DT_INT32, 1, NULL, &o, &w));
    ZB_ASSERT_OK(zb_array_writer_append(w, six, 6));
    ZB_ASSERT_OK(zb_array_writer_commit(w));
    zb_array_writer_close(w);
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    const zb_verify_problem *p = problem_at(&r, "obs/n_genes");
    assert_mentions(p, "6 rows, but the dataframe index has 5");
    zb_verify_report_free(&r);
    zb_store_close(s);
}

/* ---- verify: AtomicData --------------------------------------------------------------- */

/* Two samples: 3 + 2 atoms, 2 + 1 edges, store-global edge indices. */
static zb_store *
atomic_store(const int64_t *nl)
{
    zb_store *s = memstore();
    ZB_ASSERT_OK(zb__write_group(s, "", 3,
                                 "{\"num_samples\": 2, \"fields\": {\"core\": {\"positions\": "
                                 "\"atom\", \"neighbor_list\": \"edge\", \"energy\": "
                                 "\"system\"}, \"custom\": {}}}"));
    ZB_ASSERT_OK(zb__write_group(s, "meta", 3, NULL));
    ZB_ASSERT_OK(zb__write_group(s, "core", 3, NULL));
    int64_t aptr[3] = {0, 3, 5}, eptr[3] = {0, 2, 3};
    put_i64(s, "meta/atoms_ptr", aptr, 3, 2);
    put_i64(s, "meta/edges_ptr", eptr, 3, 2);
    put_bool(s, "meta/samples_mask", 2);
    put_bool(s, "meta/atoms_mask", 5);
    put_bool(s, "meta/edges_mask", 3);
    float pos[6][3] = {{0}};
    put_array(s, "core/positions", ZB_DT_FLOAT32, 3, pos, 5, 2, 0);
    static const int64_t numbers[5] = {8, 1, 1, 6, 6};
    put_array(s, "core/atomic_numbers", ZB_DT_INT64, 0, numbers, 5, 2, 0);
    static const int64_t global[3][2] = {{0, 1}, {1, 2}, {3, 4}};
    put_array(s, "core/neighbor_list", ZB_DT_INT64, 2, nl ? nl : &global[0][0], 3, 2, 0);
    double energy[2] = {-1.5, -2.5};
    put_array(s, "core/energy", ZB_DT_FLOAT64, 0, energy, 2, 0, 0);
    return s;
}

static void
test_verify_atomic(void **state)
{
    (void)state;
    zb_store *s = atomic_store(NULL);
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    assert_clean(&r);
    assert_int_equal(r.n_notes, 0);
    assert_int_equal(r.n_arrays, 9);
    zb_verify_report_free(&r);

    /* arrays missing from `fields` (FORMATS.md §8.1): the key sets, else atom-level in core;
     * system-level in custom */
    double two[5] = {1, 2, 3, 4, 5};
    put_array(s, "core/stress", ZB_DT_FLOAT64, 0, two, 2, 0, 0);
    put_array(s, "core/charges_ref", ZB_DT_FLOAT64, 0, two, 5, 0, 0);
    ZB_ASSERT_OK(zb__write_group(s, "custom", 3, NULL));
    put_array(s, "custom/label", ZB_DT_FLOAT64, 0, two, 2, 0, 0);
    verify(s, "", &r);
    assert_clean(&r);
    assert_int_equal(r.n_arrays, 12);
    zb_verify_report_free(&r);
    drop_doc(s, "core/charges_ref");
    put_array(s, "core/charges_ref", ZB_DT_FLOAT64, 0, two, 2, 0, 0);
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    assert_mentions(problem_at(&r, "core/charges_ref"),
                    "2 rows, but the committed samples need 5 (atoms_ptr[N])");
    zb_verify_report_free(&r);
    zb_store_close(s);

    /* an nvalchemi-style append: the second sample's edge holds local indices */
    static const int64_t local[3][2] = {{0, 1}, {1, 2}, {0, 1}};
    s = atomic_store(&local[0][0]);
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    const zb_verify_problem *p = problem_at(&r, "core/neighbor_list");
    assert_mentions(p, "2 atom indices outside their sample, first at edge 2 (sample 1): 0 not "
                       "in [3, 5)");
    zb_verify_report_free(&r);

    /* pointers that decrease, a mask and a system array too short */
    int64_t aptr[3] = {0, 3, 2};
    drop_doc(s, "meta/atoms_ptr");
    put_i64(s, "meta/atoms_ptr", aptr, 3, 2);
    drop_doc(s, "meta/samples_mask");
    put_bool(s, "meta/samples_mask", 1);
    double one = 0;
    drop_doc(s, "core/energy");
    put_array(s, "core/energy", ZB_DT_FLOAT64, 0, &one, 1, 0, 0);
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 3);
    p = problem_at(&r, "meta/atoms_ptr");
    assert_mentions(p, "first at sample 1: [1] = 3 > [2] = 2");
    p = problem_at(&r, "meta/samples_mask");
    assert_mentions(p, "1 rows, but the committed samples need 2 (num_samples)");
    p = problem_at(&r, "core/energy");
    assert_mentions(p, "1 rows, but the committed samples need 2");
    zb_verify_report_free(&r);
    zb_store_close(s);
}

/* The rules the reader applies at open (layouts.c), reported by verify too: core/positions
 * and core/atomic_numbers exist with their shapes, the fields attribute gives known levels,
 * and samples_mask exists; a mask longer than num_samples is what both readers count (a note),
 * and a fields entry without an array is a note. */
static void
test_verify_atomic_required(void **state)
{
    (void)state;
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    zb_store *s = atomic_store(NULL);
    drop_doc(s, "core/positions");
    verify(s, "", &r);
    assert_mentions(problem_at(&r, "/"), "core/positions is missing: every AtomicData store "
                                         "holds core/positions ([atoms, 3] floats)");
    zb_verify_report_free(&r);
    float pos2[5][2] = {{0}};
    put_array(s, "core/positions", ZB_DT_FLOAT32, 2, pos2, 5, 2, 0);
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    assert_mentions(problem_at(&r, "/"), "core/positions is float32 of shape [5, 2]; it must "
                                         "be [atoms, 3] floats");
    zb_verify_report_free(&r);
    zb_store_close(s);

    s = atomic_store(NULL);
    drop_doc(s, "core/atomic_numbers");
    float z[5] = {8, 1, 1, 6, 6};
    put_array(s, "core/atomic_numbers", ZB_DT_FLOAT32, 0, z, 5, 2, 0);
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    assert_mentions(problem_at(&r, "/"), "core/atomic_numbers is float32 of shape [5]; it must "
                                         "be [atoms] integers");
    zb_verify_report_free(&r);
    drop_doc(s, "meta/samples_mask");
    verify(s, "", &r);
    assert_mentions(problem_at(&r, "meta/samples_mask"), "missing");
    zb_verify_report_free(&r);
    zb_store_close(s);

    s = atomic_store(NULL);
    ZB_ASSERT_OK(zb__write_group(s, "", 3,
                                 "{\"num_samples\": 2, \"fields\": {\"core\": {\"positions\": "
                                 "\"atom\", \"energy\": \"graph\"}}}"));
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    assert_mentions(problem_at(&r, "/"), "fields.core.energy is \"graph\", not \"atom\"");
    zb_verify_report_free(&r);
    ZB_ASSERT_OK(zb__write_group(s, "", 3,
                                 "{\"num_samples\": 1, \"fields\": {\"core\": {}, "
                                 "\"custom\": {\"charges_ref\": \"atom\"}}}"));
    verify(s, "", &r);
    assert_clean(&r);
    bool mask_note = false, fields_note = false;
    for (size_t i = 0; i < r.n_kept; i++) {
        const zb_verify_problem *p = &r.problems[i];
        mask_note = mask_note || (!strcmp(p->key, "meta/samples_mask") &&
                                  strstr(p->message, "2 samples, num_samples says 1: nvalchemi "
                                                     "and zbatch read the 2"));
        fields_note = fields_note || (!strcmp(p->key, "custom/charges_ref") &&
                                      strstr(p->message, "no such array"));
    }
    assert_true(mask_note);
    assert_true(fields_note);
    zb_verify_report_free(&r);
    zb_store_close(s);
}

/* An interrupted append leaves arrays longer than num_samples needs: notes, not problems. */
static void
test_verify_atomic_tail(void **state)
{
    (void)state;
    zb_store *s = atomic_store(NULL);
    float pos[7][3] = {{0}};
    drop_doc(s, "core/positions");
    put_array(s, "core/positions", ZB_DT_FLOAT32, 3, pos, 7, 2, 0);
    int64_t aptr[4] = {0, 3, 5, 7};
    drop_doc(s, "meta/atoms_ptr");
    put_i64(s, "meta/atoms_ptr", aptr, 4, 2);
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    assert_clean(&r);
    assert_int_equal(r.n_notes, 2);
    bool tail = false;
    for (size_t i = 0; i < r.n_kept; i++)
        tail = tail || (!strcmp(r.problems[i].key, "core/positions") &&
                        strstr(r.problems[i].message, "2 rows past the committed 5"));
    assert_true(tail);
    zb_verify_report_free(&r);

    /* without num_samples nothing bounds the samples */
    ZB_ASSERT_OK(zb__write_group(s, "", 3, "{\"fields\": {\"core\": {}}}"));
    verify(s, "", &r);
    const zb_verify_problem *p = problem_at(&r, "/");
    assert_mentions(p, "num_samples");
    zb_verify_report_free(&r);
    zb_store_close(s);
}

/* Pointer and index arrays spanning many value blocks (65,536 values, rounded to whole
 * chunks): the walk over samples crosses block edges. */
static void
test_verify_atomic_many_blocks(void **state)
{
    (void)state;
    enum { N = 70000 };
    int64_t *aptr = malloc((N + 1) * sizeof *aptr), *eptr = malloc((N + 1) * sizeof *eptr);
    int64_t *nl = malloc(2 * (size_t)N * 2 * sizeof *nl);
    assert_true(aptr && eptr && nl);
    aptr[0] = eptr[0] = 0;
    size_t e = 0;
    for (int64_t p = 0; p < N; p++) {
        aptr[p + 1] = aptr[p] + 1 + p % 3;
        int64_t edges = p % 5 == 0 ? 2 : 1;
        for (int64_t k = 0; k < edges; k++) {
            nl[2 * e] = aptr[p];             /* the sample's first atom ... */
            nl[2 * e + 1] = aptr[p + 1] - 1; /* ... and its last */
            e++;
        }
        eptr[p + 1] = (int64_t)e;
    }
    zb_store *s = memstore();
    char attrs[200];
    snprintf(attrs, sizeof attrs, "{\"num_samples\": %d, \"fields\": {\"core\": {}}}", N);
    ZB_ASSERT_OK(zb__write_group(s, "", 3, attrs));
    ZB_ASSERT_OK(zb__write_group(s, "meta", 3, NULL));
    ZB_ASSERT_OK(zb__write_group(s, "core", 3, NULL));
    put_i64(s, "meta/atoms_ptr", aptr, N + 1, 1000);
    put_i64(s, "meta/edges_ptr", eptr, N + 1, 1000);
    put_bool(s, "meta/samples_mask", N);
    put_array(s, "core/neighbor_list", ZB_DT_INT64, 2, nl, e, 3000, 0);
    int64_t *zs = calloc((size_t)aptr[N], 3 * sizeof *zs);
    assert_non_null(zs);
    put_array(s, "core/atomic_numbers", ZB_DT_INT64, 0, zs, (uint64_t)aptr[N], 65536, 0);
    put_array(s, "core/positions", ZB_DT_FLOAT64, 3, zs, (uint64_t)aptr[N], 65536, 0);
    free(zs);
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    verify(s, "", &r);
    assert_clean(&r);
    zb_verify_report_free(&r);

    /* sample 68,000's second index points at the last atom of sample 67,999 */
    size_t bad_edge = (size_t)eptr[68000];
    nl[2 * bad_edge + 1] = aptr[68000] - 1;
    drop_doc(s, "core/neighbor_list");
    put_array(s, "core/neighbor_list", ZB_DT_INT64, 2, nl, e, 3000, 0);
    verify(s, "", &r);
    assert_int_equal(r.n_problems, 1);
    char want[200];
    snprintf(want, sizeof want,
             "1 atom indices outside their sample, first at edge %zu (sample 68000): %lld not in "
             "[%lld, %lld)",
             bad_edge, (long long)(aptr[68000] - 1), (long long)aptr[68000],
             (long long)aptr[68001]);
    assert_mentions(problem_at(&r, "core/neighbor_list"), want);
    zb_verify_report_free(&r);

    /* a decrease right across a block edge (blocks of 66,000 entries at 1,000 per chunk) */
    aptr[66000] = aptr[65999] - 1;
    drop_doc(s, "meta/atoms_ptr");
    put_i64(s, "meta/atoms_ptr", aptr, N + 1, 1000);
    verify(s, "", &r);
    snprintf(want, sizeof want,
             "decreases at 1 position, first at sample 65999: [65999] = %lld > "
             "[66000] = %lld",
             (long long)aptr[65999], (long long)aptr[66000]);
    assert_mentions(problem_at(&r, "meta/atoms_ptr"), want);
    zb_verify_report_free(&r);
    zb_store_close(s);
    free(aptr);
    free(eptr);
    free(nl);
}

static void
test_verify_args(void **state)
{
    (void)state;
    zb_store *s = memstore();
    zb_verify_report r = ZB_VERIFY_REPORT_INIT;
    ZB_ASSERT_ERR(zb_verify(NULL, "", &r), ZB_E_INVALID, "null store");
    ZB_ASSERT_ERR(zb_verify(s, "", NULL), ZB_E_INVALID, "null report");
    ZB_ASSERT_ERR(zb_verify(s, "a/../b", &r), ZB_E_BADKEY, NULL);
    zb_verify_report_free(NULL);
    zb_verify_report_free(&r);
    zb_store_close(s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_marker_refuses_open),
        cmocka_unit_test(test_verify_incomplete),
        cmocka_unit_test(test_verify_clean_counts),
        cmocka_unit_test(test_verify_corrupt_chunk),
        cmocka_unit_test(test_verify_truncated_shard),
        cmocka_unit_test(test_verify_anndata_clean),
        cmocka_unit_test(test_verify_csr_pointers),
        cmocka_unit_test(test_verify_dataframe_lengths),
        cmocka_unit_test(test_verify_atomic),
        cmocka_unit_test(test_verify_atomic_tail),
        cmocka_unit_test(test_verify_atomic_required),
        cmocka_unit_test(test_verify_atomic_many_blocks),
        cmocka_unit_test(test_verify_args),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
