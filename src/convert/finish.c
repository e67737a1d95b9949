/* The finishing step (zbatch_convert.h): every dataset's files checked against the digest its
 * gather task took while writing them, the collection's root group with consolidated metadata
 * of the whole tree, the manifest, then the marker and the work directory removed. Also the
 * check of a finished collection against its manifest. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_int.h"
#include "util/json.h"
#include "util/pool.h"
#include "util/status.h"
#include "write/write.h"
#include "zarr/tree.h"

static const char collection_attrs[] =
    "{\"encoding-type\": \"annbatch-preshuffled\", \"encoding-version\": \"0.1.0\"}";

static zb_status
load_json(const char *path, json_object **out)
{
    char *text;
    size_t len;
    ZB_TRY(cv_read_file(path, &text, &len));
    zb_status st = zb__json_parse(text, len, path, out);
    free(text);
    return st;
}

static const char *
str_of(json_object *o, const char *key)
{
    json_object *v = zb__json_get(o, key);
    return v ? json_object_get_string(v) : "";
}

/* Dataset d's fingerprint, read back through the output's store on a pool thread. */
typedef struct fp_job {
    zb_convert *cv;
    size_t d;
    uint64_t size, crc;
    zb_status st;
    char msg[1024];
} fp_job;

static void
fp_task(void *arg, zb_ctx *ctx)
{
    (void)ctx;
    fp_job *j = arg;
    char dir[64];
    snprintf(dir, sizeof dir, "dataset_%zu", j->d);
    j->st = cv_output_fingerprint(j->cv, dir, &j->size, &j->crc);
    if (j->st != ZB_OK) snprintf(j->msg, sizeof j->msg, "%s", zb_last_error());
}

/* The fingerprints of datasets [0, n): up to 8 at once from a bucket, which answers many
 * requests at a time (each is a few round trips per object), with a 4 MiB read buffer each
 * (32 MiB, while the gathers' memory is already free); one by one from a directory. */
static zb_status
fingerprints(zb_convert *cv, size_t n, fp_job **out)
{
    *out = NULL;
    fp_job *jobs = calloc(n ? n : 1, sizeof *jobs);
    if (!jobs) return zb__err(ZB_E_NOMEM, "checking the datasets");
    zb__pool *pool = NULL;
    zb_status st = zb__pool_new(cv->remote ? (int)(n < 8 ? n : 8) : 0, &pool);
    for (size_t d = 0; d < n && st == ZB_OK; d++) {
        jobs[d] = (fp_job){.cv = cv, .d = d};
        zb__pool_submit(pool, fp_task, &jobs[d]);
    }
    zb__pool_free(pool);
    if (st != ZB_OK) {
        free(jobs);
        return st;
    }
    *out = jobs;
    return ZB_OK;
}

/* Dataset d's files (its fingerprint `j`) against `expect` (its digest: crc64 hex, files,
 * bytes). */
static zb_status
check_dataset(const zb_convert *cv, json_object *expect, const fp_job *j)
{
    if (j->st != ZB_OK) return zb__err(j->st, "%s", j->msg);
    uint64_t want_bytes = 0;
    char hex[20];
    snprintf(hex, sizeof hex, "%016" PRIx64, j->crc);
    json_object *b = zb__json_get(expect, "bytes");
    if (b) zb__json_u64(b, "bytes", &want_bytes);
    if (!strcmp(hex, str_of(expect, "crc64")) && j->size == want_bytes) return ZB_OK;
    return zb__err(ZB_E_CHECKSUM,
                   "%s/dataset_%zu: its files (%" PRIu64 " bytes, CRC-64 %s) differ from what "
                   "was written (%" PRIu64 " bytes, CRC-64 %s)",
                   cv->output, j->d, j->size, hex, want_bytes, str_of(expect, "crc64"));
}

/* ---- root group ------------------------------------------------------------------------------ */

typedef struct entry {
    char key[4200];
    json_object *doc; /* owned ref */
} entry;

static int
cmp_entry(const void *a, const void *b)
{
    return zb__write_cmp_consolidated(((const entry *)a)->key, ((const entry *)b)->key);
}

