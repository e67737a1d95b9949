/* zb_convert_run end to end, in C (so the engine also runs under ASan and UBSan): two anndata
 * Zarr inputs written by zbatch's anndata writer from values this test generates (different
 * gene lists, different category tables), converted with a small memory budget, read back
 * through zbatch's dataset reader, and every output cell compared with the generated input
 * cell its src_path / src_row name, gene by gene. Then restart and refusal behaviour. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/testutil.h"

#define N_GENES 12

typedef struct input {
    uint64_t n;
    const char *genes[N_GENES];
    size_t n_genes;
    float *dense; /* [n][n_genes], the truth */
    const char *cats[3];
    size_t n_cats;
    int32_t *codes; /* [n] */
} input;

static uint64_t
rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void
fill_input(input *in, uint64_t seed)
{
    in->dense = calloc(in->n * in->n_genes, sizeof *in->dense);
    in->codes = calloc(in->n, sizeof *in->codes);
    for (uint64_t r = 0; r < in->n; r++) {
        for (size_t g = 0; g < in->n_genes; g++)
            if (rnd(&seed) % 3 == 0) in->dense[r * in->n_genes + g] = (float)(1 + rnd(&seed) % 50);
        in->codes[r] = (int32_t)(rnd(&seed) % in->n_cats);
    }
}

static void
pack(const char *const *names, size_t n, char *data, uint64_t *offsets)
{
    offsets[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(names[i]);
        memcpy(data + offsets[i], names[i], l);
        offsets[i + 1] = offsets[i] + l;
    }
}

static void
write_input(const char *path, const input *in)
{
    zb_store *s;
    mkdir(path, 0777);
    ZB_ASSERT_OK(zb_store_open_file(path, &s));
    zb_anndata_writer *w;
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.x_chunk = 64;
    ZB_ASSERT_OK(
        zb_anndata_writer_open(s, "", in->n_genes, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w));
    int64_t *indptr = malloc((in->n + 1) * sizeof *indptr);
    int32_t *idx = malloc(in->n * in->n_genes * sizeof *idx);
    float *data = malloc(in->n * in->n_genes * sizeof *data);
    uint64_t k = 0;
    indptr[0] = 0;
    for (uint64_t r = 0; r < in->n; r++) {
        for (size_t g = 0; g < in->n_genes; g++)
            if (in->dense[r * in->n_genes + g] != 0) {
                idx[k] = (int32_t)g;
                data[k++] = in->dense[r * in->n_genes + g];
            }
        indptr[r + 1] = (int64_t)k;
    }
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, in->n, indptr, idx, data));
    char buf[256];
    uint64_t off[N_GENES + 1];
    pack(in->genes, in->n_genes, buf, off);
    ZB_ASSERT_OK(zb_anndata_writer_append_names(w, ZB_ANNDATA_VAR, buf, off, in->n_genes));
    pack(in->cats, in->n_cats, buf, off);
    ZB_ASSERT_OK(
        zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "ct", buf, off, in->n_cats, false));
    ZB_ASSERT_OK(
        zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "ct", ZB_DT_INT32, in->codes, in->n));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
    zb_store_close(s);
    free(indptr);
    free(idx);
    free(data);
}

static int
find(const char *const *names, size_t n, const char *s, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(names[i]) == len && !memcmp(names[i], s, len)) return (int)i;
    return -1;
}

