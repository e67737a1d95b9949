/* The gather phase (zbatch_convert.h): one task per output dataset. Every scatter file holds a
 * section of the dataset's cells sorted by row; the task reads those sections pass by pass
 * (rows [r0, r1) of the dataset at a time, sized to its memory), places each cell at its row,
 * and streams the rows to the anndata writer, which compresses on the task's threads. The
 * dataset is committed, its files digested as they were written (digest.c), and a done marker
 * written last, so a killed task is simply run again from an empty dataset directory. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert_int.h"
#include "util/buf.h"
#include "write/write.h"
#include "util/pool.h"
#include "util/status.h"

/* One scatter file's section of this dataset. */
typedef struct part {
    size_t t; /* the scatter task */
    uint32_t input;
    uint64_t n; /* cells */
    uint64_t n_blocks;
    uint32_t *table;      /* [n_blocks][1 + n_arrays]: cells, compressed length per array */
    uint64_t *first;      /* [n_blocks + 1]: first cell of each block */
    uint64_t *at;         /* [n_blocks + 1]: file offset of each block */
    uint64_t *rows;       /* [n] row of each cell in the dataset */
    uint64_t **prefix;    /* [n_arrays]: count arrays' prefix sums [n + 1] (NULL otherwise) */
    uint64_t p0, p1;      /* this pass's cells */
    uint64_t b0, b1;      /* the blocks decompressed for this pass */
    uint64_t q0;          /* the first cell of block b0: where the pass buffers start */
    unsigned char **pass; /* [n_arrays] the pass's blocks' elements (into the arena) */
} part;

typedef struct gather {
    zb_convert *cv;
    size_t d;
    uint64_t cells;
    size_t n_arrays, col_start[CV_MAX_ARRAYS];
    cv_array arrays[CV_MAX_ARRAYS];
    part *parts;
    size_t n_parts;
    unsigned char *arena;
    uint64_t *who; /* [pass rows]: part << 40 | cell */
    /* assembled pass */
    int64_t *indptr;
    int32_t *indices;
    unsigned char *values;
    unsigned char *stored; /* a matrix's values in the stored type (values itself, or a copy) */
    uint64_t *offsets;
    char *text;
    uint8_t *mask;
    cv_ws *ws;      /* the buffers above live in it */
    zb__pool *pool; /* decompresses the parts of a pass */
    bool index[CV_MAX_ARRAYS];
    uint64_t nnz[64]; /* per matrix, for the done marker */
    /* the direct path: per input and matrix ([k * n_mats + j]) its file and where its rows lie,
     * its values' dtype and gene map; the jobs that read a pass's rows */
    zb__src_raw *raws;
    const zb__src_map **views; /* the files mapped (cv_view), or NULL each: read with pread */
    zb_dtype *in_dtypes;
    const int32_t **maps;
    struct direct_job *jobs;
    size_t n_jobs;
} gather;

/* Rows [r0, r1) of a pass of matrix j read from the inputs on a worker of the gather's pool,
 * with buffers kept across passes. */
typedef struct direct_job {
    gather *g;
    size_t j;
    uint64_t r0, r1;
    zb__buf ids, vals, keys, packed, mid;
    zb_status st;
    char msg[512];
} direct_job;

static zb_status
grow(gather *g, size_t slot, uint64_t bytes, void *out)
{
    if (bytes > ZB_BUF_MAX) return zb__err(ZB_E_OVERFLOW, "gather: %" PRIu64 " bytes", bytes);
    return cv_ws_grow(g->ws, slot, (size_t)bytes, (void **)out);
}

static zb_status
open_part_file(gather *g, size_t t, int *fd, char *path, size_t cap)
{
    ZB_TRY(cv_path(g->cv, path, cap, "scatter/t%zu.bin", t));
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) return zb__err(ZB_E_IO, "%s: %s", path, strerror(errno));
    return ZB_OK;
}

/* Decodes `clen` compressed bytes at src into dst, which must take exactly `want` bytes. */
static zb_status
decode_piece(const gather *g, zb_ctx *ctx, const char *path, uint64_t block, size_t a,
             const unsigned char *src, uint64_t clen, unsigned char *dst, uint64_t want)
{
    zb__codec codec;
    cv_scratch_codec(&codec);
    size_t out = 0;
    char where[4300];
    snprintf(where, sizeof where, "%s: dataset %zu, block %" PRIu64 ", array %zu", path, g->d,
             block, a);
    return zb__codec_decode(&codec, ctx, src, (size_t)clen, dst, (size_t)want, (size_t)want, &out,
                            where);
}

/* The index part of the section: block table, rows, count arrays' prefix sums. */
static zb_status
load_index(gather *g, part *p, const char *path, const unsigned char *buf, uint64_t len,
           uint64_t offset)
{
    size_t na = g->n_arrays, n_index = 0;
    for (size_t a = 0; a < na; a++) n_index += g->index[a];
    uint64_t head = (n_index + p->n_blocks * (1 + na)) * 4;
    if (head > len) return zb__err(ZB_E_CORRUPT, "%s: dataset %zu: a short index", path, g->d);
    const uint32_t *clens = (const uint32_t *)buf;
    memcpy(p->table, buf + n_index * 4, (size_t)(p->n_blocks * (1 + na) * 4));
    p->first[0] = 0;
    p->at[0] = offset + len;
    for (uint64_t b = 0; b < p->n_blocks; b++) {
        const uint32_t *r = p->table + b * (1 + na);
        uint64_t bytes = 0;
        for (size_t a = 0; a < na; a++) bytes += r[1 + a];
        if (r[0] == 0 || r[0] > p->n - p->first[b])
            return zb__err(ZB_E_CORRUPT, "%s: dataset %zu: block %" PRIu64 " holds %u cells", path,
                           g->d, b, r[0]);
        p->first[b + 1] = p->first[b] + r[0];
        p->at[b + 1] = p->at[b] + bytes;
    }
    if (p->first[p->n_blocks] != p->n)
        return zb__err(ZB_E_CORRUPT,
                       "%s: dataset %zu: the blocks hold %" PRIu64 " of %" PRIu64 " cells", path,
                       g->d, p->first[p->n_blocks], p->n);
    uint32_t *counts = malloc((size_t)p->n * 4 + 4);
    if (!counts) return zb__err(ZB_E_NOMEM, "gather");
    zb_status st = ZB_OK;
    uint64_t at = head;
    for (size_t a = 0, k = 0; a < na && st == ZB_OK; a++) {
        if (!g->index[a]) continue;
        uint64_t clen = clens[k++];
        if (clen > len - at) {
            st = zb__err(ZB_E_CORRUPT, "%s: dataset %zu: index array %zu runs past its part", path,
                         g->d, a);
            break;
        }
        if (a == CV_A_ROW) {
            st = decode_piece(g, g->ws->ctx, path, UINT64_MAX, a, buf + at, clen,
                              (unsigned char *)p->rows, p->n * 8);
        } else {
            st = decode_piece(g, g->ws->ctx, path, UINT64_MAX, a, buf + at, clen,
                              (unsigned char *)counts, p->n * 4);
            if (st == ZB_OK && !(p->prefix[a] = malloc((size_t)(p->n + 1) * 8)))
                st = zb__err(ZB_E_NOMEM, "gather");
            for (uint64_t i = 0; st == ZB_OK && i < p->n; i++) {
                if (i == 0) p->prefix[a][0] = 0;
                p->prefix[a][i + 1] = p->prefix[a][i] + counts[i];
            }
            if (st == ZB_OK && p->n == 0) p->prefix[a][0] = 0;
        }
        at += clen;
    }
    free(counts);
    return st;
}

