/* The array writer: rows along axis 0 in, chunks (or shards) and metadata out.
 *
 * Rows are buffered into the stored object they belong to: a chunk, or a shard when sharded
 * (both span every axis but the first). A full object is handed to the thread pool as one job
 * of one piece per chunk (one per inner chunk of a shard): each piece is checked against the fill
 * value, encoded by a worker, and the last piece to finish assembles the object (the shard index
 * included) and puts it. A partial last object is copied and written the same way at commit,
 * padded with the fill value; its rows stay in the buffer, so the next commit rewrites it with
 * more rows. The metadata document goes last, after every job has finished, so the store never
 * names rows whose chunks are not durably stored; the rows a committed partial chunk already held
 * never change when it is rewritten, so a reader between the chunk put and the metadata put sees
 * the old shape and the old, correct data.
 *
 * Format facts: shared FORMATS.md §1.1 (.zarray), §1.3/§3.2 (fill values), §1.5 (edge chunks
 * are stored full-size, padded with the fill value), §1.6 (vlen-utf8), §2.1 (numcodecs 0.11 key
 * sets), §3.1 (zarr.json), §4.1 and §4.5 (writing a shard).
 *
 * Choices the header leaves open:
 * - chunk_rows 0 gives 1 MiB of uncompressed rows (at least 1); for strings, whose size is not
 *   known up front, 32768 strings. With shard_rows set it is lowered to a divisor of shard_rows.
 * - v2 `.zattrs` is written only when attributes_json is given (absent means {}).
 * - v2 string arrays get fill_value "" (what zarr-python 3 writes; 2.13 reads it too).
 * - Inner chunks of the last shard that lie wholly past the array's rows are written as empty
 *   (MAX64) entries whatever write_empty_chunks says: no read ever reaches them.
 * - open_append keeps write_empty_chunks = true (only num_threads is read from opts), so every
 *   rewritten chunk replaces whatever object was under its key.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/json.h"
#include "util/pool.h"
#include "util/status.h"
#include "write/codec_spec.h"
#include "write/write.h"
#include "zarr/array.h"
#include "zarr/codec.h"
#include "zarr/meta.h"
#include "zarr/shard.h"

#define PATH_CAP 4096
#define KEY_CAP (PATH_CAP + 128)
#define MSG_CAP 1024
/* Raw bytes of the inner chunks one compression task encodes. */
#define GROUP_BYTES ((size_t)256 << 10)
/* Finished jobs a writer keeps for reuse. */
#define SPARE_JOBS 1
#define AUTO_CHUNK_BYTES ((uint64_t)1 << 20)
#define AUTO_STRING_ROWS ((uint64_t)1 << 15)
/* c-blosc1's BLOSC_MAX_BUFFERSIZE and numcodecs' LZ4 max_buffer_size (FORMATS.md §2.2, §2.4) */
#define BLOSC_MAX_CHUNK ((uint64_t)INT32_MAX - 16)
#define LZ4_MAX_CHUNK ((uint64_t)0x7E000000)

/* The encode side of a codec chain: bytes (endian) then bytes->bytes codecs in order. */
typedef struct enc_chain {
    bool big_endian;
    int nbb;
    zb__codec bb[ZB_MAX_BB];
} enc_chain;

struct zb_array_writer {
    zb_store *store;
    char path[PATH_CAP]; /* normalised; "" for a root array */
    int zarr_format;
    zb_dtype dtype;
    size_t itemsize;     /* 0 for strings */
    size_t enc_itemsize; /* blosc shuffle item size: itemsize, 1 for strings */
    int ndim;
    uint64_t row_elems;  /* prod(shape[1:]) */
    size_t row_bytes;    /* row_elems * itemsize (fixed-size types) */
    uint64_t chunk_rows; /* the inner chunk when sharded */
    uint64_t obj_rows;   /* rows per stored object: shard rows or chunk rows */
    uint64_t npieces;    /* chunks per object (1 unless sharded) */
    size_t obj_bytes;    /* obj_rows * row_bytes */
    bool sharded;
    bool index_at_start, index_big_endian, index_crc;
    enc_chain enc;
    uint8_t fill[16];
    bool fill_zero;
    bool write_empty;
    zb__array_meta keys; /* only the chunk key fields (ndim, prefix, separator) are set */
    json_object *doc;    /* the metadata document; "shape" is rewritten at each commit */
    json_object *attrs;  /* v2: .zattrs for the first commit, or NULL */
    bool committed_once;

    uint64_t nrows;     /* rows at open + rows appended */
    uint64_t obj_index; /* the object the buffer holds, along axis 0 */
    uint64_t buf_rows;  /* rows of that object held in the buffer */
    bool dirty;         /* the buffer changed since it was last written */
    uint8_t *buf;       /* fixed types: obj_bytes, fill-padded past buf_rows; NULL until needed */
    zb__buf sdata;      /* strings: the object's bytes ... */
    uint64_t *soff;     /* ... and offsets [obj_rows + 1] */

    zb__pool *pool;
    /* Finished jobs kept for the next object, with their buffers: a fresh 16 MiB shard and its
     * pieces' outputs cost a page fault per 4 KiB each time (docs/PERFORMANCE.md, "Figures
     * behind the code's decisions"). At most SPARE_JOBS; spare_raw is a recycled object buffer
     * for ensure_buf. */
    pthread_mutex_t spare_mu;
    struct obj_job *spare;
    int n_spare;
    uint8_t *spare_raw;
    pthread_mutex_t err_mu;
    atomic_int worker_err; /* first worker failure (a zb_status), 0 while none */
    char err_msg[MSG_CAP]; /* its message (zb__err is per thread) */
    zb_status failed;      /* sticky: the writer's state is no longer consistent */
    char failed_msg[MSG_CAP];
};

typedef struct obj_job obj_job;

typedef struct piece {
    obj_job *job;
    uint64_t index; /* chunk index inside the object */
    bool empty;
    zb__buf enc;         /* owned output when the chain has bytes->bytes codecs */
    const uint8_t *data; /* the encoded bytes: enc.data, or the raw region */
    size_t len;
} piece;

struct obj_job {
    zb_array_writer *w;
    obj_job *next_spare; /* the writer's spare list */
    bool full;           /* a full object (more are coming): worth keeping for reuse */
    zb__buf out;         /* the assembled shard (kept for reuse) */
    char key[KEY_CAP];
    uint8_t *raw; /* owned: the object's bytes (fixed types) or its vlen-utf8 encoding */
    size_t raw_len;
    uint64_t valid_rows;            /* rows of the object that lie inside the array */
    bool strings_empty;             /* strings: every string is "" (the fill) */
    atomic_uint_fast64_t remaining; /* tasks still running */
    atomic_bool failed;
    uint64_t npieces;
    uint64_t per_task; /* pieces one pool task encodes (a run of about GROUP_BYTES) */
    piece pieces[];
};

/* ------------------------------------------------------------------------------------------- */
/* Errors                                                                                       */
/* ------------------------------------------------------------------------------------------- */

/* Records a worker's failure (its thread-local message included); the first one wins. */
static void
record_worker_error(zb_array_writer *w, zb_status st)
{
    pthread_mutex_lock(&w->err_mu);
    if (atomic_load(&w->worker_err) == 0) {
        snprintf(w->err_msg, sizeof w->err_msg, "%s", zb_last_error());
        atomic_store(&w->worker_err, (int)st);
    }
    pthread_mutex_unlock(&w->err_mu);
}