static zb_status
push_entry(entry **list, size_t *n, size_t *cap, const char *key, json_object *doc)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 256;
        entry *p = realloc(*list, c * sizeof *p);
        if (!p) return zb__err(ZB_E_NOMEM, "consolidated metadata");
        *list = p;
        *cap = c;
    }
    snprintf((*list)[*n].key, sizeof(*list)[*n].key, "%s", key);
    (*list)[(*n)++].doc = doc;
    return ZB_OK;
}

/* Every node of every dataset, in the order zb__write_cmp_consolidated gives (v3 keys: paths
 * relative to the root, nested groups with an empty consolidated_metadata; v2: keys with the
 * document's name). */
static zb_status
consolidate_datasets(const zb_convert *cv, zb_store *store, json_object *meta)
{
    entry *list = NULL;
    size_t n = 0, cap = 0;
    zb_status st = ZB_OK;
    int ok = 1;
    for (uint64_t d = 0; d < cv->n_datasets && st == ZB_OK; d++) {
        char name[64], key[4200];
        snprintf(name, sizeof name, "dataset_%" PRIu64, d);
        zb__tree *tree = NULL;
        /* from a bucket, the dataset's own consolidated metadata (one object, just checked
         * against its checksum) instead of a request per document; the documents are the same
         * (the tests compare the root with a local conversion's byte for byte) */
        st = zb__tree_load(store, name, cv->remote, &tree);
        for (size_t i = 0; st == ZB_OK && i < tree->n; i++) {
            const zb__tree_node *nd = &tree->nodes[i];
            if (cv->zarr_format == 3) {
                const char *text = json_object_to_json_string_ext(nd->doc, JSON_C_TO_STRING_PLAIN);
                json_object *doc = NULL;
                st = zb__json_parse(text, strlen(text), nd->path, &doc);
                if (st == ZB_OK && !nd->is_array) zb__write_mark_nested_group(doc, &ok);
                if (st == ZB_OK) st = push_entry(&list, &n, &cap, nd->path, doc);
            } else {
                snprintf(key, sizeof key, "%s/%s", nd->path, nd->is_array ? ".zarray" : ".zgroup");
                st = push_entry(&list, &n, &cap, key, json_object_get(nd->doc));
                if (st == ZB_OK && json_object_object_length(nd->attrs)) {
                    snprintf(key, sizeof key, "%s/.zattrs", nd->path);
                    st = push_entry(&list, &n, &cap, key, json_object_get(nd->attrs));
                }
            }
        }
        zb__tree_free(tree);
    }
    if (st == ZB_OK && n) qsort(list, n, sizeof *list, cmp_entry);
    for (size_t i = 0; i < n; i++) {
        if (st == ZB_OK)
            zb__jw_add(meta, list[i].key, list[i].doc, &ok);
        else
            json_object_put(list[i].doc);
    }
    free(list);
    if (st == ZB_OK && !ok) st = zb__err(ZB_E_NOMEM, "consolidated metadata");
    return st;
}

static zb_status
write_root(zb_convert *cv)
{
    zb_store *store = cv->out;
    json_object *meta = json_object_new_object();
    zb_status st =
        meta ? consolidate_datasets(cv, store, meta) : zb__err(ZB_E_NOMEM, "the root group");
    if (st == ZB_OK)
        st = zb__write_consolidated_root(store, "", cv->zarr_format, collection_attrs, meta);
    json_object_put(meta);
    return st;
}

/* ---- manifest ---------------------------------------------------------------------------------- */

/* The stored types every gather recorded: one set for the whole collection (dtypes.c). */
static zb_status
manifest_dtypes(const zb_convert *cv, json_object *m)
{
    json_object *first = NULL;
    zb_status st = ZB_OK;
    for (uint64_t d = 0; d < cv->n_datasets && st == ZB_OK; d++) {
        char path[4200];
        json_object *done = NULL;
        st = cv_path(cv, path, sizeof path, "gather/d%" PRIu64 ".json", d);
        if (st == ZB_OK) st = load_json(path, &done);
        if (st != ZB_OK) break;
        json_object *dt = zb__json_get(done, "dtypes");
        if (!dt) {
            st = zb__err(ZB_E_CORRUPT, "%s: no stored types", path);
        } else if (!first) {
            first = json_object_get(dt);
        } else if (strcmp(json_object_to_json_string_ext(dt, JSON_C_TO_STRING_PLAIN),
                          json_object_to_json_string_ext(first, JSON_C_TO_STRING_PLAIN))) {
            st = zb__err(ZB_E_CORRUPT, "%s: stored types %s, but dataset_0 has %s", path,
                         json_object_to_json_string_ext(dt, JSON_C_TO_STRING_PLAIN),
                         json_object_to_json_string_ext(first, JSON_C_TO_STRING_PLAIN));
        }
        json_object_put(done);
    }
    int ok = 1;
    if (st == ZB_OK) zb__jw_add(m, "dtypes", json_object_get(first), &ok);
    json_object_put(first);
    if (st == ZB_OK && !ok) st = zb__err(ZB_E_NOMEM, "the manifest");
    return st;
}

