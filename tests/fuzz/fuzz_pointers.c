/* Pointer arrays and the values they index: a small anndata store (6 cells, 5 genes, CSR X, a
 * categorical obs column; no compression, consolidated metadata) is written once with zbatch's
 * own writer and opened once. Each input replaces the chunk of X/indptr (8 int64: the 7
 * pointers and padding), of X/indices (16 int32) and of the obs codes (8 int8), in that order,
 * each padded with zeros to its stored size, in the memory store under the open dataset; the
 * pointer blocks the dataset kept from the last run are dropped (the only reader state that
 * depends on those bytes: no chunk cache, no shards), and the samples the next byte picks are
 * read with one read_many (bits 1-6: samples 0-5; none set: all six): decreasing, negative or
 * too large pointers, column ids outside [0, n_vars) and codes outside the categories must be
 * an error or valid data, never a crash. A read stops at its first bad sample; the fuzzer
 * reaches the others' checks by picking them alone.
 *
 * The checks made at open (indptr starts at 0 and ends at len(data)) run only when the dataset
 * is opened: bit 0 of that byte also opens the dataset afresh from the same bytes and reads
 * the same samples. That open starts from the store's tree loaded at start-up (its metadata
 * never changes; parsing it was three quarters of such a run): layout detection, the fields and
 * the pointer checks run each time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "fuzz_common.h"
#include "zarr/tree.h"

#define N_OBS 6
#define N_VARS 5

static zb_store *base;
static zb_dataset *kept; /* opened once, over the store the inputs rewrite */
static zb__tree *tree;   /* the store's metadata, loaded once */
static const char *const keys[3] = {"X/indptr/c/0", "X/indices/c/0", "obs/ct/codes/c/0"};
static uint64_t key_size[3];

static void
die(const char *what)
{
    fprintf(stderr, "fuzz_pointers: %s: %s\n", what, zb_last_error());
    abort();
}

/* Forgets the pointer blocks segments loaded (segment.c), as a fresh open would have none. */
static void
drop_pointer_blocks(zb_dataset *ds)
{
    for (size_t s = 0; s < ds->nsegs; s++) {
        zb__segment *seg = &ds->segs[s];
        for (uint64_t b = 0; b < seg->nblocks; b++) {
            free(seg->blocks[b]);
            seg->blocks[b] = NULL;
        }
    }
}

static void
read_samples(zb_dataset *ds, const uint64_t *ids, size_t n)
{
    zb_batch *b = NULL;
    if (zb_dataset_read_many(ds, ids, n, &b) == ZB_OK) zb_batch_free(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (zb_store_open_memory(&base) != ZB_OK) die("memory store");
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.codec = "none";
    o.x_chunk = 16;
    o.column_chunk = 8;
    o.consolidate = true;
    zb_anndata_writer *w = NULL;
    int64_t indptr[N_OBS + 1] = {0, 2, 2, 5, 6, 9, 10};
    int32_t indices[10] = {0, 3, 1, 2, 4, 0, 1, 3, 4, 2};
    float vals[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    int8_t codes[N_OBS] = {0, 1, 2, -1, 1, 0};
    const char cats[] = "abc";
    uint64_t offs[4] = {0, 1, 2, 3};
    if (zb_anndata_writer_open(base, "", N_VARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w) !=
            ZB_OK ||
        zb_anndata_writer_append_csr(w, N_OBS, indptr, indices, vals) != ZB_OK ||
        zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, "ct", cats, offs, 3, false) !=
            ZB_OK ||
        zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "ct", ZB_DT_INT8, codes, N_OBS) !=
            ZB_OK ||
        zb_anndata_writer_commit(w) != ZB_OK)
        die("writing the base store");
    zb_anndata_writer_close(w);
    for (int i = 0; i < 3; i++)
        if (zb_store_size(base, keys[i], &key_size[i]) != ZB_OK) die(keys[i]);
    zb_dataset_opts dopts = ZB_DATASET_OPTS_DEFAULT;
    if (zb_dataset_open(base, "", &dopts, &kept) != ZB_OK) die("opening the base store");
    if (zb__tree_load(base, "", dopts.use_consolidated, &tree) != ZB_OK) die("its tree");
    /* what a run would otherwise carry over: decoded chunks or fetched units */
    if (kept->cache || kept->fetch_cache || kept->nsegs != 1) {
        fprintf(stderr, "fuzz_pointers: the dataset keeps more state than pointer blocks\n");
        abort();
    }
    return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t pos = 0;
    for (int i = 0; i < 3; i++) {
        uint8_t chunk[512] = {0};
        size_t n = key_size[i] < sizeof chunk ? (size_t)key_size[i] : sizeof chunk;
        size_t take = size - pos < n ? size - pos : n;
        memcpy(chunk, data + pos, take);
        pos += take;
        if (zb_store_put(base, keys[i], chunk, n) != ZB_OK) die("put");
    }
    uint8_t pick = pos < size ? data[pos] : 0;
    uint64_t ids[N_OBS];
    size_t n = 0;
    for (uint64_t i = 0; i < N_OBS; i++)
        if (!(pick & 0x7e) || (pick >> (i + 1) & 1)) ids[n++] = i;
    drop_pointer_blocks(kept);
    read_samples(kept, ids, n);
    if (pick & 1) {
        zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
        zb_dataset *ds = NULL;
        if (zb__dataset_open_tree(base, "", tree, &o, &ds) == ZB_OK) read_samples(ds, ids, n);
        zb_dataset_close(ds);
    }
    return 0;
}
