/* A CSC matrix written as CSR, out of core: the scratch file of csr_file.c, in two passes that
 * each hold about memory_bytes of the matrix whatever its size, reading the source once.
 *
 * 1. Distribute. Rows are cut into bands of 2^shift rows, as many as make one band's CSR
 *    (indptr, indices, data) about BAND_TARGET bytes. num_threads producers each read a run of
 *    columns holding an equal share of the elements (cut at the column pointers), block by
 *    block, and append each element as a (row, column, value) triple to its band's buffer. A
 *    full buffer becomes a chunk of the band: kept in memory when every triple fits in
 *    memory_bytes, else appended to a scratch file beside `path` (unlinked as soon as it is
 *    made, so nothing is left behind whatever happens).
 * 2. Transpose each band, bands in parallel on the pool: count its elements per row (a pass
 *    over the row ids of its chunks), turn the counts into row pointers, place each element at
 *    its row's cursor (a second pass), and write the band's indptr, indices and data at their
 *    final offsets in the output (pwrite: a band's elements start after those of every band
 *    above it, known once the distribution is done). The chunks of a band are visited in
 *    column order (producer by producer, each in the order it filled them), so the placement
 *    is stable: every row's columns come out ascending without a sort, and the file is the same
 *    byte for byte whatever the thread count. A band holding more than twice BAND_TARGET
 *    (rows denser than the average) is distributed again into narrower bands the same way,
 *    down to single rows.
 *
 * Why distribute rather than read the source once per band of rows: every extra read of an
 * .h5ad or Zarr input decodes it again, and with memory_bytes a small fraction of the matrix
 * that is many reads; distributing costs one read plus a sequential write and read of the
 * triples, which the page cache usually absorbs. Small bands keep the scatter of pass 2 in
 * cache, which is why bands are BAND_TARGET bytes even when memory is plentiful. Measurements
 * in docs/PERFORMANCE.md.
 *
 * The output is written under a temporary name beside `path`, fsync'ed and renamed; any error
 * removes it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "convert/csr_file.h"
#include "util/buf.h"
#include "util/pool.h"
#include "util/status.h"

#define BAND_TARGET ((uint64_t)4 << 20) /* output bytes of a band (measured) */
#define READ_MAX ((uint64_t)16 << 20)   /* bytes of one read from the source */
#define BUF_MIN 256u                    /* triples in a band buffer */
#define BUF_MAX 65536u
#define SHARE_MIN ((uint64_t)64 << 10) /* a thread's share of memory_bytes, at least */

/* ---- fault injection (tests) ----------------------------------------------------------------- */

static _Atomic int64_t fail_nth = -1;
static _Atomic int fail_errno;

void
zb__transpose_fail_write(int64_t nth, int err)
{
    atomic_store(&fail_errno, err);
    atomic_store(&fail_nth, nth);
}

/* The errno a test wants this write-like call to fail with, or 0. */
static int
injected(void)
{
    if (atomic_load_explicit(&fail_nth, memory_order_relaxed) < 0) return 0;
    return atomic_fetch_sub(&fail_nth, 1) == 0 ? atomic_load(&fail_errno) : 0;
}

/* ---- bytes of matrix data held, for the memory bound ----------------------------------------- */

typedef struct meter {
    _Atomic uint64_t now, peak;
} meter;

static void
meter_add(meter *m, uint64_t n)
{
    uint64_t now = atomic_fetch_add(&m->now, n) + n;
    uint64_t peak = atomic_load(&m->peak);
    while (now > peak && !atomic_compare_exchange_weak(&m->peak, &peak, now)) {}
}

static void *
meter_alloc(meter *m, size_t n, bool zero)
{
    void *p = zero ? calloc(1, n ? n : 1) : malloc(n ? n : 1);
    if (p) meter_add(m, n);
    return p;
}

static void
meter_free(meter *m, void *p, size_t n)
{
    if (!p) return;
    free(p);
    atomic_fetch_sub(&m->now, n);
}

/* ---- the job --------------------------------------------------------------------------------- */

/* A run of triples of one band: rows [cap] | columns [cap] | values [cap], n of them used. In
 * the scratch file a chunk is stored with cap == n. */
typedef struct chunk {
    uint8_t *mem; /* in memory, or NULL: in the scratch file at `offset` */
    uint64_t offset;
    uint32_t n, cap;
} chunk;

typedef struct chunk_list {
    chunk *v;
    size_t n, cap;
    uint64_t nnz; /* triples in all of them */
} chunk_list;

typedef struct job {
    zb__src_matrix *m;
    const char *path;
    size_t item, triple; /* bytes of a value; of a (row, column, value) triple */
    uint64_t n_rows, nnz;
    uint64_t band_target; /* output bytes of a band */
    uint64_t buffers;     /* bytes of band buffers one distribution holds */
    size_t max_fanout;    /* bands one distribution feeds */
    uint64_t read_nnz;    /* elements per read from the source */
    unsigned shift;       /* first distribution: 2^shift rows a band */
    size_t n_bands;
    int64_t *colptr; /* [n_cols + 1] */
    int scratch_fd;  /* -1: chunks stay in memory */
    char *scratch_path;
    _Atomic uint64_t scratch_end;
    int out_fd;
    char *tmp_path;
    zb__csr_file_layout lay;
    meter mem;
    _Atomic uint64_t bands_split;
    _Atomic bool failed; /* tasks stop early once one failed */
    pthread_mutex_t mu;  /* guards st and msg */
    zb_status st;
    char msg[1024];
} job;

