/* Neighbour lists of one structure (include/zbatch_neighbors.h): every (i, j, S) with
 * |r_j − r_i + S·cell| < cutoff, the set ASE's neighbor_list("ijS") returns.
 *
 * A cell list in the cell's own frame. The frame's axes are the periodic lattice vectors,
 * completed by unit vectors orthogonal to them for the non-periodic axes (a non-periodic lattice
 * vector plays no part in any distance, S being 0 along it, so it may be zero or anything).
 * Every atom gets fractional coordinates f = r·axes⁻¹; along a periodic axis f is wrapped into
 * [0, 1) and the whole cells the atom moved by (its offset o) are remembered. Each axis is cut
 * into bins at least half the search radius thick, thickness measured between the planes of
 * the other two axes, so a triclinic cell needs no enclosing box; at most 2n + 8 bins in all,
 * so a sparse structure still costs O(n) memory. An atom scans, along each axis, the bins
 * within the radius of its own position (about 2 × 2 + 1 of them); when the cutoff exceeds a
 * periodic cell the range wraps round, one bin recurring once per periodic image T, and no
 * (bin, image) is visited twice. Bins are numbered first axis fastest, so the bins of one row
 * in one image are one run of the sorted positions.
 *
 * A candidate found in the wrapped frame is decided from the caller's positions with ASE's own
 * formula, d = (r_j − r_i) + S·cell with S = T + o_i − o_j and |d| < cutoff, so the answer does
 * not depend on where atoms sat relative to the cell. The search radius is the cutoff widened
 * by a rounding margin, so the wrapped test never drops a pair the exact test keeps.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"
#include "zbatch.h"

/* Beyond these an input is refused rather than looped over: an atom 2^40 cells away has lost
 * most digits of its wrapped position, and a cutoff across 65,536 lattice planes would list
 * some 10^15 pairs per atom. */
#define MAX_CELLS_AWAY 1099511627776.0 /* 2^40 */
#define MAX_REACH 65536

/* Bins are at least the search radius / BIN_SPLIT thick. Thinner bins scan less empty space
 * around an atom but more rows of bins; 2 cost the fewest instructions on most of the fcc
 * crystals measured (docs/PERFORMANCE.md, "Neighbour lists and ASE conversion"). */
#define BIN_SPLIT 2.0

typedef struct frame {
    double cell[3][3]; /* the caller's cell (zeros for NULL): the exact test uses it */
    double axis[3][3]; /* rows: the periodic lattice vectors; unit vectors for the others */
    double inv[3][3];  /* axis⁻¹: the fractional coordinates of r are r · inv */
    double height[3];  /* Å between the planes f_k = x and f_k = x + 1 */
    double lo[3];      /* fractional start of the bins (0 along periodic axes) */
    double extent[3];  /* fractional length the bins cover (1 along periodic axes) */
    int64_t nbins[3];
    double reach[3]; /* the search radius in bins along each axis */
    bool pbc[3];
} frame;

/* Per-atom scratch, one allocation. */
typedef struct atoms {
    int64_t *offset; /* [n][3] whole cells each atom was moved by to wrap it */
    double *wrapped; /* [n][3] fractional coordinates, then the wrapped Cartesian position */
    double *unit;    /* [n][3] position along each axis in bins (the bin is its floor) */
    size_t *bin;     /* [n] */
    double *sorted;  /* [n][3] wrapped positions in bin order */
    uint64_t *index; /* [n] the atom at each place of `sorted` */
    size_t *start;   /* [nbins + 1] first place of each bin in `sorted` */
} atoms;

static double
dot3(const double *a, const double *b)
{
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
}

static void
cross3(const double *a, const double *b, double *out)
{
    out[0] = a[1] * b[2] - a[2] * b[1];
    out[1] = a[2] * b[0] - a[0] * b[2];
    out[2] = a[0] * b[1] - a[1] * b[0];
}

static void
normalize3(double *a)
{
    double len = sqrt(dot3(a, a));
    for (int c = 0; c < 3; c++) a[c] /= len;
}