/* Reads scatter file t's header and its section of this dataset; keeps the part when it holds
 * cells, with its block table, rows and count arrays. */
static zb_status
load_part(gather *g, size_t t)
{
    zb_convert *cv = g->cv;
    char path[4200];
    int fd;
    ZB_TRY(open_part_file(g, t, &fd, path, sizeof path));
    size_t na = g->n_arrays;
    cv_scatter_header h;
    uint64_t sec[4];
    zb_status st = zb__src_pread(fd, path, &h, sizeof h, 0);
    if (st == ZB_OK &&
        (memcmp(h.magic, CV_SCATTER_MAGIC, 8) || h.version != CV_SCATTER_VERSION ||
         h.n_arrays != na || h.n_datasets != cv->n_datasets || h.input != cv->slices[t].input))
        st = zb__err(ZB_E_CORRUPT, "%s: not a scatter file of this conversion", path);
    if (st == ZB_OK) st = zb__src_pread(fd, path, sec, sizeof sec, sizeof h + g->d * 4 * 8);
    if (st == ZB_OK &&
        (sec[0] > cv->dataset_size || sec[1] > sec[0] || sec[3] > ((uint64_t)1 << 36)))
        st = zb__err(ZB_E_CORRUPT, "%s: section %zu is out of range", path, g->d);
    part *p = &g->parts[g->n_parts];
    memset(p, 0, sizeof *p);
    if (st != ZB_OK || sec[0] == 0) {
        close(fd);
        return st;
    }
    g->n_parts++;
    p->t = t;
    p->input = (uint32_t)h.input;
    p->n = sec[0];
    p->n_blocks = sec[1];
    p->table = malloc((size_t)(p->n_blocks * (1 + na)) * 4 + 4);
    p->first = malloc((size_t)(p->n_blocks + 1) * 8);
    p->at = malloc((size_t)(p->n_blocks + 1) * 8);
    p->prefix = calloc(na, sizeof *p->prefix);
    p->pass = calloc(na, sizeof *p->pass);
    p->rows = malloc((size_t)p->n * 8);
    if (!p->table || !p->first || !p->at || !p->prefix || !p->pass || !p->rows)
        st = zb__err(ZB_E_NOMEM, "gather");
    unsigned char *buf = NULL;
    if (st == ZB_OK) st = grow(g, CV_WS_PACKED, sec[3] + 1, &buf);
    if (st == ZB_OK) st = zb__src_pread(fd, path, buf, sec[3], sec[2]);
    if (st == ZB_OK) st = load_index(g, p, path, buf, sec[3], sec[2]);
    close(fd);
    return st;
}

static void
parts_free(gather *g)
{
    for (size_t i = 0; i < g->n_parts; i++) {
        part *p = &g->parts[i];
        for (size_t a = 0; p->prefix && a < g->n_arrays; a++) free(p->prefix[a]);
        free(p->prefix);
        free(p->pass);
        free(p->table);
        free(p->first);
        free(p->at);
        free(p->rows);
    }
    free(g->parts);
}

/* Elements of array a in cells [c0, c1) of part p. */
static void
elem_range(const gather *g, const part *p, size_t a, uint64_t c0, uint64_t c1, uint64_t *e0,
           uint64_t *e1)
{
    int c = g->arrays[a].count;
    *e0 = c < 0 ? c0 : p->prefix[c][c0];
    *e1 = c < 0 ? c1 : p->prefix[c][c1];
}

/* The block of part p holding cell c, searching from block `from`. */
static uint64_t
block_of(const part *p, uint64_t c, uint64_t from)
{
    uint64_t b = from;
    while (b + 1 < p->n_blocks && p->first[b + 1] <= c) b++;
    return b;
}

/* Bytes the non-index arrays of part p's pass blocks take decompressed. */
static uint64_t
part_pass_bytes(const gather *g, const part *p)
{
    uint64_t bytes = 0;
    for (size_t a = 0; a < g->n_arrays; a++) {
        if (g->index[a]) continue;
        uint64_t e0, e1;
        elem_range(g, p, a, p->q0, p->first[p->b1], &e0, &e1);
        bytes += (e1 - e0) * g->arrays[a].item;
    }
    return bytes;
}

/* One part of a pass, decompressed on a worker of the gather's pool: the non-index arrays of
 * blocks [b0, b1) into the arena at `at`, one array after another. The compressed bytes go
 * through the worker's own scratch buffer (slot 5 of its context, the reader's slot: no reader
 * runs on this pool). */
typedef struct fill_job {
    const gather *g;
    part *p;
    unsigned char *at;
    zb_status st;
    char msg[512];
} fill_job;

