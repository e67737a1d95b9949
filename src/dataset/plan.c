/* Planning a read (DESIGN.md §3, step 2), on the calling thread, no I/O beyond cached pointer
 * chunks: logical ids -> (child, physical row) (zb__plan_locate); per segment each sample's
 * element range and the batch pointer arrays; the batch's buffers; per field the runs of source
 * rows and their destination rows, split at unit bounds into copies and sorted so that every
 * unit the request touches appears once with all the copies it serves; the copies grouped into
 * tasks (a unit row, or a few unit rows of one shard); the re-base plan of index fields. The
 * plan's memory is kept by the dataset between requests (zb__plan_mem). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/read_int.h"
#include "store/store.h"
#include "dataset/validate.h"
#include "util/status.h"
#include "util/stream.h"
#include "util/search.h"

#define SHARD_TASK_UNITS 8

/* ---- the plan's memory --------------------------------------------------------------------- */

static size_t
plan_mem_bytes(const zb__plan_mem *m)
{
    return m->copies_cap * sizeof *m->copies + m->keys_cap * sizeof *m->keys +
           m->sorted_cap * sizeof *m->sorted + m->tasks_cap * sizeof *m->tasks +
           m->xs_cap * sizeof *m->xs + m->child_cap * sizeof *m->child +
           m->phys_cap * sizeof *m->phys + m->seg_cap * sizeof *m->seg_start +
           m->off_cap * sizeof *m->arena_off + m->rb_cap * sizeof *m->rb +
           m->rb_vals_cap * sizeof *m->rb_vals + m->fetched_cap;
}

static void
plan_mem_free(zb__plan_mem *m)
{
    if (!m) return;
    free(m->copies);
    free(m->keys);
    free(m->sorted);
    free(m->tasks);
    free(m->xs);
    free(m->child);
    free(m->phys);
    free(m->seg_start);
    free(m->arena_off);
    free(m->rb);
    free(m->rb_vals);
    free(m->fetched);
    zb_ctx_free(m->ctx);
    free(m);
}

zb__plan_mem *
zb__plan_mem_take(zb_dataset *ds)
{
    /* the one this thread used last, if kept: its lines may still be in this core's cache */
    pthread_t self = pthread_self();
    pthread_mutex_lock(&ds->plan_mu);
    zb__plan_mem **pp = &ds->plan_free;
    while (*pp && !pthread_equal((*pp)->owner, self)) pp = &(*pp)->next;
    if (!*pp) pp = &ds->plan_free;
    zb__plan_mem *m = *pp;
    if (m) {
        *pp = m->next;
        ds->plan_nfree--;
    }
    pthread_mutex_unlock(&ds->plan_mu);
    if (m) {
        m->next = NULL;
        memset(&m->ctx->stats, 0, sizeof m->ctx->stats);
    } else {
        m = calloc(1, sizeof *m);
        if (m && zb_ctx_new(&m->ctx) != ZB_OK) {
            free(m);
            return NULL;
        }
    }
    if (m) m->owner = self;
    return m;
}

void
zb__plan_mem_give(zb_dataset *ds, zb__plan_mem *m)
{
    if (!m) return;
    if (plan_mem_bytes(m) <= PLAN_MEM_MAX_BYTES) {
        pthread_mutex_lock(&ds->plan_mu);
        if (ds->plan_nfree < PLAN_MEM_KEPT) {
            m->next = ds->plan_free;
            ds->plan_free = m;
            ds->plan_nfree++;
            m = NULL;
        }
        pthread_mutex_unlock(&ds->plan_mu);
    }
    plan_mem_free(m);
}

void
zb__plan_mem_release_all(zb_dataset *ds)
{
    zb__plan_mem *m = ds->plan_free;
    while (m) {
        zb__plan_mem *n = m->next;
        plan_mem_free(m);
        m = n;
    }
    ds->plan_free = NULL;
    ds->plan_nfree = 0;
}

static zb_status
push_copy(plan *p, copy c)
{
    if (p->ncopies == p->cap &&
        !grow_array((void **)&p->copies, &p->cap, p->ncopies + 1, sizeof *p->copies))
        return zb__err(ZB_E_NOMEM, "read_many: out of memory for the plan");
    p->copies[p->ncopies++] = c;
    return ZB_OK;
}