/* The scratch file's name for messages (the output's while triples stay in memory). */
static const char *
scratch_name(const job *j)
{
    return j->scratch_path ? j->scratch_path : j->path;
}

/* Records the first failure of a task (its detail message is thread-local). */
static void
job_fail(job *j, zb_status st)
{
    pthread_mutex_lock(&j->mu);
    if (j->st == ZB_OK) {
        j->st = st;
        snprintf(j->msg, sizeof j->msg, "%s", zb_last_error());
    }
    pthread_mutex_unlock(&j->mu);
    atomic_store(&j->failed, true);
}

static zb_status
job_status(job *j)
{
    if (j->st == ZB_OK) return ZB_OK;
    return zb__err(j->st, "%s", j->msg);
}

/* ---- file I/O -------------------------------------------------------------------------------- */

static zb_status
write_at(int fd, const char *path, const void *src, size_t n, uint64_t offset)
{
    const uint8_t *p = src;
    while (n > 0) {
        size_t want = n < ((size_t)1 << 30) ? n : (size_t)1 << 30;
        int e = injected();
        ssize_t put = e ? -1 : pwrite(fd, p, want, (off_t)offset);
        if (put < 0 && !e) e = errno;
        if (put < 0 && e == EINTR) continue;
        if (put <= 0)
            return zb__err(ZB_E_IO, "%s: write of %zu bytes at %llu: %s", path, want,
                           (unsigned long long)offset, strerror(put < 0 ? e : ENOSPC));
        p += put;
        n -= (size_t)put;
        offset += (uint64_t)put;
    }
    return ZB_OK;
}