static void
fill_part(void *arg, zb_ctx *ctx)
{
    fill_job *j = arg;
    const gather *g = j->g;
    part *p = j->p;
    char path[4200];
    int fd = -1;
    size_t na = g->n_arrays;
    uint64_t lo = p->at[p->b0], hi = p->at[p->b1];
    zb__buf *packed = &ctx->ws.packed;
    zb_status st = cv_path(g->cv, path, sizeof path, "scatter/t%zu.bin", p->t);
    if (st == ZB_OK && (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        st = zb__err(ZB_E_IO, "%s: %s", path, strerror(errno));
    if (st == ZB_OK) st = zb__buf_reserve(packed, (size_t)(hi - lo) + 1);
    if (st == ZB_OK) st = zb__src_pread(fd, path, packed->data, hi - lo, lo);
    if (fd >= 0) close(fd);
    unsigned char *at = j->at;
    for (size_t a = 0; st == ZB_OK && a < na; a++) {
        if (g->index[a]) continue;
        p->pass[a] = at;
        size_t item = g->arrays[a].item;
        for (uint64_t b = p->b0; st == ZB_OK && b < p->b1; b++) {
            const uint32_t *r = p->table + b * (1 + na);
            uint64_t off = p->at[b] - lo, e0, e1;
            for (size_t x = 0; x < a; x++) off += r[1 + x];
            elem_range(g, p, a, p->first[b], p->first[b + 1], &e0, &e1);
            st = decode_piece(g, ctx, path, b, a, packed->data + off, r[1 + a], at,
                              (e1 - e0) * item);
            at += (e1 - e0) * item;
        }
    }
    j->st = st;
    if (st != ZB_OK) snprintf(j->msg, sizeof j->msg, "%s", zb_last_error());
}

/* Reads the cells of rows [r0, r1) from every part into the arena (the parts decompressed on
 * the gather's pool, each into its own range of the arena) and records who holds each row.
 * Every row must come from exactly one cell. */
static zb_status
read_pass(gather *g, uint64_t r0, uint64_t r1)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < g->n_parts; i++) {
        part *p = &g->parts[i];
        p->p0 = p->p1;
        while (p->p1 < p->n && p->rows[p->p1] < r1) p->p1++;
        if (p->p1 == p->p0) continue;
        p->b0 = block_of(p, p->p0, p->b1 ? p->b1 - 1 : 0);
        p->b1 = block_of(p, p->p1 - 1, p->b0) + 1;
        p->q0 = p->first[p->b0];
        bytes += part_pass_bytes(g, p);
    }
    ZB_TRY(grow(g, CV_WS_ARENA, bytes + 1, &g->arena));
    fill_job *jobs;
    ZB_TRY(grow(g, CV_WS_JOBS, g->n_parts * sizeof *jobs + 1, &jobs));
    unsigned char *at = g->arena;
    size_t n_jobs = 0;
    for (size_t i = 0; i < g->n_parts; i++) {
        part *p = &g->parts[i];
        if (p->p1 == p->p0) continue;
        jobs[n_jobs] = (fill_job){g, p, at, ZB_OK, ""};
        at += part_pass_bytes(g, p);
        zb__pool_submit(g->pool, fill_part, &jobs[n_jobs++]);
    }
    zb__pool_wait(g->pool);
    for (size_t k = 0; k < n_jobs; k++)
        if (jobs[k].st != ZB_OK) return zb__err(jobs[k].st, "%s", jobs[k].msg);
    for (uint64_t r = 0; r < r1 - r0; r++) g->who[r] = UINT64_MAX;
    for (size_t i = 0; i < g->n_parts; i++) {
        part *p = &g->parts[i];
        for (uint64_t c = p->p0; c < p->p1; c++) {
            uint64_t r = p->rows[c];
            if (r < r0 || r >= r1 || g->who[r - r0] != UINT64_MAX)
                return zb__err(ZB_E_CORRUPT,
                               "scatter file t%zu: dataset %zu, row %" PRIu64
                               " is given twice or out of order",
                               p->t, g->d, r);
            g->who[r - r0] = (uint64_t)i << 40 | c;
        }
    }
    for (uint64_t r = 0; r < r1 - r0; r++)
        if (g->who[r] == UINT64_MAX)
            return zb__err(ZB_E_CORRUPT,
                           "dataset %zu: no cell for row %" PRIu64 " in the scatter files", g->d,
                           r0 + r);
    return ZB_OK;
}

static part *
who_part(const gather *g, uint64_t w, uint64_t *cell)
{
    *cell = w & (((uint64_t)1 << 40) - 1);
    return &g->parts[w >> 40];
}

/* Byte offset, inside the part's pass buffer of array a, of the elements of cell `cell` (an
 * index into the part), and their count. */
static uint64_t
cell_elems(const gather *g, const part *p, size_t a, uint64_t cell, uint64_t *count)
{
    uint64_t base, e0, e1, unused;
    elem_range(g, p, a, p->q0, cell, &base, &e0);
    elem_range(g, p, a, cell, cell + 1, &unused, &e1);
    *count = e1 - e0;
    return (e0 - base) * g->arrays[a].item;
}

/* Variable-length strings of array pair (lens at a, bytes at a + 1) for the pass rows, into
 * g->offsets / g->text. */
static zb_status
assemble_strings(gather *g, size_t a, uint64_t rows)
{
    uint64_t total = 0;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t cell, n;
        part *p = who_part(g, g->who[r], &cell);
        cell_elems(g, p, a + 1, cell, &n);
        total += n;
    }
    ZB_TRY(grow(g, CV_WS_TEXT, total + 1, &g->text));
    uint64_t at = 0;
    g->offsets[0] = 0;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t cell, n;
        part *p = who_part(g, g->who[r], &cell);
        uint64_t off = cell_elems(g, p, a + 1, cell, &n);
        memcpy(g->text + at, p->pass[a + 1] + off, (size_t)n);
        at += n;
        g->offsets[r + 1] = at;
    }
    return ZB_OK;
}

/* Fixed-size elements (one per cell) of array a for the pass rows, into g->values. */
static zb_status
assemble_fixed(gather *g, size_t a, uint64_t rows)
{
    size_t item = g->arrays[a].item;
    ZB_TRY(grow(g, CV_WS_VALUES, rows * item + 1, &g->values));
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t cell;
        part *p = who_part(g, g->who[r], &cell);
        memcpy(g->values + r * item, p->pass[a] + (cell - p->q0) * item, item);
    }
    return ZB_OK;
}

/* ---- the direct path: matrix rows read from the inputs --------------------------------------- */

/* ---- the handle's mappings of the inputs (cv_view) ------------------------------------------ */