/* Splits source rows [src, src+n) of field f of child c, landing at dst_row, at unit bounds. */
static zb_status
add_run(plan *p, uint32_t f, uint32_t c, uint64_t src, uint64_t n, uint64_t dst_row)
{
    uint64_t U = field_units(p, f, c)->inner[0];
    bool pow2 = (U & (U - 1)) == 0; /* the writers' default: shift and mask, no division */
    int sh = pow2 ? __builtin_ctzll(U) : 0;
    while (n > 0) {
        uint64_t u = pow2 ? src >> sh : src / U, off = pow2 ? src & (U - 1) : src % U;
        uint64_t take = U - off < n ? U - off : n;
        ZB_TRY(push_copy(p, (copy){f, c, u, off, dst_row, take}));
        src += take;
        dst_row += take;
        n -= take;
    }
    return ZB_OK;
}

static int
cmp_copy(const void *x, const void *y)
{
    const copy *a = x, *b = y;
    if (a->field != b->field) return a->field < b->field ? -1 : 1;
    if (a->child != b->child) return a->child < b->child ? -1 : 1;
    if (a->unit != b->unit) return a->unit < b->unit ? -1 : 1;
    if (a->src_row != b->src_row) return a->src_row < b->src_row ? -1 : 1;
    return a->dst_row < b->dst_row ? -1 : a->dst_row > b->dst_row;
}

/* Sort key of a copy inside its field: child, then the source row (unit * unit rows + row in
 * the unit) for raw units, whose copies are served in source order (nearby rows share a read),
 * or just the unit for decoded ones, whose copies are served in any order (fewer radix passes;
 * equal keys keep their dst order). `kc` caches what the key needs of the copy's child. False
 * when the key does not fit 64 bits (then the comparison sort takes over). */
typedef struct key_child {
    int64_t child; /* -1: nothing cached yet */
    bool raw;
    uint64_t U, max_unit;
} key_child;

static bool
copy_key(const plan *p, const copy *c, key_child *kc, uint64_t *key)
{
    if (kc->child != (int64_t)c->child) {
        const zb__unit_geom *u = field_units(p, c->field, c->child);
        kc->child = c->child;
        kc->raw = u->raw_rows;
        kc->U = u->inner[0];
        kc->max_unit = ((uint64_t)1 << 40) / kc->U;
    }
    if (c->child >= (1u << 23) || c->unit > kc->max_unit) return false;
    uint64_t row = kc->raw ? c->unit * kc->U + c->src_row : c->unit;
    if (row >= (uint64_t)1 << 40) return false;
    *key = (uint64_t)c->child << 40 | row;
    return true;
}

/* Orders copies [c0, c1) of one field, which arrive with dst_row ascending, by copy_key: a
 * stable LSD radix sort over the key bytes in use, so copies from one source row keep their dst
 * order (cmp_copy's order, without its calls: the plan's sort was 7% of a small-block read). */
static void
sort_field(plan *p, size_t c0, size_t c1, keyed *k, keyed *tmp, copy *out)
{
    size_t n = c1 - c0;
    uint64_t all = 0, prev = 0;
    bool sorted = true;
    key_child kc = {.child = -1};
    for (size_t i = 0; i < n; i++) {
        if (!copy_key(p, &p->copies[c0 + i], &kc, &k[i].key)) {
            qsort(p->copies + c0, n, sizeof *p->copies, cmp_copy);
            return;
        }
        k[i].i = c0 + i;
        all |= k[i].key;
        sorted = sorted && k[i].key >= prev;
        prev = k[i].key;
    }
    if (sorted) return; /* already in key order (one unit, or rows read in order): stable */
    for (int shift = 0; shift < 64 && (all >> shift); shift += 8) {
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++) count[((k[i].key >> shift) & 255) + 1]++;
        if (count[((k[0].key >> shift) & 255) + 1] == n) continue; /* one digit value */
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++) tmp[count[(k[i].key >> shift) & 255]++] = k[i];
        keyed *t = k;
        k = tmp;
        tmp = t;
    }
    for (size_t i = 0; i < n; i++) out[i] = p->copies[k[i].i];
    memcpy(p->copies + c0, out, n * sizeof *out);
}

/* Groups the plan's copies by field (they are pushed field by field), then orders each field's
 * copies by source (sort_field). */