/* Every output cell against its input cell; every input cell seen once. */
static void
check_output(const char *out, input *ins, const char *const *paths)
{
    zb_store *s;
    zb_dataset *ds;
    ZB_ASSERT_OK(zb_store_open_file(out, &s));
    ZB_ASSERT_OK(zb_dataset_open(s, "", NULL, &ds));
    uint64_t n;
    ZB_ASSERT_OK(zb_dataset_len(ds, &n));
    assert_int_equal(n, ins[0].n + ins[1].n);
    assert_int_equal(zb_dataset_nchildren(ds), (n + 49) / 50);
    uint64_t *ids = malloc(n * sizeof *ids);
    for (uint64_t i = 0; i < n; i++) ids[i] = i;
    zb_batch *b;
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, n, &b));
    zb_batch_view data, indices, src_path, src_row, ct;
    ZB_ASSERT_OK(zb_batch_find(b, "X/data", &data));
    ZB_ASSERT_OK(zb_batch_find(b, "X/indices", &indices));
    ZB_ASSERT_OK(zb_batch_find(b, "obs/src_path", &src_path));
    ZB_ASSERT_OK(zb_batch_find(b, "obs/src_row", &src_row));
    ZB_ASSERT_OK(zb_batch_find(b, "obs/ct", &ct));
    const zb_strings *paths_t, *cats;
    ZB_ASSERT_OK(zb_dataset_categories(ds, "obs/src_path", &paths_t));
    ZB_ASSERT_OK(zb_dataset_categories(ds, "obs/ct", &cats));
    /* the output's genes: the sorted union; its categories: the sorted union */
    static const char *const genes[] = {"A1", "B2", "C3",  "D4",  "E5",  "F6",  "G7",
                                        "H8", "I9", "J10", "K11", "L12", "M13", "N14"};
    static const char *const want_cats[] = {"B", "NK", "T", "mono"};
    assert_int_equal(zb_dataset_n_vars(ds), 14);
    assert_int_equal(cats->n, 4);
    for (size_t c = 0; c < 4; c++)
        assert_int_equal(find(want_cats, 4, cats->data + cats->offsets[c],
                              cats->offsets[c + 1] - cats->offsets[c]),
                         (int)c);
    assert_int_equal(paths_t->n, 2);
    uint8_t *seen[2] = {calloc(ins[0].n, 1), calloc(ins[1].n, 1)};
    const int64_t *ptr = data.ptr;
    for (uint64_t i = 0; i < n; i++) {
        int k = (int)((const int8_t *)src_path.data)[i];
        int64_t row = ((const int64_t *)src_row.data)[i];
        assert_true(k == 0 || k == 1);
        const char *p = paths_t->data + paths_t->offsets[k];
        assert_int_equal(strncmp(p, paths[k], paths_t->offsets[k + 1] - paths_t->offsets[k]), 0);
        assert_true(row >= 0 && (uint64_t)row < ins[k].n);
        assert_int_equal(seen[k][row]++, 0);
        const input *in = &ins[k];
        float dense[14] = {0};
        for (int64_t e = ptr[i]; e < ptr[i + 1]; e++)
            dense[((const int32_t *)indices.data)[e]] = ((const float *)data.data)[e];
        for (size_t g = 0; g < 14; g++) {
            int j = find(in->genes, in->n_genes, genes[g], strlen(genes[g]));
            float want = j < 0 ? 0.0f : in->dense[(uint64_t)row * in->n_genes + (size_t)j];
            if (dense[g] != want)
                fail_msg("cell %llu (input %d row %lld) gene %s: %g, want %g",
                         (unsigned long long)i, k, (long long)row, genes[g], dense[g], want);
        }
        int8_t code = ((const int8_t *)ct.data)[i];
        const char *label = in->cats[in->codes[row]];
        assert_int_equal(find(want_cats, 4, label, strlen(label)), code);
    }
    for (int k = 0; k < 2; k++)
        for (uint64_t r = 0; r < ins[k].n; r++) assert_int_equal(seen[k][r], 1);
    free(seen[0]);
    free(seen[1]);
    free(ids);
    zb_batch_free(b);
    zb_dataset_close(ds);
    zb_store_close(s);
}

static input ins[2] = {
    {137,
     {"A1", "C3", "B2", "D4", "E5", "F6", "G7", "H8", "I9", "J10"},
     10,
     NULL,
     {"B", "T", "NK"},
     3,
     NULL},
    {91,
     {"N14", "M13", "L12", "K11", "J10", "I9", "H8", "G7", "F6", "E5", "D4", "C3"},
     12,
     NULL,
     {"T", "mono"},
     2,
     NULL},
};

static int
setup(void **state)
{
    (void)state;
    fill_input(&ins[0], 1);
    fill_input(&ins[1], 2);
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        free(ins[k].dense);
        free(ins[k].codes);
    }
    return 0;
}