/* Marks the writer failed with `st` and this thread's message; returns st. */
static zb_status
fail_writer(zb_array_writer *w, zb_status st)
{
    if (w->failed == ZB_OK) {
        w->failed = st;
        snprintf(w->failed_msg, sizeof w->failed_msg, "%s", zb_last_error());
    }
    return st;
}

/* Re-raises a worker failure on the calling thread (and makes it sticky). */
static zb_status
check_workers(zb_array_writer *w)
{
    zb_status st = (zb_status)atomic_load(&w->worker_err);
    if (st == ZB_OK) return ZB_OK;
    pthread_mutex_lock(&w->err_mu);
    zb__err(st, "%s", w->err_msg);
    pthread_mutex_unlock(&w->err_mu);
    return fail_writer(w, st);
}

static zb_status
check_usable(zb_array_writer *w)
{
    if (w->failed == ZB_OK) return ZB_OK;
    return zb__err(w->failed, "%s: the writer failed earlier and cannot continue: %s",
                   w->path[0] ? w->path : "(root)", w->failed_msg);
}

/* ------------------------------------------------------------------------------------------- */
/* Encoding (worker threads)                                                                    */
/* ------------------------------------------------------------------------------------------- */

static void
swap_bytes(uint8_t *p, size_t n, size_t isz)
{
    for (size_t i = 0; i < n; i++, p += isz)
        for (size_t a = 0, b = isz - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

/* True if every item of p[0..len) equals fill: the first item does, and each byte equals the
 * byte one item further on (so the pattern repeats). */
static bool
all_fill(const uint8_t *p, size_t len, const uint8_t *fill, size_t isz)
{
    if (len < isz) return true;
    return memcmp(p, fill, isz) == 0 && memcmp(p, p + isz, len - isz) == 0;
}

static zb_status
encode_piece(piece *pc, zb_ctx *ctx)
{
    obj_job *j = pc->job;
    const zb_array_writer *w = j->w;
    uint8_t *src;
    size_t len;
    if (w->dtype == ZB_DT_STRING) {
        src = j->raw;
        len = j->raw_len;
        pc->empty = !w->write_empty && j->strings_empty;
    } else {
        size_t chunk_bytes = (size_t)w->chunk_rows * w->row_bytes;
        src = j->raw + (size_t)pc->index * chunk_bytes;
        len = chunk_bytes;
        /* an inner chunk wholly past the array's rows is never read: keep it out of the shard */
        if (w->sharded && pc->index * w->chunk_rows >= j->valid_rows)
            pc->empty = true;
        else
            pc->empty = !w->write_empty && all_fill(src, len, w->fill, w->itemsize);
    }
    if (pc->empty) return ZB_OK;
    /* each piece owns its region of raw, so it may swap in place */
    if (w->enc.big_endian && w->itemsize > 1) swap_bytes(src, len / w->itemsize, w->itemsize);
    if (w->enc.nbb == 0) {
        pc->data = src;
        pc->len = len;
        return ZB_OK;
    }
    zb__buf tmp = {0};
    const uint8_t *cur = src;
    size_t cur_len = len;
    zb_status st = ZB_OK;
    for (int i = 0; i < w->enc.nbb; i++) {
        /* alternate so the last codec's output lands in pc->enc */
        zb__buf *out = (w->enc.nbb - 1 - i) % 2 == 0 ? &pc->enc : &tmp;
        st = zb__codec_encode(&w->enc.bb[i], ctx, cur, cur_len, w->enc_itemsize, out);
        if (st != ZB_OK) break;
        cur = out->data;
        cur_len = out->len;
    }
    zb__buf_free(&tmp);
    pc->data = pc->enc.data;
    pc->len = pc->enc.len;
    return st;
}

static void
job_free(obj_job *j)
{
    if (!j) return;
    for (uint64_t i = 0; i < j->npieces; i++) zb__buf_free(&j->pieces[i].enc);
    zb__buf_free(&j->out);
    free(j->raw);
    free(j);
}

/* A finished full object's job back to its writer's spare list (buffers kept), or freed when
 * the list is full; a commit's partial object is freed (the writer may be finishing, and a
 * kept buffer would only raise its footprint). String objects' raw bytes are sized per
 * object: those are freed. */
static void
job_done(obj_job *j)
{
    zb_array_writer *w = j->w;
    if (!j->full) { /* the object of a commit: the writer may be done, keep nothing */
        job_free(j);
        return;
    }
    if (w->dtype == ZB_DT_STRING) {
        free(j->raw);
        j->raw = NULL;
    }
    pthread_mutex_lock(&w->spare_mu);
    bool keep = w->n_spare < SPARE_JOBS;
    if (keep) {
        j->next_spare = w->spare;
        w->spare = j;
        w->n_spare++;
    }
    pthread_mutex_unlock(&w->spare_mu);
    if (!keep) job_free(j);
}

/* A job for the next object: a spare one (its piece outputs, shard buffer and raw buffer
 * kept), or a new one. */
static obj_job *
job_take(zb_array_writer *w)
{
    pthread_mutex_lock(&w->spare_mu);
    obj_job *j = w->spare;
    if (j) {
        w->spare = j->next_spare;
        w->n_spare--;
    }
    pthread_mutex_unlock(&w->spare_mu);
    if (!j) return calloc(1, sizeof *j + (size_t)w->npieces * sizeof(piece));
    for (uint64_t i = 0; i < j->npieces; i++) {
        j->pieces[i].empty = false;
        j->pieces[i].data = NULL;
        j->pieces[i].len = 0;
        j->pieces[i].enc.len = 0;
    }
    j->raw_len = 0;
    j->strings_empty = false;
    j->next_spare = NULL;
    return j;
}

static void
store_u64(uint8_t *p, uint64_t v, bool big)
{
    for (int i = 0; i < 8; i++) p[big ? 7 - i : i] = (uint8_t)(v >> (8 * i));
}

/* Concatenates the pieces and the index (FORMATS.md §4.5) and puts the shard; erases the key
 * instead when every inner chunk is empty. */
static zb_status
put_shard(obj_job *j)
{
    const zb_array_writer *w = j->w;
    uint64_t n = j->npieces;
    uint64_t idx_bytes = 16 * n + (w->index_crc ? 4 : 0);
    uint64_t data_bytes = 0;
    bool any = false;
    for (uint64_t i = 0; i < n; i++) {
        if (j->pieces[i].empty) continue;
        any = true;
        if (!zb__add_u64(data_bytes, j->pieces[i].len, &data_bytes))
            return zb__err(ZB_E_OVERFLOW, "%s: shard size overflows", j->key);
    }
    if (!any) return zb_store_erase(w->store, j->key);
    uint64_t total;
    if (!zb__add_u64(data_bytes, idx_bytes, &total) || total > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "%s: a shard of %llu bytes exceeds the %llu-byte limit",
                       j->key, (unsigned long long)data_bytes, (unsigned long long)ZB_BUF_MAX);
    ZB_TRY(zb__buf_reserve(&j->out, (size_t)total));
    uint8_t *out = j->out.data;
    /* index at the start shifts every offset by its size; offsets are absolute either way */
    uint64_t base = w->index_at_start ? idx_bytes : 0;
    uint8_t *idx = out + (w->index_at_start ? 0 : data_bytes);
    uint64_t cursor = 0;
    for (uint64_t i = 0; i < n; i++) {
        const piece *pc = &j->pieces[i];
        uint64_t off = ZB_SHARD_EMPTY, nb = ZB_SHARD_EMPTY;
        if (!pc->empty) {
            memcpy(out + base + cursor, pc->data, pc->len);
            off = base + cursor;
            nb = pc->len;
            cursor += pc->len;
        }
        store_u64(idx + 16 * i, off, w->index_big_endian);
        store_u64(idx + 16 * i + 8, nb, w->index_big_endian);
    }
    if (w->index_crc) {
        /* the crc32c codec stores its checksum little-endian whatever the bytes codec did */
        uint32_t crc = zb__crc32c(idx, (size_t)(16 * n));
        for (int i = 0; i < 4; i++) idx[16 * n + (uint64_t)i] = (uint8_t)(crc >> (8 * i));
    }
    return zb_store_put(w->store, j->key, out, total);
}

static zb_status
finish_job(obj_job *j)
{
    if (j->w->sharded) return put_shard(j);
    const piece *pc = &j->pieces[0];
    /* an all-fill chunk is left out; a stale object under its key (from rows appended but never
     * committed, or a chunk of an earlier array) must not survive to be read instead of fill */
    if (pc->empty) return zb_store_erase(j->w->store, j->key);
    return zb_store_put(j->w->store, j->key, pc->data, pc->len);
}

static void
piece_task(void *arg, zb_ctx *ctx)
{
    piece *pc = arg;
    obj_job *j = pc->job;
    zb_array_writer *w = j->w;
    /* after a failure the commit cannot happen: skip the work, keep the countdown */
    uint64_t end = pc->index + j->per_task < j->npieces ? pc->index + j->per_task : j->npieces;
    for (uint64_t i = pc->index; i < end; i++) {
        if (atomic_load(&w->worker_err) != 0 || atomic_load(&j->failed)) break;
        zb_status st = encode_piece(&j->pieces[i], ctx);
        if (st != ZB_OK) {
            zb__err_context(st, "%s", j->key);
            record_worker_error(w, st);
            atomic_store(&j->failed, true);
        }
    }
    /* the last piece to finish owns the job (acq_rel: it sees every other piece's output) */
    if (atomic_fetch_sub(&j->remaining, 1) != 1) return;
    if (!atomic_load(&j->failed) && atomic_load(&w->worker_err) == 0) {
        zb_status st = finish_job(j);
        if (st != ZB_OK) record_worker_error(w, st);
    }
    job_done(j);
}

/* ------------------------------------------------------------------------------------------- */
/* Buffering (caller thread)                                                                    */
/* ------------------------------------------------------------------------------------------- */

static void
fill_rows(const zb_array_writer *w, uint8_t *buf, uint64_t from, uint64_t to)
{
    if (to <= from) return;
    uint8_t *p = buf + (size_t)from * w->row_bytes;
    size_t n = (size_t)(to - from) * w->row_bytes;
    if (w->fill_zero) {
        memset(p, 0, n);
        return;
    }
    memcpy(p, w->fill, w->itemsize);
    /* doubling copies: the pattern repeats every itemsize bytes */
    for (size_t have = w->itemsize; have < n;) {
        size_t k = have < n - have ? have : n - have;
        memcpy(p + have, p, k);
        have += k;
    }
}

/* Allocates the fill-padded object buffer once the previous one was handed to a job. */
static zb_status
ensure_buf(zb_array_writer *w)
{
    if (w->buf || w->dtype == ZB_DT_STRING) return ZB_OK;
    w->buf = w->spare_raw ? w->spare_raw : malloc(w->obj_bytes ? w->obj_bytes : 1);
    w->spare_raw = NULL;
    if (!w->buf)
        return zb__err(ZB_E_NOMEM, "%s: cannot allocate a %zu-byte chunk buffer", w->path,
                       w->obj_bytes);
    fill_rows(w, w->buf, 0, w->obj_rows);
    return ZB_OK;
}

/* The vlen-utf8 bytes of the string object (FORMATS.md §1.6): n_items = the chunk's full row
 * count, with "" past the rows held, as zarr-python writes edge chunks. */
static zb_status
encode_vlen(zb_array_writer *w, uint8_t **out, size_t *out_len, bool *all_empty)
{
    uint64_t total;
    if (!zb__mul_u64(w->obj_rows, 4, &total) || !zb__add_u64(total, 4, &total) ||
        !zb__add_u64(total, w->sdata.len, &total) || total > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "%s: string chunk %llu is too large", w->path,
                       (unsigned long long)w->obj_index);
    uint8_t *p = malloc((size_t)total);
    if (!p) return zb__err(ZB_E_NOMEM, "%s: out of memory for a string chunk", w->path);
    uint8_t *q = p;
    uint32_t items = (uint32_t)w->obj_rows;
    for (int i = 0; i < 4; i++) *q++ = (uint8_t)(items >> (8 * i));
    *all_empty = true;
    for (uint64_t r = 0; r < w->obj_rows; r++) {
        uint64_t len = r < w->buf_rows ? w->soff[r + 1] - w->soff[r] : 0;
        if (len) *all_empty = false;
        for (int i = 0; i < 4; i++) *q++ = (uint8_t)(len >> (8 * i));
        if (len) {
            memcpy(q, w->sdata.data + w->soff[r], (size_t)len);
            q += len;
        }
    }
    *out = p;
    *out_len = (size_t)total;
    return ZB_OK;
}

/* Hands the buffered object to the pool. A full object's buffer moves into the job; a partial
 * one (commit) is copied, because its rows stay for the next commit. */
static zb_status
dispatch(zb_array_writer *w, bool full)
{
    zb_status st;
    uint64_t n = w->npieces;
    obj_job *j = job_take(w);
    if (!j) return zb__err(ZB_E_NOMEM, "%s: out of memory", w->path);
    uint8_t *recycled = j->raw; /* a spare job's object buffer, or NULL */
    j->raw = NULL;
    j->w = w;
    j->full = full;
    j->npieces = n;
    j->valid_rows = w->buf_rows;
    uint64_t idx[ZB_MAX_DIMS] = {0};
    idx[0] = w->obj_index;
    st = zb__meta_chunk_key(&w->keys, w->path, idx, j->key, sizeof j->key);
    if (st != ZB_OK) goto fail;
    if (w->dtype == ZB_DT_STRING) {
        free(recycled);
        st = encode_vlen(w, &j->raw, &j->raw_len, &j->strings_empty);
        if (st != ZB_OK) goto fail;
    } else if (full) {
        j->raw = w->buf;
        j->raw_len = w->obj_bytes;
        w->buf = NULL;
        if (recycled && !w->spare_raw)
            w->spare_raw = recycled; /* the next object fills it (ensure_buf) */
        else
            free(recycled);
    } else {
        j->raw = recycled ? recycled : malloc(w->obj_bytes ? w->obj_bytes : 1);
        if (!j->raw) {
            st = zb__err(ZB_E_NOMEM, "%s: cannot copy a %zu-byte chunk", j->key, w->obj_bytes);
            goto fail;
        }
        memcpy(j->raw, w->buf, w->obj_bytes);
        j->raw_len = w->obj_bytes;
    }
    /* pieces go to the pool in runs: one task per 16 KiB inner chunk spent as much in the
     * hand-off (a wake-up per task) as in the encoding */
    size_t piece_bytes = w->obj_bytes / (n ? n : 1);
    j->per_task = piece_bytes && piece_bytes < GROUP_BYTES ? GROUP_BYTES / piece_bytes : 1;
    atomic_init(&j->remaining, (n + j->per_task - 1) / j->per_task);
    atomic_init(&j->failed, false);
    for (uint64_t i = 0; i < n; i++) {
        j->pieces[i].job = j;
        j->pieces[i].index = i;
    }
    /* after the last submit the job belongs to the pool (the last piece frees it) */
    uint64_t step = j->per_task; /* j may be freed by its last task before the loop ends */
    for (uint64_t i = 0; i < n; i += step) zb__pool_submit(w->pool, piece_task, &j->pieces[i]);

    w->dirty = false;
    if (full) {
        w->obj_index++;
        w->buf_rows = 0;
        w->sdata.len = 0;
    }
    return check_workers(w);

fail:
    job_free(j);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* Metadata                                                                                     */
/* ------------------------------------------------------------------------------------------- */

static uint64_t
load_le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* A float fill: a number, or "NaN"/"Infinity"/"-Infinity" (FORMATS.md §1.3, §3.2). In v3 a NaN
 * other than the canonical quiet one is written as its bit pattern, which keeps the payload. */
static json_object *
float_fill_json(double x, uint64_t bits, uint64_t canonical_nan, size_t isz, int zarr_format)
{
    if (isnan(x)) {
        if (zarr_format == 3 && bits != canonical_nan) {
            char hex[24];
            snprintf(hex, sizeof hex, "0x%0*llx", (int)(2 * isz), (unsigned long long)bits);
            return json_object_new_string(hex);
        }
        return json_object_new_string("NaN");
    }
    if (isinf(x)) return json_object_new_string(x > 0 ? "Infinity" : "-Infinity");
    return json_object_new_double(x);
}

static json_object *
fill_json(const zb_array_writer *w)
{
    const uint8_t *f = w->fill;
    size_t isz = w->itemsize;
    uint64_t u = isz ? load_le(f, isz) : 0;
    switch (w->dtype) {
    case ZB_DT_BOOL:
        return json_object_new_boolean(f[0] != 0);
    case ZB_DT_INT8:
    case ZB_DT_INT16:
    case ZB_DT_INT32:
    case ZB_DT_INT64: {
        /* sign-extend the little-endian item */
        int shift = (int)(64 - 8 * isz);
        int64_t v = (int64_t)(u << shift) >> shift;
        return json_object_new_int64(v);
    }
    case ZB_DT_UINT8:
    case ZB_DT_UINT16:
    case ZB_DT_UINT32:
    case ZB_DT_UINT64:
        return zb__jw_u64(u);
    case ZB_DT_FLOAT16:
        return float_fill_json(zb__half_to_double((uint16_t)u), u, 0x7e00, isz, w->zarr_format);
    case ZB_DT_FLOAT32: {
        float x;
        memcpy(&x, f, 4);
        return float_fill_json((double)x, u, 0x7fc00000u, isz, w->zarr_format);
    }
    case ZB_DT_FLOAT64: {
        double x;
        memcpy(&x, f, 8);
        return float_fill_json(x, u, 0x7ff8000000000000ull, isz, w->zarr_format);
    }
    case ZB_DT_STRING:
    default:
        return json_object_new_string("");
    }
}

/* [rows, row_shape...] */
static json_object *
dims_json(const zb_array_writer *w, uint64_t first, const uint64_t *rest)
{
    int ok = 1;
    json_object *a = json_object_new_array();
    zb__jw_push(a, zb__jw_u64(first), &ok);
    for (int d = 1; d < w->ndim; d++) zb__jw_push(a, zb__jw_u64(rest[d]), &ok);
    if (!ok) {
        json_object_put(a);
        return NULL;
    }
    return a;
}

static json_object *
bytes_codec_json(size_t itemsize)
{
    int ok = 1;
    json_object *o = json_object_new_object();
    zb__jw_add(o, "name", json_object_new_string("bytes"), &ok);
    /* zarr-python omits the endian for 1-byte types (FORMATS.md §3.4) */
    if (itemsize > 1) {
        json_object *cfg = zb__jw_add(o, "configuration", json_object_new_object(), &ok);
        zb__jw_add(cfg, "endian", json_object_new_string("little"), &ok);
    }
    if (!ok) {
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* The array->bytes codec and the compressor: [bytes|vlen-utf8, compressor?]. */
static zb_status
v3_chunk_codecs(const zb_array_writer *w, json_object **out)
{
    int ok = 1;
    json_object *list = json_object_new_array();
    if (w->dtype == ZB_DT_STRING) {
        json_object *v = zb__jw_push(list, json_object_new_object(), &ok);
        zb__jw_add(v, "name", json_object_new_string("vlen-utf8"), &ok);
        zb__jw_add(v, "configuration", json_object_new_object(), &ok);
    } else {
        zb__jw_push(list, bytes_codec_json(w->itemsize), &ok);
    }
    if (ok && w->enc.nbb) {
        json_object *c = NULL;
        zb_status st = zb__codec_v3_json(&w->enc.bb[0], w->enc_itemsize, &c);
        if (st != ZB_OK) {
            json_object_put(list);
            return st;
        }
        zb__jw_push(list, c, &ok);
    }
    if (!ok) {
        json_object_put(list);
        return zb__err(ZB_E_NOMEM, "%s: out of memory", w->path);
    }
    *out = list;
    return ZB_OK;
}

static zb_status
build_v3_doc(const zb_array_writer *w, const uint64_t *chunk_shape, json_object *attrs,
             json_object **out)
{
    int ok = 1;
    zb_status st;
    json_object *doc = json_object_new_object();
    json_object *chunk_codecs = NULL;
    zb__jw_add(doc, "zarr_format", json_object_new_int(3), &ok);
    zb__jw_add(doc, "node_type", json_object_new_string("array"), &ok);
    zb__jw_add(doc, "shape", dims_json(w, 0, chunk_shape), &ok);
    zb__jw_add(doc, "data_type", json_object_new_string(zb_dtype_name(w->dtype)), &ok);
    json_object *grid = zb__jw_add(doc, "chunk_grid", json_object_new_object(), &ok);
    zb__jw_add(grid, "name", json_object_new_string("regular"), &ok);
    json_object *gcfg = zb__jw_add(grid, "configuration", json_object_new_object(), &ok);
    zb__jw_add(gcfg, "chunk_shape", dims_json(w, w->obj_rows, chunk_shape), &ok);
    json_object *kenc = zb__jw_add(doc, "chunk_key_encoding", json_object_new_object(), &ok);
    zb__jw_add(kenc, "name", json_object_new_string("default"), &ok);
    json_object *kcfg = zb__jw_add(kenc, "configuration", json_object_new_object(), &ok);
    zb__jw_add(kcfg, "separator", json_object_new_string("/"), &ok);
    zb__jw_add(doc, "fill_value", fill_json(w), &ok);

    st = v3_chunk_codecs(w, &chunk_codecs);
    if (st != ZB_OK) goto fail;
    if (!w->sharded) {
        zb__jw_add(doc, "codecs", chunk_codecs, &ok);
        chunk_codecs = NULL;
    } else {
        json_object *codecs = zb__jw_add(doc, "codecs", json_object_new_array(), &ok);
        json_object *sh = zb__jw_push(codecs, json_object_new_object(), &ok);
        zb__jw_add(sh, "name", json_object_new_string("sharding_indexed"), &ok);
        json_object *scfg = zb__jw_add(sh, "configuration", json_object_new_object(), &ok);
        zb__jw_add(scfg, "chunk_shape", dims_json(w, w->chunk_rows, chunk_shape), &ok);
        zb__jw_add(scfg, "codecs", chunk_codecs, &ok);
        chunk_codecs = NULL;
        /* what zarr-python writes: bytes(little) + crc32c (FORMATS.md §4.1) */
        json_object *ic = zb__jw_add(scfg, "index_codecs", json_object_new_array(), &ok);
        zb__jw_push(ic, bytes_codec_json(8), &ok);
        json_object *crc = zb__jw_push(ic, json_object_new_object(), &ok);
        zb__jw_add(crc, "name", json_object_new_string("crc32c"), &ok);
        zb__jw_add(scfg, "index_location",
                   json_object_new_string(w->index_at_start ? "start" : "end"), &ok);
    }
    zb__jw_add(doc, "attributes", json_object_get(attrs), &ok);
    if (!ok) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory", w->path);
        goto fail;
    }
    *out = doc;
    return ZB_OK;
fail:
    json_object_put(chunk_codecs);
    json_object_put(doc);
    return st;
}

static zb_status
build_v2_doc(const zb_array_writer *w, const uint64_t *chunk_shape, json_object **out)
{
    int ok = 1;
    json_object *doc = json_object_new_object();
    /* sorted keys, as zarr-python 2.13 writes them */
    zb__jw_add(doc, "chunks", dims_json(w, w->obj_rows, chunk_shape), &ok);
    if (w->enc.nbb) {
        json_object *c = NULL;
        zb_status st = zb__codec_v2_json(&w->enc.bb[0], &c);
        if (st != ZB_OK) {
            json_object_put(doc);
            return st;
        }
        zb__jw_add(doc, "compressor", c, &ok);
    } else if (ok && json_object_object_add(doc, "compressor", NULL) != 0) {
        ok = 0;
    }
    zb__jw_add(doc, "dimension_separator", json_object_new_string("."), &ok);
    zb__jw_add(doc, "dtype", json_object_new_string(zb_dtype_typestr(w->dtype)), &ok);
    zb__jw_add(doc, "fill_value", fill_json(w), &ok);
    if (w->dtype == ZB_DT_STRING) {
        json_object *f = zb__jw_add(doc, "filters", json_object_new_array(), &ok);
        json_object *v = zb__jw_push(f, json_object_new_object(), &ok);
        zb__jw_add(v, "id", json_object_new_string("vlen-utf8"), &ok);
    } else if (ok && json_object_object_add(doc, "filters", NULL) != 0) {
        ok = 0;
    }
    zb__jw_add(doc, "order", json_object_new_string("C"), &ok);
    zb__jw_add(doc, "shape", dims_json(w, 0, chunk_shape), &ok);
    zb__jw_add(doc, "zarr_format", json_object_new_int(2), &ok);
    if (!ok) {
        json_object_put(doc);
        return zb__err(ZB_E_NOMEM, "%s: out of memory", w->path);
    }
    *out = doc;
    return ZB_OK;
}

static zb_status
write_metadata(zb_array_writer *w)
{
    char key[KEY_CAP];
    /* the other axes of the stored shape are kept as they are */
    uint64_t rest[ZB_MAX_DIMS] = {0};
    json_object *old = zb__json_get(w->doc, "shape");
    for (int d = 1; d < w->ndim; d++) {
        zb_status st = zb__json_u64(json_object_array_get_idx(old, (size_t)d), "shape", &rest[d]);
        if (st != ZB_OK) return st;
    }
    json_object *shape = dims_json(w, w->nrows, rest);
    if (!shape || json_object_object_add(w->doc, "shape", shape) != 0) {
        json_object_put(shape);
        return zb__err(ZB_E_NOMEM, "%s: out of memory", w->path);
    }
    if (w->zarr_format == 2 && w->attrs && !w->committed_once) {
        ZB_TRY(zb__write_join_key(key, sizeof key, w->path, ".zattrs"));
        ZB_TRY(zb__write_json(w->store, key, w->attrs));
    }
    ZB_TRY(zb__write_join_key(key, sizeof key, w->path,
                              w->zarr_format == 2 ? ".zarray" : "zarr.json"));
    ZB_TRY(zb__write_json(w->store, key, w->doc));
    w->committed_once = true;
    return ZB_OK;
}

/* ------------------------------------------------------------------------------------------- */
/* Open                                                                                         */
/* ------------------------------------------------------------------------------------------- */

static zb_status
writer_alloc(zb_store *store, const char *path, zb_array_writer **out)
{
    *out = NULL;
    zb_array_writer *w = calloc(1, sizeof *w);
    if (!w) return zb__err(ZB_E_NOMEM, "array writer: out of memory");
    pthread_mutex_init(&w->err_mu, NULL);
    pthread_mutex_init(&w->spare_mu, NULL);
    atomic_init(&w->worker_err, 0);
    w->store = store;
    zb_status st = zb_key_normalize(path, w->path, sizeof w->path);
    if (st != ZB_OK) {
        pthread_mutex_destroy(&w->err_mu);
        free(w);
        return st;
    }
    *out = w;
    return ZB_OK;
}

/* Sizes that follow from ndim, row shape, dtype and chunking; ZB_E_INVALID / ZB_E_OVERFLOW
 * naming the option. `chunks_full` is the chunk shape on axes >= 1. */
static zb_status
settle_sizes(zb_array_writer *w, const uint64_t *row_dims)
{
    const char *p = w->path[0] ? w->path : "(root)";
    w->row_elems = 1;
    for (int d = 1; d < w->ndim; d++)
        if (!zb__mul_u64(w->row_elems, row_dims[d], &w->row_elems))
            return zb__err(ZB_E_OVERFLOW, "%s: row_shape element count overflows", p);
    uint64_t rb;
    if (!zb__mul_u64(w->row_elems, w->itemsize, &rb) || rb > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "%s: a row of %llu elements is too large", p,
                       (unsigned long long)w->row_elems);
    w->row_bytes = (size_t)rb;
    uint64_t ob;
    if (!zb__mul_u64(w->obj_rows, w->dtype == ZB_DT_STRING ? 1 : rb, &ob) || ob > ZB_BUF_MAX)
        return zb__err(ZB_E_INVALID, "%s: %s of %llu rows exceeds %llu bytes uncompressed", p,
                       w->sharded ? "shard_rows: a shard" : "chunk_rows: a chunk",
                       (unsigned long long)w->obj_rows, (unsigned long long)ZB_BUF_MAX);
    w->obj_bytes = w->dtype == ZB_DT_STRING ? 0 : (size_t)ob;
    w->npieces = w->obj_rows / w->chunk_rows;
    if (w->npieces > ZB_SHARD_MAX_ENTRIES)
        return zb__err(ZB_E_INVALID,
                       "%s: shard_rows / chunk_rows = %llu inner chunks per shard "
                       "(at most 2^30)",
                       p, (unsigned long long)w->npieces);
    if (w->dtype == ZB_DT_STRING && w->obj_rows > UINT32_MAX)
        return zb__err(ZB_E_INVALID, "%s: chunk_rows %llu exceeds vlen-utf8's 2^32-1 items", p,
                       (unsigned long long)w->obj_rows);
    uint64_t chunk_bytes = w->chunk_rows * rb;
    for (int i = 0; i < w->enc.nbb; i++) {
        const zb__codec *c = &w->enc.bb[i];
        uint64_t lim = c->id == ZB_CODEC_BLOSC ? BLOSC_MAX_CHUNK
                       : c->id == ZB_CODEC_LZ4 ? LZ4_MAX_CHUNK
                                               : UINT64_MAX;
        if (chunk_bytes > lim)
            return zb__err(ZB_E_INVALID,
                           "%s: chunk_rows: a %llu-byte chunk exceeds the %s limit "
                           "of %llu bytes",
                           p, (unsigned long long)chunk_bytes,
                           c->id == ZB_CODEC_BLOSC ? "blosc" : "lz4", (unsigned long long)lim);
    }
    if (w->dtype == ZB_DT_STRING) {
        w->soff = calloc((size_t)w->obj_rows + 1, sizeof *w->soff);
        if (!w->soff) return zb__err(ZB_E_NOMEM, "%s: out of memory", p);
    }
    return ZB_OK;
}

/* ZB_E_INVALID if a node (array or group, either format) already lives at the path. */
static zb_status
require_no_node(zb_array_writer *w)
{
    const char *marker;
    ZB_TRY(zb__write_find_node(w->store, w->path, &marker));
    if (!marker) return ZB_OK;
    char key[KEY_CAP];
    ZB_TRY(zb__write_join_key(key, sizeof key, w->path, marker));
    return zb__err(ZB_E_INVALID,
                   "'%s' already holds a Zarr node (%s); use zb_array_writer_open_append to add "
                   "rows",
                   w->path, key);
}

/* chunk_rows 0: about AUTO_CHUNK_BYTES of rows, lowered to a divisor of shard_rows. */
static uint64_t
auto_chunk_rows(size_t row_bytes, bool strings, uint64_t shard_rows)
{
    uint64_t rows = strings                         ? AUTO_STRING_ROWS
                    : row_bytes >= AUTO_CHUNK_BYTES ? 1
                                                    : AUTO_CHUNK_BYTES / row_bytes;
    if (shard_rows == 0) return rows;
    if (rows >= shard_rows) return shard_rows;
    while (shard_rows % rows) rows--;
    return rows;
}

static zb_status
validate_new(const zb_array_writer *w, zb_dtype dtype, int ndim, const uint64_t *row_shape,
             const zb_array_write_opts *o)
{
    const char *p = w->path[0] ? w->path : "(root)";
    if ((int)dtype < 0 || dtype >= ZB_DT_COUNT_)
        return zb__err(ZB_E_INVALID, "%s: dtype %d is not a zb_dtype", p, (int)dtype);
    if (ndim < 1 || ndim > ZB_MAX_DIMS)
        return zb__err(ZB_E_INVALID, "%s: ndim %d is outside 1..%d", p, ndim, ZB_MAX_DIMS);
    if (ndim > 1 && !row_shape)
        return zb__err(ZB_E_INVALID, "%s: row_shape is NULL for ndim %d", p, ndim);
    for (int d = 0; d + 1 < ndim; d++)
        if (row_shape[d] == 0)
            return zb__err(ZB_E_INVALID, "%s: row_shape[%d] is 0 (chunks must be non-empty)", p, d);
    if (dtype == ZB_DT_STRING && ndim != 1)
        return zb__err(ZB_E_INVALID, "%s: string arrays must be 1-d (ndim is %d)", p, ndim);
    if (o->zarr_format != 2 && o->zarr_format != 3)
        return zb__err(ZB_E_INVALID, "%s: zarr_format %d is not 2 or 3", p, o->zarr_format);
    if (o->shard_rows && o->zarr_format == 2)
        return zb__err(ZB_E_INVALID, "%s: shard_rows needs zarr_format 3 (v2 has no sharding)", p);
    if (o->shard_rows && dtype == ZB_DT_STRING)
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: shard_rows: sharded string arrays are not "
                       "supported",
                       p);
    if (o->shard_index_at_start && !o->shard_rows)
        return zb__err(ZB_E_INVALID, "%s: shard_index_at_start without shard_rows", p);
    if (o->num_threads < 0 || o->num_threads > ZB_POOL_MAX_THREADS)
        return zb__err(ZB_E_INVALID, "%s: num_threads %d is outside 0..%d", p, o->num_threads,
                       ZB_POOL_MAX_THREADS);
    if (o->chunk_rows && o->shard_rows && o->shard_rows % o->chunk_rows)
        return zb__err(ZB_E_INVALID, "%s: shard_rows %llu is not a multiple of chunk_rows %llu", p,
                       (unsigned long long)o->shard_rows, (unsigned long long)o->chunk_rows);
    if (dtype == ZB_DT_BOOL && o->fill_value && *(const uint8_t *)o->fill_value > 1)
        return zb__err(ZB_E_INVALID, "%s: fill_value of a bool array must be 0 or 1", p);
    return ZB_OK;
}

zb_status
zb_array_writer_open(zb_store *store, const char *path, zb_dtype dtype, int ndim,
                     const uint64_t *row_shape, const zb_array_write_opts *opts,
                     zb_array_writer **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_array_writer_open: null out");
    *out = NULL;
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_array_writer_open: null argument");
    static const zb_array_write_opts defaults = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    const zb_array_write_opts *o = opts ? opts : &defaults;
    zb_array_writer *w = NULL;
    json_object *attrs = NULL;
    ZB_TRY(writer_alloc(store, path, &w));
    zb_status st = validate_new(w, dtype, ndim, row_shape, o);
    if (st != ZB_OK) goto fail;

    w->zarr_format = o->zarr_format;
    w->dtype = dtype;
    w->itemsize = zb_dtype_size(dtype);
    w->enc_itemsize = w->itemsize ? w->itemsize : 1;
    w->ndim = ndim;
    w->write_empty = o->write_empty_chunks;
    w->sharded = o->shard_rows != 0;
    w->index_at_start = o->shard_index_at_start;
    w->index_crc = true;
    bool has_codec;
    st = zb__codec_spec_parse(o->codec, o->zarr_format, &w->enc.bb[0], &has_codec);
    if (st != ZB_OK) goto fail;
    w->enc.nbb = has_codec ? 1 : 0;

    uint64_t dims[ZB_MAX_DIMS] = {0}; /* dims[d] = row_shape[d-1] */
    for (int d = 1; d < ndim; d++) dims[d] = row_shape[d - 1];
    uint64_t row_elems = 1;
    for (int d = 1; d < ndim; d++)
        if (!zb__mul_u64(row_elems, dims[d], &row_elems)) row_elems = UINT64_MAX;
    uint64_t rb = row_elems > ZB_BUF_MAX ? ZB_BUF_MAX : row_elems * w->itemsize;
    w->chunk_rows = o->chunk_rows
                        ? o->chunk_rows
                        : auto_chunk_rows((size_t)rb, dtype == ZB_DT_STRING, o->shard_rows);
    if (w->chunk_rows == 0) {
        st = zb__err(ZB_E_INVALID, "%s: chunk_rows is 0 after automatic sizing", w->path);
        goto fail;
    }
    w->obj_rows = w->sharded ? o->shard_rows : w->chunk_rows;
    st = settle_sizes(w, dims);
    if (st != ZB_OK) goto fail;

    /* fill: itemsize bytes in native order; zeros by default */
    if (o->fill_value && w->itemsize) memcpy(w->fill, o->fill_value, w->itemsize);
    w->fill_zero = true;
    for (size_t i = 0; i < w->itemsize; i++) w->fill_zero = w->fill_zero && w->fill[i] == 0;

    w->keys.ndim = ndim;
    w->keys.sep = o->zarr_format == 2 ? '.' : '/';
    snprintf(w->keys.key_prefix, sizeof w->keys.key_prefix, "%s", o->zarr_format == 2 ? "" : "c/");
    snprintf(w->keys.zero_dim_key, sizeof w->keys.zero_dim_key, "%s",
             o->zarr_format == 2 ? "0" : "c");

    st = zb__write_parse_attrs(o->attributes_json, "attributes_json", &attrs);
    if (st != ZB_OK) goto fail;
    if (o->zarr_format == 3)
        st = build_v3_doc(w, dims, attrs, &w->doc);
    else
        st = build_v2_doc(w, dims, &w->doc);
    if (st != ZB_OK) goto fail;
    if (o->zarr_format == 2 && o->attributes_json) w->attrs = json_object_get(attrs);

    st = require_no_node(w);
    if (st != ZB_OK) goto fail;
    st = zb__pool_new(o->num_threads, &w->pool);
    if (st != ZB_OK) goto fail;
    json_object_put(attrs);
    *out = w;
    return ZB_OK;

fail:
    json_object_put(attrs);
    zb_array_writer_close(w);
    return st;
}

/* Reads the array's metadata document (zarr.json first, as zb_array_open does). */
static zb_status
read_doc(zb_array_writer *w, json_object **doc)
{
    char key[KEY_CAP];
    uint8_t *text = NULL;
    uint64_t len = 0;
    ZB_TRY(zb__write_join_key(key, sizeof key, w->path, "zarr.json"));
    zb_status st = zb_store_read_all(w->store, key, &text, &len);
    if (st == ZB_E_NOTFOUND) {
        ZB_TRY(zb__write_join_key(key, sizeof key, w->path, ".zarray"));
        st = zb_store_read_all(w->store, key, &text, &len);
    }
    if (st != ZB_OK) return st;
    st = zb__json_parse((const char *)text, (size_t)len, key, doc);
    free(text);
    return st;
}

/* Loads the committed rows of the last partial object into the buffer, so the next write of
 * that object keeps them. */
static zb_status
load_partial(zb_array_writer *w, const zb_array *a)
{
    uint64_t start = w->obj_index * w->obj_rows;
    if (start >= w->nrows) return ZB_OK;
    uint64_t rows = w->nrows - start;
    if (w->dtype != ZB_DT_STRING) {
        ZB_TRY(ensure_buf(w));
        ZB_TRY(zb_array_read_rows(a, start, w->nrows, w->buf, (size_t)rows * w->row_bytes, NULL));
    } else {
        zb_strings s;
        ZB_TRY(zb_array_read_strings(a, start, w->nrows, &s, NULL));
        zb_status st = zb__buf_append(&w->sdata, s.data, (size_t)s.offsets[s.n]);
        for (uint64_t i = 0; st == ZB_OK && i <= s.n; i++) w->soff[i] = s.offsets[i];
        zb_strings_free(&s);
        ZB_TRY(st);
    }
    w->buf_rows = rows;
    return ZB_OK;
}

/* What the writer can append to: chunked along axis 0 only, no transpose, a bytes or
 * vlen-utf8 serializer. Copies the encode chain and the key layout. */
static zb_status
adopt_meta(zb_array_writer *w, const zb_array *a, uint64_t *dims)
{
    const zb__array_meta *m = &a->meta;
    const char *p = w->path[0] ? w->path : "(root)";
    if (m->ndim < 1) return zb__err(ZB_E_UNSUPPORTED, "%s: cannot append rows to a 0-d array", p);
    const zb__chain *c = &m->chain;
    const zb__chain *inner = c->ab == ZB_AB_SHARDING ? c->shard->inner_chain : c;
    for (int d = 1; d < m->ndim; d++) {
        if (m->chunks[d] != m->shape[d] || a->inner[d] != m->shape[d])
            return zb__err(ZB_E_UNSUPPORTED,
                           "%s: chunked along axis %d (chunk %llu, shape %llu); only arrays "
                           "chunked along axis 0 can be appended to",
                           p, d, (unsigned long long)a->inner[d], (unsigned long long)m->shape[d]);
        dims[d] = m->shape[d];
    }
    if (c->has_transpose || inner->has_transpose)
        return zb__err(ZB_E_UNSUPPORTED,
                       "%s: appending to a transposed (order F) array is not "
                       "supported",
                       p);
    w->zarr_format = m->zarr_format;
    w->dtype = m->dtype;
    w->itemsize = m->itemsize;
    w->enc_itemsize = w->itemsize ? w->itemsize : 1;
    w->ndim = m->ndim;
    w->sharded = c->ab == ZB_AB_SHARDING;
    if (w->sharded) {
        w->index_at_start = c->shard->index_at_start;
        w->index_big_endian = c->shard->index_big_endian;
        w->index_crc = c->shard->index_crc;
    }
    w->enc.big_endian = inner->big_endian;
    w->enc.nbb = inner->nbb;
    memcpy(w->enc.bb, inner->bb, sizeof inner->bb);
    w->obj_rows = m->chunks[0];
    w->chunk_rows = a->inner[0];
    memcpy(w->fill, m->fill, sizeof w->fill);
    w->fill_zero = true;
    for (size_t i = 0; i < w->itemsize; i++) w->fill_zero = w->fill_zero && w->fill[i] == 0;
    w->keys.ndim = m->ndim;
    w->keys.sep = m->sep;
    memcpy(w->keys.key_prefix, m->key_prefix, sizeof w->keys.key_prefix);
    memcpy(w->keys.zero_dim_key, m->zero_dim_key, sizeof w->keys.zero_dim_key);
    w->nrows = m->shape[0];
    w->obj_index = w->nrows / w->obj_rows;
    return ZB_OK;
}

zb_status
zb_array_writer_open_append(zb_store *store, const char *path, const zb_array_write_opts *opts,
                            zb_array_writer **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_array_writer_open_append: null out");
    *out = NULL;
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_array_writer_open_append: null argument");
    int nthreads = opts ? opts->num_threads : 1;
    if (nthreads < 0 || nthreads > ZB_POOL_MAX_THREADS)
        return zb__err(ZB_E_INVALID, "%s: num_threads %d is outside 0..%d", path, nthreads,
                       ZB_POOL_MAX_THREADS);
    zb_array_writer *w = NULL;
    zb_array *a = NULL;
    ZB_TRY(writer_alloc(store, path, &w));
    zb_status st = zb_array_open(store, w->path, &a);
    if (st != ZB_OK) goto fail;
    uint64_t dims[ZB_MAX_DIMS] = {0};
    st = adopt_meta(w, a, dims);
    if (st != ZB_OK) goto fail;
    w->write_empty = true;
    w->committed_once = true; /* attributes stay as they are */
    st = settle_sizes(w, dims);
    if (st != ZB_OK) goto fail;
    st = read_doc(w, &w->doc);
    if (st != ZB_OK) goto fail;
    st = load_partial(w, a);
    if (st != ZB_OK) goto fail;
    st = zb__pool_new(nthreads, &w->pool);
    if (st != ZB_OK) goto fail;
    zb_array_close(a);
    *out = w;
    return ZB_OK;

fail:
    zb_array_close(a);
    zb_array_writer_close(w);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* Append, commit, close                                                                        */
/* ------------------------------------------------------------------------------------------- */

static zb_status
check_growth(zb_array_writer *w, uint64_t n)
{
    uint64_t total, bytes;
    if (!zb__add_u64(w->nrows, n, &total) || !zb__mul_u64(total, w->row_elems, &bytes) ||
        !zb__mul_u64(bytes, w->itemsize ? w->itemsize : 1, &bytes))
        return zb__err(ZB_E_OVERFLOW, "%s: %llu more rows overflow the array's size", w->path,
                       (unsigned long long)n);
    return ZB_OK;
}

zb_status
zb_array_writer_append(zb_array_writer *w, const void *rows, uint64_t nrows)
{
    if (!w) return zb__err(ZB_E_INVALID, "zb_array_writer_append: null writer");
    ZB_TRY(check_usable(w));
    if (w->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_TYPE, "%s: a string array takes zb_array_writer_append_strings",
                       w->path);
    if (nrows && !rows) return zb__err(ZB_E_INVALID, "%s: append: rows is NULL", w->path);
    ZB_TRY(check_growth(w, nrows));
    ZB_TRY(check_workers(w));
    const uint8_t *src = rows;
    while (nrows) {
        zb_status st = ensure_buf(w);
        if (st != ZB_OK) return fail_writer(w, st);
        uint64_t take = w->obj_rows - w->buf_rows;
        if (take > nrows) take = nrows;
        size_t n = (size_t)take * w->row_bytes;
        memcpy(w->buf + (size_t)w->buf_rows * w->row_bytes, src, n);
        src += n;
        nrows -= take;
        w->buf_rows += take;
        w->nrows += take;
        w->dirty = true;
        if (w->buf_rows == w->obj_rows) {
            st = dispatch(w, true);
            if (st != ZB_OK) return fail_writer(w, st);
        }
    }
    return ZB_OK;
}

/* Strict UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF), so every reader decodes
 * what is written (write.h). */
size_t
zb__write_utf8_check(const uint8_t *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        size_t n;
        uint32_t lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return i;
        }
        if (len - i <= n) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += n + 1;
    }
    return len;
}

zb_status
zb_array_writer_append_strings(zb_array_writer *w, const char *data, const uint64_t *offsets,
                               uint64_t n)
{
    if (!w) return zb__err(ZB_E_INVALID, "zb_array_writer_append_strings: null writer");
    ZB_TRY(check_usable(w));
    if (w->dtype != ZB_DT_STRING)
        return zb__err(ZB_E_TYPE, "%s: append_strings on a %s array", w->path,
                       zb_dtype_name(w->dtype));
    if (n == 0) return ZB_OK;
    if (!offsets) return zb__err(ZB_E_INVALID, "%s: append_strings: offsets is NULL", w->path);
    if (!data && offsets[n] > offsets[0])
        return zb__err(ZB_E_INVALID, "%s: append_strings: data is NULL", w->path);
    /* every string is checked before any is taken, so a bad call changes nothing */
    for (uint64_t i = 0; i < n; i++) {
        if (offsets[i + 1] < offsets[i])
            return zb__err(ZB_E_INVALID, "%s: append_strings: offsets[%llu] > offsets[%llu]",
                           w->path, (unsigned long long)i, (unsigned long long)i + 1);
        uint64_t len = offsets[i + 1] - offsets[i];
        if (len > UINT32_MAX)
            return zb__err(ZB_E_INVALID,
                           "%s: append_strings: string %llu has %llu bytes "
                           "(vlen-utf8 allows 2^32-1)",
                           w->path, (unsigned long long)i, (unsigned long long)len);
        size_t bad = zb__write_utf8_check((const uint8_t *)data + offsets[i], (size_t)len);
        if (bad != len)
            return zb__err(ZB_E_INVALID,
                           "%s: append_strings: string %llu is not valid UTF-8 "
                           "(byte %zu)",
                           w->path, (unsigned long long)i, bad);
    }
    ZB_TRY(check_growth(w, n));
    ZB_TRY(check_workers(w));
    for (uint64_t i = 0; i < n; i++) {
        size_t len = (size_t)(offsets[i + 1] - offsets[i]);
        zb_status st = zb__buf_append(&w->sdata, data + offsets[i], len);
        if (st != ZB_OK) return fail_writer(w, st);
        w->soff[w->buf_rows + 1] = w->sdata.len;
        w->buf_rows++;
        w->nrows++;
        w->dirty = true;
        if (w->buf_rows == w->obj_rows) {
            st = dispatch(w, true);
            if (st != ZB_OK) return fail_writer(w, st);
        }
    }
    return ZB_OK;
}

uint64_t
zb_array_writer_rows(const zb_array_writer *w)
{
    return w ? w->nrows : 0;
}

zb_status
zb_array_writer_commit(zb_array_writer *w)
{
    if (!w) return zb__err(ZB_E_INVALID, "zb_array_writer_commit: null writer");
    ZB_TRY(check_usable(w));
    zb_status st;
    /* The partial object is the only one ever written twice. Waiting below, before commit
     * returns, means its job is done before a later job for the same key can start, so the
     * older version can never land last. */
    if (w->buf_rows && w->dirty) {
        st = dispatch(w, false);
        if (st != ZB_OK) return fail_writer(w, st);
    }
    /* the commit point: every chunk of the rows so far is stored before the metadata names
     * them */
    zb__pool_wait(w->pool);
    ZB_TRY(check_workers(w));
    /* a failed metadata put leaves the previous document in place (puts are atomic), so the
     * writer stays usable and the commit may be retried */
    return write_metadata(w);
}

void
zb_array_writer_close(zb_array_writer *w)
{
    if (!w) return;
    /* queued jobs point at the writer: let them finish first */
    zb__pool_free(w->pool);
    while (w->spare) {
        obj_job *j = w->spare;
        w->spare = j->next_spare;
        job_free(j);
    }
    free(w->spare_raw);
    pthread_mutex_destroy(&w->spare_mu);
    free(w->buf);
    zb__buf_free(&w->sdata);
    free(w->soff);
    json_object_put(w->doc);
    json_object_put(w->attrs);
    pthread_mutex_destroy(&w->err_mu);
    free(w);
}
