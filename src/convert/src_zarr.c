/* Placeholder until the Zarr backend lands (being written). */
#include "convert/source.h"
#include "util/status.h"

zb_status
zb_src_open_zarr(const char *path, zb_src **out)
{
    *out = NULL;
    return zb_err(ZB_E_UNSUPPORTED, "%s: Zarr inputs are not readable yet", path);
}
