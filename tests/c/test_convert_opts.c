/* The conversion's switches for comparisons, as options (zb_convert_opts.scratch_path and
 * buffered_output, zb_convert_set_buffered_output) with no environment variable set: the
 * library reads none (the command and the Python package read ZBATCH_CONVERT_SCRATCH and
 * ZBATCH_CONVERT_BUFFERED and pass these). The input is an .h5ad with a contiguous, unfiltered
 * CSR X, so the default plan takes the direct path; its float values are not integers, so X's
 * shards are float32 and pass the 64 KiB above which the output is written with direct I/O.
 * Observables: the plan's "direct", the output's bytes against the default conversion's, every
 * output cell's nonzeros and value sum against its source row, and which of the output's
 * shards sit in the page cache afterwards (mincore; not on tmpfs, where everything does). */
#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "support/h5write.h"
#include "support/testutil.h"

#define N_OBS 4000
#define N_VARS 200

static int64_t indptr[N_OBS + 1];
static int32_t *indices;
static float *values;

static int
setup(void **state)
{
    (void)state;
    unsetenv("ZBATCH_CONVERT_SCRATCH");
    unsetenv("ZBATCH_CONVERT_BUFFERED");
    uint64_t s = 15;
    indices = malloc((size_t)N_OBS * N_VARS * sizeof *indices);
    values = malloc((size_t)N_OBS * N_VARS * sizeof *values);
    for (int r = 0; r < N_OBS; r++) {
        indptr[r + 1] = indptr[r];
        for (int g = 0; g < N_VARS; g++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            if ((s >> 33) % 4) continue;
            indices[indptr[r + 1]] = g;
            values[indptr[r + 1]++] = (float)((s >> 40) % 100000) / 7.0f;
        }
    }
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    free(indices);
    free(values);
    return 0;
}

static zb_convert_opts
options(void)
{
    zb_convert_opts o = ZB_CONVERT_OPTS_DEFAULT;
    o.dataset_size = 2000;
    o.memory_bytes = ZB_CONVERT_MIN_MEMORY;
    o.num_threads = 2;
    o.seed = 7;
    return o;
}

/* Whether OUTPUT/.zbatch-convert/plan.json records the direct path. */
static bool
plan_direct(const char *out)
{
    char path[2048], text[1 << 16];
    snprintf(path, sizeof path, "%s/.zbatch-convert/plan.json", out);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    if (strstr(text, "\"direct\":true")) return true;
    if (!strstr(text, "\"direct\":false")) fail_msg("%s records no \"direct\"", path);
    return false;
}

/* The fraction of a file's pages in the page cache (a shared mapping reads nothing). */
static double
cached_fraction(const char *path)
{
    size_t pages, in = zbt_cached_pages(path, &pages);
    return pages ? (double)in / (double)pages : 0;
}

/* Over the objects of 128 KiB and more below `dir` (X's shards): the least (want_cached) or
 * the largest fraction in the page cache; the objects counted in *n. */
static double
shards_cached(const char *dir, bool want_cached, int *n)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    double extreme = want_cached ? 1.0 : 0.0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        double f = -1;
        if (S_ISDIR(st.st_mode)) {
            int below = 0;
            f = shards_cached(p, want_cached, &below);
            if (!below) continue;
            *n += below;
        } else if (st.st_size >= 128 << 10) {
            f = cached_fraction(p);
            (*n)++;
        } else {
            continue;
        }
        if (want_cached ? f < extreme : f > extreme) extreme = f;
    }
    closedir(d);
    return extreme;
}

/* Bytes of every file below `a` equal those below `b`, and `b` holds no other file. */
static void
assert_same_tree(const char *a, const char *b)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "diff -r '%s' '%s' > /dev/null", a, b);
    if (system(cmd) != 0) fail_msg("%s and %s differ", a, b);
}

/* Every input row is in the output once, with its nonzeros and value sum (sums do not depend
 * on the output's gene order; the bytes against the default conversion carry the rest). */
