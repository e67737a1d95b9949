/* The conversion's limit on this machine (zb_convert_measure_limit): what reading the inputs
 * and writing the output's X cost without the shuffle, so a conversion's time can be set
 * against what it cannot avoid doing. Reading is measured alone (every slice of the plan, on
 * the same threads); then an ordered copy reads every slice again and appends its X to one
 * writer with the conversion's codec, chunks, shards and threads: read_s + compress_s is that
 * copy's time (compress_s = copy - read). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "convert/convert_int.h"
#include "util/pool.h"
#include "util/status.h"

typedef struct read_job {
    zb_convert *cv;
    size_t t;
    bool fold; /* fold X's values: the prepare task did not (prepare.c) */
    zb_status st;
    char msg[512];
    cv_value_stats x; /* what the slice's X values are, for the copy's stored type */
} read_job;

/* Reads slice t the way a scatter task does, into a workspace's blocks (as the conversion's
 * tasks do: buffers reused, no page faults), and drops it. */
static void
read_slice(void *arg, zb_ctx *ctx)
{
    (void)ctx;
    read_job *j = arg;
    zb_convert *cv = j->cv;
    const cv_slice *s = &cv->slices[j->t];
    zb_strings names = {0};
    zb__src *src = NULL;
    cv_ws *ws = NULL;
    zb_status st = cv_ws_take(cv, &ws);
    if (st == ZB_OK) st = cv_ws_blocks(ws, cv->n_mats, cv->n_cols);
    if (st == ZB_OK) st = cv_source(cv, s->input, &src);
    for (size_t m = 0; st == ZB_OK && m < cv->n_mats; m++) {
        zb__src_matrix *mat;
        zb__csr_block *b = &ws->mats[m];
        st = cv_matrix(cv, s->input, m, &mat);
        if (st == ZB_OK) st = zb__src_matrix_read(mat, s->start, s->stop, b);
        if (st == ZB_OK && m == 0 && j->fold) cv_stats_add(&j->x, b->data, b->dtype, b->nnz);
    }
    for (size_t k = 0; st == ZB_OK && k < cv->n_cols; k++)
        st = zb__src_read_column(src, cv->cols[k].src_index[s->input], s->start, s->stop,
                                 &ws->cols[k]);
    if (st == ZB_OK) st = zb__src_read_obs_names(src, s->start, s->stop, &names);
    zb_strings_free(&names);
    if (ws) cv_ws_give(cv, ws);
    j->st = st;
    if (st != ZB_OK) snprintf(j->msg, sizeof j->msg, "%s", zb_last_error());
}

static double
now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* X's values as the prepare tasks folded them; folded[k] says for which inputs they did. */
static zb_status
prepared_x(zb_convert *cv, bool *folded, cv_value_stats *x)
{
    cv_value_stats *s = calloc(cv->n_mats, sizeof *s);
    bool *have = calloc(cv->n_mats, sizeof *have);
    zb_status st = s && have ? ZB_OK : zb__err(ZB_E_NOMEM, "the limit");
    for (size_t k = 0; st == ZB_OK && k < cv->n_inputs; k++) {
        st = cv_prepared_values(cv, k, s, have);
        folded[k] = st == ZB_OK && have[0];
        x->flags |= folded[k] ? s[0].flags : 0;
        if (folded[k] && s[0].max > x->max) x->max = s[0].max;
    }
    free(s);
    free(have);
    return st;
}

/* The read pass (timed). X's values are folded on the way only for the inputs whose prepare
 * task did not fold them (as the conversion's scatter does). */
static zb_status
measure_read(zb_convert *cv, int threads, double *seconds, cv_value_stats *x)
{
    read_job *jobs = calloc(cv->n_slices, sizeof *jobs);
    bool *folded = calloc(cv->n_inputs, sizeof *folded);
    *x = (cv_value_stats){0, 0};
    zb_status st = jobs && folded ? prepared_x(cv, folded, x) : zb__err(ZB_E_NOMEM, "the limit");
    zb__pool *pool = NULL;
    if (st == ZB_OK) st = zb__pool_new(threads > 1 ? threads : 0, &pool);
    double t0 = now_s();
    for (size_t t = 0; st == ZB_OK && t < cv->n_slices; t++) {
        jobs[t] = (read_job){cv, t, !folded[cv->slices[t].input], ZB_OK, "", {0, 0}};
        zb__pool_submit(pool, read_slice, &jobs[t]);
    }
    zb__pool_free(pool);
    *seconds = now_s() - t0;
    for (size_t t = 0; st == ZB_OK && t < cv->n_slices; t++) {
        if (jobs[t].st != ZB_OK) st = zb__err(jobs[t].st, "%s", jobs[t].msg);
        x->flags |= jobs[t].x.flags;
        if (jobs[t].x.max > x->max) x->max = jobs[t].x.max;
    }
    free(jobs);
    free(folded);
    cv_ws_free_all(cv);
    return st;
}

/* The ordered copy: every slice in input order read and its X appended to one writer (same
 * codec, chunks, shards, threads and stored types as the conversion's: the types chosen from
 * the values the read pass saw, by the conversion's rule), so the time is what reading,
 * compressing and writing the output take without the shuffle. */