static zb_status
sort_copies(plan *p)
{
    size_t n = p->ncopies;
    if (n == 0) return ZB_OK;
    bool grouped = true;
    for (size_t i = 1; i < n && grouped; i++)
        grouped = p->copies[i].field >= p->copies[i - 1].field;
    if (!grouped) {
        qsort(p->copies, n, sizeof *p->copies, cmp_copy);
        return ZB_OK;
    }
    zb__plan_mem *m = p->m;
    if (!grow_array((void **)&m->keys, &m->keys_cap, 2 * n, sizeof *m->keys) ||
        !grow_array((void **)&m->sorted, &m->sorted_cap, n, sizeof *m->sorted))
        return zb__err(ZB_E_NOMEM, "read_many: out of memory sorting the plan");
    for (size_t c0 = 0, c1; c0 < n; c0 = c1) {
        for (c1 = c0 + 1; c1 < n && p->copies[c1].field == p->copies[c0].field; c1++) {}
        sort_field(p, c0, c1, m->keys, m->keys + n, m->sorted);
    }
    return ZB_OK;
}

/* The end of the task that starts at copy i: the copies of one unit row, or of a few unit
 * rows of one shard row. */
static size_t
task_end(const plan *p, size_t i)
{
    const copy *c = &p->copies[i];
    const zb__unit_geom *u = field_units(p, c->field, c->child);
    zb__unit_kind pk = u->kind;
    /* the units [lo, hi) one task may span: c's unit row, or c's shard row */
    uint64_t lo = c->unit, hi = c->unit + 1;
    if (pk == ZB_UNITS_SHARD) {
        uint64_t cps0 = u->per_shard[0];
        lo = c->unit / cps0 * cps0;
        hi = lo + cps0;
    }
    size_t j = i + 1, units = 1;
    while (j < p->ncopies) {
        const copy *d = &p->copies[j];
        if (d->field != c->field || d->child != c->child) break;
        if (d->unit < lo || d->unit >= hi) break;
        /* a shard row is cut into tasks of a few unit rows, so the threads share it; each
         * piece still merges its neighbouring inner chunks into one range read */
        if (pk == ZB_UNITS_SHARD && d->unit != p->copies[j - 1].unit && ++units > SHARD_TASK_UNITS)
            break;
        j++;
    }
    return j;
}

/* Groups the sorted copies into tasks: one per unit row (plain), a few unit rows of one shard
 * row (sharded). */
static zb_status
make_tasks(plan *p)
{
    /* one pass, the array grown by doubling: there are far fewer tasks than copies (a record
     * per copy was 2.5% of a block read) */
    for (size_t i = 0, j; i < p->ncopies; i = j) {
        j = task_end(p, i);
        /* the work estimate: the decoded bytes of the task's unit rows */
        const copy *c = &p->copies[i];
        const zb__unit_geom *u = field_units(p, c->field, c->child);
        uint64_t rows = 1, row_bytes = u->unit_bytes * zb__unit_row_units(u);
        for (size_t k = i + 1; k < j; k++) rows += p->copies[k].unit != p->copies[k - 1].unit;
        p->work += rows * row_bytes;
        if (p->ntasks == p->tasks_cap &&
            !grow_array((void **)&p->tasks, &p->tasks_cap, p->ntasks + 1, sizeof *p->tasks))
            return zb__err(ZB_E_NOMEM, "read_many: out of memory for tasks");
        p->tasks[p->ntasks++] = (task){.c0 = i, .c1 = j};
    }
    return ZB_OK;
}

void
zb__plan_end(plan *p)
{
    for (size_t t = 0; t < p->ntasks; t++) free(p->tasks[t].msg);
    zb__plan_mem *m = p->m;
    m->copies = p->copies;
    m->copies_cap = p->cap;
    m->tasks = p->tasks;
    m->tasks_cap = p->tasks_cap;
    zb__plan_mem_give(p->ds, m);
}

zb_status
zb__plan_locate(const zb_dataset *ds, uint64_t id, uint64_t nlogical, uint32_t *child,
                uint64_t *phys)
{
    if (id >= nlogical)
        return zb__err(ZB_E_RANGE, "%s: sample id %llu outside [0, %llu)", zb_dataset_name(ds),
                       (unsigned long long)id, (unsigned long long)nlogical);
    if (ds->nchildren) {
        size_t lo = zb__last_le(ds->child_start, ds->nchildren, id);
        *child = (uint32_t)lo;
        zb_dataset *ch = ds->children[lo];
        *phys = zb__mask_select(&ch->mask, id - ds->child_start[lo]);
        return ZB_OK;
    }
    *child = 0;
    *phys = zb__mask_select(&ds->mask, id);
    return ZB_OK;
}

