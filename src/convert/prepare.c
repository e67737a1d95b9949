/* The prepare phase (zbatch_convert.h): one task per input — its CRC-64 for the manifest, and
 * each of its CSC matrices transposed out of core into a CSR scratch file the scatter tasks
 * read by rows. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "convert/convert_int.h"
#include "util/status.h"

zb_status
cv_prepare_task(zb_convert *cv, size_t k)
{
    char dir[4200], path[4200];
    ZB_TRY(cv_path(cv, dir, sizeof dir, "prepare"));
    ZB_TRY(cv_mkdirs(dir));
    const cv_input *in = &cv->inputs[k];
    uint64_t size, crc;
    int64_t mtime;
    ZB_TRY(cv_fingerprint(in->path, &size, &mtime, &crc));
    if (size != in->size || mtime != in->mtime_ns)
        return zb__err(ZB_E_INVALID, "%s changed since the conversion was planned", in->path);
    zb__src *src;
    ZB_TRY(cv_source(cv, (uint32_t)k, &src));
    for (size_t j = 0; j < cv->n_mats; j++) {
        if (in->mats[j].layout != ZB_SRC_CSC) continue;
        zb__src_matrix *m;
        ZB_TRY(zb__src_matrix_get(src, cv->mat_keys[j], &m));
        ZB_TRY(cv_path(cv, path, sizeof path, "prepare/i%zu-m%zu.csr", k, j));
        if (!cv_exists(path)) ZB_TRY(zb__csc_transpose(m, path, cv->memory_bytes / 2, 1));
    }
    char text[256];
    int n = snprintf(text, sizeof text, "{\"crc64\": \"%016" PRIx64 "\", \"size\": %" PRIu64 "}\n",
                     crc, size);
    ZB_TRY(cv_path(cv, path, sizeof path, "prepare/i%zu.json", k));
    const void *bufs[1] = {text};
    size_t lens[1] = {(size_t)n};
    return cv_write_file(path, bufs, lens, 1);
}
