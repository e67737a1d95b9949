/* Planning a conversion (zbatch_convert.h): from the inputs' metadata to plan.json — the gene
 * list and each input's gene map, the merged obs columns, the cells' count and the scatter
 * slices. Reads names, categories and pointer arrays (in blocks), never matrix values.
 * cv_plan_load (convert.c) turns the document back into a zb_convert. */
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert_int.h"
#include "util/json.h"
#include "util/status.h"
#include "util/strmap.h"
#include "write/write.h"

/* Rows of pointers read per step while slicing (bounds the planner's memory). */
#define INDPTR_BLOCK ((uint64_t)1 << 20)
/* Most rows in one scatter slice, whatever their size (bounds the per-cell arrays). */
#define SLICE_MAX_ROWS ((uint64_t)1 << 20)

typedef struct planner {
    const zb_convert_opts *o;
    const char *const *paths;
    size_t n;          /* inputs */
    size_t n_mats;     /* X, then layers */
    const char **keys; /* input keys of the matrices */
    zb__src **srcs;
    zb__src_matrix ***mats; /* [n][n_mats] */
    zb_strings *var;        /* [n] var names of each input's X */
    cv_strbuf genes;
    json_object *doc;
} planner;

/* ---- gene list --------------------------------------------------------------------------------- */

static zb_status
read_gene_file(const char *path, cv_strbuf *out)
{
    char *text;
    size_t len;
    zb_status st = cv_read_file(path, &text, &len);
    if (st != ZB_OK) return zb__err_context(st, "--genes");
    for (size_t i = 0; i < len && st == ZB_OK;) {
        size_t e = i;
        while (e < len && text[e] != '\n') e++;
        size_t l = e - i;
        if (l && text[i + l - 1] == '\r') l--;
        if (l) st = cv_strbuf_push(out, text + i, l);
        i = e + 1;
    }
    free(text);
    return st;
}

/* Duplicate names make alignment ambiguous: refused, naming where. */
static zb_status
check_unique(const zb_strings *names, const char *what, const char *where)
{
    zb__strmap m;
    uint64_t dup;
    ZB_TRY(zb__strmap_build(&m, names, &dup));
    zb__strmap_free(&m);
    if (dup == UINT64_MAX) return ZB_OK;
    return zb__err(ZB_E_INVALID,
                   "%s: %s '%.*s' appears twice (at %" PRIu64 "); names must be "
                   "unique to align genes",
                   where, what, (int)(names->offsets[dup + 1] - names->offsets[dup]),
                   names->data + names->offsets[dup], dup);
}

static const zb_strings *sort_table; /* qsort has no context argument; planning is serial */

static int
cmp_name_index(const void *a, const void *b)
{
    return cv_strings_cmp(sort_table, *(const uint64_t *)a, sort_table, *(const uint64_t *)b);
}

/* Every name of any input, sorted, each once (pandas' Index.union). */
static zb_status
outer_join(planner *p)
{
    cv_strbuf all = {0};
    zb_status st = ZB_OK;
    for (size_t k = 0; k < p->n && st == ZB_OK; k++)
        for (uint64_t i = 0; i < p->var[k].n && st == ZB_OK; i++)
            st = cv_strbuf_push_from(&all, &p->var[k], i);
    uint64_t *idx = st == ZB_OK ? malloc((size_t)(all.s.n ? all.s.n : 1) * sizeof *idx) : NULL;
    if (st == ZB_OK && !idx) st = zb__err(ZB_E_NOMEM, "the gene list");
    if (st == ZB_OK) {
        for (uint64_t i = 0; i < all.s.n; i++) idx[i] = i;
        sort_table = &all.s;
        qsort(idx, (size_t)all.s.n, sizeof *idx, cmp_name_index);
        for (uint64_t i = 0; i < all.s.n && st == ZB_OK; i++)
            if (i == 0 || cv_strings_cmp(&all.s, idx[i - 1], &all.s, idx[i]) != 0)
                st = cv_strbuf_push_from(&p->genes, &all.s, idx[i]);
    }
    free(idx);
    zb_strings_free(&all.s);
    return st;
}

/* The first input's names that every other input has, in its order (Index.intersection). */
static zb_status
inner_join(planner *p)
{
    zb__strmap *maps = calloc(p->n, sizeof *maps);
    if (!maps) return zb__err(ZB_E_NOMEM, "the gene list");
    zb_status st = ZB_OK;
    for (size_t k = 1; k < p->n && st == ZB_OK; k++)
        st = zb__strmap_build(&maps[k], &p->var[k], NULL);
    const zb_strings *first = &p->var[0];
    for (uint64_t i = 0; i < first->n && st == ZB_OK; i++) {
        const char *s = first->data + first->offsets[i];
        size_t len = (size_t)(first->offsets[i + 1] - first->offsets[i]);
        bool everywhere = true;
        for (size_t k = 1; k < p->n && everywhere; k++)
            everywhere = zb__strmap_find(&maps[k], s, len) >= 0;
        if (everywhere) st = cv_strbuf_push(&p->genes, s, len);
    }
    for (size_t k = 0; k < p->n; k++) zb__strmap_free(&maps[k]);
    free(maps);
    return st;
}