/* Completes the non-periodic axes with unit vectors orthogonal to the periodic ones. */
static zb_status
frame_complete(frame *f)
{
    int per[3], np = 0, non[3], nn = 0;
    for (int k = 0; k < 3; k++) {
        if (f->pbc[k])
            per[np++] = k;
        else
            non[nn++] = k;
    }
    for (int p = 0; p < np; p++) {
        memcpy(f->axis[per[p]], f->cell[per[p]], sizeof f->axis[0]);
        if (dot3(f->axis[per[p]], f->axis[per[p]]) == 0)
            return zb__err(ZB_E_INVALID,
                           "singular periodic cell: lattice vector %d is zero but "
                           "axis %d is periodic",
                           per[p], per[p]);
    }
    if (np == 0) {
        for (int k = 0; k < 3; k++)
            for (int c = 0; c < 3; c++) f->axis[k][c] = k == c;
    } else if (np == 1) {
        /* a × e for the Cartesian axis e least aligned with a, then a × that */
        const double *a = f->axis[per[0]];
        int e = 0;
        for (int c = 1; c < 3; c++)
            if (fabs(a[c]) < fabs(a[e])) e = c;
        double unit[3] = {0, 0, 0};
        unit[e] = 1;
        cross3(a, unit, f->axis[non[0]]);
        normalize3(f->axis[non[0]]);
        cross3(a, f->axis[non[0]], f->axis[non[1]]);
        normalize3(f->axis[non[1]]);
    } else if (np == 2) {
        cross3(f->axis[per[0]], f->axis[per[1]], f->axis[non[0]]);
        double len = sqrt(dot3(f->axis[non[0]], f->axis[non[0]]));
        double scale =
            sqrt(dot3(f->axis[per[0]], f->axis[per[0]]) * dot3(f->axis[per[1]], f->axis[per[1]]));
        if (!(len > 1e-12 * scale))
            return zb__err(ZB_E_INVALID,
                           "singular periodic cell: lattice vectors %d and %d "
                           "are parallel",
                           per[0], per[1]);
        normalize3(f->axis[non[0]]);
    }
    return ZB_OK;
}

/* The inverse of the axes (its columns are the reciprocal vectors) and the plane spacings. */
static zb_status
frame_invert(frame *f)
{
    double rec[3][3]; /* rec[k] = axis[k+1] × axis[k+2] */
    for (int k = 0; k < 3; k++) cross3(f->axis[(k + 1) % 3], f->axis[(k + 2) % 3], rec[k]);
    double det = dot3(f->axis[0], rec[0]);
    double scale = 1;
    for (int k = 0; k < 3; k++) scale *= sqrt(dot3(f->axis[k], f->axis[k]));
    if (!(fabs(det) > 1e-12 * scale))
        return zb__err(ZB_E_INVALID,
                       "singular periodic cell: the periodic lattice vectors are "
                       "linearly dependent (volume %g)",
                       det);
    for (int k = 0; k < 3; k++) {
        for (int c = 0; c < 3; c++) f->inv[c][k] = rec[k][c] / det;
        f->height[k] = fabs(det) / sqrt(dot3(rec[k], rec[k]));
    }
    return ZB_OK;
}

static zb_status
frame_init(frame *f, const zb_structure *s)
{
    memset(f, 0, sizeof *f);
    for (int k = 0; k < 3; k++) f->pbc[k] = s->pbc[k];
    if (s->cell) {
        for (int k = 0; k < 3; k++)
            for (int c = 0; c < 3; c++) {
                f->cell[k][c] = s->cell[3 * k + c];
                if (!isfinite(f->cell[k][c]))
                    return zb__err(ZB_E_INVALID, "cell[%d][%d] is %g, not a finite number", k, c,
                                   f->cell[k][c]);
            }
    } else if (f->pbc[0] || f->pbc[1] || f->pbc[2]) {
        return zb__err(ZB_E_INVALID, "a periodic structure needs a cell (cell is NULL)");
    }
    ZB_TRY(frame_complete(f));
    return frame_invert(f);
}

static void
atoms_free(atoms *a)
{
    free(a->offset); /* the per-atom arrays share this allocation */
    free(a->start);
    memset(a, 0, sizeof *a);
}