zb_status
cv_view(zb_convert *cv, uint32_t k, size_t j, const zb__src_raw *raw, const zb__src_map **out)
{
    pthread_mutex_lock(&cv->lock);
    size_t n = cv->n_inputs * cv->n_mats, i = k * cv->n_mats + j;
    zb_status st = ZB_OK;
    if (!cv->views && (cv->views = calloc(n, sizeof *cv->views)))
        for (size_t v = 0; v < n; v++) cv->views[v].fd = -1;
    if (!cv->views) st = zb__err(ZB_E_NOMEM, "mapping %s", raw->path);
    for (size_t o = k * cv->n_mats; st == ZB_OK && o < (k + 1) * cv->n_mats; o++)
        if (cv->views[i].fd < 0 && cv->views[o].fd == raw->fd) cv->views[i] = cv->views[o];
    /* mapped once per handle, right after the caller checked that the input is the planned file
     * (cv_input_unchanged): a file truncated under a mapping is SIGBUS, not an error
     * (docs/CONVERT.md). Mapped pages count in
     * the RSS, and with the page cache's large folios a fault maps many pages, so the mappings
     * are bounded by the memory rather than released as they are read (docs/PERFORMANCE.md) */
    uint64_t limit =
        cv->input_mmap_bytes < cv->memory_bytes / 2 ? cv->input_mmap_bytes : cv->memory_bytes / 2;
    limit = limit > cv->mapped_bytes ? limit - cv->mapped_bytes : 0;
    if (st == ZB_OK && cv->views[i].fd < 0 && limit) {
        st = zb__src_map_open(raw->fd, raw->path, limit, &cv->views[i].map);
        if (st == ZB_OK && cv->views[i].map.base) {
            cv->views[i].fd = raw->fd;
            cv->mapped_bytes += cv->views[i].map.len;
        }
    }
    *out = st == ZB_OK && cv->views[i].map.base ? &cv->views[i].map : NULL;
    pthread_mutex_unlock(&cv->lock);
    return st;
}

void
cv_views_free(zb_convert *cv)
{
    size_t n = cv->n_inputs * cv->n_mats;
    for (size_t i = 0; cv->views && i < n; i++) {
        bool shared = false; /* an earlier matrix of the same file owns the mapping */
        for (size_t o = i - i % cv->n_mats; o < i; o++)
            shared |= cv->views[o].fd >= 0 && cv->views[o].map.base == cv->views[i].map.base;
        if (!shared) zb__src_map_close(&cv->views[i].map);
    }
    free(cv->views);
    cv->views = NULL;
}

/* Opens every input's matrices for reading rows (files, offsets, dtypes, gene maps; the files
 * mapped unless the handle reads with pread) and makes the jobs: a few per thread, so uneven
 * rows even out. An input changed since it was planned is an error here, before any read. */
static zb_status
direct_open(gather *g, int num_threads)
{
    zb_convert *cv = g->cv;
    size_t n = cv->n_inputs * cv->n_mats;
    g->raws = calloc(n, sizeof *g->raws);
    g->views = calloc(n, sizeof *g->views);
    g->in_dtypes = calloc(n, sizeof *g->in_dtypes);
    g->maps = calloc(n, sizeof *g->maps);
    g->n_jobs = 4 * (size_t)(num_threads > 1 ? num_threads : 1);
    g->jobs = calloc(g->n_jobs, sizeof *g->jobs);
    if (!g->raws || !g->views || !g->in_dtypes || !g->maps || !g->jobs)
        return zb__err(ZB_E_NOMEM, "gather");
    for (size_t k = 0; k < cv->n_inputs; k++) ZB_TRY(cv_input_unchanged(&cv->inputs[k]));
    for (size_t i = 0; i < n; i++) {
        uint32_t k = (uint32_t)(i / cv->n_mats);
        size_t j = i % cv->n_mats;
        zb__src_matrix *m;
        ZB_TRY(cv_matrix(cv, k, j, &m));
        if (!zb__src_matrix_raw(m, &g->raws[i]))
            return zb__err(ZB_E_CORRUPT,
                           "%s: %s is not stored as the plan found it (contiguous, "
                           "uncompressed)",
                           cv->inputs[k].path, cv->mat_keys[j]);
        g->in_dtypes[i] = zb__src_matrix_info_of(m)->dtype;
        ZB_TRY(cv_gene_map(cv, k, j, &g->maps[i]));
        if (cv->input_mmap_bytes) ZB_TRY(cv_view(cv, k, j, &g->raws[i], &g->views[i]));
    }
    return ZB_OK;
}

static void
direct_close(gather *g)
{
    for (size_t i = 0; g->jobs && i < g->n_jobs; i++) {
        direct_job *jb = &g->jobs[i];
        zb__buf_free(&jb->ids);
        zb__buf_free(&jb->vals);
        zb__buf_free(&jb->keys);
        zb__buf_free(&jb->packed);
        zb__buf_free(&jb->mid);
    }
    free(g->raws);
    free(g->views);
    free(g->in_dtypes);
    free(g->maps);
    free(g->jobs);
}

/* Elements [first, first + n) of the indices or the data of the matrix in slot `slot`: straight
 * from the file's mapping (a pointer into it, or b when they straddle chunks), or read with
 * pread into b, placed as the file's bytes are (zb__buf_for_read: the kernel's copy runs
 * fastest between congruent addresses). */
static zb_status
row_elems(const gather *g, size_t slot, bool data, size_t item, uint64_t first, uint64_t n,
          zb__buf *b, const uint8_t **out)
{
    const zb__src_raw *raw = &g->raws[slot];
    const zb__src_raw_array *a = data ? &raw->data : &raw->indices;
    if (g->views[slot])
        return zb__src_raw_view(g->views[slot], raw->path, a, item, first, n, b, out);
    uint64_t run,
        at = n ? zb__src_raw_at(a, item, first, &run) : 0; /* n = 0: maybe past the table */
    uint8_t *p;
    ZB_TRY(zb__buf_for_read(b, at, (size_t)(n * item), &p));
    *out = p;
    return zb__src_raw_read(raw->fd, raw->path, a, item, first, n, p);
}

/* Where pass row r of matrix j lies in its input: the slot of its input's matrix, its first
 * element and count there, and the elements the scatter counted it keeping. */