/* Whether the tasks can re-base index field f as its rows land: every child's array is 1-d or
 * 2-d (a unit covers whole rows or some columns of each) or in units spanning whole rows. (The
 * other reader paths copy boxes of part of a row; such fields are re-based after the tasks.) */
static bool
can_rebase_in_tasks(const zb_dataset *ds, size_t f)
{
    size_t nc = ds->nchildren ? ds->nchildren : 1;
    for (size_t c = 0; c < nc; c++) {
        const zb__unit_geom *u = zb__array_units(child_of(ds, (uint32_t)c)->fields[f].arr);
        if (u->ndim > 2 && !u->spans_rows) return false;
    }
    return true;
}

/* Fills p->rb for the index fields: each sample's stored range and shift, re-based to its group
 * of b->groups (the whole batch without groups), and who applies it. */
static zb_status
plan_rebase(plan *p)
{
    const zb_dataset *pr = child_of(p->ds, 0);
    zb_batch *b = p->b;
    zb__plan_mem *m = p->m;
    size_t n = p->n, nidx = 0;
    for (size_t f = 0; f < pr->nfields; f++) nidx += pr->fields[f].kind == ZB_FIELD_INDEX;
    if (!nidx) return ZB_OK;
    if (!grow_array((void **)&m->rb, &m->rb_cap, pr->nfields, sizeof *m->rb) ||
        !grow_array((void **)&m->rb_vals, &m->rb_vals_cap, 3 * nidx * n + 1, sizeof *m->rb_vals))
        return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    p->rb = m->rb;
    int64_t *vals = m->rb_vals;
    for (size_t f = 0; f < pr->nfields; f++) {
        const zb__field *fd = &pr->fields[f];
        rebase *r = &p->rb[f];
        memset(r, 0, sizeof *r);
        if (fd->kind != ZB_FIELD_INDEX) continue;
        r->in_tasks = can_rebase_in_tasks(p->ds, f);
        r->rows = b->segs[fd->seg].ptr;
        r->shift = vals;
        r->lo = vals + n;
        r->len = vals + 2 * n;
        vals += 3 * n;
        const int64_t *tp = b->segs[fd->target].ptr;
        size_t g = 0, g0 = 0; /* the group of sample i and its first sample */
        for (size_t i = 0; i < n; i++) {
            while (b->groups && i >= b->groups[g + 1]) g0 = b->groups[++g];
            const zb_dataset *ch = child_of(p->ds, p->child[i]);
            int64_t sub = ch->fields[f].global_index ? p->seg_start[(size_t)fd->target * n + i] : 0;
            r->lo[i] = sub;
            r->len[i] = tp[i + 1] - tp[i];
            r->shift[i] = (tp[i] - tp[g0]) - sub;
        }
    }
    return ZB_OK;
}

/* ---- the request --------------------------------------------------------------------------- */

zb_status
zb__plan_begin(plan *p, zb_dataset *ds, size_t n)
{
    memset(p, 0, sizeof *p);
    const zb_dataset *pr = child_of(ds, 0);
    zb__plan_mem *m = zb__plan_mem_take(ds);
    zb_batch *b = m ? calloc(1, sizeof *b) : NULL;
    if (!b) {
        zb__plan_mem_give(ds, m);
        return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    }
    *p = (plan){.ds = ds,
                .b = b,
                .m = m,
                .copies = m->copies,
                .cap = m->copies_cap,
                .tasks = m->tasks,
                .tasks_cap = m->tasks_cap,
                .n = n,
                .ctx = m->ctx};
    m->copies = NULL; /* the plan owns them until the end (push_copy and make_tasks grow them) */
    m->tasks = NULL;
    b->B = n;
    b->refs = 1;
    b->n_vars = ds->n_vars;
    b->fields = calloc(pr->nfields + 1, sizeof *b->fields);
    b->segs = calloc(pr->nsegs + 1, sizeof *b->segs);
    /* counted only once they exist: zb_batch_free walks them on the way out */
    b->nfields = b->fields ? pr->nfields : 0;
    b->nsegs = b->segs ? pr->nsegs : 0;
    b->index = malloc((n + 1) * sizeof *b->index);
    if (grow_array((void **)&m->child, &m->child_cap, n + 1, sizeof *m->child)) p->child = m->child;
    if (grow_array((void **)&m->phys, &m->phys_cap, n + 1, sizeof *m->phys)) p->phys = m->phys;
    if (grow_array((void **)&m->seg_start, &m->seg_cap, pr->nsegs * n + 1, sizeof *m->seg_start))
        p->seg_start = m->seg_start;
    if (ds->nchildren) b->dataset = malloc((n + 1) * sizeof *b->dataset);
    if (!b->fields || !b->segs || !b->index || !p->child || !p->phys || !p->seg_start ||
        (ds->nchildren && !b->dataset))
        return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    return ZB_OK;
}