static zb_status
gene_list(planner *p)
{
    for (size_t k = 0; k < p->n; k++) ZB_TRY(check_unique(&p->var[k], "var name", p->paths[k]));
    zb_status st;
    if (p->o->genes) {
        st = read_gene_file(p->o->genes, &p->genes);
        if (st == ZB_OK) st = check_unique(&p->genes.s, "gene", p->o->genes);
    } else {
        bool same = true;
        for (size_t k = 1; k < p->n && same; k++) same = cv_strings_equal(&p->var[0], &p->var[k]);
        if (same) {
            st = ZB_OK;
            for (uint64_t i = 0; i < p->var[0].n && st == ZB_OK; i++)
                st = cv_strbuf_push_from(&p->genes, &p->var[0], i);
        } else {
            st = p->o->var_join == ZB_VAR_INNER ? inner_join(p) : outer_join(p);
        }
    }
    if (st == ZB_OK && p->genes.s.n == 0)
        st = zb__err(ZB_E_INVALID, "the output would have no genes (%s)",
                     p->o->genes ? "the gene file names none"
                                 : "the inputs share no var names (an inner join)");
    if (st == ZB_OK && p->genes.s.n > (uint64_t)INT32_MAX)
        st = zb__err(ZB_E_INVALID, "%" PRIu64 " genes: at most %d", p->genes.s.n, INT32_MAX);
    return st;
}

/* Writes maps/i<k>-m<j>.bin (int32 output gene per input column, -1 = dropped) and records
 * whether the map keeps column order. */
static zb_status
gene_map(planner *p, const char *work, const zb__strmap *genes, size_t k, size_t j,
         json_object *mat)
{
    zb_strings names = {0};
    ZB_TRY(zb__src_matrix_var_names(p->mats[k][j], &names));
    zb_status st = ZB_OK;
    int32_t *map = malloc((size_t)(names.n ? names.n : 1) * sizeof *map);
    if (!map) st = zb__err(ZB_E_NOMEM, "%s: a gene map", p->paths[k]);
    bool monotone = true, identity = names.n == genes->keys->n;
    int32_t last = -1;
    uint64_t kept = 0;
    for (uint64_t i = 0; st == ZB_OK && i < names.n; i++) {
        int64_t g = zb__strmap_find(genes, names.data + names.offsets[i],
                                    (size_t)(names.offsets[i + 1] - names.offsets[i]));
        map[i] = (int32_t)g;
        identity = identity && g == (int64_t)i;
        if (g < 0) continue;
        kept++;
        if ((int32_t)g < last) monotone = false;
        last = (int32_t)g;
    }
    char path[4200];
    if (st == ZB_OK) {
        snprintf(path, sizeof path, "%s/maps/i%zu-m%zu.bin", work, k, j);
        const void *bufs[1] = {map};
        size_t lens[1] = {(size_t)names.n * sizeof *map};
        st = cv_write_file(path, bufs, lens, 1);
    }
    if (st == ZB_OK) {
        int ok = 1;
        zb__jw_add(mat, "monotone", json_object_new_boolean(monotone), &ok);
        zb__jw_add(mat, "identity", json_object_new_boolean(identity), &ok);
        zb__jw_add(mat, "genes_kept", zb__jw_u64(kept), &ok);
        if (!ok) st = zb__err(ZB_E_NOMEM, "the plan");
    }
    free(map);
    zb_strings_free(&names);
    return st;
}

/* ---- obs columns ------------------------------------------------------------------------------- */

static const char *const kind_names[] = {"numeric", "categorical", "string", "nullable"};

static bool
reserved_column(const char *name)
{
    return !strcmp(name, "src_path") || !strcmp(name, "src_row");
}

/* The columns kept: every column all inputs have (input 0's order), or the ones asked for. */
static zb_status
column_names(planner *p, const char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    const zb__src_common *c0 = &p->srcs[0]->c;
    size_t cap = p->o->obs ? p->o->n_obs : c0->n_columns;
    const char **out = calloc(cap ? cap : 1, sizeof *out);
    if (!out) return zb__err(ZB_E_NOMEM, "obs columns");
    size_t m = 0;
    if (p->o->obs) {
        for (size_t i = 0; i < p->o->n_obs; i++) {
            const char *name = p->o->obs[i];
            if (reserved_column(name)) {
                free(out);
                return zb__err(ZB_E_INVALID,
                               "obs column '%s': the converter adds it itself "
                               "(the source file and row of every cell)",
                               name);
            }
            for (size_t k = 0; k < p->n; k++) {
                size_t idx;
                zb_status st = zb__src_find_column(p->srcs[k], name, &idx);
                if (st == ZB_OK) continue;
                free(out);
                const char *why = zb__src_skipped_reason(&p->srcs[k]->c, name);
                if (why)
                    return zb__err(ZB_E_UNSUPPORTED,
                                   "%s: obs column '%s' cannot be converted "
                                   "(asked for with --obs): %s",
                                   p->paths[k], name, why);
                return zb__err(ZB_E_NOTFOUND, "%s: no obs column '%s' (asked for with --obs)",
                               p->paths[k], name);
            }
            out[m++] = name;
        }
    } else {
        for (size_t i = 0; i < c0->n_columns; i++) {
            const char *name = c0->columns[i].name;
            bool everywhere = !reserved_column(name);
            for (size_t k = 1; k < p->n && everywhere; k++) {
                size_t idx;
                everywhere = zb__src_find_column(p->srcs[k], name, &idx) == ZB_OK;
                zb_clear_error();
            }
            if (everywhere) out[m++] = name;
        }
    }
    *names = out;
    *n = m;
    return ZB_OK;
}