static size_t
row_source(const gather *g, size_t j, uint64_t r, uint64_t *first, uint32_t *m, uint32_t *kept)
{
    size_t a = cv_matrix_array(j);
    uint64_t cell;
    const part *p = who_part(g, g->who[r], &cell);
    uint64_t x = cell - p->q0;
    memcpy(kept, p->pass[a] + x * 4, 4);
    memcpy(first, p->pass[a + 1] + x * 8, 8);
    memcpy(m, p->pass[a + 2] + x * 4, 4);
    return p->input * g->cv->n_mats + j;
}

/* Pass row r of matrix j: its row in the input read, its column ids checked, placed at
 * g->indptr[r] of g->indices and g->stored with the gene map applied (cv_remap_row, as the
 * scatter path does) and the values converted to the promoted, then the stored dtype. */
static zb_status
direct_row(direct_job *jb, uint64_t r)
{
    gather *g = jb->g;
    const zb_convert *cv = g->cv;
    size_t j = jb->j;
    uint64_t first;
    uint32_t kept, m;
    size_t slot = row_source(g, j, r, &first, &m, &kept);
    uint32_t input = (uint32_t)(slot / cv->n_mats);
    const cv_in_matrix *im = &cv->inputs[input].mats[j];
    zb_dtype from = g->in_dtypes[slot], mid = cv->mat_dtypes[j], to = cv->stored_dtypes[j];
    size_t in_item = zb_dtype_size(from);
    uint64_t at = (uint64_t)g->indptr[r];
    uint32_t *out_ids = (uint32_t *)g->indices + at;
    unsigned char *out = g->stored + at * zb_dtype_size(to);
    const uint8_t *b_ids, *vals;
    ZB_TRY(row_elems(g, slot, false, 4, first, m, &jb->ids, &b_ids));
    const uint32_t *ids = (const uint32_t *)b_ids; /* aligned: zb__src_matrix_raw */
    uint32_t bad = 0;
    for (uint32_t e = 0; e < m; e++) bad |= ids[e] >= im->n_cols;
    for (uint32_t e = 0; bad && e < m; e++)
        if (ids[e] >= im->n_cols)
            return zb__err(ZB_E_CORRUPT,
                           "%s: %s/indices: element %" PRIu64 ": index %" PRId32
                           " is outside [0, %" PRIu64 ")",
                           cv->inputs[input].path, cv->mat_keys[j], first + e, (int32_t)ids[e],
                           im->n_cols);
    ZB_TRY(row_elems(g, slot, true, in_item, first, m, &jb->vals, &vals));
    unsigned char *wide = out; /* the values in the promoted dtype */
    if (mid != to) {
        ZB_TRY(zb__buf_reserve(&jb->mid, (size_t)m * zb_dtype_size(mid) + 1));
        wide = jb->mid.data;
    }
    uint64_t got = m;
    if (im->identity && from == mid) { /* one conversion, straight to the stored dtype */
        memcpy(out_ids, ids, (size_t)m * 4);
        cv_convert_values(out, to, vals, from, m);
        wide = out;
    } else {
        ZB_TRY(zb__buf_reserve(&jb->keys, (size_t)m * 16 + 16));
        ZB_TRY(zb__buf_reserve(&jb->packed, (size_t)m * in_item + 1));
        cv_row_map rm = {g->maps[slot], im->identity, im->monotone, from, mid};
        got = cv_remap_row(&rm, ids, vals, m, (uint64_t *)jb->keys.data, jb->packed.data, out_ids,
                           wide);
    }
    if (got != kept)
        return zb__err(ZB_E_CORRUPT,
                       "%s: %s, element %" PRIu64 ": %" PRIu64 " of the row's elements kept, "
                       "where the scatter counted %" PRIu32 " (did the input change?)",
                       cv->inputs[input].path, cv->mat_keys[j], first, got, kept);
    if (wide != out) cv_convert_values(out, to, wide, mid, got);
    return ZB_OK;
}

#define PREFETCH_ROWS 4

/* Asks the CPU for the first line of each page of row r's extents in the mapping, a few rows
 * ahead of reading them: each lies on pages no recent row touched (a TLB miss and a cache
 * miss), which pread's copy in the kernel would otherwise have taken. */
static void
prefetch_row(const gather *g, size_t j, uint64_t r)
{
    uint64_t first;
    uint32_t m, kept;
    size_t slot = row_source(g, j, r, &first, &m, &kept);
    const zb__src_map *v = g->views[slot];
    if (!v || !m) return;
    size_t item = zb_dtype_size(g->in_dtypes[slot]);
    for (int d = 0; d < 2; d++) {
        const zb__src_raw_array *ra = d ? &g->raws[slot].data : &g->raws[slot].indices;
        size_t it = d ? item : 4;
        uint64_t run, at = zb__src_raw_at(ra, it, first, &run);
        uint64_t end = at + (uint64_t)m * it;
        for (uint64_t o = at; o < end && o < v->len; o = (o | 4095) + 1)
            __builtin_prefetch(v->base + o);
    }
}

static void
direct_rows(void *arg, zb_ctx *ctx)
{
    (void)ctx;
    direct_job *jb = arg;
    zb_status st = ZB_OK;
    for (uint64_t r = jb->r0; r < jb->r1 && st == ZB_OK; r++) {
        if (r + PREFETCH_ROWS < jb->r1) prefetch_row(jb->g, jb->j, r + PREFETCH_ROWS);
        st = direct_row(jb, r);
    }
    jb->st = st;
    if (st != ZB_OK) snprintf(jb->msg, sizeof jb->msg, "%s", zb_last_error());
}

/* Matrix j's rows of the pass as CSR, read from the inputs on the gather's pool. */
static zb_status
assemble_direct(gather *g, size_t j, uint64_t rows)
{
    size_t a = cv_matrix_array(j);
    g->indptr[0] = 0;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t cell;
        const part *p = who_part(g, g->who[r], &cell);
        uint32_t kept;
        memcpy(&kept, p->pass[a] + (cell - p->q0) * 4, 4);
        g->indptr[r + 1] = g->indptr[r] + kept;
    }
    uint64_t total = (uint64_t)g->indptr[rows];
    ZB_TRY(grow(g, CV_WS_INDICES, total * 4 + 4, &g->indices));
    ZB_TRY(grow(g, CV_WS_RAW, total * zb_dtype_size(g->cv->stored_dtypes[j]) + 1, &g->stored));
    for (size_t k = 0; k < g->n_jobs; k++) {
        direct_job *jb = &g->jobs[k];
        jb->g = g;
        jb->j = j;
        jb->r0 = rows * k / g->n_jobs;
        jb->r1 = rows * (k + 1) / g->n_jobs;
        jb->st = ZB_OK;
        zb__pool_submit(g->pool, direct_rows, jb);
    }
    zb__pool_wait(g->pool);
    for (size_t k = 0; k < g->n_jobs; k++)
        if (g->jobs[k].st != ZB_OK) return zb__err(g->jobs[k].st, "%s", g->jobs[k].msg);
    g->nnz[j < 64 ? j : 63] += total;
    return ZB_OK;
}