static zb_status
atoms_alloc(atoms *a, uint64_t n)
{
    memset(a, 0, sizeof *a);
    /* 3 + 3 + 3 + 1 + 3 + 1 eight-byte values per atom */
    if (n > SIZE_MAX / (14 * 8)) return zb__err(ZB_E_OVERFLOW, "%llu atoms", (unsigned long long)n);
    size_t m = (size_t)n ? (size_t)n : 1;
    char *p = malloc(m * 14 * 8);
    if (!p)
        return zb__err(ZB_E_NOMEM, "neighbour list scratch for %llu atoms", (unsigned long long)n);
    a->offset = (int64_t *)(void *)p;
    a->wrapped = (double *)(void *)(p + m * 24);
    a->unit = (double *)(void *)(p + m * 48);
    a->bin = (size_t *)(void *)(p + m * 72);
    a->sorted = (double *)(void *)(p + m * 80);
    a->index = (uint64_t *)(void *)(p + m * 104);
    return ZB_OK;
}

/* Fractional coordinates of every atom, wrapped along periodic axes (a->offset keeps the
 * cells), and the span of the others; *size bounds the coordinates the search computes with
 * (positions, and the cells they moved by), which sizes the rounding margin. */
static zb_status
atoms_wrap(atoms *a, frame *f, const zb_structure *s, double *size)
{
    double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
    double far = 0, cells[3] = {0, 0, 0};
    for (uint64_t i = 0; i < s->n_atoms; i++) {
        const double *r = s->positions + 3 * i;
        if (!isfinite(r[0]) || !isfinite(r[1]) || !isfinite(r[2]))
            return zb__err(ZB_E_INVALID, "atom %llu: position (%g, %g, %g) is not finite",
                           (unsigned long long)i, r[0], r[1], r[2]);
        for (int c = 0; c < 3; c++) far = fmax(far, fabs(r[c]));
        for (int k = 0; k < 3; k++) {
            double x = r[0] * f->inv[0][k] + r[1] * f->inv[1][k] + r[2] * f->inv[2][k];
            double o = 0;
            if (f->pbc[k]) {
                o = floor(x);
                if (!(fabs(o) < MAX_CELLS_AWAY))
                    return zb__err(ZB_E_INVALID,
                                   "atom %llu lies %g cells outside the periodic "
                                   "cell along axis %d",
                                   (unsigned long long)i, o, k);
                x -= o;
                cells[k] = fmax(cells[k], fabs(o));
            }
            a->offset[3 * i + k] = (int64_t)o;
            a->wrapped[3 * i + k] = x;
            lo[k] = fmin(lo[k], x);
            hi[k] = fmax(hi[k], x);
        }
    }
    *size = 3 * far;
    for (int k = 0; k < 3; k++) {
        f->lo[k] = f->pbc[k] ? 0 : lo[k];
        f->extent[k] = f->pbc[k] ? 1 : (s->n_atoms ? hi[k] - lo[k] : 0);
        if (f->pbc[k]) *size += (1 + cells[k]) * sqrt(dot3(f->axis[k], f->axis[k]));
    }
    return ZB_OK;
}

/* Bins per axis (at least radius / BIN_SPLIT thick, at most 2n + 8 in all) and the radius
 * in bins. */
static zb_status
frame_bins(frame *f, uint64_t n, double radius)
{
    const double cap = 2.0 * (double)n + 8;
    for (int k = 0; k < 3; k++) {
        double span = f->extent[k] * f->height[k];
        f->nbins[k] = (int64_t)fmax(1, fmin(floor(span * BIN_SPLIT / radius), cap));
    }
    while ((double)f->nbins[0] * (double)f->nbins[1] * (double)f->nbins[2] > cap) {
        int big = 0;
        for (int k = 1; k < 3; k++)
            if (f->nbins[k] > f->nbins[big]) big = k;
        f->nbins[big] /= 2;
    }
    for (int k = 0; k < 3; k++) {
        double span = f->extent[k] * f->height[k];
        if (!f->pbc[k]) { /* no images: the range is clipped to the bins anyway */
            f->reach[k] = span > 0 ? fmin(radius * (double)f->nbins[k] / span, cap) : 0;
            continue;
        }
        if (!(radius / f->height[k] <= MAX_REACH))
            return zb__err(ZB_E_OVERFLOW,
                           "the cutoff spans %g lattice planes along axis %d (at "
                           "most %d)",
                           radius / f->height[k], k, MAX_REACH);
        f->reach[k] = radius * (double)f->nbins[k] / f->height[k];
    }
    return ZB_OK;
}