static zb_status
build_manifest(const zb_convert *cv, json_object **out)
{
    int ok = 1;
    zb_status st = ZB_OK;
    json_object *m = json_object_new_object();
    zb__jw_add(m, "format", json_object_new_string("zbatch-convert-manifest"), &ok);
    zb__jw_add(m, "version", json_object_new_int(1), &ok);
    zb__jw_add(m, "checksum", json_object_new_string("crc64-xz"), &ok);
    zb__jw_add(m, "args", json_object_get(zb__json_get(cv->plan_doc, "args")), &ok);
    json_object *ins = zb__jw_add(m, "inputs", json_object_new_array(), &ok);
    for (size_t k = 0; k < cv->n_inputs && st == ZB_OK && ok; k++) {
        char path[4200];
        json_object *done = NULL;
        st = cv_path(cv, path, sizeof path, "prepare/i%zu.json", k);
        if (st == ZB_OK) st = load_json(path, &done);
        if (st != ZB_OK) break;
        json_object *in = zb__jw_push(ins, json_object_new_object(), &ok);
        zb__jw_add(in, "path",
                   json_object_new_string_len(
                       cv->input_names.data + cv->input_names.offsets[k],
                       (int)(cv->input_names.offsets[k + 1] - cv->input_names.offsets[k])),
                   &ok);
        zb__jw_add(in, "format", json_object_new_string(cv->inputs[k].format), &ok);
        zb__jw_add(in, "bytes", zb__jw_u64(cv->inputs[k].size), &ok);
        zb__jw_add(in, "crc64", json_object_new_string(str_of(done, "crc64")), &ok);
        zb__jw_add(in, "cells", zb__jw_u64(cv->inputs[k].n_obs), &ok);
        json_object_put(done);
    }
    if (st == ZB_OK && ok) st = manifest_dtypes(cv, m);
    zb__jw_add(m, "skipped_columns", json_object_get(zb__json_get(cv->plan_doc, "skipped_columns")),
               &ok);
    zb__jw_add(m, "n_cells", zb__jw_u64(cv->n_cells), &ok);
    zb__jw_add(m, "n_genes", zb__jw_u64(cv->genes.n), &ok);
    json_object *ds = zb__jw_add(m, "datasets", json_object_new_array(), &ok);
    for (uint64_t d = 0; d < cv->n_datasets && st == ZB_OK && ok; d++) {
        char path[4200], name[64];
        json_object *done = NULL;
        st = cv_path(cv, path, sizeof path, "gather/d%" PRIu64 ".json", d);
        if (st == ZB_OK) st = load_json(path, &done);
        if (st != ZB_OK) break;
        snprintf(name, sizeof name, "dataset_%" PRIu64, d);
        json_object *e = zb__jw_push(ds, json_object_new_object(), &ok);
        zb__jw_add(e, "name", json_object_new_string(name), &ok);
        static const char *const keys[] = {"cells", "nnz", "files", "bytes", "crc64"};
        for (size_t i = 0; i < 5; i++)
            zb__jw_add(e, keys[i], json_object_get(zb__json_get(done, keys[i])), &ok);
        json_object_put(done);
    }
    if (st == ZB_OK && !ok) st = zb__err(ZB_E_NOMEM, "the manifest");
    if (st != ZB_OK) {
        json_object_put(m);
        return st;
    }
    *out = m;
    return ZB_OK;
}