/* Bytes of every file below dir, compared with those below other. */
static void
assert_same_tree(const char *a, const char *b)
{
    DIR *d = opendir(a);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        char pa[2048], pb[2048];
        snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
        struct stat sa, sb;
        assert_int_equal(stat(pa, &sa), 0);
        if (stat(pb, &sb) != 0) fail_msg("%s is missing", pb);
        if (S_ISDIR(sa.st_mode)) {
            assert_same_tree(pa, pb);
            continue;
        }
        assert_int_equal(sa.st_size, sb.st_size);
        FILE *fa = fopen(pa, "rb"), *fb = fopen(pb, "rb");
        char *x = malloc((size_t)sa.st_size + 1), *y = malloc((size_t)sa.st_size + 1);
        assert_int_equal(fread(x, 1, (size_t)sa.st_size, fa), (size_t)sa.st_size);
        assert_int_equal(fread(y, 1, (size_t)sa.st_size, fb), (size_t)sa.st_size);
        if (memcmp(x, y, (size_t)sa.st_size)) fail_msg("%s and %s differ", pa, pb);
        free(x);
        free(y);
        fclose(fa);
        fclose(fb);
    }
    closedir(d);
}

/* The whole of a small file (NUL-terminated), or NULL. */
static char *
slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1 << 16, 1);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The manifest records `want` (a fragment of its "dtypes"), and every dataset's X/data and
 * X/indices metadata name the types. */
static void
assert_stored(const char *out, const char *want, const char *data, const char *indices)
{
    char path[2048], needle[64];
    snprintf(path, sizeof path, "%s/zbatch-manifest.json", out);
    char *m = slurp(path);
    assert_non_null(m);
    if (!strstr(m, want)) fail_msg("the manifest lacks %s:\n%s", want, m);
    free(m);
    for (int d = 0; d < 5; d++) {
        static const char *const arrays[2] = {"data", "indices"};
        for (int a = 0; a < 2; a++) {
            snprintf(path, sizeof path, "%s/dataset_%d/X/%s/zarr.json", out, d, arrays[a]);
            char *doc = slurp(path);
            assert_non_null(doc);
            snprintf(needle, sizeof needle, "\"data_type\": \"%s\"", a ? indices : data);
            if (!strstr(doc, needle)) fail_msg("%s lacks %s", path, needle);
            free(doc);
        }
    }
}

static void
test_convert_and_restart(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("convert_run");
    char p0[1024], p1[1024], out[1024], out2[1024];
    snprintf(p0, sizeof p0, "%s/a.zarr", dir);
    snprintf(p1, sizeof p1, "%s/b.zarr", dir);
    snprintf(out, sizeof out, "%s/out.zarr", dir);
    snprintf(out2, sizeof out2, "%s/out2.zarr", dir);
    write_input(p0, &ins[0]);
    write_input(p1, &ins[1]);
    const char *paths[2] = {p0, p1};
    zb_convert_opts o = ZB_CONVERT_OPTS_DEFAULT;
    o.dataset_size = 50;
    o.memory_bytes = ZB_CONVERT_MIN_MEMORY;
    o.num_threads = 2;
    o.x_chunk = 64;
    o.seed = 3;
    ZB_ASSERT_OK(zb_convert_run(paths, 2, out, &o));
    check_output(out, ins, paths);
    assert_stored(out, "\"X/data\": \"uint8\"", "uint8", "uint8"); /* counts 1..50 */
    /* run the same again: verified against its manifest, left as it is */
    ZB_ASSERT_OK(zb_convert_run(paths, 2, out, &o));

    /* interrupted by hand: the plan, the first input's prepare and scatter tasks, one gather;
     * the handle closed (as a killed process leaves it); then run to the end */
    zb_convert *cv;
    o.num_threads = 1;
    ZB_ASSERT_OK(zb_convert_plan(paths, 2, out2, &o, &cv));
    ZB_ASSERT_OK(zb_convert_run_task(cv, ZB_CONVERT_PREPARE, 0, 1));
    ZB_ASSERT_ERR(zb_convert_run_task(cv, ZB_CONVERT_SCATTER, 0, 1), ZB_E_INVALID,
                  "previous phase");
    ZB_ASSERT_OK(zb_convert_run_task(cv, ZB_CONVERT_PREPARE, 1, 1));
    ZB_ASSERT_OK(zb_convert_run_task(cv, ZB_CONVERT_SCATTER, 0, 1));
    assert_true(zb_convert_task_done(cv, ZB_CONVERT_SCATTER, 0));
    zb_convert_close(cv);
    /* another seed is another conversion: refused, naming it */
    o.seed = 4;
    ZB_ASSERT_ERR(zb_convert_run(paths, 2, out2, &o), ZB_E_INVALID, "seed");
    o.seed = 3;
    o.num_threads = 2;
    ZB_ASSERT_OK(zb_convert_run(paths, 2, out2, &o));
    assert_same_tree(out, out2);
}