static void
check_cells(const char *out)
{
    zb_store *s;
    zb_dataset *ds;
    ZB_ASSERT_OK(zb_store_open_file(out, &s));
    ZB_ASSERT_OK(zb_dataset_open(s, "", NULL, &ds));
    uint64_t n;
    ZB_ASSERT_OK(zb_dataset_len(ds, &n));
    assert_int_equal(n, N_OBS);
    uint64_t *ids = malloc(n * sizeof *ids);
    for (uint64_t i = 0; i < n; i++) ids[i] = i;
    zb_batch *b;
    ZB_ASSERT_OK(zb_dataset_read_many(ds, ids, n, &b));
    zb_batch_view data, src_row;
    ZB_ASSERT_OK(zb_batch_find(b, "X/data", &data));
    ZB_ASSERT_OK(zb_batch_find(b, "obs/src_row", &src_row));
    const int64_t *ptr = data.ptr;
    unsigned char *seen = calloc(N_OBS, 1);
    for (uint64_t i = 0; i < n; i++) {
        int64_t row = ((const int64_t *)src_row.data)[i];
        assert_true(row >= 0 && row < N_OBS && !seen[row]++);
        assert_int_equal(ptr[i + 1] - ptr[i], indptr[row + 1] - indptr[row]);
        double got = 0, want = 0;
        for (int64_t e = ptr[i]; e < ptr[i + 1]; e++) got += ((const float *)data.data)[e];
        for (int64_t e = indptr[row]; e < indptr[row + 1]; e++) want += values[e];
        if (got - want > 1e-6 * (want + 1) || want - got > 1e-6 * (want + 1))
            fail_msg("cell %llu (row %lld): values sum to %g, want %g", (unsigned long long)i,
                     (long long)row, got, want);
    }
    free(seen);
    free(ids);
    zb_batch_free(b);
    zb_dataset_close(ds);
    zb_store_close(s);
}

static void
test_scratch_and_buffered_options(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("convert_opts");
    char in[1024], direct[1024], scratch[1024], buffered[1024], tasks[1024];
    snprintf(in, sizeof in, "%s/in.h5ad", dir);
    snprintf(direct, sizeof direct, "%s/direct.zarr", dir);
    snprintf(scratch, sizeof scratch, "%s/scratch.zarr", dir);
    snprintf(buffered, sizeof buffered, "%s/buffered.zarr", dir);
    snprintf(tasks, sizeof tasks, "%s/tasks.zarr", dir);
    zbt_h5ad_write_csr(in, N_OBS, N_VARS, indptr, indices, values);
    const char *paths[1] = {in};
    struct statfs fs;
    assert_int_equal(statfs(dir, &fs), 0);
    bool tmpfs = fs.f_type == TMPFS_MAGIC;

    /* the defaults: the direct path, the output written and read back with direct I/O */
    zb_convert_opts o = options();
    zb_convert *cv;
    ZB_ASSERT_OK(zb_convert_plan(paths, 1, direct, &o, &cv));
    zb_convert_close(cv);
    assert_true(plan_direct(direct));
    ZB_ASSERT_OK(zb_convert_run(paths, 1, direct, &o));
    int n = 0;
    double most = shards_cached(direct, false, &n);
    assert_true(n >= 2); /* a float32 X/data shard per dataset at least */
    if (!tmpfs && most > 0.05)
        fail_msg("a shard of the direct output is %.0f%% cached", 100 * most);

    /* scratch_path: recorded in the plan, and the same bytes */
    o.scratch_path = true;
    ZB_ASSERT_OK(zb_convert_plan(paths, 1, scratch, &o, &cv));
    zb_convert_close(cv);
    assert_false(plan_direct(scratch));
    ZB_ASSERT_OK(zb_convert_run(paths, 1, scratch, &o));

    /* buffered_output: the shards stay in the page cache, the same bytes */
    o = options();
    o.buffered_output = true;
    ZB_ASSERT_OK(zb_convert_run(paths, 1, buffered, &o));
    n = 0;
    double least = shards_cached(buffered, true, &n);
    assert_true(n >= 2);
    if (!tmpfs && least < 0.9)
        fail_msg("a shard of the buffered output is %.0f%% cached", 100 * least);

    /* tasks run through a handle of their own (as a Dask worker runs them), which starts with
     * direct I/O and is switched by zb_convert_set_buffered_output */
    o = options();
    ZB_ASSERT_OK(zb_convert_plan(paths, 1, tasks, &o, &cv));
    zb_convert_close(cv);
    ZB_ASSERT_OK(zb_convert_open(tasks, &cv));
    ZB_ASSERT_OK(zb_convert_set_buffered_output(cv, true));
    for (int ph = ZB_CONVERT_PREPARE; ph <= ZB_CONVERT_GATHER; ph++)
        for (size_t i = 0; i < zb_convert_ntasks(cv, (zb_convert_phase)ph); i++)
            ZB_ASSERT_OK(zb_convert_run_task(cv, (zb_convert_phase)ph, i, 2));
    ZB_ASSERT_OK(zb_convert_finish(cv));
    zb_convert_close(cv);
    n = 0;
    least = shards_cached(tasks, true, &n);
    assert_true(n >= 2);
    if (!tmpfs && least < 0.9)
        fail_msg("a shard written by the tasks is %.0f%% cached", 100 * least);

    /* only now read anything back: the same bytes everywhere, the cells of their source rows */
    assert_same_tree(direct, scratch);
    assert_same_tree(scratch, direct);
    assert_same_tree(direct, buffered);
    assert_same_tree(direct, tasks);
    check_cells(direct);
}

