/* Where each chunk of a 1-d dataset lies in its file, in one pass of lookups (h5ad_io.h,
 * zb__h5_chunk_table).
 *
 * Why this exists: the direct path reads matrix rows straight from an .h5ad file, so it needs
 * the file offset of every chunk of X/data and X/indices. libhdf5 >= 1.12.3 hands them all out
 * in one walk of the chunk index (H5Dchunk_iter); the 1.10 that Debian packages has only
 * H5Dget_chunk_info_by_coord, which walks the index from its start up to the chunk asked for, so
 * a table of n chunks costs n^2 / 2 steps (docs/PERFORMANCE.md: most of the plan's time on the
 * benchmark's inputs, and the reason tables were capped at 16,384 chunks).
 *
 * H5Dread_chunk finds a chunk through the index's own lookup (log n) and then reads exactly the
 * chunk's stored bytes at its address through the file driver. So the table is made by opening
 * the file a second time with a file driver of our own (libhdf5's documented extension point,
 * H5FDregister): it reads like libhdf5's sec2 driver, except that while a chunk is being probed
 * the raw-data read is recorded (address and length) instead of done. Nothing else of libhdf5's
 * is reimplemented: the index, its format and the lookup stay libhdf5's.
 *
 * The table is then checked where the old way is cheap: the first and the last chunk's addresses
 * against H5Dget_chunk_info_by_coord. Its offsets are where the driver was asked to read, so
 * they are file offsets even in a file with a user block (where 1.10's answers are not). Any surprise (the driver does not register, a read is not
 * seen, the check disagrees) answers "unknown", and the caller builds the table the old way. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/h5ad_io.h"

typedef struct probe_file {
    H5FD_t pub; /* libhdf5's part, first */
    int fd;
    haddr_t eoa, eof;
    bool probing;  /* record the next raw-data read instead of doing it */
    int seen;      /* raw-data reads recorded while probing */
    haddr_t addr;  /* the last one's address (a file offset: base_addr included) */
    size_t length; /* and length */
} probe_file;

static H5FD_t *
p_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr)
{
    (void)fapl;
    (void)maxaddr;
    if (flags & (H5F_ACC_RDWR | H5F_ACC_CREAT | H5F_ACC_TRUNC)) return NULL; /* read-only */
    probe_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    struct stat sb;
    f->fd = open(name, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0 || fstat(f->fd, &sb) < 0) {
        if (f->fd >= 0) close(f->fd);
        free(f);
        return NULL;
    }
    f->eof = (haddr_t)sb.st_size;
    return &f->pub;
}

static herr_t
p_close(H5FD_t *file)
{
    probe_file *f = (probe_file *)file;
    close(f->fd);
    free(f);
    return 0;
}

static herr_t
p_query(const H5FD_t *file, unsigned long *flags)
{
    (void)file;
    /* metadata read through libhdf5's accumulator, as with sec2 */
    *flags = H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_AGGREGATE_METADATA;
    return 0;
}

static haddr_t
p_get_eoa(const H5FD_t *file, H5FD_mem_t type)
{
    (void)type;
    return ((const probe_file *)file)->eoa;
}

static herr_t
p_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr)
{
    (void)type;
    ((probe_file *)file)->eoa = addr;
    return 0;
}

static haddr_t
p_get_eof(const H5FD_t *file, H5FD_mem_t type)
{
    (void)type;
    return ((const probe_file *)file)->eof;
}

static herr_t
p_get_handle(H5FD_t *file, hid_t fapl, void **handle)
{
    (void)fapl;
    *handle = file; /* zb__h5_chunk_table's way to its probe state */
    return 0;
}

static herr_t
p_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, void *buf)
{
    (void)dxpl;
    probe_file *f = (probe_file *)file;
    if (f->probing && type == H5FD_MEM_DRAW) {
        f->seen++;
        f->addr = addr;
        f->length = size;
        return 0;
    }
    unsigned char *p = buf;
    while (size) { /* as sec2 does: bytes past the end of the file read as zeros */
        ssize_t r = pread(f->fd, p, size, (off_t)addr);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) {
            memset(p, 0, size);
            break;
        }
        p += r;
        size -= (size_t)r;
        addr += (haddr_t)r;
    }
    return 0;
}

static herr_t
p_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, const void *buf)
{
    (void)file, (void)type, (void)dxpl, (void)addr, (void)size, (void)buf;
    return -1;
}