typedef enum family { FAM_CATEGORICAL, FAM_STRING, FAM_NUMBER } family;

static family
family_of(const zb__col_info *c)
{
    if (c->kind == ZB_COL_CATEGORICAL) return FAM_CATEGORICAL;
    return c->dtype == ZB_DT_STRING ? FAM_STRING : FAM_NUMBER;
}

/* The output kind and dtype of a column from its kinds in the inputs: one family everywhere
 * (categorical, text, numbers); numbers promoted; nullable when any input's is. */
static zb_status
merge_kind(planner *p, const char *name, const zb__col_info *const *in, zb__col_kind *kind,
           zb_dtype *dtype)
{
    family f = family_of(in[0]);
    bool nullable = false;
    *dtype = in[0]->dtype;
    for (size_t k = 0; k < p->n; k++) {
        nullable |= in[k]->kind == ZB_COL_NULLABLE;
        bool string_cats = f == FAM_CATEGORICAL && in[k]->kind == ZB_COL_CATEGORICAL &&
                           (in[0]->dtype == ZB_DT_STRING) != (in[k]->dtype == ZB_DT_STRING);
        if (family_of(in[k]) != f || string_cats)
            return zb__err(ZB_E_INVALID,
                           "obs column '%s' is %s of %s in %s but %s of %s in %s: they cannot "
                           "be merged into one column",
                           name, kind_names[in[0]->kind], zb_dtype_name(in[0]->dtype), p->paths[0],
                           kind_names[in[k]->kind], zb_dtype_name(in[k]->dtype), p->paths[k]);
        if (*dtype == ZB_DT_STRING) continue;
        zb_dtype t = cv_promote(*dtype, in[k]->dtype);
        if (t == ZB_DT_COUNT_)
            return zb__err(ZB_E_INVALID,
                           "obs column '%s': %s in %s and %s in %s have no common "
                           "type",
                           name, zb_dtype_name(*dtype), p->paths[0], zb_dtype_name(in[k]->dtype),
                           p->paths[k]);
        *dtype = t;
    }
    if (f == FAM_CATEGORICAL)
        *kind = ZB_COL_CATEGORICAL;
    else if (nullable)
        *kind = ZB_COL_NULLABLE;
    else
        *kind = f == FAM_STRING ? ZB_COL_STRING : ZB_COL_NUMERIC;
    return ZB_OK;
}

/* Text of category i of an input column, converted to the output's dtype first. */
static size_t
category_key(const zb__col_info *c, uint64_t i, zb_dtype out, char *buf, size_t cap)
{
    if (c->dtype == ZB_DT_STRING) {
        size_t len = (size_t)(c->categories->offsets[i + 1] - c->categories->offsets[i]);
        if (len >= cap) len = cap - 1;
        memcpy(buf, c->categories->data + c->categories->offsets[i], len);
        buf[len] = '\0';
        return len;
    }
    unsigned char v[16];
    cv_convert_values(v, out, (const char *)c->category_values + i * zb_dtype_size(c->dtype),
                      c->dtype, 1);
    return zb__src_category_text(out, v, buf, cap);
}

/* Sort order of numeric category texts by value (plan-time only). */
static zb_dtype sort_dtype;
static const zb_strings *sort_cats;

static double
category_number(const zb_strings *s, uint64_t i)
{
    char buf[64];
    size_t len = (size_t)(s->offsets[i + 1] - s->offsets[i]);
    if (len >= sizeof buf) len = sizeof buf - 1;
    memcpy(buf, s->data + s->offsets[i], len);
    buf[len] = '\0';
    if (!strcmp(buf, "True")) return 1;
    if (!strcmp(buf, "False")) return 0;
    return strtod(buf, NULL);
}

static int
cmp_category(const void *a, const void *b)
{
    uint64_t i = *(const uint64_t *)a, j = *(const uint64_t *)b;
    if (sort_dtype == ZB_DT_STRING) return cv_strings_cmp(sort_cats, i, sort_cats, j);
    double x = category_number(sort_cats, i), y = category_number(sort_cats, j);
    return x < y ? -1 : x > y ? 1 : 0;
}

/* The output's category table and each input's code map, into `col` (a JSON object): an
 * input's table when every input has the same one, else the sorted union of them all (by
 * value for numbers), as pandas' Index.union orders it. */
