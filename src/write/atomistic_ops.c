/* Operations on existing atomistic (AtomicData) datasets: recover, check, delete, add_custom, defragment.
 * Format facts: shared FORMATS.md §8.2 (invariants), §8.3 (edge index), §8.5 (nvalchemi's
 * hazards, which these avoid). The crash-safety rules are documented in zbatch_atomic.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "util/buf.h"
#include "util/json.h"
#include "util/status.h"
#include "write/atomistic_int.h"
#include "write/write.h"
#include "zarr/array.h"
#include "zarr/meta.h"

#define NEW_SUFFIX ".zbatch-new"
#define OLD_SUFFIX ".zbatch-old"
/* Samples whose pointers are read at once, and the most atoms / edges copied per block. */
#define PTR_BLOCK ((uint64_t)1 << 16)
#define ATOM_BLOCK ((uint64_t)1 << 21)
#define EDGE_BLOCK ((uint64_t)1 << 22)
/* Rows of a mask rewritten at once (runs of touched chunks are split above it). */
#define MASK_RUN_ROWS ((uint64_t)1 << 24)

static uint64_t
rows_for(zb_atomic_level level, uint64_t atoms, uint64_t edges, uint64_t samples)
{
    return level == ZB_ATOMIC_ATOM ? atoms : level == ZB_ATOMIC_EDGE ? edges : samples;
}

static zb_status
read_ptr_at(const zb__at_layout *L, int m, uint64_t i, int64_t *v)
{
    return zb__at_read_i64(L->meta[m], i, i + 1, v);
}

/* Refuses an uncommitted new store (before recovery would look at it). */
static zb_status
refuse_incomplete(zb_store *store, const char *path)
{
    char mk[ZB_AT_KEY_CAP], root[ZB_AT_KEY_CAP];
    ZB_TRY(zb__at_join(mk, sizeof mk, path, ZB_INCOMPLETE_MARKER));
    ZB_TRY(zb__at_join(root, sizeof root, path, "zarr.json"));
    if (zb__at_has_key(store, mk) && !zb__at_has_key(store, root))
        return zb__err(ZB_E_INCOMPLETE, "'%s': a new atomic store that was never committed", path);
    return ZB_OK;
}

/* ------------------------------------------------------------------------------------------- */
/* Recovery                                                                                     */
/* ------------------------------------------------------------------------------------------- */

typedef struct sib_ctx {
    const char *base;
    const char *parent;
    char **paths;
    size_t n;
    zb_status st;
} sib_ctx;

static int
sib_cb(void *vctx, const char *name, bool is_dir)
{
    sib_ctx *c = vctx;
    size_t bl = strlen(c->base);
    if (!is_dir || strncmp(name, c->base, bl) != 0) return 0;
    if (strncmp(name + bl, NEW_SUFFIX, strlen(NEW_SUFFIX)) != 0 &&
        strncmp(name + bl, OLD_SUFFIX, strlen(OLD_SUFFIX)) != 0)
        return 0;
    char **p = realloc(c->paths, (c->n + 1) * sizeof *p);
    char full[ZB_AT_KEY_CAP];
    if (!p || zb__at_join(full, sizeof full, c->parent, name) != ZB_OK) {
        if (p) c->paths = p;
        c->st = zb__err(ZB_E_NOMEM, "out of memory listing siblings of '%s'", c->base);
        return 1;
    }
    c->paths = p;
    c->paths[c->n] = strdup(full);
    if (!c->paths[c->n]) {
        c->st = zb__err(ZB_E_NOMEM, "out of memory listing siblings of '%s'", c->base);
        return 1;
    }
    c->n++;
    return 0;
}

static void
free_paths(char **paths, size_t n)
{
    for (size_t i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

/* The `<path>.zbatch-new` and `<path>.zbatch-old*` siblings of `path` (old ones may carry a
 * numeric suffix when the backend kept an emptied directory under the plain name). */
static zb_status
list_siblings(zb_store *store, const char *path, char ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    char parent[ZB_AT_PATH_CAP];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash)
        *slash = '\0';
    else
        parent[0] = '\0';
    sib_ctx c = {base, parent, NULL, 0, ZB_OK};
    zb_status st = zb_store_list(store, parent, sib_cb, &c);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        st = ZB_OK;
    }
    if (st == ZB_OK) st = c.st;
    if (st != ZB_OK) {
        free_paths(c.paths, c.n);
        return st;
    }
    *out = c.paths;
    *n = c.n;
    return ZB_OK;
}

static bool
ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The defragment swap's rule (zbatch_atomic.h): `path` complete wins; else a complete new, else
 * a complete old, is renamed to `path`; leftovers are removed once `path` is complete. */
static zb_status
recover_swap(zb_store *store, const char *path)
{
    char **sib = NULL;
    size_t ns = 0;
    ZB_TRY(list_siblings(store, path, &sib, &ns));
    zb_status st = ZB_OK;
    if (ns && !zb__at_has_keys_below(store, path)) {
        const char *pick = NULL;
        for (size_t i = 0; !pick && i < ns; i++)
            if (ends_with(sib[i], NEW_SUFFIX) && zb__at_is_complete(store, sib[i])) pick = sib[i];
        for (size_t i = 0; !pick && i < ns; i++)
            if (!ends_with(sib[i], NEW_SUFFIX) && zb__at_is_complete(store, sib[i])) pick = sib[i];
        if (pick) st = zb__at_rename_tree(store, pick, path);
    }
    /* every leftover, emptied ones too: a kill inside the removal of the old tree can leave
     * its directories without a key in them (a backend that cannot erase directories keeps
     * them, which zb__at_remove_tree tolerates) */
    if (st == ZB_OK && ns && zb__at_is_complete(store, path))
        for (size_t i = 0; st == ZB_OK && i < ns; i++) st = zb__at_remove_tree(store, sib[i]);
    free_paths(sib, ns);
    return st;
}

bool
zb__at_parked_elsewhere(zb_store *store, const char *path)
{
    char **sib = NULL;
    size_t ns = 0;
    if (!path[0] || list_siblings(store, path, &sib, &ns) != ZB_OK) {
        zb_clear_error();
        return false;
    }
    bool found = false;
    for (size_t i = 0; !found && i < ns; i++) found = zb__at_is_complete(store, sib[i]);
    free_paths(sib, ns);
    return found;
}

/* Rows array `x` needs for `samples` samples with `atoms`/`edges` totals. */
static uint64_t
need_rows(const zb__at_array *x, uint64_t atoms, uint64_t edges, uint64_t samples)
{
    return rows_for(x->level, atoms, edges, samples);
}

/* The interrupted-append rule (zbatch_atomic.h): roll forward to len(samples_mask) when every
 * array is long enough for it, else cut every array back to what num_samples needs. */