/* 0. The fields whose values the tasks range-check as they land (value_bound), with the
 * category tables the checks of codes need (loaded once, on the planning thread). */
static zb_status
plan_checks(plan *p)
{
    zb_dataset *ds = p->ds;
    size_t nc = ds->nchildren ? ds->nchildren : 1, n = 0, cap = 0;
    zb_dataset **chs = NULL;
    zb__field **fds = NULL;
    bool remote = false;
    zb_status st = ZB_OK;
    for (uint32_t c = 0; c < nc && st == ZB_OK; c++) {
        zb_dataset *ch = ds->nchildren ? ds->children[c] : ds;
        for (uint32_t f = 0; f < ch->nfields && st == ZB_OK; f++) {
            zb__field *fd = &ch->fields[f];
            uint64_t nlut;
            if (fd->categorical && fd->kind == ZB_FIELD_PER_SAMPLE &&
                !zb__dataset_lut(ds, f, c, &nlut)) {
                if (n == cap) {
                    cap = cap ? 2 * cap : 8;
                    zb_dataset **a = realloc(chs, cap * sizeof *a);
                    if (a) chs = a;
                    zb__field **b = realloc(fds, cap * sizeof *b);
                    if (b) fds = b;
                    if (!a || !b) st = zb__err(ZB_E_NOMEM, "read_many: out of memory");
                }
                if (st == ZB_OK) {
                    chs[n] = ch;
                    fds[n++] = fd;
                    remote = remote || zb__store_lists_ranges(ch->store);
                }
            }
        }
    }
    /* loaded once; from a remote store all at once (each table is two round trips) */
    if (st == ZB_OK && n) {
        pthread_mutex_lock(&ds->fetch_mu);
        st = zb__fields_load_categories(chs, fds, n, remote);
        pthread_mutex_unlock(&ds->fetch_mu);
    }
    free(chs);
    free(fds);
    ZB_TRY(st);
    for (uint32_t c = 0; c < nc; c++) {
        zb_dataset *ch = ds->nchildren ? ds->children[c] : ds;
        for (uint32_t f = 0; f < ch->nfields; f++)
            if (field_bound(ds, f, c).on) p->checked[f] = true;
    }
    return ZB_OK;
}

/* 1. ids -> (child, physical row). */
static zb_status
plan_ids(plan *p, const uint64_t *ids, uint64_t nlogical)
{
    uint32_t *child = p->m->child;
    uint64_t *phys = p->m->phys;
    zb_batch *b = p->b;
    for (size_t i = 0; i < p->n; i++) {
        ZB_TRY(zb__plan_locate(p->ds, ids[i], nlogical, &child[i], &phys[i]));
        b->index[i] = ids[i];
        if (b->dataset) b->dataset[i] = (int32_t)child[i];
    }
    return ZB_OK;
}