static zb_status
merge_categories(planner *p, const char *name, const zb__col_info *const *in, zb_dtype dtype,
                 json_object *col, json_object *sources)
{
    cv_strbuf all = {0}, out = {0};
    zb__strmap map = {0};
    zb_status st = ZB_OK;
    char key[512];
    bool same = true;
    for (size_t k = 1; k < p->n && same; k++)
        same =
            in[k]->dtype == in[0]->dtype && cv_strings_equal(in[0]->categories, in[k]->categories);
    uint64_t first_n = in[0]->categories->n;
    for (size_t k = 0; k < p->n && st == ZB_OK; k++)
        for (uint64_t i = 0; i < in[k]->categories->n && st == ZB_OK; i++)
            st = cv_strbuf_push(&all, key, category_key(in[k], i, dtype, key, sizeof key));
    if (st == ZB_OK) { /* the first input's table, converted, must name each category once */
        zb_strings head = {first_n, all.s.offsets, all.s.data};
        st = check_unique(&head, "category", p->paths[0]);
        if (st != ZB_OK) st = zb__err_context(ZB_E_CORRUPT, "obs column '%s'", name);
    }
    uint64_t *idx = st == ZB_OK ? malloc((size_t)(all.s.n ? all.s.n : 1) * sizeof *idx) : NULL;
    if (st == ZB_OK && !idx) st = zb__err(ZB_E_NOMEM, "obs column '%s'", name);
    if (st == ZB_OK) {
        uint64_t m = same ? first_n : all.s.n;
        for (uint64_t i = 0; i < m; i++) idx[i] = i;
        if (!same) {
            sort_dtype = dtype;
            sort_cats = &all.s;
            qsort(idx, (size_t)m, sizeof *idx, cmp_category);
        }
        for (uint64_t i = 0; i < m && st == ZB_OK; i++)
            if (same || i == 0 || cv_strings_cmp(&all.s, idx[i - 1], &all.s, idx[i]) != 0)
                st = cv_strbuf_push_from(&out, &all.s, idx[i]);
    }
    free(idx);
    if (st == ZB_OK) st = zb__strmap_build(&map, &out.s, NULL);
    int ok = 1;
    json_object *cats = zb__jw_add(col, "categories", json_object_new_array(), &ok);
    for (uint64_t i = 0; st == ZB_OK && ok && i < out.s.n; i++)
        zb__jw_push(cats,
                    json_object_new_string_len(out.s.data + out.s.offsets[i],
                                               (int)(out.s.offsets[i + 1] - out.s.offsets[i])),
                    &ok);
    bool ordered = same;
    for (size_t k = 0; k < p->n; k++) ordered = ordered && in[k]->ordered;
    zb__jw_add(col, "ordered", json_object_new_boolean(ordered), &ok);
    for (size_t k = 0, at = 0; st == ZB_OK && ok && k < p->n; k++) {
        json_object *src = json_object_array_get_idx(sources, k);
        json_object *codes = zb__jw_add(src, "codes", json_object_new_array(), &ok);
        for (uint64_t i = 0; ok && i < in[k]->categories->n; i++, at++) {
            const char *t = all.s.data + all.s.offsets[at];
            size_t len = (size_t)(all.s.offsets[at + 1] - all.s.offsets[at]);
            zb__jw_push(codes, json_object_new_int64(zb__strmap_find(&map, t, len)), &ok);
        }
    }
    if (st == ZB_OK && !ok) st = zb__err(ZB_E_NOMEM, "the plan");
    zb__strmap_free(&map);
    zb_strings_free(&all.s);
    zb_strings_free(&out.s);
    return st;
}

static zb_status
plan_columns(planner *p, json_object *cols)
{
    const char **names;
    size_t n;
    ZB_TRY(column_names(p, &names, &n));
    const zb__col_info **in = calloc(p->n, sizeof *in);
    zb_status st = in ? ZB_OK : zb__err(ZB_E_NOMEM, "obs columns");
    for (size_t c = 0; c < n && st == ZB_OK; c++) {
        json_object *sources = json_object_new_array();
        int ok = sources != NULL;
        for (size_t k = 0; k < p->n && st == ZB_OK && ok; k++) {
            size_t idx;
            st = zb__src_find_column(p->srcs[k], names[c], &idx);
            if (st != ZB_OK) break;
            in[k] = &p->srcs[k]->c.columns[idx];
            json_object *src = zb__jw_push(sources, json_object_new_object(), &ok);
            zb__jw_add(src, "index", zb__jw_u64(idx), &ok);
        }
        zb__col_kind kind = ZB_COL_NUMERIC;
        zb_dtype dtype = ZB_DT_COUNT_;
        if (st == ZB_OK && ok) st = merge_kind(p, names[c], in, &kind, &dtype);
        json_object *col = json_object_new_object();
        ok = ok && col;
        zb__jw_add(col, "name", json_object_new_string(names[c]), &ok);
        zb__jw_add(col, "kind", json_object_new_string(kind_names[kind]), &ok);
        zb__jw_add(col, "dtype", json_object_new_string(zb_dtype_name(dtype)), &ok);
        if (st == ZB_OK && ok && kind == ZB_COL_CATEGORICAL)
            st = merge_categories(p, names[c], in, dtype, col, sources);
        zb__jw_add(col, "sources", sources, &ok);
        zb__jw_push(cols, col, &ok);
        if (st == ZB_OK && !ok) st = zb__err(ZB_E_NOMEM, "the plan");
    }
    free(in);
    free(names);
    return st;
}

/* ---- inputs and slices -------------------------------------------------------------------------- */

static const char *const layout_names[] = {"csr", "csc", "dense"};