static zb_status
repair_tails(zb_store *store, const char *path)
{
    zb__at_layout L;
    ZB_TRY(zb__at_layout_open(store, path, &L));
    zb_status st = ZB_OK;
    uint64_t n = L.num_samples, target = n;
    uint64_t s = L.meta_rows[ZB_AT_SAMPLES_MASK];
    int64_t va = 0, ve = 0;
    if (L.meta_rows[ZB_AT_ATOMS_PTR] < n + 1 || L.meta_rows[ZB_AT_EDGES_PTR] < n + 1 || s < n)
        goto done; /* shorter than committed: not a tail, zb_atomic_check reports it */
    st = read_ptr_at(&L, ZB_AT_ATOMS_PTR, n, &va);
    if (st == ZB_OK) st = read_ptr_at(&L, ZB_AT_EDGES_PTR, n, &ve);
    if (st != ZB_OK) goto done;
    if (s > n && L.meta_rows[ZB_AT_ATOMS_PTR] >= s + 1 && L.meta_rows[ZB_AT_EDGES_PTR] >= s + 1) {
        int64_t fa = 0, fe = 0;
        st = read_ptr_at(&L, ZB_AT_ATOMS_PTR, s, &fa);
        if (st == ZB_OK) st = read_ptr_at(&L, ZB_AT_EDGES_PTR, s, &fe);
        if (st != ZB_OK) goto done;
        bool ok = fa >= va && fe >= ve;
        if (L.meta[ZB_AT_ATOMS_MASK] && L.meta_rows[ZB_AT_ATOMS_MASK] < (uint64_t)fa) ok = false;
        if (L.meta[ZB_AT_EDGES_MASK] && L.meta_rows[ZB_AT_EDGES_MASK] < (uint64_t)fe) ok = false;
        for (size_t i = 0; ok && i < L.n; i++)
            ok =
                L.arrays[i].info.shape[0] >= need_rows(&L.arrays[i], (uint64_t)fa, (uint64_t)fe, s);
        if (ok) {
            target = s;
            va = fa;
            ve = fe;
        }
    }
    /* cut back what is longer than the target needs; samples_mask first, as it is what
     * nvalchemi's reader counts */
    static const int order[ZB_AT_NMETA] = {ZB_AT_SAMPLES_MASK, ZB_AT_ATOMS_PTR, ZB_AT_EDGES_PTR,
                                           ZB_AT_ATOMS_MASK, ZB_AT_EDGES_MASK};
    for (int k = 0; st == ZB_OK && k < ZB_AT_NMETA; k++) {
        int m = order[k];
        if (!L.meta[m]) continue;
        uint64_t want = m <= ZB_AT_EDGES_PTR      ? target + 1
                        : m == ZB_AT_SAMPLES_MASK ? target
                        : m == ZB_AT_ATOMS_MASK   ? (uint64_t)va
                                                  : (uint64_t)ve;
        if (L.meta_rows[m] > want) {
            char apath[ZB_AT_KEY_CAP];
            st = zb__at_join3(apath, sizeof apath, L.path, "meta", zb__at_meta_names[m]);
            if (st == ZB_OK) st = zb__at_truncate_array(store, apath, want);
        }
    }
    for (size_t i = 0; st == ZB_OK && i < L.n; i++) {
        const zb__at_array *x = &L.arrays[i];
        uint64_t want = need_rows(x, (uint64_t)va, (uint64_t)ve, target);
        if (x->info.shape[0] > want) {
            char apath[ZB_AT_KEY_CAP];
            st = zb__at_join3(apath, sizeof apath, L.path, x->group, x->name);
            if (st == ZB_OK) st = zb__at_truncate_array(store, apath, want);
        }
    }
    if (st == ZB_OK && target != n) {
        /* the roll forward's commit point, last, as in the append itself */
        if (json_object_object_add(L.attrs, "num_samples", zb__jw_u64(target)) != 0)
            st = zb__err(ZB_E_NOMEM, "out of memory");
        else
            st = zb__at_write_root(store, L.path, L.attrs);
    }
done:
    zb__at_layout_close(&L);
    return st;
}

zb_status
zb_atomic_recover(zb_store *store, const char *path)
{
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_atomic_recover: null argument");
    char p[ZB_AT_PATH_CAP], root[ZB_AT_KEY_CAP], mk[ZB_AT_KEY_CAP];
    ZB_TRY(zb_key_normalize(path, p, sizeof p));
    if (p[0]) ZB_TRY(recover_swap(store, p));
    ZB_TRY(zb__at_join(root, sizeof root, p, "zarr.json"));
    ZB_TRY(zb__at_join(mk, sizeof mk, p, ZB_INCOMPLETE_MARKER));
    bool has_root = zb__at_has_key(store, root), has_mk = zb__at_has_key(store, mk);
    if (has_mk && !has_root)
        return zb__err(ZB_E_INCOMPLETE,
                       "'%s': a new atomic store that was never committed "
                       "(zb_atomic_writer_open clears it)",
                       p);
    if (!has_root) return zb__err(ZB_E_NOTFOUND, "'%s': no atomic store here", p);
    /* the root was written, so the store committed: the marker is only stale */
    if (has_mk) ZB_TRY(zb_store_erase(store, mk));
    return repair_tails(store, p);
}

/* ------------------------------------------------------------------------------------------- */
/* Pointer blocks                                                                               */
/* ------------------------------------------------------------------------------------------- */

/* Pointer values of samples [p0, p0 + m] (m+1 values each), read together. */
typedef struct ptr_block {
    uint64_t p0, m;
    int64_t *ap, *ep; /* [m+1] */
    uint8_t *mask;    /* [m] */
} ptr_block;

static void
ptr_block_free(ptr_block *b)
{
    free(b->ap);
    free(b->ep);
    free(b->mask);
    memset(b, 0, sizeof *b);
}

/* Reads the pointers of [p0, min(n, p0 + PTR_BLOCK)] and checks them (start at 0, never
 * decrease, never negative), naming the array. */
static zb_status
ptr_block_read(const zb__at_layout *L, uint64_t p0, uint64_t n, int64_t prev_a, int64_t prev_e,
               ptr_block *b)
{
    uint64_t m = n - p0 < PTR_BLOCK ? n - p0 : PTR_BLOCK;
    if (!b->ap) {
        b->ap = malloc((size_t)(PTR_BLOCK + 1) * 8);
        b->ep = malloc((size_t)(PTR_BLOCK + 1) * 8);
        b->mask = malloc((size_t)PTR_BLOCK);
        if (!b->ap || !b->ep || !b->mask) return zb__err(ZB_E_NOMEM, "out of memory");
    }
    b->p0 = p0;
    b->m = m;
    ZB_TRY(zb__at_read_i64(L->meta[ZB_AT_ATOMS_PTR], p0, p0 + m + 1, b->ap));
    ZB_TRY(zb__at_read_i64(L->meta[ZB_AT_EDGES_PTR], p0, p0 + m + 1, b->ep));
    if (m)
        ZB_TRY(
            zb_array_read_rows(L->meta[ZB_AT_SAMPLES_MASK], p0, p0 + m, b->mask, (size_t)m, NULL));
    const int64_t *arr[2] = {b->ap, b->ep};
    const int64_t prev[2] = {prev_a, prev_e};
    for (int k = 0; k < 2; k++) {
        const char *name = zb__at_meta_names[k];
        if (p0 == 0 && arr[k][0] != 0)
            return zb__err(ZB_E_CORRUPT, "%s/meta/%s: starts at %lld, not 0", L->path, name,
                           (long long)arr[k][0]);
        if (p0 && arr[k][0] != prev[k])
            return zb__err(ZB_E_CORRUPT, "%s/meta/%s changed while being read", L->path, name);
        for (uint64_t i = 0; i < m; i++)
            if (arr[k][i + 1] < arr[k][i])
                return zb__err(ZB_E_CORRUPT,
                               "%s/meta/%s: decreases at sample %llu (%lld after "
                               "%lld)",
                               L->path, name, (unsigned long long)(p0 + i + 1),
                               (long long)arr[k][i + 1], (long long)arr[k][i]);
    }
    return ZB_OK;
}