/* 2. Segments: each sample's element range and the batch pointer arrays. */
static zb_status
plan_segments(plan *p)
{
    const zb_dataset *pr = child_of(p->ds, 0);
    zb_batch *b = p->b;
    size_t n = p->n;
    int64_t *seg_start = p->m->seg_start;
    for (size_t s = 0; s < pr->nsegs; s++) {
        bseg *bs = &b->segs[s];
        snprintf(bs->name, sizeof bs->name, "%s", pr->segs[s].name);
        bs->ptr = malloc((n + 1) * sizeof *bs->ptr);
        if (!bs->ptr) return zb__err(ZB_E_NOMEM, "read_many: out of memory");
        bs->ptr[0] = 0;
        for (size_t i = 0; i < n; i++) {
            zb__segment *seg = &((zb_dataset *)child_of(p->ds, p->child[i]))->segs[s];
            int64_t a0, a1;
            ZB_TRY(zb__segment_get(seg, p->ctx, p->phys[i], &a0));
            ZB_TRY(zb__segment_get(seg, p->ctx, p->phys[i] + 1, &a1));
            if (a1 < a0 || a0 < 0)
                return zb__err(ZB_E_CORRUPT,
                               "%s: pointers [%lld, %lld] at sample %llu are not "
                               "monotone",
                               zb__array_units(seg->ptr)->path, (long long)a0, (long long)a1,
                               (unsigned long long)p->phys[i]);
            /* samples each past their values (validated below) can sum past int64 first */
            if (a1 - a0 > INT64_MAX - bs->ptr[i])
                return zb__err(ZB_E_CORRUPT,
                               "%s: pointers [%lld, %lld] at sample %llu take the read past "
                               "2^63 elements",
                               zb__array_units(seg->ptr)->path, (long long)a0, (long long)a1,
                               (unsigned long long)p->phys[i]);
            seg_start[s * n + i] = a0;
            bs->ptr[i + 1] = bs->ptr[i] + (a1 - a0);
        }
        ZB_TRY(zb__validate_segment(p->ds, s, n, b->index, p->child, p->phys, seg_start + s * n,
                                    bs->ptr));
    }
    return ZB_OK;
}

/* 3a. The batch's field buffers: one block from the dataset's pool, 64-byte aligned fields. */
static zb_status
plan_buffers(plan *p)
{
    const zb_dataset *pr = child_of(p->ds, 0);
    zb_batch *b = p->b;
    zb__plan_mem *m = p->m;
    size_t n = p->n;
    if (!grow_array((void **)&m->arena_off, &m->off_cap, pr->nfields + 1, sizeof *m->arena_off))
        return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    size_t *arena_off = m->arena_off, arena_need = 0;
    for (size_t f = 0; f < pr->nfields; f++) {
        const zb__field *fd = &pr->fields[f];
        uint64_t rows = fd->seg >= 0 ? (uint64_t)b->segs[fd->seg].ptr[n] : n;
        size_t isz = zb_dtype_size(zb__dataset_field_dtype(p->ds, f)); /* 0 for strings */
        arena_off[f] = arena_need;
        ZB_TRY(zb__request_bytes_add(p->ds, fd->name, rows, fd->row_elems, isz, &arena_need));
    }
    p->stream = arena_need >= ZB_STREAM_MIN_BATCH_BYTES;
    b->arenas = p->pool ? p->pool : p->ds->arenas;
    b->arena = zb__arena_take(b->arenas, arena_need + 64, &b->arena_cap);
    if (!b->arena) {
        zb__arena_pool_unref(b->arenas);
        b->arenas = NULL;
        return zb__err(ZB_E_NOMEM, "read_many: out of memory for a %zu-byte batch", arena_need);
    }
    for (size_t f = 0; f < pr->nfields; f++) {
        const zb__field *fd = &pr->fields[f];
        bfield *bf = &b->fields[f];
        bf->name = strdup(fd->name);
        bf->kind = fd->kind;
        bf->dtype = zb__dataset_field_dtype(p->ds, f);
        bf->itemsize = zb_dtype_size(bf->dtype);
        bf->ndim = fd->ndim;
        memcpy(bf->row_shape, fd->row_shape, sizeof bf->row_shape);
        bf->row_elems = fd->row_elems;
        bf->seg = fd->seg;
        bf->target = fd->target;
        bf->owned = false; /* in the batch's arena */
        bf->nrows = fd->seg >= 0 ? (uint64_t)b->segs[fd->seg].ptr[n] : n;
        bf->data = (uint8_t *)b->arena + arena_off[f];
        if (!bf->name) return zb__err(ZB_E_NOMEM, "read_many: out of memory for %s", fd->name);
    }
    return ZB_OK;
}

/* Sample i's source rows of field f (its element range, or its row) and where they land; the
 * rows lie inside the field (plan_segments checked them, zb__validate_segment). */