/* Matrix j's rows of the pass as CSR: g->indptr, g->indices, g->values. */
static zb_status
assemble_matrix(gather *g, size_t j, uint64_t rows)
{
    if (g->cv->direct) return assemble_direct(g, j, rows);
    size_t a = cv_matrix_array(j), item = g->arrays[a + 2].item;
    uint64_t total = 0;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t cell;
        part *p = who_part(g, g->who[r], &cell);
        uint64_t e0, e1;
        elem_range(g, p, a + 1, cell, cell + 1, &e0, &e1);
        total += e1 - e0;
    }
    ZB_TRY(grow(g, CV_WS_INDICES, total * 4 + 4, &g->indices));
    ZB_TRY(grow(g, CV_WS_VALUES, total * item + 1, &g->values));
    uint64_t at = 0;
    g->indptr[0] = 0;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t cell, n;
        part *p = who_part(g, g->who[r], &cell);
        uint64_t off = cell_elems(g, p, a + 1, cell, &n);
        memcpy(g->indices + at, p->pass[a + 1] + off, (size_t)n * 4);
        off = cell_elems(g, p, a + 2, cell, &n);
        memcpy(g->values + at * item, p->pass[a + 2] + off, (size_t)(n * item));
        at += n;
        g->indptr[r + 1] = (int64_t)at;
    }
    g->nnz[j < 64 ? j : 63] += total;
    /* the values go from the scratch files' type to the stored one (dtypes.c), out of the
     * aligned copy (the pass buffers hold arrays of every item size back to back) */
    zb_dtype from = g->cv->mat_dtypes[j], to = g->cv->stored_dtypes[j];
    g->stored = g->values;
    if (to != from) {
        ZB_TRY(grow(g, CV_WS_RAW, total * zb_dtype_size(to) + 1, &g->stored));
        cv_convert_values(g->stored, to, g->values, from, total);
    }
    return ZB_OK;
}

/* NaN where a nullable float column is masked (anndata has no nullable float encoding). */
static void
nan_where_masked(gather *g, zb_dtype dtype, uint64_t rows)
{
    for (uint64_t r = 0; r < rows; r++) {
        if (!g->mask[r]) continue;
        if (dtype == ZB_DT_FLOAT32) {
            float v = __builtin_nanf("");
            memcpy(g->values + r * 4, &v, 4);
        } else if (dtype == ZB_DT_FLOAT64) {
            double v = __builtin_nan("");
            memcpy(g->values + r * 8, &v, 8);
        } else if (dtype == ZB_DT_FLOAT16) {
            uint16_t v = 0x7e00;
            memcpy(g->values + r * 2, &v, 2);
        }
    }
}

static bool
is_float(zb_dtype t)
{
    return t == ZB_DT_FLOAT16 || t == ZB_DT_FLOAT32 || t == ZB_DT_FLOAT64;
}

static zb_status
append_column(gather *g, zb_anndata_writer *w, size_t c, uint64_t rows)
{
    const cv_column *col = &g->cv->cols[c];
    size_t a = g->col_start[c];
    if (col->kind == ZB_COL_CATEGORICAL) {
        ZB_TRY(assemble_fixed(g, a, rows));
        return zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, col->name, ZB_DT_INT32, g->values,
                                              rows);
    }
    bool nullable = col->kind == ZB_COL_NULLABLE;
    size_t mask_a = a + (col->dtype == ZB_DT_STRING ? 2 : 1);
    if (nullable) {
        for (uint64_t r = 0; r < rows; r++) {
            uint64_t cell;
            part *p = who_part(g, g->who[r], &cell);
            g->mask[r] = p->pass[mask_a][cell - p->q0];
        }
    }
    if (col->dtype == ZB_DT_STRING) {
        ZB_TRY(assemble_strings(g, a, rows));
        if (nullable)
            return zb_anndata_writer_append_nullable_string_column(
                w, ZB_ANNDATA_OBS, col->name, g->text, g->offsets, rows, g->mask, rows);
        return zb_anndata_writer_append_string_column(w, ZB_ANNDATA_OBS, col->name, g->text,
                                                      g->offsets, rows);
    }
    ZB_TRY(assemble_fixed(g, a, rows));
    if (nullable && is_float(col->dtype)) nan_where_masked(g, col->dtype, rows);
    if (nullable && !is_float(col->dtype))
        return zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, col->name, col->dtype,
                                                        g->values, rows, g->mask, rows);
    return zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, col->name, col->dtype, g->values,
                                           rows);
}

/* The pass's rows into the writer: X, layers, names, columns, src_path, src_row. */
static zb_status
write_pass(gather *g, zb_anndata_writer *w, uint64_t rows)
{
    zb_convert *cv = g->cv;
    for (size_t j = 0; j < cv->n_mats; j++) {
        ZB_TRY(assemble_matrix(g, j, rows));
        if (j == 0)
            ZB_TRY(zb_anndata_writer_append_csr(w, rows, g->indptr, g->indices, g->stored));
        else
            ZB_TRY(zb_anndata_writer_append_layer_csr(w, cv->mat_names[j], cv->stored_dtypes[j],
                                                      rows, g->indptr, g->indices, g->stored));
    }
    ZB_TRY(assemble_strings(g, CV_A_NAME_LEN, rows));
    ZB_TRY(zb_anndata_writer_append_names(w, ZB_ANNDATA_OBS, g->text, g->offsets, rows));
    for (size_t c = 0; c < cv->n_cols; c++) ZB_TRY(append_column(g, w, c, rows));
    /* the source of every cell: its input (a code into the input paths) and its row there */
    ZB_TRY(grow(g, CV_WS_VALUES, rows * 8 + 1, &g->values));
    int32_t *codes = (int32_t *)g->values;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t cell;
        codes[r] = (int32_t)who_part(g, g->who[r], &cell)->input;
    }
    ZB_TRY(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "src_path", ZB_DT_INT32, codes, rows));
    ZB_TRY(assemble_fixed(g, CV_A_SRC_ROW, rows));
    return zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "src_row", ZB_DT_INT64, g->values,
                                           rows);
}