/* The end (exclusive, relative to the block) of the sub-block starting at q0: as many samples
 * as fit ATOM_BLOCK atoms and EDGE_BLOCK edges, at least one. */
static uint64_t
sub_block_end(const ptr_block *b, uint64_t q0)
{
    uint64_t q1 = q0 + 1;
    while (q1 < b->m && (uint64_t)(b->ap[q1 + 1] - b->ap[q0]) <= ATOM_BLOCK &&
           (uint64_t)(b->ep[q1 + 1] - b->ep[q0]) <= EDGE_BLOCK)
        q1++;
    return q1;
}

/* ------------------------------------------------------------------------------------------- */
/* Check                                                                                        */
/* ------------------------------------------------------------------------------------------- */

static const zb__at_array *
find_nlist(const zb__at_layout *L)
{
    for (size_t i = 0; i < L->n; i++)
        if (!strcmp(L->arrays[i].group, "core") && !strcmp(L->arrays[i].name, "neighbor_list"))
            return &L->arrays[i];
    return NULL;
}

static zb_status
check_nlist_shape(const zb__at_layout *L, const zb__at_array *nl)
{
    if (nl->level != ZB_ATOMIC_EDGE || !zb__at_dtype_is_int(nl->info.dtype) || nl->info.ndim != 2 ||
        nl->info.shape[1] != 2)
        return zb__err(ZB_E_CORRUPT,
                       "%s/core/neighbor_list: expected an edge-level integer "
                       "array of shape [E, 2]",
                       L->path);
    return ZB_OK;
}

/* Converts rows [0, ne) of stored neighbor_list values (sample p, atoms [a0, a1)) to local
 * indices in place, requiring each to lie in the sample. */
static zb_status
localize(const zb__at_layout *L, void *rows, zb_dtype dt, uint64_t first, uint64_t ne, uint64_t p,
         int64_t a0, int64_t a1)
{
    for (uint64_t k = 0; k < 2 * ne; k++) {
        int64_t v = zb__at_get_int(rows, dt, first + k);
        if (v < a0 || v >= a1)
            return zb__err(ZB_E_CORRUPT,
                           "%s/core/neighbor_list: sample %llu, edge %llu: stored index %lld - "
                           "atoms_ptr[%llu] = %lld lies outside [0, %lld) (an append without the "
                           "atom offset, FORMATS.md §8.5?)",
                           L->path, (unsigned long long)p, (unsigned long long)(k / 2),
                           (long long)v, (unsigned long long)p, (long long)(v - a0),
                           (long long)(a1 - a0));
        zb__at_set_int(rows, dt, first + k, v - a0);
    }
    return ZB_OK;
}

zb_status
zb_atomic_check(zb_store *store, const char *path, zb_atomic_summary *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_atomic_check: null argument");
    zb__at_layout L;
    ZB_TRY(zb__at_layout_open(store, path, &L));
    zb_status st = ZB_OK;
    zb_atomic_summary sum;
    memset(&sum, 0, sizeof sum);
    ptr_block b = {0};
    zb__buf nbuf = {0};
    uint64_t n = L.num_samples;
    sum.num_samples = n;
    sum.num_fields = L.n;
    static const char *const need[ZB_AT_NMETA] = {"num_samples + 1", "num_samples + 1",
                                                  "num_samples", "", ""};
    for (int m = 0; m <= ZB_AT_SAMPLES_MASK; m++) {
        uint64_t want = m < ZB_AT_SAMPLES_MASK ? n + 1 : n;
        if (L.meta_rows[m] < want) {
            st = zb__err(ZB_E_CORRUPT, "%s/meta/%s: %llu entries, needs %s = %llu", L.path,
                         zb__at_meta_names[m], (unsigned long long)L.meta_rows[m], need[m],
                         (unsigned long long)want);
            goto done;
        }
        if (L.meta_rows[m] > want) sum.uncommitted_tail = true;
    }
    const zb__at_array *nl = find_nlist(&L);
    if (nl) {
        st = check_nlist_shape(&L, nl);
        if (st != ZB_OK) goto done;
    }
    /* pointers (and neighbor_list, per sample) in blocks */
    int64_t pa = 0, pe = 0;
    for (uint64_t p0 = 0; p0 < n || p0 == 0; p0 += b.m) {
        st = ptr_block_read(&L, p0, n, pa, pe, &b);
        if (st != ZB_OK) goto done;
        for (uint64_t i = 0; i < b.m; i++) sum.num_live += b.mask[i] != 0;
        pa = b.ap[b.m];
        pe = b.ep[b.m];
        if (b.m == 0) break;
        for (uint64_t q0 = 0; nl && q0 < b.m;) {
            uint64_t q1 = sub_block_end(&b, q0);
            uint64_t e0 = (uint64_t)b.ep[q0], e1 = (uint64_t)b.ep[q1];
            if (e1 > nl->info.shape[0]) break; /* reported below as a short array */
            size_t isz = nl->info.itemsize;
            st = zb__buf_reserve(&nbuf, (size_t)(e1 - e0) * 2 * isz + 1);
            if (st == ZB_OK && e1 > e0)
                st =
                    zb_array_read_rows(nl->a, e0, e1, nbuf.data, (size_t)(e1 - e0) * 2 * isz, NULL);
            /* a soft-deleted sample is skipped: nvalchemi's delete zero-fills its rows */
            for (uint64_t q = q0; st == ZB_OK && q < q1; q++)
                if (b.mask[q])
                    st =
                        localize(&L, nbuf.data, nl->info.dtype, 2 * ((uint64_t)b.ep[q] - e0),
                                 (uint64_t)(b.ep[q + 1] - b.ep[q]), b.p0 + q, b.ap[q], b.ap[q + 1]);
            if (st != ZB_OK) goto done;
            q0 = q1;
        }
    }
    sum.num_atoms = (uint64_t)pa;
    sum.num_edges = (uint64_t)pe;
    uint64_t mask_need[2] = {sum.num_atoms, sum.num_edges};
    for (int m = ZB_AT_ATOMS_MASK; m <= ZB_AT_EDGES_MASK; m++) {
        if (!L.meta[m]) continue;
        uint64_t want = mask_need[m - ZB_AT_ATOMS_MASK];
        if (L.meta_rows[m] < want) {
            st = zb__err(ZB_E_CORRUPT, "%s/meta/%s: %llu entries, %s_ptr[N] = %llu", L.path,
                         zb__at_meta_names[m], (unsigned long long)L.meta_rows[m],
                         m == ZB_AT_ATOMS_MASK ? "atoms" : "edges", (unsigned long long)want);
            goto done;
        }
        if (L.meta_rows[m] > want) sum.uncommitted_tail = true;
    }
    for (size_t i = 0; i < L.n; i++) {
        const zb__at_array *x = &L.arrays[i];
        uint64_t want = need_rows(x, sum.num_atoms, sum.num_edges, n);
        if (x->info.shape[0] < want) {
            st = zb__err(ZB_E_CORRUPT,
                         "%s/%s/%s: %llu rows, but %s level needs %llu (%s); an append that did "
                         "not extend it?",
                         L.path, x->group, x->name, (unsigned long long)x->info.shape[0],
                         zb_atomic_level_name(x->level), (unsigned long long)want,
                         x->level == ZB_ATOMIC_ATOM   ? "atoms_ptr[N]"
                         : x->level == ZB_ATOMIC_EDGE ? "edges_ptr[N]"
                                                      : "num_samples");
            goto done;
        }
        if (x->info.shape[0] > want) sum.uncommitted_tail = true;
    }
    if (out) *out = sum;
done:
    ptr_block_free(&b);
    zb__buf_free(&nbuf);
    zb__at_layout_close(&L);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* Rewriting chunks in place                                                                    */
/* ------------------------------------------------------------------------------------------- */

/* A store that serves one metadata document of its own (an array whose shape is cut to the
 * first row being rewritten) and swallows the writer's put of it, passing everything else to
 * the base store. The array writer appending to the cut array then rewrites exactly the chunks
 * from that row on, each with an atomic put, while the real document never changes. */
typedef struct view_store {
    zb_store *base;
    char key[ZB_AT_KEY_CAP];
    char *text;
    size_t len;
} view_store;

static zb_status
v_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    view_store *v = self;
    if (strcmp(key, v->key) != 0) return zb_store_get(v->base, key, offset, length, dst, nread);
    *nread = 0;
    if (offset >= v->len) return ZB_OK;
    uint64_t k = v->len - offset < length ? v->len - offset : length;
    memcpy(dst, v->text + offset, (size_t)k);
    *nread = k;
    return ZB_OK;
}

