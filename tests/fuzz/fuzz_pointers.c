/* Pointer arrays and the values they index: a small anndata store (6 cells, 5 genes, CSR X, a
 * categorical obs column; no compression) is written once with zbatch's own writer, then each
 * input replaces the chunk of X/indptr (8 int64: the 7 pointers and padding), of X/indices (16
 * int32) and of the obs codes (8 int8), in that order, each padded with zeros to its stored
 * size. The dataset is opened afresh, from consolidated metadata (one document to parse per
 * run, not one per node, which was most of a run; the `consolidated` and `read_many` targets
 * walk unconsolidated trees), and every sample read, alone and all at once: decreasing,
 * negative or too large pointers, column ids outside [0, n_vars) and codes outside the
 * categories must be an error or valid data, never a crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

#define N_OBS 6
#define N_VARS 5

static zb_store *base;
static const char *const keys[3] = {"X/indptr/c/0", "X/indices/c/0", "obs/ct/codes/c/0"};
static uint64_t key_size[3];

static void
die(const char *what)
{
    fprintf(stderr, "fuzz_pointers: %s: %s\n", what, zb_last_error());
    abort();
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
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ds = NULL;
    if (zb_dataset_open(base, "", &o, &ds) != ZB_OK) return 0;
    uint64_t all[N_OBS] = {0, 1, 2, 3, 4, 5};
    zb_batch *b = NULL;
    for (size_t i = 0; i < N_OBS; i++)
        if (zb_dataset_read_many(ds, all + i, 1, &b) == ZB_OK) zb_batch_free(b);
    if (zb_dataset_read_many(ds, all, N_OBS, &b) == ZB_OK) zb_batch_free(b);
    zb_dataset_close(ds);
    return 0;
}