static zb_status
write_manifest(zb_convert *cv, json_object *m)
{
    const char *text = json_object_to_json_string_ext(
        m, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
    size_t n = strlen(text);
    char *buf = malloc(n + 1);
    if (!buf) return zb__err(ZB_E_NOMEM, "the manifest");
    memcpy(buf, text, n);
    buf[n] = '\n';
    zb_status st = cv_output_put(cv, CV_MANIFEST, buf, n + 1);
    free(buf);
    return st;
}

/* Every dataset of the manifest against its fingerprint in fp. */
static zb_status
check_manifest(const zb_convert *cv, json_object *m, const fp_job *fp)
{
    json_object *ds = zb__json_get(m, "datasets");
    for (size_t d = 0; d < cv->n_datasets; d++)
        ZB_TRY(check_dataset(cv, json_object_array_get_idx(ds, d), &fp[d]));
    return ZB_OK;
}

/* Every dataset of the manifest against its files, read back. */
static zb_status
verify_manifest(zb_convert *cv, json_object *m, fp_job **fp)
{
    *fp = NULL;
    json_object *ds = zb__json_get(m, "datasets");
    size_t n = ds ? json_object_array_length(ds) : 0;
    if (n != cv->n_datasets)
        return zb__err(ZB_E_CORRUPT, "%s/%s: %zu datasets listed, %" PRIu64 " expected", cv->output,
                       CV_MANIFEST, n, cv->n_datasets);
    ZB_TRY(fingerprints(cv, n, fp));
    return check_manifest(cv, m, *fp);
}

zb_status
zb_convert_finish(zb_convert *cv)
{
    if (!cv) return zb__err(ZB_E_INVALID, "zb_convert_finish: null handle");
    fp_job *fp = NULL;
    if (cv->finished) {
        zb_status st = verify_manifest(cv, cv->manifest, &fp);
        free(fp);
        return st;
    }
    for (zb_convert_phase p = ZB_CONVERT_PREPARE; p < ZB_CONVERT_PHASES_; p++)
        for (size_t i = 0; i < zb_convert_ntasks(cv, p); i++)
            if (!zb_convert_task_done(cv, p, i))
                return zb__err(ZB_E_INVALID, "%s: task %zu of phase %d is not finished", cv->output,
                               i, (int)p);
    json_object *m = NULL;
    ZB_TRY(build_manifest(cv, &m));
    zb_status st = verify_manifest(cv, m, &fp);
    if (st == ZB_E_CHECKSUM) {
        /* a dataset whose files changed after it was written is rewritten by the next run */
        for (uint64_t d = 0; d < cv->n_datasets; d++) {
            json_object *e = json_object_array_get_idx(zb__json_get(m, "datasets"), d);
            if (check_dataset(cv, e, &fp[d]) != ZB_OK) {
                char path[4200];
                if (cv_path(cv, path, sizeof path, "gather/d%" PRIu64 ".json", d) == ZB_OK)
                    remove(path);
            }
        }
        zb_clear_error();
        st = check_manifest(cv, m, fp);
    }
    free(fp);
    if (st == ZB_OK) st = write_root(cv);
    if (st == ZB_OK) st = write_manifest(cv, m);
    json_object_put(m);
    if (st == ZB_OK) st = zb_store_erase(cv->out, ZB_INCOMPLETE_MARKER);
    if (st == ZB_OK) st = cv_remove_tree(cv->work);
    if (st != ZB_OK) return zb__err_context(st, "finishing %s", cv->output);
    return ZB_OK;
}

zb_status
cv_finished_open(zb_convert *cv, json_object *args)
{
    char *text = NULL;
    size_t len = 0;
    char what[4200];
    snprintf(what, sizeof what, "%s/%s", cv->output, CV_MANIFEST);
    ZB_TRY(cv_output_read(cv, CV_MANIFEST, &text, &len));
    zb_status st = zb__json_parse(text, len, what, &cv->manifest);
    free(text);
    if (st != ZB_OK) return st;
    json_object *had = zb__json_get(cv->manifest, "args");
    const char *a = had ? json_object_to_json_string_ext(had, JSON_C_TO_STRING_PLAIN) : "";
    if (strcmp(a, json_object_to_json_string_ext(args, JSON_C_TO_STRING_PLAIN))) {
        char diff[512];
        cv_args_difference(had, args, diff, sizeof diff);
        return zb__err(ZB_E_INVALID,
                       "%s holds a finished conversion of other inputs or options "
                       "(%s); remove it first",
                       cv->output, diff);
    }
    json_object *ds = zb__json_get(cv->manifest, "datasets");
    cv->n_datasets = ds ? json_object_array_length(ds) : 0;
    cv->finished = true;
    return ZB_OK;
}