/* Sorts the atoms into bins (a counting sort) and turns their fractional coordinates into
 * wrapped Cartesian positions. */
static zb_status
atoms_bin(atoms *a, const frame *f, const zb_structure *s)
{
    size_t nb = (size_t)(f->nbins[0] * f->nbins[1] * f->nbins[2]);
    a->start = calloc(nb + 1, sizeof *a->start);
    if (!a->start) return zb__err(ZB_E_NOMEM, "%zu neighbour-list bins", nb);
    uint64_t n = s->n_atoms;
    for (uint64_t i = 0; i < n; i++) {
        int64_t b[3];
        for (int k = 0; k < 3; k++) {
            double x = f->extent[k] > 0 ? (a->wrapped[3 * i + k] - f->lo[k]) / f->extent[k] : 0;
            double u = x * (double)f->nbins[k], v = floor(u);
            b[k] = v < 0 ? 0 : v >= (double)f->nbins[k] ? f->nbins[k] - 1 : (int64_t)v;
            a->unit[3 * i + k] = u;
        }
        a->bin[i] = (size_t)(b[0] + f->nbins[0] * (b[1] + f->nbins[1] * b[2]));
        a->start[a->bin[i] + 1]++;
        const double *r = s->positions + 3 * i;
        for (int c = 0; c < 3; c++) {
            double w = r[c];
            for (int k = 0; k < 3; k++)
                if (f->pbc[k]) w -= (double)a->offset[3 * i + k] * f->axis[k][c];
            a->wrapped[3 * i + c] = w;
        }
    }
    for (size_t b = 0; b < nb; b++) a->start[b + 1] += a->start[b];
    for (uint64_t i = 0; i < n; i++) {
        size_t at = a->start[a->bin[i]]++;
        memcpy(a->sorted + 3 * at, a->wrapped + 3 * i, 3 * sizeof(double));
        a->index[at] = i;
    }
    for (size_t b = nb; b > 0; b--) a->start[b] = a->start[b - 1]; /* undo the fill's advance */
    a->start[0] = 0;
    return ZB_OK;
}

/* Room for one more pair. */
static zb_status
list_reserve(zb_neighbor_list *nl, uint64_t max_pairs, double cutoff)
{
    if (max_pairs && nl->n_pairs >= max_pairs) /* before the capacity: a reused list may be
                                                   larger than this call's cap */
        return zb__err(ZB_E_OVERFLOW,
                       "more than %llu neighbour pairs within the cutoff %g "
                       "(max_pairs)",
                       (unsigned long long)max_pairs, cutoff);
    if (nl->n_pairs < nl->capacity) return ZB_OK;
    uint64_t cap = nl->capacity ? nl->capacity * 2 : 4096;
    if (max_pairs && cap > max_pairs) cap = max_pairs;
    if (cap > SIZE_MAX / (3 * sizeof(int64_t)))
        return zb__err(ZB_E_OVERFLOW, "%llu neighbour pairs", (unsigned long long)cap);
    int64_t *p = realloc(nl->i, (size_t)cap * sizeof *p);
    if (p) nl->i = p;
    int64_t *q = p ? realloc(nl->j, (size_t)cap * sizeof *q) : NULL;
    if (q) nl->j = q;
    int64_t *s = q ? realloc(nl->cell_shifts, (size_t)cap * 3 * sizeof *s) : NULL;
    if (!s) return zb__err(ZB_E_NOMEM, "a neighbour list of %llu pairs", (unsigned long long)cap);
    nl->cell_shifts = s;
    nl->capacity = cap;
    return ZB_OK;
}

/* The bin `v` steps along axis k lands in, and the periodic image it belongs to; false when it
 * falls off a non-periodic axis. */
static bool
step_bin(const frame *f, int k, int64_t v, int64_t *bin, int64_t *image)
{
    int64_t nb = f->nbins[k];
    if (!f->pbc[k]) {
        *bin = v;
        *image = 0;
        return v >= 0 && v < nb;
    }
    int64_t t = v >= 0 ? v / nb : -((-v + nb - 1) / nb); /* floor division */
    *image = t;
    *bin = v - t * nb;
    return true;
}