static const H5FD_class_t probe_class = {
    .name = "zbatch-chunk-probe",
    .maxaddr = (haddr_t)INT64_MAX,
    .fc_degree = H5F_CLOSE_WEAK,
    .open = p_open,
    .close = p_close,
    .query = p_query,
    .get_eoa = p_get_eoa,
    .set_eoa = p_set_eoa,
    .get_eof = p_get_eof,
    .get_handle = p_get_handle,
    .read = p_read,
    .write = p_write,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

/* Under the lock: the driver, registered once for the process (H5FDregister hands out an id
 * that libhdf5 releases when it shuts down). */
static hid_t
probe_driver(void)
{
    static hid_t id = H5I_INVALID_HID;
    if (id < 0) id = H5FDregister(&probe_class);
    return id;
}

bool
zb__h5_chunk_addr(const zb__h5_ds *d, uint64_t c, uint64_t *addr)
{
    hsize_t off[1] = {c * d->chunk[0]};
    unsigned mask = 0;
    haddr_t a = HADDR_UNDEF;
    hsize_t size = 0;
    bool ok = H5Dget_chunk_info_by_coord(d->id, off, &mask, &a, &size) >= 0 && a != HADDR_UNDEF &&
              mask == 0 && size == d->chunk[0] * d->item;
    H5Eclear2(H5E_DEFAULT);
    *addr = (uint64_t)a;
    return ok;
}

/* Under the lock: fills table[0..n) through the probe file f's dataset ds. 1 built, 0 a chunk
 * that is not as required (unallocated, filtered, another size, misaligned), -1 unknown. */
static int
probe_chunks(probe_file *f, hid_t ds, const zb__h5_ds *d, uint64_t n, uint64_t *table)
{
    size_t bytes = (size_t)(d->chunk[0] * d->item);
    void *sink = malloc(bytes ? bytes : 1); /* never written by the probe: no pages touched */
    if (!sink) return -1;
    int result = 1;
    for (uint64_t c = 0; result == 1 && c < n; c++) {
        hsize_t off[1] = {c * d->chunk[0]};
        uint32_t filters = 0;
        f->probing = true;
        f->seen = 0;
        herr_t r = H5Dread_chunk(ds, H5P_DEFAULT, off, &filters, sink);
        f->probing = false;
        if (r < 0) /* no chunk there (never written), or a damaged index */
            result = 0;
        else if (f->seen != 1)
            result = -1;
        else if (filters != 0 || f->length != bytes || f->addr % d->item)
            result = 0;
        else
            table[c] = (uint64_t)f->addr;
    }
    free(sink);
    return result;
}

int
zb__h5_chunk_table(const zb__h5_ds *d, uint64_t n, uint64_t *table)
{
    if (d->rank != 1 || !d->chunk[0] || !d->item || !n) return -1;
    hid_t driver = probe_driver();
    char name[4096];
    ssize_t len = H5Iget_name(d->id, name, sizeof name);
    if (driver < 0 || len <= 0 || (size_t)len >= sizeof name) {
        H5Eclear2(H5E_DEFAULT);
        return -1;
    }
    int result = -1;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), file = H5I_INVALID_HID, ds = H5I_INVALID_HID;
    probe_file *f = NULL;
    if (fapl >= 0 && H5Pset_driver(fapl, driver, NULL) >= 0)
        file = H5Fopen(d->path, H5F_ACC_RDONLY, fapl);
    if (file >= 0) ds = H5Dopen2(file, name, H5P_DEFAULT);
    hid_t plist = ds >= 0 ? H5Dget_create_plist(ds) : H5I_INVALID_HID;
    int n_filters = plist >= 0 ? H5Pget_nfilters(plist) : -1;
    if (plist >= 0) H5Pclose(plist);
    if (n_filters > 0)
        result = 0;
    else if (n_filters == 0 && H5Fget_vfd_handle(file, H5P_DEFAULT, (void **)&f) >= 0 && f)
        result = probe_chunks(f, ds, d, n, table);
    /* the check: the ends of the table agree with libhdf5's own answer on the caller's handle,
     * which 1.10 gives relative to the user block (if any) and later versions as file offsets */
    uint64_t first, last, base = result == 1 ? (uint64_t)f->pub.base_addr : 0;
    if (result == 1 &&
        (!zb__h5_chunk_addr(d, 0, &first) || (first != table[0] && first + base != table[0]) ||
         !zb__h5_chunk_addr(d, n - 1, &last) ||
         (last != table[n - 1] && last + base != table[n - 1])))
        result = -1;
    if (ds >= 0) H5Dclose(ds);
    if (file >= 0) H5Fclose(file);
    if (fapl >= 0) H5Pclose(fapl);
    H5Eclear2(H5E_DEFAULT);
    return result;
}