/* Every obs column created before any row, in the inputs' column order (the writer keeps
 * creation order as anndata's column-order), then src_path and src_row; and the var names. */
static zb_status
define_frame(gather *g, zb_anndata_writer *w)
{
    zb_convert *cv = g->cv;
    static const uint64_t no_strings[1] = {0};
    for (size_t c = 0; c < cv->n_cols; c++) {
        const cv_column *col = &cv->cols[c];
        const char *name = col->name;
        if (col->kind == ZB_COL_CATEGORICAL && col->dtype == ZB_DT_STRING)
            ZB_TRY(zb_anndata_writer_define_categorical(
                w, ZB_ANNDATA_OBS, name, col->categories.data, col->categories.offsets,
                col->categories.n, col->ordered));
        else if (col->kind == ZB_COL_CATEGORICAL)
            ZB_TRY(zb_anndata_writer_define_categorical_values(w, ZB_ANNDATA_OBS, name, col->dtype,
                                                               col->category_values,
                                                               col->categories.n, col->ordered));
        else if (col->dtype == ZB_DT_STRING && col->kind == ZB_COL_NULLABLE)
            ZB_TRY(zb_anndata_writer_append_nullable_string_column(w, ZB_ANNDATA_OBS, name, "",
                                                                   no_strings, 0, NULL, 0));
        else if (col->dtype == ZB_DT_STRING)
            ZB_TRY(
                zb_anndata_writer_append_string_column(w, ZB_ANNDATA_OBS, name, "", no_strings, 0));
        else if (col->kind == ZB_COL_NULLABLE && !is_float(col->dtype))
            ZB_TRY(zb_anndata_writer_append_nullable_column(w, ZB_ANNDATA_OBS, name, col->dtype, "",
                                                            0, NULL, 0));
        else
            ZB_TRY(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, name, col->dtype, "", 0));
    }
    /* src_path: the inputs as the command named them */
    ZB_TRY(zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "src_path", cv->input_names.data,
                                                cv->input_names.offsets, cv->input_names.n, false));
    ZB_TRY(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "src_row", ZB_DT_INT64, "", 0));
    return zb_anndata_writer_append_names(w, ZB_ANNDATA_VAR, cv->genes.data, cv->genes.offsets,
                                          cv->genes.n);
}

uint64_t
cv_writer_bytes(uint64_t x_chunk, uint64_t x_shard, const zb_dtype *mat_dtypes, size_t n_mats,
                size_t n_cols)
{
    uint64_t shard = x_shard == UINT64_MAX ? x_chunk * 4 : x_shard;
    uint64_t bytes = 0;
    for (size_t j = 0; j < n_mats; j++) bytes += 6 * shard * (zb_dtype_size(mat_dtypes[j]) + 4);
    bytes += (uint64_t)(n_cols + 4) * 65536 * 16;
    return bytes + ((uint64_t)16 << 20);
}

uint64_t
cv_gather_overhead(const zb_convert *cv)
{
    return cv_writer_bytes(cv->x_chunk, cv->x_shard, cv->mat_dtypes, cv->n_mats, cv->n_cols);
}

/* The done marker: cells, files, bytes, CRC-64, nonzeros per matrix and the stored types
 * ({"X/data": ..., "X/indices": ..., "layers/NAME/data": ...}). */
static zb_status
write_done(gather *g, uint64_t files, uint64_t bytes, uint64_t crc, zb_dtype index_dtype)
{
    const zb_convert *cv = g->cv;
    char hex[20], path[4200];
    snprintf(hex, sizeof hex, "%016" PRIx64, crc);
    int ok = 1;
    json_object *doc = json_object_new_object();
    zb__jw_add(doc, "cells", zb__jw_u64(g->cells), &ok);
    zb__jw_add(doc, "files", zb__jw_u64(files), &ok);
    zb__jw_add(doc, "bytes", zb__jw_u64(bytes), &ok);
    zb__jw_add(doc, "crc64", json_object_new_string(hex), &ok);
    json_object *nnz = zb__jw_add(doc, "nnz", json_object_new_array(), &ok);
    for (size_t j = 0; j < cv->n_mats && j < 64; j++) zb__jw_push(nnz, zb__jw_u64(g->nnz[j]), &ok);
    json_object *dt = zb__jw_add(doc, "dtypes", json_object_new_object(), &ok);
    for (size_t j = 0; j < cv->n_mats; j++) {
        char key[1200];
        const char *pre = j ? "layers/" : "", *name = j ? cv->mat_names[j] : "X";
        snprintf(key, sizeof key, "%s%s/data", pre, name);
        zb__jw_add(dt, key, json_object_new_string(zb_dtype_name(cv->stored_dtypes[j])), &ok);
        snprintf(key, sizeof key, "%s%s/indices", pre, name);
        zb__jw_add(dt, key, json_object_new_string(zb_dtype_name(index_dtype)), &ok);
    }
    zb_status st = ok ? cv_path(cv, path, sizeof path, "gather/d%zu.json", g->d)
                      : zb__err(ZB_E_NOMEM, "gather");
    if (st == ZB_OK) {
        const char *text = json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN |
                                                                   JSON_C_TO_STRING_NOSLASHESCAPE);
        const void *bufs[2] = {text, "\n"};
        size_t lens[2] = {strlen(text), 1};
        st = cv_write_file(path, bufs, lens, 2);
    }
    json_object_put(doc);
    return st;
}

/* Rows per pass: what the task's memory holds twice over (read, then assembled), after the
 * writer and the parts' per-cell arrays; at least 8 MiB of rows. */