/* ASE's test of a pair, from the caller's positions: |(r_j − r_i) + S·cell| < cutoff. */
static bool
pair_within(const frame *f, const double *ri, const double *rj, const int64_t *S, double cutoff)
{
    double d2 = 0;
    for (int c = 0; c < 3; c++) {
        double sc = (double)S[0] * f->cell[0][c] + (double)S[1] * f->cell[1][c] +
                    (double)S[2] * f->cell[2][c];
        double d = (rj[c] - ri[c]) + sc;
        d2 += d * d;
    }
    return sqrt(d2) < cutoff;
}

/* Bins that follow each other along the first axis in one periodic image: one run of the
 * sorted array per row. */
typedef struct xrun {
    int64_t bin, len, image;
    double shift[3]; /* image · axis[0] */
} xrun;

/* What a search reads and where it writes. */
typedef struct search {
    xrun *runs; /* scratch for one atom's runs along the first axis */
    const frame *f;
    const atoms *a;
    const zb_structure *s;
    double radius2; /* beyond it, no pair */
    double inner2;  /* within it, a pair for sure: only the shell between takes the exact test */
    double cutoff;
    uint64_t max_pairs;
    zb_neighbor_list *nl;
} search;

/* The atoms at places [from, to) of the sorted array, seen in one periodic image (t: its
 * translation minus atom i's wrapped position; base: its shift T plus atom i's offset): those
 * within the search radius of atom i are pairs, after the exact test if near the cutoff. */
static zb_status
scan_run(const search *q, uint64_t i, size_t from, size_t to, const int64_t *base, const double *t)
{
    zb_neighbor_list *nl = q->nl;
    for (size_t at = from; at < to; at++) {
        const double *wj = q->a->sorted + 3 * at;
        double x = wj[0] + t[0], y = wj[1] + t[1], z = wj[2] + t[2];
        double d2 = x * x + y * y + z * z;
        if (d2 >= q->radius2) continue;
        uint64_t j = q->a->index[at];
        const int64_t *oj = q->a->offset + 3 * j;
        int64_t S[3] = {base[0] - oj[0], base[1] - oj[1], base[2] - oj[2]};
        if (j == i && !S[0] && !S[1] && !S[2]) continue;
        if (d2 >= q->inner2 &&
            !pair_within(q->f, q->s->positions + 3 * i, q->s->positions + 3 * j, S, q->cutoff))
            continue;
        if (nl->n_pairs >= nl->capacity || (q->max_pairs && nl->n_pairs >= q->max_pairs))
            ZB_TRY(list_reserve(nl, q->max_pairs, q->cutoff));
        uint64_t e = nl->n_pairs++;
        nl->i[e] = (int64_t)i;
        nl->j[e] = (int64_t)j;
        memcpy(nl->cell_shifts + 3 * e, S, sizeof S);
    }
    return ZB_OK;
}

/* The pairs of atom i: every bin within the search radius of it along each axis (counted from
 * its own position, not its bin's), once per periodic image. Along the first axis, bins that
 * follow each other in one image are one run of the sorted array. */