static zb_status
read_scratch(job *j, void *dst, size_t n, uint64_t offset)
{
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t got = pread(j->scratch_fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return zb__err(got < 0 ? ZB_E_IO : ZB_E_CORRUPT, "%s: read of %zu bytes at %llu: %s",
                           j->scratch_path, n, (unsigned long long)offset,
                           got < 0 ? strerror(errno) : "the file ends");
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return ZB_OK;
}

/* `path` + suffix + ".<pid>.<n>", unique within the process. */
static char *
temp_name(const char *path, const char *suffix)
{
    static _Atomic unsigned long counter;
    size_t cap = strlen(path) + strlen(suffix) + 48;
    char *s = malloc(cap);
    if (s)
        snprintf(s, cap, "%s%s.%ld.%lu", path, suffix, (long)getpid(),
                 atomic_fetch_add(&counter, 1) + 1);
    return s;
}

/* Creates the temporary output and reserves its whole size, so a full disk shows at once
 * rather than after the work. */
static zb_status
open_output(job *j)
{
    j->tmp_path = temp_name(j->path, ".zbtmp");
    if (!j->tmp_path) return zb__err(ZB_E_NOMEM, "%s: out of memory", j->path);
    j->out_fd = open(j->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (j->out_fd < 0)
        return zb__err(errno == ENOENT ? ZB_E_NOTFOUND : ZB_E_IO, "%s: create: %s", j->tmp_path,
                       strerror(errno));
    int e = injected();
    if (!e && fallocate(j->out_fd, 0, 0, (off_t)j->lay.size) == 0) return ZB_OK;
    if (!e) e = errno;
    if (e == EOPNOTSUPP || e == ENOSYS) { /* a file system without it: errors show at write */
        if (ftruncate(j->out_fd, (off_t)j->lay.size) == 0) return ZB_OK;
        e = errno;
    }
    return zb__err(ZB_E_IO, "%s: reserving %llu bytes: %s", j->tmp_path,
                   (unsigned long long)j->lay.size, strerror(e));
}

static zb_status
open_scratch(job *j)
{
    j->scratch_path = temp_name(j->path, ".bands.zbtmp");
    if (!j->scratch_path) return zb__err(ZB_E_NOMEM, "%s: out of memory", j->path);
    j->scratch_fd = open(j->scratch_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (j->scratch_fd < 0)
        return zb__err(ZB_E_IO, "%s: create: %s", j->scratch_path, strerror(errno));
    unlink(j->scratch_path); /* the descriptor keeps it; nothing is left behind */
    return ZB_OK;
}

/* fsync of the directory holding `path`, so the rename is durable too. */
static zb_status
sync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash == path ? strdup("/")
                : slash       ? strndup(path, (size_t)(slash - path))
                              : strdup(".");
    if (!dir) return zb__err(ZB_E_NOMEM, "%s: out of memory", path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int e = fd < 0 ? errno : injected();
    if (fd >= 0 && !e && fsync(fd) != 0 && errno != EINVAL) e = errno;
    if (fd >= 0) close(fd);
    zb_status st = e ? zb__err(ZB_E_IO, "%s: fsync: %s", dir, strerror(e)) : ZB_OK;
    free(dir);
    return st;
}

/* Writes the header and the last row pointer, then makes the file durable and gives it its
 * name. */
static zb_status
commit_output(job *j)
{
    uint8_t h[ZB_CSR_FILE_HEADER_BYTES];
    zb__csr_file_header(h, j->m->info.dtype, j->n_rows, j->m->info.n_cols, j->nnz);
    int64_t last = (int64_t)j->nnz;
    ZB_TRY(write_at(j->out_fd, j->tmp_path, &last, 8, j->lay.indptr + 8 * j->n_rows));
    ZB_TRY(write_at(j->out_fd, j->tmp_path, h, sizeof h, 0));
    int e = injected();
    if (!e && fsync(j->out_fd) != 0) e = errno;
    int fd = j->out_fd;
    j->out_fd = -1;
    if (close(fd) != 0 && !e) e = errno;
    if (e) return zb__err(ZB_E_IO, "%s: fsync: %s", j->tmp_path, strerror(e));
    if (rename(j->tmp_path, j->path) != 0)
        return zb__err(ZB_E_IO, "%s: rename to %s: %s", j->tmp_path, j->path, strerror(errno));
    zb_status st = sync_dir(j->path);
    if (st != ZB_OK) unlink(j->path); /* an error means no file */
    return st;
}

/* ---- chunk lists ----------------------------------------------------------------------------- */

static zb_status
chunk_push(chunk_list *l, chunk c)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        chunk *v = realloc(l->v, cap * sizeof *v);
        if (!v) return zb__err(ZB_E_NOMEM, "out of memory for %zu chunks", cap);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = c;
    l->nnz += c.n;
    return ZB_OK;
}

/* Frees the chunks' memory (those still in memory) and the list. */
static void
chunk_list_free(job *j, chunk_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        meter_free(&j->mem, l->v[i].mem, (size_t)l->v[i].cap * j->triple);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* The triples of chunk c: in memory where they are, else read into `buf` (the row ids only
 * when rows_only). */
static zb_status
chunk_load(job *j, const chunk *c, uint8_t *buf, bool rows_only, const uint32_t **rows,
           const uint32_t **cols, const uint8_t **vals)
{
    const uint8_t *p = c->mem;
    if (!p) {
        ZB_TRY(read_scratch(j, buf, (size_t)c->n * (rows_only ? 4 : j->triple), c->offset));
        p = buf;
    }
    *rows = (const uint32_t *)p;
    *cols = (const uint32_t *)p + c->cap;
    *vals = p + (size_t)8 * c->cap;
    return ZB_OK;
}

/* A buffer for the largest chunk of the list read from the scratch file (NULL if none is). */
static zb_status
chunk_buffer(job *j, const chunk_list *l, uint8_t **buf, size_t *bytes)
{
    size_t most = 0;
    for (size_t i = 0; i < l->n; i++)
        if (!l->v[i].mem && l->v[i].n > most) most = l->v[i].n;
    *bytes = most * j->triple;
    *buf = NULL;
    if (most && !(*buf = meter_alloc(&j->mem, *bytes, false)))
        return zb__err(ZB_E_NOMEM, "%s: out of memory for a chunk of %zu bytes", j->path, *bytes);
    return ZB_OK;
}

/* ---- distribution ---------------------------------------------------------------------------- */

/* Triples going to bands of rows: band b holds rows base + [b << shift, (b + 1) << shift). */
typedef struct dist {
    job *j;
    uint64_t base;
    unsigned shift;
    size_t k;        /* bands */
    uint32_t cap;    /* triples a buffer */
    uint8_t **buf;   /* [k] the filling buffers (NULL until needed) */
    uint32_t *fill;  /* [k] */
    chunk_list *out; /* [k] each band's chunks, in the order filled */
} dist;

static zb_status
dist_init(dist *d, job *j, uint64_t base, unsigned shift, size_t k)
{
    memset(d, 0, sizeof *d);
    d->j = j;
    d->base = base;
    d->shift = shift;
    d->k = k;
    uint64_t cap = j->buffers / ((k ? k : 1) * j->triple);
    cap = cap < BUF_MIN ? BUF_MIN : cap > BUF_MAX ? BUF_MAX : cap;
    d->cap = (uint32_t)(cap & ~(uint64_t)15); /* values stay aligned after 8 * cap bytes */
    d->buf = calloc(k + 1, sizeof *d->buf);
    d->fill = calloc(k + 1, sizeof *d->fill);
    d->out = calloc(k + 1, sizeof *d->out);
    if (!d->buf || !d->fill || !d->out)
        return zb__err(ZB_E_NOMEM, "%s: out of memory for %zu bands", j->path, k);
    return ZB_OK;
}

static void
dist_free(dist *d)
{
    for (size_t b = 0; d->buf && b < d->k; b++)
        meter_free(&d->j->mem, d->buf[b], (size_t)d->cap * d->j->triple);
    for (size_t b = 0; d->out && b < d->k; b++) chunk_list_free(d->j, &d->out[b]);
    free(d->buf);
    free(d->fill);
    free(d->out);
    memset(d, 0, sizeof *d);
}

/* Makes band b's filled triples a chunk: the buffer itself in memory, or appended to the
 * scratch file (the buffer is then reused). */
static zb_status
flush(dist *d, size_t b)
{
    job *j = d->j;
    uint32_t n = d->fill[b];
    if (n == 0) return ZB_OK;
    uint8_t *p = d->buf[b];
    chunk c = {.n = n, .cap = d->cap};
    if (j->scratch_fd < 0) {
        c.mem = p;
        d->buf[b] = NULL;
    } else {
        if (n < d->cap) { /* close the gaps of a part-filled buffer */
            memmove(p + (size_t)4 * n, p + (size_t)4 * d->cap, (size_t)4 * n);
            memmove(p + (size_t)8 * n, p + (size_t)8 * d->cap, (size_t)n * j->item);
        }
        size_t bytes = (size_t)n * j->triple;
        c.offset = atomic_fetch_add(&j->scratch_end, bytes);
        c.cap = n;
        ZB_TRY(write_at(j->scratch_fd, j->scratch_path, p, bytes, c.offset));
    }
    d->fill[b] = 0;
    zb_status st = chunk_push(&d->out[b], c);
    if (st != ZB_OK) meter_free(&j->mem, c.mem, (size_t)c.cap * j->triple);
    return st;
}

/* Flushes band b and makes sure it has a buffer. */
static zb_status
refill(dist *d, size_t b)
{
    ZB_TRY(flush(d, b));
    if (!d->buf[b] && !(d->buf[b] = meter_alloc(&d->j->mem, (size_t)d->cap * d->j->triple, false)))
        return zb__err(ZB_E_NOMEM, "%s: out of memory for a band buffer", d->j->path);
    return ZB_OK;
}

/* Flushes every band and frees the buffers (in memory they became chunks already). */
static zb_status
flush_all(dist *d)
{
    for (size_t b = 0; b < d->k; b++) {
        ZB_TRY(flush(d, b));
        meter_free(&d->j->mem, d->buf[b], (size_t)d->cap * d->j->triple);
        d->buf[b] = NULL;
    }
    return ZB_OK;
}

/* Copies one value; `item` is one of 1, 2, 4, 8, so each case is a single move. */
static inline void
copy_value(uint8_t *dst, const uint8_t *src, size_t item)
{
    switch (item) {
    case 1:
        *dst = *src;
        break;
    case 2:
        memcpy(dst, src, 2);
        break;
    case 4:
        memcpy(dst, src, 4);
        break;
    default:
        memcpy(dst, src, 8);
        break;
    }
}

/* Appends n triples to their bands' buffers: rows[i], cols[i] (or `col` for all when cols is
 * NULL: one column of the source), and the value at vals + i * item. The loop every element
 * goes through once per distribution, so what it reads of d sits in locals. */
static zb_status
distribute(dist *d, const uint32_t *rows, const uint32_t *cols, uint32_t col, const uint8_t *vals,
           size_t n)
{
    const uint64_t base = d->base, k = d->k;
    const unsigned shift = d->shift;
    const uint32_t cap = d->cap;
    const size_t item = d->j->item;
    uint8_t **buf = d->buf;
    uint32_t *fill = d->fill;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = ((uint64_t)rows[i] - base) >> shift;
        if (rows[i] < base || b >= k)
            return zb__err(ZB_E_CORRUPT, "%s: row %u outside the bands from row %llu",
                           scratch_name(d->j), rows[i], (unsigned long long)base);
        uint32_t at = fill[b];
        uint8_t *p = buf[b];
        if (at == cap || !p) {
            ZB_TRY(refill(d, (size_t)b));
            at = 0;
            p = buf[b];
        }
        ((uint32_t *)p)[at] = rows[i];
        ((uint32_t *)p)[cap + at] = cols ? cols[i] : col;
        copy_value(p + (size_t)8 * cap + (size_t)at * item, vals + i * item, item);
        fill[b] = at + 1;
    }
    return ZB_OK;
}

/* ---- pass 1: producers read the source ------------------------------------------------------- */

typedef struct producer {
    job *j;
    uint64_t c0, c1; /* columns */
    dist d;
} producer;

/* The end of a read from column c: as many columns as read_nnz elements allow, at least one. */
static uint64_t
read_end(const job *j, uint64_t c, uint64_t stop)
{
    uint64_t e = c + 1;
    while (e < stop && (uint64_t)(j->colptr[e + 1] - j->colptr[c]) <= j->read_nnz) e++;
    return e;
}

static uint64_t
block_bytes(const zb__csr_block *b)
{
    return b->cap_rows * 8 + b->cap_nnz * 4 + b->cap_data_bytes;
}

static zb_status
produce(producer *pr)
{
    job *j = pr->j;
    zb__csr_block blk = {0};
    uint64_t held = 0;
    zb_status st = ZB_OK;
    for (uint64_t c = pr->c0; c < pr->c1 && st == ZB_OK && !atomic_load(&j->failed);) {
        uint64_t e = read_end(j, c, pr->c1);
        st = zb__src_matrix_read(j->m, c, e, &blk);
        meter_add(&j->mem, block_bytes(&blk) - held);
        held = block_bytes(&blk);
        uint64_t want = (uint64_t)(j->colptr[e] - j->colptr[c]);
        if (st == ZB_OK && blk.nnz != want)
            st = zb__err(ZB_E_CORRUPT,
                         "%s: %s: columns [%llu, %llu) hold %llu elements, but "
                         "their pointers say %llu",
                         j->m->path, j->m->key, (unsigned long long)c, (unsigned long long)e,
                         (unsigned long long)blk.nnz, (unsigned long long)want);
        const uint8_t *data = blk.data;
        for (uint64_t k = 0; st == ZB_OK && k < blk.n_rows; k++) {
            int64_t x = blk.indptr[k];
            st = distribute(&pr->d, blk.indices + x, NULL, (uint32_t)(c + k),
                            data + (size_t)x * j->item, (size_t)(blk.indptr[k + 1] - x));
        }
        c = e;
    }
    if (st == ZB_OK) st = flush_all(&pr->d);
    zb__csr_block_free(&blk);
    atomic_fetch_sub(&j->mem.now, held);
    return st;
}

static void
produce_task(void *arg, zb_ctx *ctx)
{
    (void)ctx;
    producer *pr = arg;
    zb_status st = produce(pr);
    if (st != ZB_OK) job_fail(pr->j, st);
}

/* ---- pass 2: bands transposed in memory ------------------------------------------------------ */

typedef struct band {
    job *j;
    uint64_t r0, r1; /* rows */
    unsigned shift;  /* r1 - r0 <= 2^shift */
    uint64_t at;     /* its first element's place in the output */
    chunk_list chunks;
} band;

static zb_status transpose_band(job *j, band *b);

/* Distributes a band too dense for memory into narrower ones and transposes each. */
static zb_status
split_band(job *j, band *b, uint64_t out_bytes)
{
    uint64_t want = out_bytes / j->band_target + 1;
    unsigned lg = 1;
    while (lg < b->shift && ((uint64_t)1 << lg) < want && ((size_t)2 << lg) <= j->max_fanout) lg++;
    unsigned shift = b->shift > lg ? b->shift - lg : 0;
    uint64_t rows = b->r1 - b->r0;
    dist d;
    uint8_t *buf = NULL;
    size_t buf_bytes = 0;
    zb_status st = dist_init(&d, j, b->r0, shift, (size_t)(((rows - 1) >> shift) + 1));
    if (st == ZB_OK) st = chunk_buffer(j, &b->chunks, &buf, &buf_bytes);
    for (size_t i = 0; st == ZB_OK && i < b->chunks.n; i++) {
        chunk *c = &b->chunks.v[i];
        const uint32_t *r, *col;
        const uint8_t *v;
        st = chunk_load(j, c, buf, false, &r, &col, &v);
        if (st == ZB_OK) st = distribute(&d, r, col, 0, v, c->n);
        meter_free(&j->mem, c->mem, (size_t)c->cap * j->triple); /* consumed */
        c->mem = NULL;
        c->n = 0;
    }
    if (st == ZB_OK) st = flush_all(&d);
    meter_free(&j->mem, buf, buf_bytes);
    if (st == ZB_OK) atomic_fetch_add(&j->bands_split, 1);
    uint64_t at = b->at;
    for (size_t i = 0; st == ZB_OK && i < d.k; i++) {
        band sub = {j, b->r0 + ((uint64_t)i << shift), 0, shift, at, d.out[i]};
        sub.r1 = sub.r0 + ((uint64_t)1 << shift) < b->r1 ? sub.r0 + ((uint64_t)1 << shift) : b->r1;
        memset(&d.out[i], 0, sizeof d.out[i]); /* the sub-band owns its chunks now */
        st = transpose_band(j, &sub);
        at += sub.chunks.nnz;
        chunk_list_free(j, &sub.chunks);
    }
    dist_free(&d);
    return st;
}

/* Counts the band's elements per row into ptr[row + 2]. */
static zb_status
count_rows(job *j, band *b, uint8_t *buf, int64_t *ptr)
{
    uint64_t rows = b->r1 - b->r0;
    for (size_t i = 0; i < b->chunks.n; i++) {
        const chunk *c = &b->chunks.v[i];
        const uint32_t *r, *col;
        const uint8_t *v;
        ZB_TRY(chunk_load(j, c, buf, true, &r, &col, &v));
        for (uint32_t e = 0; e < c->n; e++) {
            uint64_t x = (uint64_t)r[e] - b->r0;
            if (r[e] < b->r0 || x >= rows)
                return zb__err(ZB_E_CORRUPT, "%s: row %u in the band of rows [%llu, %llu)",
                               scratch_name(j), r[e], (unsigned long long)b->r0,
                               (unsigned long long)b->r1);
            ptr[x + 2]++;
        }
    }
    return ZB_OK;
}

/* Places each element at its row's cursor ptr[row + 1] (counts already summed into starts). */
static zb_status
place(job *j, band *b, uint8_t *buf, int64_t *ptr, uint32_t *cols, uint8_t *vals)
{
    uint64_t rows = b->r1 - b->r0;
    int64_t nnz = (int64_t)b->chunks.nnz;
    size_t item = j->item;
    for (size_t i = 0; i < b->chunks.n; i++) {
        chunk *c = &b->chunks.v[i];
        const uint32_t *r, *col;
        const uint8_t *v;
        ZB_TRY(chunk_load(j, c, buf, false, &r, &col, &v));
        for (uint32_t e = 0; e < c->n; e++) {
            uint64_t x = (uint64_t)r[e] - b->r0;
            int64_t k = x < rows ? ptr[x + 1]++ : nnz;
            if (k >= nnz)
                return zb__err(ZB_E_CORRUPT,
                               "%s: the band of rows [%llu, %llu) changed between "
                               "two reads",
                               scratch_name(j), (unsigned long long)b->r0,
                               (unsigned long long)b->r1);
            cols[k] = col[e];
            copy_value(vals + (size_t)k * item, v + (size_t)e * item, item);
        }
        meter_free(&j->mem, c->mem, (size_t)c->cap * j->triple); /* consumed */
        c->mem = NULL;
    }
    return ZB_OK;
}

static zb_status
transpose_band(job *j, band *b)
{
    uint64_t rows = b->r1 - b->r0, nnz = b->chunks.nnz;
    uint64_t out_bytes = (rows + 2) * 8 + nnz * (4 + j->item);
    if (out_bytes > 2 * j->band_target && rows > 1) return split_band(j, b, out_bytes);
    size_t ptr_bytes = (size_t)(rows + 2) * 8, val_bytes = (size_t)nnz * j->item, buf_bytes = 0;
    int64_t *ptr = meter_alloc(&j->mem, ptr_bytes, true);
    uint32_t *cols = meter_alloc(&j->mem, (size_t)nnz * 4, false);
    uint8_t *vals = meter_alloc(&j->mem, val_bytes, false), *buf = NULL;
    zb_status st = ZB_OK;
    if (!ptr || !cols || !vals)
        st = zb__err(ZB_E_NOMEM, "%s: out of memory for a band of %llu bytes", j->path,
                     (unsigned long long)out_bytes);
    if (st == ZB_OK) st = chunk_buffer(j, &b->chunks, &buf, &buf_bytes);
    if (st == ZB_OK) st = count_rows(j, b, buf, ptr);
    for (uint64_t r = 2; st == ZB_OK && r < rows + 2; r++) ptr[r] += ptr[r - 1];
    if (st == ZB_OK) st = place(j, b, buf, ptr, cols, vals);
    /* ptr[0 .. rows] are now the band's row pointers; rebased to the file's */
    for (uint64_t r = 0; st == ZB_OK && r < rows; r++) ptr[r] += (int64_t)b->at;
    if (st == ZB_OK)
        st = write_at(j->out_fd, j->tmp_path, ptr, (size_t)rows * 8, j->lay.indptr + 8 * b->r0);
    if (st == ZB_OK)
        st = write_at(j->out_fd, j->tmp_path, cols, (size_t)nnz * 4, j->lay.indices + 4 * b->at);
    if (st == ZB_OK)
        st = write_at(j->out_fd, j->tmp_path, vals, val_bytes, j->lay.data + j->item * b->at);
    meter_free(&j->mem, buf, buf_bytes);
    meter_free(&j->mem, ptr, ptr_bytes);
    meter_free(&j->mem, cols, (size_t)nnz * 4);
    meter_free(&j->mem, vals, val_bytes);
    return st;
}

static void
band_task(void *arg, zb_ctx *ctx)
{
    (void)ctx;
    band *b = arg;
    if (!atomic_load(&b->j->failed)) {
        zb_status st = transpose_band(b->j, b);
        if (st != ZB_OK) job_fail(b->j, st);
    }
    chunk_list_free(b->j, &b->chunks);
}

/* ---- planning and the two passes ------------------------------------------------------------- */

/* Sizes bands, buffers and reads from memory_bytes: per thread a share of it, half for band
 * buffers while distributing, a quarter for a read from the source, and a band's output at
 * most half (twice BAND_TARGET, or of a quarter of the share when that is less). */
static void
plan(job *j, uint64_t memory_bytes, int threads, uint64_t band_bytes)
{
    uint64_t share = memory_bytes / (uint64_t)threads;
    if (share < SHARE_MIN) share = SHARE_MIN;
    if (!band_bytes) band_bytes = BAND_TARGET;
    j->band_target = share / 4 < band_bytes ? share / 4 : band_bytes;
    j->buffers = share / 2;
    j->max_fanout = (size_t)(j->buffers / (BUF_MIN * j->triple));
    if (j->max_fanout < 2) j->max_fanout = 2;
    uint64_t read = share / 4 < READ_MAX ? share / 4 : READ_MAX;
    j->read_nnz = read / (4 + j->item) ? read / (4 + j->item) : 1;
    double row_bytes =
        8.0 + (j->n_rows ? (double)j->nnz / (double)j->n_rows : 0.0) * (double)(4 + j->item);
    unsigned shift = 0;
    while (shift < 32 && (double)((uint64_t)2 << shift) * row_bytes <= (double)j->band_target)
        shift++;
    while (j->n_rows && ((j->n_rows - 1) >> shift) + 1 > j->max_fanout) shift++;
    j->shift = shift;
    j->n_bands = j->n_rows ? (size_t)(((j->n_rows - 1) >> shift) + 1) : 0;
}

/* Whether every triple fits in memory_bytes beside the bands being transposed: then there is
 * no scratch file. Buffers count whole (a band's last chunk is part-filled). */
static bool
fits_in_memory(const job *j, uint64_t memory_bytes, int threads)
{
    uint64_t cap = j->buffers / ((j->n_bands ? j->n_bands : 1) * j->triple);
    cap = cap < BUF_MIN ? BUF_MIN : cap > BUF_MAX ? BUF_MAX : cap;
    uint64_t triples, slack, need;
    return zb__mul_u64(j->nnz, j->triple, &triples) &&
           zb__mul_u64((uint64_t)threads * j->n_bands, cap * j->triple, &slack) &&
           zb__add_u64(triples, slack, &need) &&
           zb__add_u64(need, (uint64_t)threads * 2 * j->band_target, &need) && need <= memory_bytes;
}

/* The first column of producer p's run: runs hold equal shares of the elements. */
static uint64_t
run_start(const job *j, int p, int threads, uint64_t n_cols)
{
    if (p >= threads) return n_cols;
    uint64_t t = (uint64_t)threads;
    uint64_t goal = j->nnz / t * (uint64_t)p + j->nnz % t * (uint64_t)p / t;
    uint64_t lo = 0, hi = n_cols; /* first c with colptr[c] - colptr[0] >= goal */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)(j->colptr[mid] - j->colptr[0]) < goal)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Pass 1: the producers fill each band's chunks; bands[b] gets them in column order. */
static zb_status
distribute_source(job *j, zb__pool *pool, int threads, band *bands)
{
    uint64_t n_cols = j->m->info.n_cols;
    producer *pr = calloc((size_t)threads, sizeof *pr);
    if (!pr) return zb__err(ZB_E_NOMEM, "%s: out of memory", j->path);
    zb_status st = ZB_OK;
    int started = 0;
    for (; started < threads && st == ZB_OK; started++) {
        producer *p = &pr[started];
        p->j = j;
        p->c0 = run_start(j, started, threads, n_cols);
        p->c1 = run_start(j, started + 1, threads, n_cols);
        st = dist_init(&p->d, j, 0, j->shift, j->n_bands);
    }
    for (int p = 0; st == ZB_OK && p < threads; p++) zb__pool_submit(pool, produce_task, &pr[p]);
    zb__pool_wait(pool);
    if (st == ZB_OK) st = job_status(j);
    for (size_t b = 0; st == ZB_OK && b < j->n_bands; b++) {
        band *bd = &bands[b];
        bd->j = j;
        bd->r0 = (uint64_t)b << j->shift;
        bd->r1 = bd->r0 + ((uint64_t)1 << j->shift) < j->n_rows ? bd->r0 + ((uint64_t)1 << j->shift)
                                                                : j->n_rows;
        bd->shift = j->shift;
        for (int p = 0; st == ZB_OK && p < threads; p++) {
            chunk_list *l = &pr[p].d.out[b];
            for (size_t i = 0; st == ZB_OK && i < l->n; i++) {
                st = chunk_push(&bd->chunks, l->v[i]);
                if (st == ZB_OK) l->v[i].mem = NULL; /* moved */
            }
        }
    }
    for (int p = 0; p < started; p++) dist_free(&pr[p].d);
    free(pr);
    return st;
}

/* Pass 2: every band transposed and written, in parallel. */
static zb_status
transpose_bands(job *j, zb__pool *pool, band *bands)
{
    uint64_t at = 0;
    for (size_t b = 0; b < j->n_bands; b++) {
        bands[b].at = at;
        at += bands[b].chunks.nnz;
    }
    if (at != j->nnz)
        return zb__err(ZB_E_CORRUPT, "%s: %s: %llu elements read, %llu announced", j->m->path,
                       j->m->key, (unsigned long long)at, (unsigned long long)j->nnz);
    for (size_t b = 0; b < j->n_bands; b++) zb__pool_submit(pool, band_task, &bands[b]);
    zb__pool_wait(pool);
    return job_status(j);
}

/* Checks what the transposition needs of m and reads its column pointers. */
static zb_status
prepare(job *j)
{
    const zb__src_matrix_info *info = &j->m->info;
    if (info->layout != ZB_SRC_CSC)
        return zb__err(ZB_E_INVALID, "%s: %s is not a CSC matrix", j->m->path, j->m->key);
    if (j->item == 0 || j->item > 8 || (j->item & (j->item - 1)))
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: values of dtype %s", j->m->path, j->m->key,
                       zb_dtype_name(info->dtype));
    if (info->n_rows > (uint64_t)UINT32_MAX + 1 || info->n_cols > (uint64_t)UINT32_MAX + 1 ||
        info->n_cols >= ZB_BUF_MAX / 8)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: %llu x %llu is beyond 2^32 rows or columns",
                       j->m->path, j->m->key, (unsigned long long)info->n_rows,
                       (unsigned long long)info->n_cols);
    if (info->n_rows == 0 && info->nnz != 0)
        return zb__err(ZB_E_CORRUPT, "%s: %s: %llu elements in no rows", j->m->path, j->m->key,
                       (unsigned long long)info->nnz);
    size_t bytes = (size_t)(info->n_cols + 1) * 8;
    if (!(j->colptr = meter_alloc(&j->mem, bytes, false)))
        return zb__err(ZB_E_NOMEM, "%s: %s: out of memory for %llu column pointers", j->m->path,
                       j->m->key, (unsigned long long)info->n_cols);
    ZB_TRY(zb__src_matrix_indptr(j->m, 0, info->n_cols, j->colptr));
    if ((uint64_t)(j->colptr[info->n_cols] - j->colptr[0]) != info->nnz)
        return zb__err(ZB_E_CORRUPT, "%s: %s: column pointers span %lld elements, not %llu",
                       j->m->path, j->m->key, (long long)(j->colptr[info->n_cols] - j->colptr[0]),
                       (unsigned long long)info->nnz);
    return zb__csr_file_layout_of(info->n_rows, info->nnz, j->item, &j->lay);
}