static void
sample_rows(const plan *p, size_t f, size_t i, uint64_t *src, uint64_t *len, uint64_t *dst)
{
    const zb__field *fd = &child_of(p->ds, 0)->fields[f];
    if (fd->seg < 0) {
        *src = p->phys[i];
        *len = 1;
        *dst = i;
        return;
    }
    const int64_t *ptr = p->b->segs[fd->seg].ptr;
    *src = (uint64_t)p->seg_start[(size_t)fd->seg * p->n + i];
    *len = (uint64_t)(ptr[i + 1] - ptr[i]);
    *dst = (uint64_t)ptr[i];
}

/* 3b. Field f's copies: runs of consecutive source rows from one child coalesce into one run,
 * split at unit bounds (add_run). */
static zb_status
plan_field(plan *p, uint32_t f)
{
    uint64_t run_src = 0, run_n = 0, run_dst = 0;
    uint32_t run_child = 0;
    for (size_t i = 0; i < p->n; i++) {
        uint64_t src, len, dst;
        sample_rows(p, f, i, &src, &len, &dst);
        if (run_n && p->child[i] == run_child && src == run_src + run_n && dst == run_dst + run_n) {
            run_n += len;
            continue;
        }
        if (run_n) ZB_TRY(add_run(p, f, run_child, run_src, run_n, run_dst));
        run_src = src;
        run_n = len;
        run_dst = dst;
        run_child = p->child[i];
    }
    if (run_n) ZB_TRY(add_run(p, f, run_child, run_src, run_n, run_dst));
    return ZB_OK;
}

zb_status
zb__plan_request(plan *p, const uint64_t *ids, uint64_t nlogical)
{
    ZB_TRY(plan_checks(p));
    ZB_TRY(plan_ids(p, ids, nlogical));
    ZB_TRY(plan_segments(p));
    ZB_TRY(plan_buffers(p));
    for (size_t f = 0; f < p->b->nfields; f++)
        if (p->b->fields[f].dtype != ZB_DT_STRING) /* strings: read at the end (reader.c) */
            ZB_TRY(plan_field(p, (uint32_t)f));
    ZB_TRY(sort_copies(p));
    ZB_TRY(make_tasks(p));
    return plan_rebase(p);
}

/* ---- the units of a request, for `zbatch bench` -------------------------------------------- */

zb_status
zb__dataset_plan_units(zb_dataset *ds, const uint64_t *ids, size_t n, zb__plan_unit **units,
                       size_t *nunits, uint64_t *bytes_delivered)
{
    *units = NULL;
    *nunits = 0;
    *bytes_delivered = 0;
    uint64_t nlogical;
    ZB_TRY(zb_dataset_len(ds, &nlogical));
    for (size_t c = 0; c < ds->nchildren; c++) ZB_TRY(zb__mask_load(ds->children[c]));
    plan p;
    zb_status st = zb__plan_begin(&p, ds, n);
    if (st == ZB_OK) st = plan_ids(&p, ids, nlogical);
    if (st == ZB_OK) st = plan_segments(&p);
    for (size_t f = 0; st == ZB_OK && f < p.b->nfields; f++)
        if (zb__dataset_field_dtype(ds, f) != ZB_DT_STRING) st = plan_field(&p, (uint32_t)f);
    if (st == ZB_OK) st = sort_copies(&p);
    zb__plan_unit *u = st == ZB_OK ? malloc((p.ncopies + 1) * sizeof *u) : NULL;
    if (st == ZB_OK && !u) st = zb__err(ZB_E_NOMEM, "plan: out of memory");
    size_t k = 0;
    for (size_t i = 0; st == ZB_OK && i < p.ncopies; i++) {
        const copy *c = &p.copies[i], *prev = i ? &p.copies[i - 1] : NULL;
        const zb_array *a = child_of(ds, c->child)->fields[c->field].arr;
        const zb__unit_geom *g = zb__array_units(a);
        *bytes_delivered += c->nrows * g->row_elems * g->itemsize;
        if (prev && prev->field == c->field && prev->child == c->child && prev->unit == c->unit)
            continue;
        u[k++] = (zb__plan_unit){.arr = a, .g0 = c->unit};
    }
    zb_batch *b = p.b;
    if (p.m) zb__plan_end(&p);
    zb_batch_free(b);
    if (st != ZB_OK) {
        free(u);
        return st;
    }
    *units = u;
    *nunits = k;
    return ZB_OK;
}