static zb_status
measure_copy(zb_convert *cv, const char *dir, int threads, const cv_value_stats *x, double *seconds,
             uint64_t *x_bytes)
{
    uint64_t n_vars = 1;
    zb_dtype dtype = cv_stored_dtype(cv, 0, x);
    size_t item = zb_dtype_size(dtype);
    bool narrow = cv_narrow_indices(cv);
    *x_bytes = 0;
    for (size_t k = 0; k < cv->n_inputs; k++) {
        *x_bytes += cv->inputs[k].mats[0].nnz * (item + (narrow ? 2 : 4));
        if (cv->inputs[k].mats[0].n_cols > n_vars) n_vars = cv->inputs[k].mats[0].n_cols;
    }
    zb_store *store = NULL;
    zb_anndata_writer *w = NULL;
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.zarr_format = cv->zarr_format;
    o.codec = cv->codec;
    o.x_chunk = cv->x_chunk;
    o.x_shard = cv->x_shard == UINT64_MAX ? 0 : cv->x_shard;
    o.num_threads = threads;
    o.narrow_indices = narrow;
    zb__csr_block b = {0};
    int32_t *idx = NULL;
    unsigned char *data = NULL;
    size_t cap = 0;
    zb_status st = cv_mkdirs(dir);
    if (st == ZB_OK) /* written as the conversion writes */
        st = cv_output_open_dir(dir, cv->buffered_output, &store);
    double t0 = now_s();
    if (st == ZB_OK)
        st = zb_anndata_writer_open(store, "copy", n_vars, ZB_ANNDATA_X_CSR, dtype, &o, &w);
    for (size_t t = 0; st == ZB_OK && t < cv->n_slices; t++) {
        const cv_slice *s = &cv->slices[t];
        zb__src_matrix *m;
        st = cv_matrix(cv, s->input, 0, &m);
        if (st == ZB_OK) st = zb__src_matrix_read(m, s->start, s->stop, &b);
        if (st == ZB_OK && b.nnz + 1 > cap) {
            cap = (size_t)b.nnz + 1;
            int32_t *pi = realloc(idx, cap * 4);
            unsigned char *pd = pi ? realloc(data, cap * item) : NULL;
            if (pi) idx = pi;
            if (pd) data = pd;
            if (!pi || !pd) st = zb__err(ZB_E_NOMEM, "the limit");
        }
        if (st != ZB_OK) break;
        for (uint64_t e = 0; e < b.nnz; e++) idx[e] = (int32_t)b.indices[e];
        cv_convert_values(data, dtype, b.data, b.dtype, b.nnz);
        st = zb_anndata_writer_append_csr(w, b.n_rows, b.indptr, idx, data);
    }
    if (st == ZB_OK) st = zb_anndata_writer_commit(w);
    *seconds = now_s() - t0;
    zb_anndata_writer_close(w);
    zb_store_close(store);
    zb__csr_block_free(&b);
    free(idx);
    free(data);
    return st;
}

zb_status
zb_convert_measure_limit(const char *const *inputs, size_t n_inputs, const char *output,
                         const zb_convert_opts *opts, zb_convert_limit *out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_convert_measure_limit: null out");
    memset(out, 0, sizeof *out);
    if (!output) return zb__err(ZB_E_INVALID, "zb_convert_measure_limit: null output");
    if (strstr(output, "://") && strncmp(output, "file://", 7))
        return zb__err(ZB_E_UNSUPPORTED, "%s: the limit is measured into a local directory",
                       output);
    zb_convert_opts o = ZB_CONVERT_OPTS_DEFAULT;
    if (opts) o = *opts;
    o.progress = NULL;
    bool made = !cv_exists(output);
    char scratch[4200];
    snprintf(scratch, sizeof scratch, "%s/.zbatch-limit", output);
    ZB_TRY(cv_remove_tree(scratch));
    zb_convert *cv = NULL;
    zb_status st = zb_convert_plan(inputs, n_inputs, scratch, &o, &cv);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = o.num_threads > 0 ? o.num_threads : cpus > 0 ? (int)cpus : 1;
    for (size_t k = 0; st == ZB_OK && k < cv->n_inputs; k++)
        st = zb_convert_run_task(cv, ZB_CONVERT_PREPARE, k, 1);
    cv_value_stats x = {0, 0};
    if (st == ZB_OK) st = measure_read(cv, threads, &out->read_s, &x);
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/copy", scratch);
    double copy_s = 0;
    if (st == ZB_OK) st = measure_copy(cv, dir, threads, &x, &copy_s, &out->output_bytes);
    /* the copy reads and compresses at once; what it takes beyond reading is the output's */
    out->compress_s = copy_s > out->read_s ? copy_s - out->read_s : 0;
    if (st == ZB_OK) {
        out->cells = cv->n_cells;
        out->input_bytes = cv->input_bytes;
    }
    zb_convert_close(cv);
    zb_status rm = made ? cv_remove_tree(output) : cv_remove_tree(scratch);
    return st != ZB_OK ? st : rm;
}