static zb_status
v_size(void *self, const char *key, uint64_t *size)
{
    view_store *v = self;
    if (strcmp(key, v->key) != 0) return zb_store_size(v->base, key, size);
    *size = v->len;
    return ZB_OK;
}

static zb_status
v_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    return zb_store_list(((view_store *)self)->base, prefix, fn, ctx);
}

static zb_status
v_put(void *self, const char *key, const void *data, uint64_t length)
{
    view_store *v = self;
    if (!strcmp(key, v->key)) return ZB_OK; /* the real document stays as it is */
    return zb_store_put(v->base, key, data, length);
}

static zb_status
v_erase(void *self, const char *key)
{
    return zb_store_erase(((view_store *)self)->base, key);
}

static zb_status
v_rename(void *self, const char *from, const char *to)
{
    return zb_store_rename(((view_store *)self)->base, from, to);
}

static void
v_close(void *self)
{
    view_store *v = self;
    if (!v) return;
    free(v->text);
    free(v);
}

static const zb_store_methods view_methods = {
    .scheme = "view",
    .get = v_get,
    .size = v_size,
    .list = v_list,
    .put = v_put,
    .erase = v_erase,
    .rename = v_rename,
    .close = v_close,
};

/* Rewrites rows [r0, r0 + nrows) of the array at `apath` with `rows`. r0 must start a stored
 * object (chunk or shard) and r0 + nrows must end one or be the array's length. */
static zb_status
rewrite_rows(zb_store *store, const char *apath, uint64_t r0, const void *rows, uint64_t nrows)
{
    view_store *v = calloc(1, sizeof *v);
    if (!v) return zb__err(ZB_E_NOMEM, "out of memory");
    v->base = store;
    zb_status st = zb__at_join(v->key, sizeof v->key, apath, "zarr.json");
    if (st == ZB_OK && !zb__at_has_key(store, v->key))
        st = zb__at_join(v->key, sizeof v->key, apath, ".zarray");
    uint8_t *text = NULL;
    uint64_t len = 0;
    json_object *doc = NULL;
    if (st == ZB_OK) st = zb_store_read_all(store, v->key, &text, &len);
    if (st == ZB_OK) st = zb__json_parse((const char *)text, (size_t)len, v->key, &doc);
    free(text);
    json_object *shape = st == ZB_OK ? zb__json_get(doc, "shape") : NULL;
    if (st == ZB_OK && (!shape || !json_object_is_type(shape, json_type_array)))
        st = zb__err(ZB_E_METADATA, "%s: no shape", v->key);
    if (st == ZB_OK && json_object_array_put_idx(shape, 0, zb__jw_u64(r0)) != 0)
        st = zb__err(ZB_E_NOMEM, "out of memory");
    if (st == ZB_OK) {
        const char *t = json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN);
        v->len = t ? strlen(t) : 0;
        v->text = t ? strdup(t) : NULL;
        if (!v->text) st = zb__err(ZB_E_NOMEM, "out of memory");
    }
    json_object_put(doc);
    if (st != ZB_OK) {
        v_close(v);
        return st;
    }
    zb_store *vs = NULL;
    st = zb_store_new(&view_methods, v, &vs);
    if (st != ZB_OK) {
        v_close(v);
        return st;
    }
    zb_array_writer *aw = NULL;
    st = zb_array_writer_open_append(vs, apath, NULL, &aw);
    if (st == ZB_OK) st = zb_array_writer_append(aw, rows, nrows);
    if (st == ZB_OK) st = zb_array_writer_commit(aw);
    zb_array_writer_close(aw);
    zb_store_close(vs);
    return st;
}

typedef struct row_range {
    uint64_t start, stop;
} row_range;

/* Clears (sets false) the rows of `ranges` (sorted, disjoint) in the bool array `a` at `apath`,
 * rewriting only the stored objects they touch, and only those whose contents change. */