static double
now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static zb_status
run(job *j, uint64_t memory_bytes, int threads, uint64_t band_bytes, zb__transpose_stats *stats)
{
    ZB_TRY(prepare(j));
    plan(j, memory_bytes, threads, band_bytes);
    stats->bands = j->n_bands;
    stats->in_memory = fits_in_memory(j, memory_bytes, threads);
    ZB_TRY(open_output(j));
    if (!stats->in_memory) ZB_TRY(open_scratch(j));
    zb__pool *pool = NULL;
    ZB_TRY(zb__pool_new(threads, &pool));
    double t0 = now();
    band *bands = calloc(j->n_bands + 1, sizeof *bands);
    zb_status st = bands ? distribute_source(j, pool, threads, bands)
                         : zb__err(ZB_E_NOMEM, "%s: out of memory", j->path);
    double t1 = now();
    if (st == ZB_OK) st = transpose_bands(j, pool, bands);
    double t2 = now();
    zb__pool_free(pool);
    for (size_t b = 0; bands && b < j->n_bands; b++) chunk_list_free(j, &bands[b].chunks);
    free(bands);
    if (st == ZB_OK) st = commit_output(j);
    stats->seconds[0] = t1 - t0;
    stats->seconds[1] = t2 - t1;
    stats->seconds[2] = now() - t2;
    return st;
}