static zb_status
open_inputs(planner *p, json_object *inputs)
{
    zb_status st = ZB_OK;
    for (size_t k = 0; k < p->n && st == ZB_OK; k++) {
        st = zb__src_open(p->paths[k], &p->srcs[k]);
        if (st != ZB_OK) break;
        char real[PATH_MAX];
        if (!realpath(p->paths[k], real)) snprintf(real, sizeof real, "%s", p->paths[k]);
        for (size_t i = 0; i < k && st == ZB_OK; i++) {
            const char *earlier = json_object_get_string(
                json_object_object_get(json_object_array_get_idx(inputs, i), "path"));
            if (earlier && !strcmp(earlier, real))
                st = zb__err(ZB_E_INVALID, "%s is given twice (inputs %zu and %zu)", p->paths[k], i,
                             k);
        }
        if (st != ZB_OK) break;
        uint64_t size;
        int64_t mtime;
        st = cv_fingerprint(p->paths[k], &size, &mtime, NULL);
        int ok = 1;
        json_object *in = zb__jw_push(inputs, json_object_new_object(), &ok);
        zb__jw_add(in, "path", json_object_new_string(real), &ok);
        zb__jw_add(in, "format", json_object_new_string(p->srcs[k]->c.format), &ok);
        zb__jw_add(in, "size", zb__jw_u64(size), &ok);
        zb__jw_add(in, "mtime_ns", json_object_new_int64(mtime), &ok);
        zb__jw_add(in, "n_obs", zb__jw_u64(p->srcs[k]->c.n_obs), &ok);
        json_object *mats = zb__jw_add(in, "matrices", json_object_new_array(), &ok);
        for (size_t j = 0; j < p->n_mats && st == ZB_OK && ok; j++) {
            st = zb__src_matrix_get(p->srcs[k], p->keys[j], &p->mats[k][j]);
            if (st != ZB_OK) break;
            const zb__src_matrix_info *mi = zb__src_matrix_info_of(p->mats[k][j]);
            if (mi->n_rows != p->srcs[k]->c.n_obs)
                st = zb__err(ZB_E_CORRUPT, "%s: %s has %" PRIu64 " rows but obs has %" PRIu64,
                             p->paths[k], p->keys[j], mi->n_rows, p->srcs[k]->c.n_obs);
            json_object *m = zb__jw_push(mats, json_object_new_object(), &ok);
            zb__jw_add(m, "layout", json_object_new_string(layout_names[mi->layout]), &ok);
            zb__jw_add(m, "dtype", json_object_new_string(zb_dtype_name(mi->dtype)), &ok);
            zb__jw_add(m, "n_cols", zb__jw_u64(mi->n_cols), &ok);
            zb__jw_add(m, "nnz", zb__jw_u64(mi->nnz), &ok);
        }
        if (st == ZB_OK && !ok) st = zb__err(ZB_E_NOMEM, "the plan");
        if (st == ZB_OK) st = zb__src_matrix_var_names(p->mats[k][0], &p->var[k]);
    }
    return st;
}

/* Uncompressed bytes one cell of input k costs in a scatter task besides its matrices. */
static uint64_t
cell_overhead(const planner *p, size_t k)
{
    (void)k;
    return 16 /* row, source row */ + 32 /* obs name */ + 16 * (uint64_t)p->srcs[0]->c.n_columns;
}

/* Cuts input k's rows into slices of at most `budget` estimated bytes. */
static zb_status
slice_input(planner *p, size_t k, const zb_dtype *out_dtypes, uint64_t budget, json_object *slices,
            uint64_t *total_bytes)
{
    uint64_t n = p->srcs[k]->c.n_obs;
    int64_t *ptr[8] = {0};
    size_t n_ptr = p->n_mats < 8 ? p->n_mats : 8;
    zb_status st = ZB_OK;
    for (size_t j = 0; j < n_ptr && st == ZB_OK; j++)
        if (!(ptr[j] = malloc((size_t)(INDPTR_BLOCK + 1) * sizeof(int64_t))))
            st = zb__err(ZB_E_NOMEM, "%s: pointers", p->paths[k]);
    uint64_t start = 0, bytes = 0;
    int ok = 1;
    for (uint64_t b = 0; b < n && st == ZB_OK; b += INDPTR_BLOCK) {
        uint64_t e = n - b < INDPTR_BLOCK ? n : b + INDPTR_BLOCK;
        for (size_t j = 0; j < n_ptr && st == ZB_OK; j++) {
            const zb__src_matrix_info *mi = zb__src_matrix_info_of(p->mats[k][j]);
            if (mi->layout == ZB_SRC_CSR) {
                st = zb__src_matrix_indptr(p->mats[k][j], b, e, ptr[j]);
            } else { /* rows unknown until transposed / densities unknown: the mean */
                uint64_t per =
                    mi->layout == ZB_SRC_DENSE ? mi->n_cols : (mi->nnz + n - 1) / (n ? n : 1);
                for (uint64_t r = b; r <= e; r++) ptr[j][r - b] = (int64_t)((r - b) * per);
            }
        }
        for (uint64_t r = b; r < e && st == ZB_OK; r++) {
            uint64_t cell = cell_overhead(p, k);
            for (size_t j = 0; j < n_ptr; j++)
                cell += (uint64_t)(ptr[j][r - b + 1] - ptr[j][r - b]) *
                        (4 + zb_dtype_size(out_dtypes[j]));
            if (r > start && (bytes + cell > budget || r - start >= SLICE_MAX_ROWS)) {
                json_object *s = zb__jw_push(slices, json_object_new_array(), &ok);
                zb__jw_push(s, zb__jw_u64(k), &ok);
                zb__jw_push(s, zb__jw_u64(start), &ok);
                zb__jw_push(s, zb__jw_u64(r), &ok);
                zb__jw_push(s, zb__jw_u64(bytes), &ok);
                *total_bytes += bytes;
                start = r;
                bytes = 0;
            }
            bytes += cell;
        }
    }
    if (st == ZB_OK && n > start) {
        json_object *s = zb__jw_push(slices, json_object_new_array(), &ok);
        zb__jw_push(s, zb__jw_u64(k), &ok);
        zb__jw_push(s, zb__jw_u64(start), &ok);
        zb__jw_push(s, zb__jw_u64(n), &ok);
        zb__jw_push(s, zb__jw_u64(bytes), &ok);
        *total_bytes += bytes;
    }
    if (st == ZB_OK && !ok) st = zb__err(ZB_E_NOMEM, "the plan");
    for (size_t j = 0; j < n_ptr; j++) free(ptr[j]);
    return st;
}