static zb_status
clear_mask_rows(zb_store *store, const char *apath, const zb_array *a, const row_range *ranges,
                size_t nr)
{
    zb_array_info info;
    ZB_TRY(zb_array_get_info(a, &info));
    uint64_t unit = a->meta.chunks[0], total = info.shape[0];
    if (unit == 0) return zb__err(ZB_E_CORRUPT, "%s: zero chunk rows", apath);
    uint8_t *buf = NULL;
    size_t cap = 0;
    zb_status st = ZB_OK;
    for (size_t i = 0; st == ZB_OK && i < nr;) {
        if (ranges[i].stop <= ranges[i].start) {
            i++;
            continue;
        }
        uint64_t u0 = ranges[i].start / unit, u1 = (ranges[i].stop - 1) / unit;
        size_t j = i + 1;
        while (j < nr && ranges[j].start / unit <= u1 + 1 && (u1 - u0 + 1) * unit < MASK_RUN_ROWS) {
            if (ranges[j].stop > ranges[j].start && (ranges[j].stop - 1) / unit > u1)
                u1 = (ranges[j].stop - 1) / unit;
            j++;
        }
        uint64_t r0 = u0 * unit, r1 = (u1 + 1) * unit;
        if (r1 > total) r1 = total;
        size_t need = (size_t)(r1 - r0);
        if (need > cap) {
            uint8_t *nb = realloc(buf, need);
            if (!nb) {
                st = zb__err(ZB_E_NOMEM, "%s: out of memory", apath);
                break;
            }
            buf = nb;
            cap = need;
        }
        st = zb_array_read_rows(a, r0, r1, buf, need, NULL);
        bool changed = false;
        for (size_t k = i; st == ZB_OK && k < j; k++)
            for (uint64_t r = ranges[k].start; r < ranges[k].stop; r++) {
                changed = changed || buf[r - r0];
                buf[r - r0] = 0;
            }
        if (st == ZB_OK && changed) st = rewrite_rows(store, apath, r0, buf, r1 - r0);
        i = j;
    }
    free(buf);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* Delete                                                                                       */
/* ------------------------------------------------------------------------------------------- */

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Merges touching ranges in place (input sorted by start). */
static size_t
merge_ranges(row_range *r, size_t n)
{
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].stop <= r[i].start) continue;
        if (out && r[out - 1].stop >= r[i].start) {
            if (r[i].stop > r[out - 1].stop) r[out - 1].stop = r[i].stop;
        } else {
            r[out++] = r[i];
        }
    }
    return out;
}