zb_status
zb__csc_transpose_ex(zb__src_matrix *m, const char *path, const zb__transpose_opts *opts,
                     zb__transpose_stats *stats)
{
    zb__transpose_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!m || !path || !*path || !opts)
        return zb__err(ZB_E_INVALID, "zb__csc_transpose: no matrix, path or options");
    job *j = calloc(1, sizeof *j);
    if (!j) return zb__err(ZB_E_NOMEM, "%s: out of memory", path);
    j->m = m;
    j->path = path;
    j->item = zb_dtype_size(m->info.dtype);
    j->triple = 8 + j->item;
    j->n_rows = m->info.n_rows;
    j->nnz = m->info.nnz;
    j->scratch_fd = -1;
    j->out_fd = -1;
    pthread_mutex_init(&j->mu, NULL);
    int threads = opts->num_threads < 1 ? 1 : opts->num_threads;
    zb_status st = run(j, opts->memory_bytes, threads, opts->band_bytes, stats);
    if (j->out_fd >= 0) close(j->out_fd);
    if (st != ZB_OK && j->tmp_path) unlink(j->tmp_path);
    if (j->scratch_fd >= 0) close(j->scratch_fd);
    meter_free(&j->mem, j->colptr, (size_t)(m->info.n_cols + 1) * 8);
    stats->bands_split = j->bands_split;
    stats->scratch_bytes = j->scratch_end;
    stats->peak_bytes = j->mem.peak;
    pthread_mutex_destroy(&j->mu);
    free(j->tmp_path);
    free(j->scratch_path);
    free(j);
    return st;
}

zb_status
zb__csc_transpose(zb__src_matrix *m, const char *path, uint64_t memory_bytes, int num_threads)
{
    zb__transpose_opts o = {memory_bytes, num_threads, 0};
    return zb__csc_transpose_ex(m, path, &o, NULL);
}
