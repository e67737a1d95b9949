/* The dataset reader: one call turns a list of sample ids into one batch (DESIGN.md §3), as
 * plan (plan.c) -> execute (exec.c) -> finish (here: index fields the tasks did not re-base,
 * strings, genes in the collection's order). The batch object lives in batch.c; what the
 * files share, in read_int.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/read_int.h"
#include "dataset/validate.h"
#include "util/buf.h"
#include "util/status.h"

/* A sample of a string field: where its string lies in its child's array, and where it went
 * (read_strings). */
typedef struct str_req {
    uint32_t child;
    uint64_t row;
    size_t i;          /* the sample */
    uint64_t off, len; /* its bytes in the gathered buffer */
} str_req;

static int
cmp_str_req(const void *x, const void *y)
{
    const str_req *a = x, *b = y;
    if (a->child != b->child) return a->child < b->child ? -1 : 1;
    if (a->row != b->row) return a->row < b->row ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* String field f of the batch (zb_dataset_opts.load_strings): its samples sorted by child and
 * row, each unit (chunk, or inner chunk) they touch decoded once with the rows they need, then
 * the strings laid out in batch order. Runs on the calling thread after the tasks: strings are
 * delivered on request, not on the fixed-size fields' fast path. */
static zb_status
read_strings(plan *p, uint32_t f)
{
    size_t n = p->n;
    bfield *bf = &p->b->fields[f];
    str_req *rq = malloc((n + 1) * sizeof *rq);
    zb__buf got = {0};
    zb_status st = rq ? ZB_OK : zb__err(ZB_E_NOMEM, "read_many: out of memory for %s", bf->name);
    for (size_t i = 0; i < n && st == ZB_OK; i++)
        rq[i] = (str_req){p->child[i], p->phys[i], i, 0, 0};
    if (st == ZB_OK) qsort(rq, n, sizeof *rq, cmp_str_req);
    for (size_t i = 0, j; i < n && st == ZB_OK; i = j) {
        const zb_array *a = child_of(p->ds, rq[i].child)->fields[f].arr;
        uint64_t U = zb__array_units(a)->inner[0], unit = rq[i].row / U;
        for (j = i + 1; j < n && rq[j].child == rq[i].child && rq[j].row / U == unit; j++) {}
        zb_strings s = {0};
        st = zb_array_read_strings(a, rq[i].row, rq[j - 1].row + 1, &s, NULL);
        for (size_t k = i; k < j && st == ZB_OK; k++) {
            uint64_t r = rq[k].row - rq[i].row;
            rq[k].off = got.len;
            rq[k].len = s.offsets[r + 1] - s.offsets[r];
            st = zb__buf_append(&got, s.data + s.offsets[r], (size_t)rq[k].len);
        }
        zb_strings_free(&s);
    }
    bf->offs = st == ZB_OK ? malloc((n + 1) * sizeof *bf->offs) : NULL;
    bf->data = st == ZB_OK ? malloc(got.len + 1) : NULL;
    if (st == ZB_OK && (!bf->offs || !bf->data))
        st = zb__err(ZB_E_NOMEM, "read_many: out of memory for %s", bf->name);
    bf->owns_offs = bf->offs != NULL;
    bf->owned = bf->data != NULL;
    if (st == ZB_OK) {
        /* batch order: each sample's length by position, then the bytes */
        for (size_t k = 0; k < n; k++) bf->offs[rq[k].i + 1] = (int64_t)rq[k].len;
        bf->offs[0] = 0;
        for (size_t i = 0; i < n; i++) bf->offs[i + 1] += bf->offs[i];
        for (size_t k = 0; k < n; k++)
            memcpy(bf->data + bf->offs[rq[k].i], got.data + rq[k].off, (size_t)rq[k].len);
        bf->nrows = n;
        p->b->stats.bytes_delivered += got.len;
    }
    free(rq);
    zb__buf_free(&got);
    return st;
}

/* Genes of children whose order is not the collection's (zb_dataset_opts.reorder_vars): dense
 * rows permuted, CSR gene ids mapped and each row re-sorted with its values. */
static zb_status
reorder_vars(plan *p)
{
    zb_dataset *ds = p->ds;
    const zb_dataset *pr = child_of(ds, 0);
    zb_batch *b = p->b;
    zb__buf scratch = {0};
    zb_status st = ZB_OK;
    for (size_t f = 0; f < pr->nfields && st == ZB_OK; f++) {
        const zb__field *fd = &pr->fields[f];
        if (!fd->var_cols) continue;
        bfield *bf = &b->fields[f];
        bfield *vals = NULL; /* CSR: the values sharing the gene ids' segment */
        for (size_t k = 0; fd->seg >= 0 && k < pr->nfields; k++)
            if (k != f && pr->fields[k].seg == fd->seg) vals = &b->fields[k];
        if (fd->seg >= 0 && !vals) continue;
        size_t row_bytes = (size_t)(bf->row_elems * bf->itemsize);
        if (fd->seg < 0) st = zb__buf_reserve(&scratch, row_bytes);
        for (size_t i = 0; i < p->n && st == ZB_OK; i++) {
            const int64_t *lut = ds->vars.lut[p->child[i]];
            if (!lut) continue;
            if (fd->seg < 0) {
                zb__var_reorder_dense(bf->data + i * row_bytes, bf->row_elems, bf->itemsize, lut,
                                      scratch.data);
                continue;
            }
            const int64_t *ptr = b->segs[fd->seg].ptr;
            st = zb__var_reorder_csr(
                bf->data + (size_t)ptr[i] * bf->itemsize, bf->dtype,
                vals->data + (size_t)ptr[i] * vals->itemsize, vals->itemsize,
                (uint64_t)(ptr[i + 1] - ptr[i]), lut, ds->n_vars, &scratch,
                zb__array_units(child_of(ds, p->child[i])->fields[f].arr)->path);
        }
    }
    zb__buf_free(&scratch);
    return st;
}

zb_status
zb_dataset_read_many(zb_dataset *ds, const uint64_t *ids, size_t n, zb_batch **out)
{
    return zb__dataset_read_batches(ds, ids, n, NULL, 0, out);
}

/* Step 4: what the tasks leave: index fields they did not re-base (plan_rebase), strings
 * (load_strings), and genes in the collection's order (reorder_vars). */
static zb_status
finish(plan *p)
{
    zb_batch *b = p->b;
    for (size_t f = 0; f < b->nfields && p->rb; f++) {
        const rebase *r = &p->rb[f];
        if (r->shift && !r->in_tasks)
            ZB_TRY(zb__rows_rebase(p, (uint32_t)f, 0, (uint64_t)r->rows[p->n], 0,
                                   b->fields[f].row_elems));
    }
    for (size_t f = 0; f < b->nfields; f++)
        if (b->fields[f].dtype == ZB_DT_STRING) ZB_TRY(read_strings(p, (uint32_t)f));
    if (p->ds->vars.lut) ZB_TRY(reorder_vars(p));
    return ZB_OK;
}

/* The caller's batches, which index fields are re-based to (b->groups). */
static zb_status
set_groups(zb_batch *b, const size_t *sizes, size_t nbatches)
{
    if (!nbatches) return ZB_OK;
    b->groups = malloc((nbatches + 1) * sizeof *b->groups);
    if (!b->groups) return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    b->groups[0] = 0;
    for (size_t k = 0; k < nbatches; k++) b->groups[k + 1] = b->groups[k] + sizes[k];
    b->ngroups = nbatches;
    return ZB_OK;
}

zb_status
zb__reader_read_batches(zb_dataset *ds, zb__arena_pool *pool, const uint64_t *ids, size_t n,
                        const size_t *sizes, size_t nbatches, zb_batch **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "read_many: null out");
    *out = NULL;
    if (!ds || (!ids && n) || (nbatches && !sizes))
        return zb__err(ZB_E_INVALID, "read_many: null argument");
    size_t total = 0;
    for (size_t k = 0; k < nbatches; k++) total += sizes[k];
    if (nbatches && total != n)
        return zb__err(ZB_E_INVALID, "zb__dataset_read_batches: batch sizes add up to %zu, not %zu",
                       total, n);
    uint64_t nlogical;
    ZB_TRY(zb_dataset_len(ds, &nlogical));
    for (size_t c = 0; c < ds->nchildren; c++) ZB_TRY(zb__mask_load(ds->children[c]));

    plan p;
    zb_status st = zb__plan_begin(&p, ds, n);
    if (st == ZB_OK) st = set_groups(p.b, sizes, nbatches);
    p.pool = pool;
    if (st == ZB_OK) st = zb__plan_request(&p, ids, nlogical);
    if (st == ZB_OK) st = zb__exec_run(&p);
    if (st == ZB_OK) st = finish(&p);
    zb_batch *b = p.b;
    if (p.m) zb__plan_end(&p);
    if (st != ZB_OK) {
        zb_batch_free(b);
        return st;
    }
    *out = b;
    return ZB_OK;
}