/* A setter that cannot open the output again fails naming it and leaves the handle as it was:
 * its tasks still write with direct I/O. */
static void
test_failed_setter_keeps_the_handle(void **state)
{
    (void)state;
    ZB_ASSERT_ERR(zb_convert_set_buffered_output(NULL, true), ZB_E_INVALID, "null");
    const char *dir = zbt_tempdir("convert_opts_setter");
    char in[1024], out[1024], moved[1024];
    snprintf(in, sizeof in, "%s/in.h5ad", dir);
    snprintf(out, sizeof out, "%s/out.zarr", dir);
    snprintf(moved, sizeof moved, "%s/moved.zarr", dir);
    zbt_h5ad_write_csr(in, N_OBS, N_VARS, indptr, indices, values);
    const char *paths[1] = {in};
    zb_convert_opts o = options();
    zb_convert *cv;
    ZB_ASSERT_OK(zb_convert_plan(paths, 1, out, &o, &cv));
    zb_convert_close(cv);
    ZB_ASSERT_OK(zb_convert_open(out, &cv));
    assert_int_equal(rename(out, moved), 0);
    ZB_ASSERT_ERR(zb_convert_set_buffered_output(cv, true), ZB_E_NOTFOUND, out);
    assert_int_equal(rename(moved, out), 0);
    for (int ph = ZB_CONVERT_PREPARE; ph <= ZB_CONVERT_GATHER; ph++)
        for (size_t i = 0; i < zb_convert_ntasks(cv, (zb_convert_phase)ph); i++)
            ZB_ASSERT_OK(zb_convert_run_task(cv, (zb_convert_phase)ph, i, 2));
    zb_convert_close(cv);
    struct statfs fs;
    assert_int_equal(statfs(dir, &fs), 0);
    int n = 0;
    double most = shards_cached(out, false, &n);
    assert_true(n >= 2);
    if (fs.f_type != TMPFS_MAGIC && most > 0.05)
        fail_msg("a shard is %.0f%% cached after the failed switch", 100 * most);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scratch_and_buffered_options),
        cmocka_unit_test(test_failed_setter_keeps_the_handle),
    };
    return ZBT_RUN_GROUP(tests, setup, teardown);
}
