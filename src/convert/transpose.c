/* Placeholder until the out-of-core CSC transposition lands (being written). */
#include "convert/source.h"
#include "util/status.h"

zb_status
zb_csc_transpose(zb_src_matrix *m, const char *path, uint64_t memory_bytes, int num_threads)
{
    (void)memory_bytes;
    (void)num_threads;
    return zb_err(ZB_E_UNSUPPORTED, "%s: %s: CSC transposition is not written yet", m->path, path);
}

zb_status
zb_csr_file_open(const char *path, zb_src_matrix *names_of, zb_src_matrix **out)
{
    (void)names_of;
    *out = NULL;
    return zb_err(ZB_E_UNSUPPORTED, "%s: not written yet", path);
}
