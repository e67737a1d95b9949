/* Placeholder until the .h5ad backend lands (being written). */
#include "convert/source.h"
#include "util/status.h"

zb_status
zb_src_open_h5ad(const char *path, zb_src **out)
{
    *out = NULL;
    return zb_err(ZB_E_UNSUPPORTED, "%s: .h5ad inputs are not readable yet", path);
}
