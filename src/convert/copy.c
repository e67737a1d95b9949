/* Copying a store tree with new codecs and chunking: every group with its attributes, every
 * array decoded and re-encoded row block by row block (memory bounded by the block), metadata
 * last (the array writer commits each array; groups are written after their arrays, the root
 * last). It backs `zbatch convert` and in-memory datasets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"
#include "util/status.h"
#include "write/write.h"
#include "zarr/array.h"
#include "zarr/tree.h"

#define BLOCK_BYTES ((uint64_t)64 << 20)

static zb_status
copy_array(zb_store *src, const char *spath, zb_store *dst, const char *dpath,
           const zb_copy_opts *o, const zb__tree_node *nd)
{
    zb_array *a = NULL;
    zb__array_meta m;
    zb_status st = nd->zarr_format == 2 ? zb__meta_from_v2_obj(nd->doc, nd->attrs, spath, &m)
                                        : zb__meta_from_v3_obj(nd->doc, spath, &m);
    if (st == ZB_E_UNSUPPORTED && o->skip_unsupported) {
        zb_clear_error();
        return ZB_OK;
    }
    if (st != ZB_OK) return st;
    ZB_TRY(zb__array_open_meta(src, spath, &m, &a));
    zb_array_info info;
    zb_array_get_info(a, &info);
    if (info.ndim == 0) {
        zb_array_close(a);
        if (o->skip_unsupported) return ZB_OK;
        return zb__err(ZB_E_UNSUPPORTED, "%s: 0-d arrays are not copied", spath);
    }
    zb_array_write_opts wo = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    wo.zarr_format = o->zarr_format;
    wo.codec = o->codec;
    wo.num_threads = o->num_threads;
    wo.attributes_json = info.attributes_json;
    wo.fill_value = info.dtype == ZB_DT_STRING ? NULL : info.fill_value;
    wo.write_empty_chunks = true;
    uint64_t row_bytes = zb_array_row_elems(a) * (info.itemsize ? info.itemsize : 16);
    if (o->chunk_bytes) {
        uint64_t rows = o->chunk_bytes / (row_bytes ? row_bytes : 1);
        wo.chunk_rows = rows ? rows : 1;
    }
    zb_array_writer *w = NULL;
    st = zb_array_writer_open(dst, dpath, info.dtype, info.ndim, info.shape + 1, &wo, &w);
    uint64_t rows = info.shape[0];
    uint64_t block = BLOCK_BYTES / (row_bytes ? row_bytes : 1);
    if (block == 0) block = 1;
    void *buf = NULL;
    if (st == ZB_OK && info.dtype != ZB_DT_STRING) {
        buf = malloc((size_t)(block * row_bytes) + 1);
        if (!buf) st = zb__err(ZB_E_NOMEM, "%s: out of memory for a copy block", spath);
    }
    zb_ctx *ctx = NULL;
    if (st == ZB_OK) st = zb_ctx_new(&ctx);
    for (uint64_t r = 0; st == ZB_OK && r < rows; r += block) {
        uint64_t e = r + block < rows ? r + block : rows;
        if (info.dtype == ZB_DT_STRING) {
            zb_strings s;
            st = zb_array_read_strings(a, r, e, &s, ctx);
            if (st == ZB_OK) st = zb_array_writer_append_strings(w, s.data, s.offsets, s.n);
            zb_strings_free(&s);
        } else {
            size_t bytes = (size_t)((e - r) * row_bytes);
            st = zb_array_read_rows(a, r, e, buf, bytes, ctx);
            if (st == ZB_OK) st = zb_array_writer_append(w, buf, e - r);
        }
    }
    if (st == ZB_OK) st = zb_array_writer_commit(w);
    zb_array_writer_close(w);
    zb_ctx_free(ctx);
    free(buf);
    zb_array_close(a);
    return st;
}

static void
rel_join(char *buf, size_t cap, const char *base, const char *rel)
{
    int n = base[0] && rel[0] ? snprintf(buf, cap, "%s/%s", base, rel)
                              : snprintf(buf, cap, "%s", base[0] ? base : rel);
    if (n < 0 || (size_t)n >= cap) buf[cap - 1] = '\0';
}

zb_status
zb_store_copy(zb_store *src, const char *src_path, zb_store *dst, const char *dst_path,
              const zb_copy_opts *opts)
{
    if (!src || !dst) return zb__err(ZB_E_INVALID, "zb_store_copy: null store");
    zb_copy_opts o = ZB_COPY_OPTS_DEFAULT;
    if (opts) o = *opts;
    char sroot[4096], droot[4096];
    ZB_TRY(zb_key_normalize(src_path ? src_path : "", sroot, sizeof sroot));
    ZB_TRY(zb_key_normalize(dst_path ? dst_path : "", droot, sizeof droot));
    zb__tree *tree = NULL;
    ZB_TRY(zb__tree_load(src, sroot, true, &tree));
    zb_status st = ZB_OK;
    size_t plen = strlen(tree->nodes[0].path);
    char dpath[8400];
    /* arrays first, then groups deepest first, so every group appears after its contents and
     * the root document (the commit point of layouts) comes last */
    for (size_t i = 0; i < tree->n && st == ZB_OK; i++) {
        const zb__tree_node *nd = &tree->nodes[i];
        if (!nd->is_array) continue;
        const char *rel = nd->path + plen + (plen && nd->path[plen] == '/' ? 1 : 0);
        rel_join(dpath, sizeof dpath, droot, rel);
        st = copy_array(src, nd->path, dst, dpath, &o, nd);
        if (st != ZB_OK) zb__err_context(st, "copying %s", nd->path);
    }
    for (size_t k = tree->n; k-- > 0 && st == ZB_OK;) {
        const zb__tree_node *nd = &tree->nodes[k];
        if (nd->is_array) continue;
        const char *rel = nd->path + plen + (plen && nd->path[plen] == '/' ? 1 : 0);
        rel_join(dpath, sizeof dpath, droot, rel);
        st = zb__write_group(dst, dpath, o.zarr_format, zb__json_text(nd->attrs));
    }
    zb__tree_free(tree);
    return st;
}