static zb_status
search_atom(const search *q, uint64_t i)
{
    const frame *f = q->f;
    const double *wi = q->a->wrapped + 3 * i;
    const int64_t *oi = q->a->offset + 3 * i;
    int64_t lo[3], hi[3];
    size_t nruns = 0;
    for (int k = 0; k < 3; k++) {
        /* a bin's floor may differ from its atoms' by rounding: widen by a hair */
        double u = q->a->unit[3 * i + k], slack = 1e-9 * (1 + fabs(u));
        lo[k] = (int64_t)floor(u - f->reach[k] - slack);
        hi[k] = (int64_t)floor(u + f->reach[k] + slack);
        if (!f->pbc[k]) { /* no images: only the bins there are */
            lo[k] = lo[k] < 0 ? 0 : lo[k];
            hi[k] = hi[k] >= f->nbins[k] ? f->nbins[k] - 1 : hi[k];
        }
    }
    for (int64_t vx = lo[0]; vx <= hi[0]; nruns++) {
        xrun *r = &q->runs[nruns];
        step_bin(f, 0, vx, &r->bin, &r->image); /* lo/hi are inside the bins if not periodic */
        r->len = f->nbins[0] - r->bin;          /* to the end of this image's row */
        if (r->len > hi[0] - vx + 1) r->len = hi[0] - vx + 1;
        for (int c = 0; c < 3; c++) r->shift[c] = (double)r->image * f->axis[0][c];
        vx += r->len;
    }
    for (int64_t vz = lo[2]; vz <= hi[2]; vz++) {
        int64_t bz, tz;
        if (!step_bin(f, 2, vz, &bz, &tz)) continue;
        for (int64_t vy = lo[1]; vy <= hi[1]; vy++) {
            int64_t by, ty;
            if (!step_bin(f, 1, vy, &by, &ty)) continue;
            size_t row = (size_t)(f->nbins[0] * (by + f->nbins[1] * bz));
            double t_row[3]; /* the row's image translation, minus atom i */
            for (int c = 0; c < 3; c++)
                t_row[c] = (double)ty * f->axis[1][c] + (double)tz * f->axis[2][c] - wi[c];
            for (size_t k = 0; k < nruns; k++) {
                const xrun *r = &q->runs[k];
                int64_t base[3] = {r->image + oi[0], ty + oi[1], tz + oi[2]};
                double t[3] = {t_row[0] + r->shift[0], t_row[1] + r->shift[1],
                               t_row[2] + r->shift[2]};
                ZB_TRY(scan_run(q, i, q->a->start[row + (size_t)r->bin],
                                q->a->start[row + (size_t)(r->bin + r->len)], base, t));
            }
        }
    }
    return ZB_OK;
}

zb_status
zb_neighbor_list_build(const zb_structure *s, double cutoff, uint64_t max_pairs,
                       zb_neighbor_list *nl)
{
    if (!nl) return zb__err(ZB_E_INVALID, "neighbour list: nl is NULL");
    nl->n_pairs = 0;
    if (!s) return zb__err(ZB_E_INVALID, "neighbour list: the structure is NULL");
    if (!(cutoff > 0) || !isfinite(cutoff))
        return zb__err(ZB_E_INVALID, "neighbour list: the cutoff %g is not a finite number > 0",
                       cutoff);
    if (s->n_atoms && !s->positions)
        return zb__err(ZB_E_INVALID, "neighbour list: positions are NULL for %llu atoms",
                       (unsigned long long)s->n_atoms);
    frame f;
    atoms a;
    memset(&a, 0, sizeof a);
    double size = 0;
    zb_status st = frame_init(&f, s);
    if (st == ZB_OK) st = atoms_alloc(&a, s->n_atoms);
    if (st == ZB_OK) st = atoms_wrap(&a, &f, s, &size);
    /* the wrapped test may err by a few ulps of the coordinates involved; widen it by far more */
    double margin = 1e-9 * (cutoff + size), radius = cutoff + margin;
    double inner = cutoff - margin > 0 ? cutoff - margin : 0;
    if (st == ZB_OK) st = frame_bins(&f, s->n_atoms, radius);
    if (st == ZB_OK) st = atoms_bin(&a, &f, s);
    /* an atom's range along a periodic first axis spans at most 2·(reach + slack) + 2 bins, so
     * as many runs; along a non-periodic one it is one run */
    search q = {NULL, &f, &a, s, radius * radius, inner * inner, cutoff, max_pairs, nl};
    size_t nruns =
        f.pbc[0] ? (size_t)ceil(2 * (f.reach[0] + 1e-9 * (2 + (double)f.nbins[0]))) + 4 : 1;
    if (st == ZB_OK && !(q.runs = malloc(nruns * sizeof *q.runs)))
        st = zb__err(ZB_E_NOMEM, "neighbour search runs");
    for (uint64_t i = 0; st == ZB_OK && i < s->n_atoms; i++) st = search_atom(&q, i);
    free(q.runs);
    atoms_free(&a);
    if (st != ZB_OK) nl->n_pairs = 0;
    return st;
}

void
zb_neighbor_list_free(zb_neighbor_list *nl)
{
    if (!nl) return;
    free(nl->i);
    free(nl->j);
    free(nl->cell_shifts);
    memset(nl, 0, sizeof *nl);
}