/* The stored types: the narrowest exact one over the whole input (one value of 300 in one
 * input makes every dataset uint16), an explicit uint8 refused for it, keep and int32. */
static void
test_stored_types(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("convert_types");
    char p0[1024], p1[1024], out[1024];
    snprintf(p0, sizeof p0, "%s/a.zarr", dir);
    snprintf(p1, sizeof p1, "%s/b.zarr", dir);
    input big[2] = {ins[0], ins[1]};
    size_t cells = big[1].n * big[1].n_genes;
    big[1].dense = malloc(cells * sizeof *big[1].dense);
    memcpy(big[1].dense, ins[1].dense, cells * sizeof *big[1].dense);
    size_t at = cells / 2;
    while (big[1].dense[at] == 0) at++;
    big[1].dense[at] = 300;
    write_input(p0, &big[0]);
    write_input(p1, &big[1]);
    const char *paths[2] = {p0, p1};
    zb_convert_opts o = ZB_CONVERT_OPTS_DEFAULT;
    o.dataset_size = 50;
    o.num_threads = 2;
    o.x_chunk = 64;
    snprintf(out, sizeof out, "%s/auto.zarr", dir);
    ZB_ASSERT_OK(zb_convert_run(paths, 2, out, &o));
    assert_stored(out, "\"X/data\": \"uint16\"", "uint16", "uint8");
    check_output(out, big, paths);

    o.data_dtype = ZB_CONVERT_DATA_UINT8;
    snprintf(out, sizeof out, "%s/uint8.zarr", dir);
    char row[64];
    snprintf(row, sizeof row, "row %zu: the value 300 ", at / big[1].n_genes);
    ZB_ASSERT_ERR(zb_convert_run(paths, 2, out, &o), ZB_E_INVALID, "b.zarr");
    assert_non_null(strstr(zb_last_error(), row));

    o.data_dtype = ZB_CONVERT_DATA_KEEP;
    o.index_dtype = ZB_CONVERT_INDEX_INT32;
    snprintf(out, sizeof out, "%s/keep.zarr", dir);
    ZB_ASSERT_OK(zb_convert_run(paths, 2, out, &o));
    assert_stored(out, "\"X/indices\": \"int32\"", "float32", "int32");
    check_output(out, big, paths);
    free(big[1].dense);
}

static void
test_bad_arguments(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("convert_bad");
    char out[1024], plain[1024];
    snprintf(out, sizeof out, "%s/out.zarr", dir);
    snprintf(plain, sizeof plain, "%s/plain.txt", dir);
    FILE *f = fopen(plain, "w");
    fputs("not anndata", f);
    fclose(f);
    const char *paths[1] = {plain};
    zb_convert_opts o = ZB_CONVERT_OPTS_DEFAULT;
    ZB_ASSERT_ERR(zb_convert_run(paths, 1, out, &o), ZB_E_UNSUPPORTED, "plain.txt");
    o.memory_bytes = 1 << 20;
    ZB_ASSERT_ERR(zb_convert_run(paths, 1, out, &o), ZB_E_INVALID, "memory");
    o = (zb_convert_opts)ZB_CONVERT_OPTS_DEFAULT;
    o.x_chunk = 100;
    o.x_shard = 150;
    ZB_ASSERT_ERR(zb_convert_run(paths, 1, out, &o), ZB_E_INVALID, "multiple");
    ZB_ASSERT_ERR(zb_convert_run(paths, 0, out, NULL), ZB_E_INVALID, "no inputs");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_and_restart),
        cmocka_unit_test(test_stored_types),
        cmocka_unit_test(test_bad_arguments),
    };
    return ZBT_RUN_GROUP(tests, setup, teardown);
}