zb_status
zb_atomic_delete(zb_store *store, const char *path, const uint64_t *logical_ids, size_t n)
{
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_atomic_delete: null argument");
    if (n && !logical_ids) return zb__err(ZB_E_INVALID, "zb_atomic_delete: logical_ids is NULL");
    char p[ZB_AT_PATH_CAP];
    ZB_TRY(zb_key_normalize(path, p, sizeof p));
    ZB_TRY(refuse_incomplete(store, p));
    ZB_TRY(zb_atomic_recover(store, p));
    zb__at_layout L;
    ZB_TRY(zb__at_layout_open(store, p, &L));
    zb_status st = ZB_OK;
    uint64_t N = L.num_samples;
    uint8_t *mask = NULL;
    uint64_t *ids = NULL;
    int64_t *ap = NULL, *ep = NULL;
    row_range *ra = NULL, *re = NULL, *rs = NULL;
    if (L.meta_rows[ZB_AT_SAMPLES_MASK] < N || L.meta_rows[ZB_AT_ATOMS_PTR] < N + 1 ||
        L.meta_rows[ZB_AT_EDGES_PTR] < N + 1) {
        st = zb__err(ZB_E_CORRUPT, "%s/meta: shorter than num_samples %llu (run zb_atomic_check)",
                     p, (unsigned long long)N);
        goto done;
    }
    mask = malloc(N ? (size_t)N : 1);
    ids = malloc(n ? n * sizeof *ids : 1);
    if (!mask || !ids) {
        st = zb__err(ZB_E_NOMEM, "zb_atomic_delete: out of memory");
        goto done;
    }
    if (N) st = zb_array_read_rows(L.meta[ZB_AT_SAMPLES_MASK], 0, N, mask, (size_t)N, NULL);
    if (st != ZB_OK) goto done;
    uint64_t live = 0;
    for (uint64_t i = 0; i < N; i++) live += mask[i] != 0;
    for (size_t i = 0; i < n; i++)
        if (logical_ids[i] >= live) {
            st = zb__err(ZB_E_RANGE,
                         "zb_atomic_delete: index %llu out of range for %llu live "
                         "samples",
                         (unsigned long long)logical_ids[i], (unsigned long long)live);
            goto done;
        }
    if (n == 0) goto done;
    memcpy(ids, logical_ids, n * sizeof *ids);
    qsort(ids, n, sizeof *ids, cmp_u64);
    size_t nu = 0;
    for (size_t i = 0; i < n; i++)
        if (!nu || ids[nu - 1] != ids[i]) ids[nu++] = ids[i];
    /* logical -> physical, in one pass (ids is sorted) */
    uint64_t seen = 0;
    size_t k = 0;
    for (uint64_t i = 0; i < N && k < nu; i++) {
        if (!mask[i]) continue;
        if (seen == ids[k]) ids[k++] = i;
        seen++;
    }
    ap = malloc((size_t)(N + 1) * 8);
    ep = malloc((size_t)(N + 1) * 8);
    ra = malloc(nu * sizeof *ra);
    re = malloc(nu * sizeof *re);
    rs = malloc(nu * sizeof *rs);
    if (!ap || !ep || !ra || !re || !rs) {
        st = zb__err(ZB_E_NOMEM, "zb_atomic_delete: out of memory");
        goto done;
    }
    st = zb__at_read_i64(L.meta[ZB_AT_ATOMS_PTR], 0, N + 1, ap);
    if (st == ZB_OK) st = zb__at_read_i64(L.meta[ZB_AT_EDGES_PTR], 0, N + 1, ep);
    if (st != ZB_OK) goto done;
    for (size_t i = 0; i < nu; i++) {
        uint64_t q = ids[i];
        if (ap[q] < 0 || ap[q + 1] < ap[q] || ep[q] < 0 || ep[q + 1] < ep[q]) {
            st = zb__err(ZB_E_CORRUPT, "%s/meta: bad pointers at sample %llu", p,
                         (unsigned long long)q);
            goto done;
        }
        ra[i] = (row_range){(uint64_t)ap[q], (uint64_t)ap[q + 1]};
        re[i] = (row_range){(uint64_t)ep[q], (uint64_t)ep[q + 1]};
        rs[i] = (row_range){q, q + 1};
    }
    size_t na = merge_ranges(ra, nu), ne = merge_ranges(re, nu), nsr = merge_ranges(rs, nu);
    /* the masks nobody reads first, samples_mask (what readers use) last */
    char apath[ZB_AT_KEY_CAP];
    if (L.meta[ZB_AT_ATOMS_MASK]) {
        st = zb__at_join3(apath, sizeof apath, p, "meta", "atoms_mask");
        if (st == ZB_OK) st = clear_mask_rows(store, apath, L.meta[ZB_AT_ATOMS_MASK], ra, na);
    }
    if (st == ZB_OK && L.meta[ZB_AT_EDGES_MASK]) {
        st = zb__at_join3(apath, sizeof apath, p, "meta", "edges_mask");
        if (st == ZB_OK) st = clear_mask_rows(store, apath, L.meta[ZB_AT_EDGES_MASK], re, ne);
    }
    if (st == ZB_OK) {
        st = zb__at_join3(apath, sizeof apath, p, "meta", "samples_mask");
        if (st == ZB_OK) st = clear_mask_rows(store, apath, L.meta[ZB_AT_SAMPLES_MASK], rs, nsr);
    }
done:
    free(mask);
    free(ids);
    free(ap);
    free(ep);
    free(ra);
    free(re);
    free(rs);
    zb__at_layout_close(&L);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* add_custom                                                                                   */
/* ------------------------------------------------------------------------------------------- */

/* What zb_atomic_add_custom asks of the field before it opens the store. */
static zb_status
check_custom_field(const zb_atomic_field *field, uint64_t n_rows)
{
    if (field->group && strcmp(field->group, "custom") != 0)
        return zb__err(ZB_E_INVALID,
                       "zb_atomic_add_custom: group '%s': only custom fields can "
                       "be added",
                       field->group);
    ZB_TRY(zb__at_check_name("custom field", field->name));
    if (field->level != ZB_ATOMIC_ATOM && field->level != ZB_ATOMIC_EDGE &&
        field->level != ZB_ATOMIC_SYSTEM)
        return zb__err(ZB_E_INVALID, "custom field '%s': level %d is not atom, edge or system",
                       field->name, (int)field->level);
    if (field->dtype < 0 || field->dtype >= ZB_DT_COUNT_ || field->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_INVALID, "custom field '%s': dtype must be a fixed-size type",
                       field->name);
    if (field->ndim < 0 || field->ndim > ZB_MAX_DIMS - 1 || (field->ndim && !field->shape))
        return zb__err(ZB_E_INVALID, "custom field '%s': bad ndim/shape", field->name);
    for (int d = 0; d < field->ndim; d++)
        if (!field->shape[d])
            return zb__err(ZB_E_INVALID, "custom field '%s': zero dimension", field->name);
    if (n_rows && !field->data)
        return zb__err(ZB_E_INVALID, "custom field '%s': data is NULL", field->name);
    return ZB_OK;
}

zb_status
zb_atomic_add_custom(zb_store *store, const char *path, const zb_atomic_write_config *cfg,
                     const zb_atomic_field *field, uint64_t n_rows)
{
    if (!store || !path || !field)
        return zb__err(ZB_E_INVALID, "zb_atomic_add_custom: null argument");
    ZB_TRY(check_custom_field(field, n_rows));
    zb__at_cfg c;
    ZB_TRY(zb__at_cfg_copy(cfg, &c));
    char p[ZB_AT_PATH_CAP];
    zb_status st = zb_key_normalize(path, p, sizeof p);
    if (st == ZB_OK) st = refuse_incomplete(store, p);
    if (st == ZB_OK) st = zb_atomic_recover(store, p);
    zb__at_layout L;
    memset(&L, 0, sizeof L);
    if (st == ZB_OK) st = zb__at_layout_open(store, p, &L);
    json_object *before = NULL;
    zb_array_writer *aw = NULL;
    if (st != ZB_OK) goto done;
    uint64_t N = L.num_samples;
    int64_t va = 0, ve = 0;
    if (L.meta_rows[ZB_AT_ATOMS_PTR] < N + 1 || L.meta_rows[ZB_AT_EDGES_PTR] < N + 1) {
        st = zb__err(ZB_E_CORRUPT, "%s/meta: pointer arrays shorter than num_samples + 1", p);
        goto done;
    }
    st = read_ptr_at(&L, ZB_AT_ATOMS_PTR, N, &va);
    if (st == ZB_OK) st = read_ptr_at(&L, ZB_AT_EDGES_PTR, N, &ve);
    if (st != ZB_OK) goto done;
    uint64_t want = rows_for(field->level, (uint64_t)va, (uint64_t)ve, N);
    if (n_rows != want) {
        st = zb__err(ZB_E_INVALID, "custom field '%s': %llu rows given, %s level needs %llu (%s)",
                     field->name, (unsigned long long)n_rows, zb_atomic_level_name(field->level),
                     (unsigned long long)want,
                     field->level == ZB_ATOMIC_ATOM   ? "the store's atoms"
                     : field->level == ZB_ATOMIC_EDGE ? "the store's edges"
                                                      : "num_samples");
        goto done;
    }
    /* every value finite, as zb_atomic_writer_add asks (an overflowing size is refused by the
     * array writer below, before any value is read) */
    uint64_t row_elems = 1, elems = 0;
    bool sized = true;
    for (int d = 0; d < field->ndim; d++)
        sized = sized && zb__mul_u64(row_elems, field->shape[d], &row_elems);
    sized = sized && zb__mul_u64(n_rows, row_elems, &elems);
    uint64_t bad =
        sized && field->data ? zb__at_first_non_finite(field->dtype, field->data, elems) : elems;
    if (bad < elems) {
        st = zb__err(ZB_E_INVALID,
                     "custom field '%s': a non-finite value (NaN or infinity) in "
                     "row %llu",
                     field->name, (unsigned long long)(bad / row_elems));
        goto done;
    }
    for (size_t i = 0; i < L.n; i++)
        if (!strcmp(L.arrays[i].name, field->name)) {
            st = zb__err(ZB_E_INVALID, "custom field '%s': %s/%s already exists", field->name,
                         L.arrays[i].group, field->name);
            goto done;
        }
    char gpath[ZB_AT_KEY_CAP], apath[ZB_AT_KEY_CAP], key[ZB_AT_KEY_CAP];
    st = zb__at_join(gpath, sizeof gpath, p, "custom");
    if (st == ZB_OK) st = zb__at_join(apath, sizeof apath, gpath, field->name);
    if (st == ZB_OK) st = zb__at_join(key, sizeof key, gpath, "zarr.json");
    if (st == ZB_OK && !zb__at_has_key(store, key)) st = zb__write_group(store, gpath, 3, NULL);
    if (st != ZB_OK) goto done;
    /* stale chunks of an earlier attempt that never committed its metadata */
    st = zb__at_remove_tree(store, apath);
    if (st != ZB_OK) goto done;
    zb_array_write_opts o;
    uint64_t shape[ZB_MAX_DIMS];
    uint64_t row_bytes = zb_dtype_size(field->dtype);
    for (int d = 0; d < field->ndim; d++) {
        shape[d] = field->shape[d];
        if (!zb__mul_u64(row_bytes, shape[d], &row_bytes)) row_bytes = UINT64_MAX;
    }
    /* (an overflowing row is refused by the array writer below) */
    zb__at_cfg_resolve(&c, "custom", field->name,
                       row_bytes > SIZE_MAX ? SIZE_MAX : (size_t)row_bytes, &o);
    st = zb_array_writer_open(store, apath, field->dtype, field->ndim + 1, shape, &o, &aw);
    if (st != ZB_OK) goto done;
    /* the level first: a crash then leaves a named array that does not exist yet (ignored),
     * never an array whose level nvalchemi would guess as "system" */
    before = json_object_get(L.attrs);
    json_object *attrs = NULL;
    if (json_object_deep_copy(L.attrs, &attrs, NULL) != 0) {
        st = zb__err(ZB_E_NOMEM, "out of memory");
        goto done;
    }
    st = zb__at_fields_set(attrs, "custom", field->name, field->level);
    if (st == ZB_OK) st = zb__at_write_root(store, p, attrs);
    json_object_put(attrs);
    if (st != ZB_OK) goto done;
    if (n_rows) st = zb_array_writer_append(aw, field->data, n_rows);
    if (st == ZB_OK) st = zb_array_writer_commit(aw);
    if (st != ZB_OK) {
        /* undo the level (best effort; the error that matters is st) */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zb_last_error());
        zb__at_write_root(store, p, before);
        zb__err(st, "%s", msg);
    }
done:
    zb_array_writer_close(aw);
    json_object_put(before);
    zb__at_layout_close(&L);
    zb__at_cfg_free(&c);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* Defragment                                                                                   */
/* ------------------------------------------------------------------------------------------- */

/* The codec string of an array's chain, when the writer can express it. */
static bool
codec_string(const zb_array *a, char *buf, size_t cap)
{
    const zb__chain *c = &a->meta.chain;
    if (c->ab == ZB_AB_SHARDING) c = c->shard->inner_chain;
    if (c->ab != ZB_AB_BYTES || c->has_transpose) return false;
    if (c->nbb == 0) {
        snprintf(buf, cap, "none");
        return true;
    }
    if (c->nbb != 1) return false;
    const zb__codec *k = &c->bb[0];
    static const char *const shuffles[3] = {"noshuffle", "shuffle", "bitshuffle"};
    switch (k->id) {
    case ZB_CODEC_ZSTD:
        snprintf(buf, cap, "zstd:%d%s", k->level, k->checksum ? ":checksum" : "");
        return true;
    case ZB_CODEC_BLOSC: {
        int sh = k->shuffle;
        /* zarr-python's derivation for an unset shuffle (FORMATS.md §3.4) */
        if (sh < 0 || sh > 2) sh = a->meta.itemsize > 1 ? 1 : 2;
        snprintf(buf, cap, "blosc:%s:%d:%s", k->cname, k->level, shuffles[sh]);
        return true;
    }
    case ZB_CODEC_LZ4:
        snprintf(buf, cap, "lz4:%d", k->acceleration);
        return true;
    case ZB_CODEC_GZIP:
        snprintf(buf, cap, "gzip:%d", k->level);
        return true;
    case ZB_CODEC_ZLIB:
        snprintf(buf, cap, "zlib:%d", k->level);
        return true;
    default:
        return false;
    }
}

/* An override keeping `a`'s codec, chunk rows and shard rows. */
static zb_status
keep_config(zb__at_cfg *c, const char *group, const char *name, const zb_array *a)
{
    char codec[64], qual[ZB_AT_NAME_CAP + 16];
    zb_atomic_array_config ac = {NULL, 0, ZB_ATOMIC_NO_SHARDS};
    if (codec_string(a, codec, sizeof codec)) ac.codec = codec;
    if (a->meta.chain.ab == ZB_AB_SHARDING) {
        ac.shard_rows = a->meta.chunks[0];
        ac.chunk_rows = a->meta.chain.shard->inner[0];
    } else {
        ac.chunk_rows = a->meta.chunks[0];
    }
    snprintf(qual, sizeof qual, "%s/%s", group, name);
    zb_status st = zb__at_cfg_add_override(c, qual, &ac);
    if (st == ZB_E_INVALID) {
        /* something the writer cannot reproduce: fall back to its defaults for that array */
        zb_clear_error();
        zb_atomic_array_config none = {NULL, 0, 0};
        st = zb__at_cfg_add_override(c, qual, &none);
    }
    return st;
}

typedef struct defrag_col {
    zb_atomic_field f;
    const zb__at_array *x;
    size_t row_bytes;
    zb__buf buf;
} defrag_col;

/* Copies the live samples of block b into the new writer. */
static zb_status
copy_block(const zb__at_layout *L, zb_atomic_writer *w, const ptr_block *b, defrag_col *cols,
           size_t ncols, int64_t *na, int64_t *ne)
{
    for (uint64_t q0 = 0; q0 < b->m;) {
        uint64_t q1 = sub_block_end(b, q0);
        uint64_t live = 0;
        for (uint64_t q = q0; q < q1; q++)
            if (b->mask[q]) {
                na[live] = b->ap[q + 1] - b->ap[q];
                ne[live] = b->ep[q + 1] - b->ep[q];
                live++;
            }
        if (live == 0) {
            q0 = q1;
            continue;
        }
        for (size_t i = 0; i < ncols; i++) {
            defrag_col *c = &cols[i];
            const int64_t *ptr = c->x->level == ZB_ATOMIC_ATOM ? b->ap : b->ep;
            uint64_t r0, r1;
            if (c->x->level == ZB_ATOMIC_SYSTEM) {
                r0 = b->p0 + q0;
                r1 = b->p0 + q1;
            } else {
                r0 = (uint64_t)ptr[q0];
                r1 = (uint64_t)ptr[q1];
            }
            if (r1 > c->x->info.shape[0])
                return zb__err(ZB_E_CORRUPT, "%s/%s/%s: %llu rows, the pointers need %llu", L->path,
                               c->x->group, c->x->name, (unsigned long long)c->x->info.shape[0],
                               (unsigned long long)r1);
            size_t bytes = (size_t)(r1 - r0) * c->row_bytes;
            ZB_TRY(zb__buf_reserve(&c->buf, bytes + 1));
            if (r1 > r0) ZB_TRY(zb_array_read_rows(c->x->a, r0, r1, c->buf.data, bytes, NULL));
            /* compact the live samples to the front (never overlapping forward) */
            size_t dst = 0;
            bool nlist = !strcmp(c->x->group, "core") && !strcmp(c->x->name, "neighbor_list");
            for (uint64_t q = q0; q < q1; q++) {
                if (!b->mask[q]) continue;
                uint64_t s0, s1;
                if (c->x->level == ZB_ATOMIC_SYSTEM) {
                    s0 = b->p0 + q - r0;
                    s1 = s0 + 1;
                } else {
                    s0 = (uint64_t)ptr[q] - r0;
                    s1 = (uint64_t)ptr[q + 1] - r0;
                }
                size_t len = (size_t)(s1 - s0) * c->row_bytes;
                if (len) memmove(c->buf.data + dst, c->buf.data + s0 * c->row_bytes, len);
                if (nlist)
                    ZB_TRY(localize(L, c->buf.data, c->x->info.dtype,
                                    (uint64_t)dst / zb_dtype_size(c->x->info.dtype), s1 - s0,
                                    b->p0 + q, b->ap[q], b->ap[q + 1]));
                dst += len;
            }
            c->f.data = c->buf.data;
        }
        zb_atomic_field *fields = malloc((ncols ? ncols : 1) * sizeof *fields);
        if (!fields) return zb__err(ZB_E_NOMEM, "out of memory");
        for (size_t i = 0; i < ncols; i++) fields[i] = cols[i].f;
        zb_status st = zb_atomic_writer_add(w, live, na, ne, ncols, fields);
        free(fields);
        ZB_TRY(st);
        q0 = q1;
    }
    return ZB_OK;
}

/* Moves `path` aside: `<path>.zbatch-old`, or a numbered variant when a backend that cannot
 * erase directories kept an emptied one under that name. */
static zb_status
move_aside(zb_store *store, const char *path, char *aside, size_t cap)
{
    zb_status st = ZB_E_IO;
    for (int k = 0; k < 1024; k++) {
        int n = k ? snprintf(aside, cap, "%s%s.%d", path, OLD_SUFFIX, k)
                  : snprintf(aside, cap, "%s%s", path, OLD_SUFFIX);
        if (n < 0 || (size_t)n >= cap) return zb__err(ZB_E_INVALID, "'%s': path too long", path);
        if (zb__at_has_keys_below(store, aside)) continue; /* never over a store */
        st = zb__at_rename_tree(store, path, aside);
        if (st != ZB_E_IO) return st;
        zb_clear_error();
    }
    return zb__err(ZB_E_IO, "'%s': cannot rename it aside", path);
}

zb_status
zb_atomic_defragment(zb_store *store, const char *path, const zb_atomic_write_config *cfg)
{
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_atomic_defragment: null argument");
    char p[ZB_AT_PATH_CAP], newp[ZB_AT_PATH_CAP + 16], aside[ZB_AT_PATH_CAP + 32];
    ZB_TRY(zb_key_normalize(path, p, sizeof p));
    if (!p[0])
        return zb__err(ZB_E_INVALID,
                       "zb_atomic_defragment: the dataset is the store root; open "
                       "the parent directory as the store so the new store can be swapped in");
    snprintf(newp, sizeof newp, "%s%s", p, NEW_SUFFIX);
    ZB_TRY(refuse_incomplete(store, p));
    ZB_TRY(zb_atomic_recover(store, p));
    zb__at_layout L;
    ZB_TRY(zb__at_layout_open(store, p, &L));
    zb__at_cfg c;
    memset(&c, 0, sizeof c);
    zb_status st = zb__at_cfg_copy(cfg, &c);
    zb_atomic_writer *w = NULL;
    defrag_col *cols = NULL;
    ptr_block b = {0};
    int64_t *na = NULL, *ne = NULL;
    json_object *attrs = NULL;
    bool cfg_taken = false;
    size_t ncols = L.n;
    if (st != ZB_OK) goto done;
    if (!cfg) {
        for (int m = 0; st == ZB_OK && m < ZB_AT_NMETA; m++)
            if (L.meta[m]) st = keep_config(&c, "meta", zb__at_meta_names[m], L.meta[m]);
        for (size_t i = 0; st == ZB_OK && i < L.n; i++)
            st = keep_config(&c, L.arrays[i].group, L.arrays[i].name, L.arrays[i].a);
        if (st != ZB_OK) goto done;
    }
    uint64_t N = L.num_samples;
    if (L.meta_rows[ZB_AT_SAMPLES_MASK] < N || L.meta_rows[ZB_AT_ATOMS_PTR] < N + 1 ||
        L.meta_rows[ZB_AT_EDGES_PTR] < N + 1) {
        st = zb__err(ZB_E_CORRUPT, "%s/meta: shorter than num_samples %llu (run zb_atomic_check)",
                     p, (unsigned long long)N);
        goto done;
    }
    const zb__at_array *nl = find_nlist(&L);
    if (nl) {
        st = check_nlist_shape(&L, nl);
        if (st != ZB_OK) goto done;
    }
    /* debris of an earlier attempt (recovery keeps an incomplete new store only when the
     * dataset itself is incomplete, which was refused above) */
    if (zb__at_has_keys_below(store, newp)) {
        st = zb__at_remove_tree(store, newp);
        if (st != ZB_OK) goto done;
    }
    if (json_object_deep_copy(L.attrs, &attrs, NULL) != 0) {
        st = zb__err(ZB_E_NOMEM, "out of memory");
        goto done;
    }
    st = zb__at_writer_open_new(store, newp, &c, attrs, &w);
    if (st != ZB_OK) goto done;
    zb__at_writer_set_copying(w);
    cfg_taken = true;
    cols = calloc(L.n ? L.n : 1, sizeof *cols);
    na = malloc((size_t)PTR_BLOCK * 8);
    ne = malloc((size_t)PTR_BLOCK * 8);
    zb_atomic_field *fields = malloc((L.n ? L.n : 1) * sizeof *fields);
    if (!cols || !na || !ne || !fields) {
        free(fields);
        st = zb__err(ZB_E_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < L.n; i++) {
        const zb__at_array *x = &L.arrays[i];
        if (x->info.dtype == ZB_DT_STRING) {
            free(fields);
            st = zb__err(ZB_E_UNSUPPORTED, "%s/%s/%s: string arrays are not atomic fields", p,
                         x->group, x->name);
            goto done;
        }
        cols[i].x = x;
        cols[i].row_bytes = (size_t)zb_array_row_elems(x->a) * x->info.itemsize;
        cols[i].f = (zb_atomic_field){x->group,         x->name,           x->level, x->info.dtype,
                                      x->info.ndim - 1, x->info.shape + 1, NULL};
        fields[i] = cols[i].f;
    }
    /* fixes the field set, so every array exists even when nothing is live */
    st = zb_atomic_writer_add(w, 0, NULL, NULL, L.n, fields);
    free(fields);
    int64_t pa = 0, pe = 0;
    for (uint64_t p0 = 0; st == ZB_OK && p0 < N; p0 += b.m) {
        st = ptr_block_read(&L, p0, N, pa, pe, &b);
        if (st == ZB_OK) st = copy_block(&L, w, &b, cols, L.n, na, ne);
        pa = b.ap[b.m];
        pe = b.ep[b.m];
    }
    if (st == ZB_OK) st = zb_atomic_writer_commit(w);
    zb_atomic_writer_close(w);
    w = NULL;
    if (st != ZB_OK) {
        /* a failure (not a crash): the half-written new store goes; the dataset is untouched */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zb_last_error());
        zb__at_remove_tree(store, newp);
        zb__err(st, "%s", msg);
        goto done;
    }
    /* the swap: old aside, new in, old removed (recovery rule in zbatch_atomic.h) */
    zb__at_layout_close(&L);
    st = move_aside(store, p, aside, sizeof aside);
    if (st == ZB_OK) st = zb__at_rename_tree(store, newp, p);
    if (st == ZB_OK) st = zb__at_remove_tree(store, aside);
done:
    zb_atomic_writer_close(w);
    if (!cfg_taken) zb__at_cfg_free(&c);
    if (cols)
        for (size_t i = 0; i < ncols; i++) zb__buf_free(&cols[i].buf);
    free(cols);
    free(na);
    free(ne);
    ptr_block_free(&b);
    json_object_put(attrs);
    zb__at_layout_close(&L);
    return st;
}