static uint64_t
pass_rows(const gather *g, uint64_t memory)
{
    uint64_t bytes = 0, fixed = 0;
    for (size_t i = 0; i < g->n_parts; i++) {
        const part *p = &g->parts[i];
        for (size_t a = 0; a < g->n_arrays; a++) {
            if (g->index[a]) continue;
            uint64_t e0, e1;
            elem_range(g, p, a, 0, p->n, &e0, &e1);
            bytes += (e1 - e0) * g->arrays[a].item;
        }
        fixed += p->n * 8 * 4 + p->n_blocks * (4 * (1 + g->n_arrays) + 16);
    }
    /* a pass holds its cells decompressed, their compressed blocks, and the rows assembled;
     * each part may add a block that straddles two passes */
    /* the direct path: the rows read from the inputs and placed (their share of the inputs) */
    for (size_t k = 0; g->cv->direct && k < g->cv->n_inputs; k++)
        for (size_t j = 0; j < g->cv->n_mats; j++)
            bytes += g->cv->inputs[k].mats[j].nnz * (4 + zb_dtype_size(g->cv->mat_dtypes[j])) /
                     (g->cv->n_cells ? g->cv->n_cells : 1) * g->cells;
    uint64_t per_row = bytes / (g->cells ? g->cells : 1) + 1;
    uint64_t used = cv_gather_overhead(g->cv) + fixed + g->n_parts * g->cv->block_bytes * 3 / 2;
    uint64_t floor = (uint64_t)8 << 20, left = memory > used + floor ? memory - used : floor;
    uint64_t rows = left / (per_row * 5 / 2 + 24);
    return rows < 1 ? 1 : rows;
}

static zb_status
gather_rows(gather *g, zb_anndata_writer *w, uint64_t memory)
{
    /* the mapped inputs' pages count in the RSS: this task's share of them comes off its passes
     * (at most half: cv_view maps at most half of memory_bytes) */
    zb_convert *cv = g->cv;
    pthread_mutex_lock(&cv->lock);
    uint64_t mapped = cv->mapped_bytes;
    pthread_mutex_unlock(&cv->lock);
    if (mapped && cv->memory_bytes)
        memory -= (uint64_t)((double)mapped / (double)cv->memory_bytes * (double)memory);
    uint64_t per_pass = pass_rows(g, memory);
    if (per_pass > g->cells) per_pass = g->cells;
    ZB_TRY(grow(g, CV_WS_WHO, (per_pass + 1) * sizeof *g->who, &g->who));
    ZB_TRY(grow(g, CV_WS_INDPTR, (per_pass + 1) * sizeof *g->indptr, &g->indptr));
    ZB_TRY(grow(g, CV_WS_OFFSETS, (per_pass + 1) * sizeof *g->offsets, &g->offsets));
    ZB_TRY(grow(g, CV_WS_MASK, per_pass + 1, &g->mask));
    for (uint64_t r0 = 0; r0 < g->cells; r0 += per_pass) {
        uint64_t r1 = g->cells - r0 < per_pass ? g->cells : r0 + per_pass;
        ZB_TRY(read_pass(g, r0, r1));
        ZB_TRY(write_pass(g, w, r1 - r0));
    }
    return ZB_OK;
}

zb_status
cv_gather_task(zb_convert *cv, size_t d, int num_threads)
{
    char dir[4200], name[64];
    ZB_TRY(cv_path(cv, dir, sizeof dir, "gather"));
    ZB_TRY(cv_mkdirs(dir));
    snprintf(name, sizeof name, "dataset_%zu", d);
    ZB_TRY(cv_output_remove(cv, name)); /* what a killed attempt left */
    gather g;
    memset(&g, 0, sizeof g);
    g.cv = cv;
    g.d = d;
    g.cells = cv_dataset_cells(cv, d);
    g.n_arrays = cv_arrays(cv, g.arrays, g.col_start);
    cv_index_arrays(g.arrays, g.n_arrays, g.index);
    g.parts = calloc(cv->n_slices ? cv->n_slices : 1, sizeof *g.parts);
    zb_status st = g.parts ? cv_ws_take(cv, &g.ws) : zb__err(ZB_E_NOMEM, "gather");
    for (size_t t = 0; t < cv->n_slices && st == ZB_OK; t++) st = load_part(&g, t);
    uint64_t have = 0;
    for (size_t i = 0; i < g.n_parts; i++) have += g.parts[i].n;
    if (st == ZB_OK && have != g.cells)
        st = zb__err(ZB_E_CORRUPT,
                     "dataset %zu: the scatter files hold %" PRIu64 " of its %" PRIu64 " cells", d,
                     have, g.cells);
    cv_digest *dg = NULL;
    zb_store *store = NULL;
    zb_anndata_writer *w = NULL;
    if (st == ZB_OK) st = zb__pool_new(num_threads > 1 ? num_threads : 0, &g.pool);
    if (st == ZB_OK && cv->direct) st = direct_open(&g, num_threads);
    /* the shards are read back while the gather goes on (digest.c), not all at the end */
    if (st == ZB_OK) st = cv_digest_open(cv->out, name, true, &dg, &store);
    if (st == ZB_OK) st = cv_stored_types(cv);
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.zarr_format = cv->zarr_format;
    o.codec = cv->codec;
    o.x_chunk = cv->x_chunk;
    o.x_shard = cv->x_shard == UINT64_MAX ? 0 : cv->x_shard;
    o.num_threads = num_threads;
    o.narrow_indices = cv->narrow_indices;
    if (st == ZB_OK)
        st = zb_anndata_writer_open(store, name, cv->genes.n, ZB_ANNDATA_X_CSR,
                                    cv->stored_dtypes[0], &o, &w);
    zb_dtype index_dtype = zb_anndata_writer_index_dtype(w);
    if (st == ZB_OK) st = define_frame(&g, w);
    if (st == ZB_OK) st = gather_rows(&g, w, cv->task_memory ? cv->task_memory : cv->memory_bytes);
    if (st == ZB_OK) st = zb_anndata_writer_commit(w);
    zb_anndata_writer_close(w);
    uint64_t files = 0, bytes = 0, crc = 0;
    if (st == ZB_OK) st = cv_digest_result(dg, &files, &bytes, &crc);
    if (st == ZB_OK) st = cv_digest_remember(dg, cv);
    zb_store_close(store);
    cv_digest_free(dg);
    if (st == ZB_OK) st = write_done(&g, files, bytes, crc, index_dtype);
    zb__pool_free(g.pool);
    if (cv->direct) direct_close(&g);
    parts_free(&g);
    cv_ws_give(cv, g.ws);
    if (st != ZB_OK) return zb__err_context(st, "gather of %s", name);
    return ZB_OK;
}