/* ---- the document ------------------------------------------------------------------------------- */

static json_object *
string_array(const char *const *items, size_t n, int *ok)
{
    json_object *a = json_object_new_array();
    for (size_t i = 0; i < n; i++) zb__jw_push(a, json_object_new_string(items[i]), ok);
    if (!a) *ok = 0;
    return a;
}

static const char *const data_choices[] = {"auto", "keep", "uint8", "uint16", "float32"};
static const char *const index_choices[] = {"auto", "int32", "narrow"};

const char *
cv_data_choice_name(zb_convert_data_dtype c)
{
    return (unsigned)c < 5 ? data_choices[c] : "?";
}

const char *
cv_index_choice_name(zb_convert_index_dtype c)
{
    return (unsigned)c < 3 ? index_choices[c] : "?";
}

zb_status
cv_choices_of(const char *data, const char *index, zb_convert_data_dtype *d,
              zb_convert_index_dtype *x)
{
    *d = ZB_CONVERT_DATA_AUTO;
    *x = ZB_CONVERT_INDEX_AUTO;
    bool found_d = false, found_x = false;
    for (int i = 0; i < 5 && data; i++)
        if (!strcmp(data, data_choices[i])) {
            *d = (zb_convert_data_dtype)i;
            found_d = true;
        }
    for (int i = 0; i < 3 && index; i++)
        if (!strcmp(index, index_choices[i])) {
            *x = (zb_convert_index_dtype)i;
            found_x = true;
        }
    if (!found_d || !found_x)
        return zb__err(ZB_E_CORRUPT, "data_dtype '%s' / index_dtype '%s'", data ? data : "",
                       index ? index : "");
    return ZB_OK;
}

zb_status
cv_args_json(const char *const *inputs, size_t n, const zb_convert_opts *o, json_object **out)
{
    int ok = 1;
    json_object *a = json_object_new_object();
    zb__jw_add(a, "inputs", string_array(inputs, n, &ok), &ok);
    zb__jw_add(a, "dataset_size", zb__jw_u64(o->dataset_size), &ok);
    zb__jw_add(a, "var_join",
               json_object_new_string(o->var_join == ZB_VAR_INNER ? "inner" : "outer"), &ok);
    if (o->genes) {
        uint64_t size, crc;
        int64_t mtime;
        zb_status st = cv_fingerprint(o->genes, &size, &mtime, &crc);
        if (st != ZB_OK) {
            json_object_put(a);
            return zb__err_context(st, "--genes");
        }
        char hex[20];
        snprintf(hex, sizeof hex, "%016" PRIx64, crc);
        json_object *g = zb__jw_add(a, "genes", json_object_new_object(), &ok);
        zb__jw_add(g, "bytes", zb__jw_u64(size), &ok);
        zb__jw_add(g, "crc64", json_object_new_string(hex), &ok);
    } else {
        json_object_object_add(a, "genes", NULL);
    }
    if (o->obs)
        zb__jw_add(a, "obs", string_array(o->obs, o->n_obs, &ok), &ok);
    else
        json_object_object_add(a, "obs", NULL);
    zb__jw_add(a, "x", json_object_new_string(o->x_key ? o->x_key : "X"), &ok);
    zb__jw_add(a, "layers", string_array(o->layers, o->n_layers, &ok), &ok);
    zb__jw_add(a, "seed", zb__jw_u64(o->seed), &ok);
    zb__jw_add(a, "shuffle", json_object_new_boolean(o->shuffle), &ok);
    zb__jw_add(a, "zarr_format", json_object_new_int(o->zarr_format), &ok);
    if (o->codec)
        zb__jw_add(a, "codec", json_object_new_string(o->codec), &ok);
    else
        json_object_object_add(a, "codec", NULL);
    zb__jw_add(a, "x_chunk", zb__jw_u64(o->x_chunk), &ok);
    zb__jw_add(a, "x_shard", zb__jw_u64(o->x_shard), &ok);
    zb__jw_add(a, "data_dtype", json_object_new_string(cv_data_choice_name(o->data_dtype)), &ok);
    zb__jw_add(a, "index_dtype", json_object_new_string(cv_index_choice_name(o->index_dtype)), &ok);
    if (!ok) {
        json_object_put(a);
        return zb__err(ZB_E_NOMEM, "the plan");
    }
    *out = a;
    return ZB_OK;
}

static void
planner_free(planner *p)
{
    for (size_t k = 0; k < p->n; k++) {
        if (p->srcs) zb__src_close(p->srcs[k]);
        if (p->mats) free(p->mats[k]);
        if (p->var) zb_strings_free(&p->var[k]);
    }
    free(p->srcs);
    free(p->mats);
    free(p->var);
    free(p->keys);
    zb_strings_free(&p->genes.s);
    json_object_put(p->doc);
}

/* Whether the gather reads every cell's matrix rows straight from the inputs (the direct path:
 * every matrix is CSR in contiguous uncompressed arrays, or CSC, which prepare turns into such a
 * CSR file), unless the options ask for the scratch path (docs/CONVERT.md). */
static bool
direct_rows(planner *p)
{
    if (p->o->scratch_path) return false;
    for (size_t k = 0; k < p->n; k++)
        for (size_t j = 0; j < p->n_mats; j++) {
            zb__src_raw raw;
            const zb__src_matrix_info *info = zb__src_matrix_info_of(p->mats[k][j]);
            bool csc = info->layout == ZB_SRC_CSC && info->dtype != ZB_DT_BOOL;
            if (!csc && !zb__src_matrix_raw(p->mats[k][j], &raw)) return false;
        }
    return true;
}

/* The scatter file's block size: a gather pass reads a straddling block of every section, so
 * blocks are about a section's share of a pass (convert_int.h, "the scatter file"). */
static uint64_t
scatter_block_bytes(const zb_convert_opts *o, uint64_t n_cells, uint64_t total, uint64_t slices,
                    uint64_t writer, int num_threads)
{
    uint64_t d = (n_cells + o->dataset_size - 1) / (o->dataset_size ? o->dataset_size : 1);
    uint64_t g = cv_concurrent_gathers(o->memory_bytes, writer, d ? d : 1, num_threads);
    uint64_t share = o->memory_bytes / g, floor = (uint64_t)8 << 20;
    uint64_t pass = share > writer + floor ? (share - writer) * 2 / 5 : floor;
    uint64_t dataset = total / (d ? d : 1), passes = (dataset + pass - 1) / pass;
    uint64_t block = total / (slices ? slices : 1) / (d ? d : 1) / (passes ? passes : 1);
    if (block < CV_MIN_BLOCK_BYTES) block = CV_MIN_BLOCK_BYTES;
    if (block > CV_MAX_BLOCK_BYTES) block = CV_MAX_BLOCK_BYTES;
    return block;
}

zb_status
cv_plan_write(const char *const *inputs, size_t n, const zb_convert_opts *o, const char *work,
              json_object *args, int num_threads, zb__src **keep)
{
    planner p = {.o = o, .paths = inputs, .n = n, .n_mats = 1 + o->n_layers};
    zb_status st = ZB_OK;
    p.srcs = calloc(n, sizeof *p.srcs);
    p.mats = calloc(n, sizeof *p.mats);
    p.var = calloc(n, sizeof *p.var);
    p.keys = calloc(p.n_mats, sizeof *p.keys);
    p.doc = json_object_new_object();
    if (!p.srcs || !p.mats || !p.var || !p.keys || !p.doc) st = zb__err(ZB_E_NOMEM, "the plan");
    for (size_t k = 0; k < n && st == ZB_OK; k++)
        if (!(p.mats[k] = calloc(p.n_mats, sizeof **p.mats))) st = zb__err(ZB_E_NOMEM, "the plan");
    char layer_keys[64][1100];
    if (st == ZB_OK && o->n_layers > 64) st = zb__err(ZB_E_INVALID, "at most 64 layers");
    for (size_t j = 0; st == ZB_OK && j < p.n_mats; j++) {
        if (j == 0) {
            p.keys[0] = o->x_key ? o->x_key : "X";
            continue;
        }
        snprintf(layer_keys[j - 1], sizeof layer_keys[0], "layers/%s", o->layers[j - 1]);
        p.keys[j] = layer_keys[j - 1];
    }
    int ok = 1;
    zb__jw_add(p.doc, "format", json_object_new_string("zbatch-convert-plan"), &ok);
    zb__jw_add(p.doc, "version", json_object_new_int(CV_PLAN_VERSION), &ok);
    zb__jw_add(p.doc, "args", json_object_get(args), &ok);
    json_object *jin = zb__jw_add(p.doc, "inputs", json_object_new_array(), &ok);
    if (st == ZB_OK && ok) st = open_inputs(&p, jin);
    if (st == ZB_OK) st = gene_list(&p);

    /* matrices: names and promoted dtypes */
    zb_dtype out_dtypes[65];
    json_object *jm = zb__jw_add(p.doc, "matrices", json_object_new_array(), &ok);
    for (size_t j = 0; st == ZB_OK && j < p.n_mats; j++) {
        zb_dtype t = zb__src_matrix_info_of(p.mats[0][j])->dtype;
        for (size_t k = 1; k < n && t != ZB_DT_COUNT_; k++)
            t = cv_promote(t, zb__src_matrix_info_of(p.mats[k][j])->dtype);
        if (t == ZB_DT_COUNT_) {
            st = zb__err(ZB_E_INVALID, "%s: the inputs' types have no common type", p.keys[j]);
            break;
        }
        out_dtypes[j] = t;
        json_object *m = zb__jw_push(jm, json_object_new_object(), &ok);
        zb__jw_add(m, "key", json_object_new_string(p.keys[j]), &ok);
        zb__jw_add(m, "name", json_object_new_string(j ? o->layers[j - 1] : "X"), &ok);
        zb__jw_add(m, "dtype", json_object_new_string(zb_dtype_name(t)), &ok);
    }

    /* genes and maps */
    zb__strmap gmap = {0};
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/maps", work);
    if (st == ZB_OK) st = cv_mkdirs(dir);
    if (st == ZB_OK) st = zb__strmap_build(&gmap, &p.genes.s, NULL);
    json_object *jg = zb__jw_add(p.doc, "genes", json_object_new_array(), &ok);
    for (uint64_t i = 0; st == ZB_OK && ok && i < p.genes.s.n; i++)
        zb__jw_push(
            jg,
            json_object_new_string_len(p.genes.s.data + p.genes.s.offsets[i],
                                       (int)(p.genes.s.offsets[i + 1] - p.genes.s.offsets[i])),
            &ok);
    for (size_t k = 0; st == ZB_OK && k < n; k++) {
        json_object *mats = json_object_object_get(json_object_array_get_idx(jin, k), "matrices");
        for (size_t j = 0; st == ZB_OK && j < p.n_mats; j++)
            st = gene_map(&p, work, &gmap, k, j, json_object_array_get_idx(mats, j));
    }
    zb__strmap_free(&gmap);

    json_object *jc = zb__jw_add(p.doc, "columns", json_object_new_array(), &ok);
    if (st == ZB_OK && ok) st = plan_columns(&p, jc);
    /* columns an input's reader left out: named in the plan and the manifest */
    json_object *skipped = zb__jw_add(p.doc, "skipped_columns", json_object_new_array(), &ok);
    for (size_t k = 0; st == ZB_OK && ok && k < n; k++)
        for (size_t i = 0; i < p.srcs[k]->c.n_skipped; i++) {
            const char *entry = p.srcs[k]->c.skipped[i], *tab = strchr(entry, '\t');
            char line[4200];
            snprintf(line, sizeof line, "%s: obs column '%.*s' left out: %s", inputs[k],
                     (int)(tab ? tab - entry : (ptrdiff_t)strlen(entry)), entry,
                     tab ? tab + 1 : "");
            zb__jw_push(skipped, json_object_new_string(line), &ok);
        }

    /* cells and slices: a scatter task holds its slice about three times over (read with its
     * pointers, remapped and sorted into sections, compressed), and `num_threads` of them run
     * at once; a slice's bytes are its cells' uncompressed bytes (gene ids and values) */
    uint64_t n_cells = 0;
    for (size_t k = 0; k < n; k++) n_cells += p.srcs[k] ? p.srcs[k]->c.n_obs : 0;
    uint64_t per_task = o->memory_bytes / (3 * (uint64_t)(num_threads > 0 ? num_threads : 1));
    json_object *js = zb__jw_add(p.doc, "slices", json_object_new_array(), &ok);
    uint64_t total = 0;
    for (size_t k = 0; st == ZB_OK && ok && k < n; k++)
        st = slice_input(&p, k, out_dtypes, per_task, js, &total);
    /* scatter blocks: a gather pass reads a straddling block of every section, so blocks are
     * about a section's share of a pass (convert_int.h, "the scatter file") */
    if (st == ZB_OK && ok) {
        uint64_t writer = cv_writer_bytes(o->x_chunk, o->x_shard, out_dtypes, p.n_mats,
                                          json_object_array_length(jc));
        uint64_t block = scatter_block_bytes(o, n_cells, total, json_object_array_length(js),
                                             writer, num_threads);
        zb__jw_add(p.doc, "block_bytes", zb__jw_u64(block), &ok);
    }
    zb__jw_add(p.doc, "direct", json_object_new_boolean(st == ZB_OK && direct_rows(&p)), &ok);
    zb__jw_add(p.doc, "n_cells", zb__jw_u64(n_cells), &ok);
    zb__jw_add(p.doc, "input_bytes", zb__jw_u64(total), &ok);
    zb__jw_add(p.doc, "memory_bytes", zb__jw_u64(o->memory_bytes), &ok);
    if (st == ZB_OK && n_cells == 0) st = zb__err(ZB_E_INVALID, "the inputs hold no cells");
    if (st == ZB_OK && !ok) st = zb__err(ZB_E_NOMEM, "the plan");
    if (st == ZB_OK) {
        char path[4200];
        snprintf(path, sizeof path, "%s/plan.json", work);
        const char *text = json_object_to_json_string_ext(
            p.doc, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        const void *bufs[1] = {text};
        size_t lens[1] = {strlen(text)};
        st = cv_write_file(path, bufs, lens, 1);
    }
    for (size_t k = 0; st == ZB_OK && keep && k < n; k++) { /* handed over open */
        keep[k] = p.srcs[k];
        p.srcs[k] = NULL;
    }
    planner_free(&p);
    return st;
}
